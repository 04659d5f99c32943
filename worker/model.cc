#include "worker/model.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <torch/version.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ts::worker {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& c) : heads_(c.heads) {
  const int64_t d = c.d_model;
  qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
  proj_ = register_module("proj", torch::nn::Linear(d, d));
  mask_ = register_buffer(
      "mask",
      torch::ones({c.context, c.context}, torch::TensorOptions().dtype(torch::kBool)).tril());
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const int64_t hd = d / heads_;
  std::vector<torch::Tensor> qkv = qkv_->forward(x).split(d, /*dim=*/2);
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, heads_, hd}).transpose(1, 2); };
  const torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);  // [B, h, T, hd]
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(hd)));
  const torch::Tensor causal = mask_.slice(0, 0, t).slice(1, 0, t);
  scores = scores.masked_fill(causal.logical_not(), -std::numeric_limits<float>::infinity());
  const torch::Tensor y = torch::matmul(torch::softmax(scores, /*dim=*/-1), v);
  return proj_->forward(y.transpose(1, 2).contiguous().view({b, t, d}));
}

MlpImpl::MlpImpl(const ModelConfig& c) {
  const int64_t d = c.d_model, hidden = int64_t{c.mlp_ratio} * c.d_model;
  fc_ = register_module("fc", torch::nn::Linear(d, hidden));
  proj_ = register_module("proj", torch::nn::Linear(hidden, d));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return proj_->forward(torch::gelu(fc_->forward(x)));  // exact (erf) GELU
}

BlockImpl::BlockImpl(const ModelConfig& c) {
  const std::vector<int64_t> d = {int64_t{c.d_model}};
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions(d)));
  attn_ = register_module("attn", CausalSelfAttention(c));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions(d)));
  mlp_ = register_module("mlp", Mlp(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = x + attn_->forward(ln1_->forward(x));
  return h + mlp_->forward(ln2_->forward(h));
}

void LanguageModel::CheckLayout() {
  const auto named = named_parameters(/*recurse=*/true);
  const std::vector<TensorSpec> layout = ParameterLayout(config_);
  TS_CHECK(named.size() == layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    TS_CHECK(named[i].key() == layout[i].name);
    TS_CHECK(static_cast<uint64_t>(named[i].value().numel()) == layout[i].numel);
  }
}

torch::Tensor LanguageModel::Logits(const torch::Tensor& tokens) {
  torch::Tensor x = Embed(tokens);
  for (int64_t i = 0; i < int64_t{config_.layers}; ++i) x = Layer(i, x);
  return Head(x);
}

std::shared_ptr<LanguageModel> MakeModel(const ModelConfig& config) {
  TS_CHECK(ValidateModelConfig(config).ok());
  if (config.family == ModelFamily::kLlama) return std::make_shared<LlamaImpl>(config);
  return std::make_shared<GptImpl>(config);
}

GptImpl::GptImpl(const ModelConfig& c) : LanguageModel(c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  TS_CHECK(c.family == ModelFamily::kGpt);
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (uint32_t i = 0; i < c.layers; ++i) blocks_->push_back(Block(c));
  ln_f_ = register_module("ln_f",
                          torch::nn::LayerNorm(torch::nn::LayerNormOptions({int64_t{c.d_model}})));
  CheckLayout();
}

torch::Tensor GptImpl::Embed(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  const torch::Tensor pos =
      torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  return wte_->forward(tokens) + wpe_->forward(pos);
}

torch::Tensor GptImpl::Layer(int64_t i, const torch::Tensor& x) {
  return (*blocks_)[static_cast<size_t>(i)]->as<BlockImpl>()->forward(x);
}

torch::Tensor GptImpl::Head(const torch::Tensor& x) {
  return torch::matmul(ln_f_->forward(x), wte_->weight.t());  // tied output head
}

// ---------------------------------------------------------------------------------------------
// llama

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight_ * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t context, int64_t head_dim,
                                                     double theta) {
  const torch::Tensor exponent =
      torch::arange(0, head_dim, 2, torch::TensorOptions().dtype(torch::kLong))
          .to(torch::kFloat32) /
      static_cast<double>(head_dim);
  const torch::Tensor inv_freq = 1.0 / torch::pow(theta, exponent);
  const torch::Tensor positions = torch::arange(context, torch::kFloat32);
  const torch::Tensor freqs = torch::outer(positions, inv_freq);  // [context, hd/2]
  const torch::Tensor angles = torch::cat({freqs, freqs}, /*dim=*/-1);
  return {angles.cos(), angles.sin()};
}

namespace {

// x [B, h, T, hd]: x · cos + rotate_half(x) · sin, rotate_half(x) = [−x₂, x₁] over the halves.
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor x1 = x.slice(-1, 0, half), x2 = x.slice(-1, half);
  return x * cos + torch::cat({-x2, x1}, /*dim=*/-1) * sin;
}

// Causal attention of q [B, h, T, hd] over k, v [B, h, T, hd].
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v) {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
  // The fused kernels (flash or memory-efficient attention where the device has them).
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  // libtorch 1.x has no fused attention: the same maths, written out.
  const int64_t t = q.size(2);
  torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const torch::Tensor future =
      torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, /*dim=*/-1), v);
#endif
}

torch::nn::Linear Projection(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& c)
    : heads_(c.heads), kv_heads_(c.kv_heads), head_dim_(c.d_model / c.heads) {
  const int64_t d = c.d_model;
  q_proj_ = register_module("q_proj", Projection(d, heads_ * head_dim_));
  k_proj_ = register_module("k_proj", Projection(d, kv_heads_ * head_dim_));
  v_proj_ = register_module("v_proj", Projection(d, kv_heads_ * head_dim_));
  o_proj_ = register_module("o_proj", Projection(heads_ * head_dim_, d));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  auto split = [&](const torch::Tensor& y, int64_t heads) {
    return y.view({b, t, heads, head_dim_}).transpose(1, 2);  // [B, heads, T, hd]
  };
  torch::Tensor q = ApplyRotary(split(q_proj_->forward(x), heads_), cos, sin);
  torch::Tensor k = ApplyRotary(split(k_proj_->forward(x), kv_heads_), cos, sin);
  torch::Tensor v = split(v_proj_->forward(x), kv_heads_);
  if (kv_heads_ != heads_) {
    // Grouped-query attention: query head j reads key-value head j / (heads / kv_heads), as
    // Hugging Face's repeat_kv.
    const int64_t repeats = heads_ / kv_heads_;
    k = k.repeat_interleave(repeats, /*dim=*/1);
    v = v.repeat_interleave(repeats, /*dim=*/1);
  }
  const torch::Tensor y = CausalAttention(q, k, v);  // [B, heads, T, hd]
  return o_proj_->forward(y.transpose(1, 2).contiguous().view({b, t, heads_ * head_dim_}));
}

LlamaMlpImpl::LlamaMlpImpl(const ModelConfig& c) {
  const int64_t d = c.d_model, f = c.mlp_hidden;
  gate_proj_ = register_module("gate_proj", Projection(d, f));
  up_proj_ = register_module("up_proj", Projection(d, f));
  down_proj_ = register_module("down_proj", Projection(f, d));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  return down_proj_->forward(torch::silu(gate_proj_->forward(x)) * up_proj_->forward(x));
}

LlamaLayerImpl::LlamaLayerImpl(const ModelConfig& c) {
  // Hugging Face's registration order, which is the layout's.
  self_attn_ = register_module("self_attn", LlamaAttention(c));
  mlp_ = register_module("mlp", LlamaMlp(c));
  input_layernorm_ = register_module("input_layernorm", RmsNorm(c.d_model, c.norm_eps));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", RmsNorm(c.d_model, c.norm_eps));
}

torch::Tensor LlamaLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                      const torch::Tensor& sin) {
  const torch::Tensor h = x + self_attn_->forward(input_layernorm_->forward(x), cos, sin);
  return h + mlp_->forward(post_attention_layernorm_->forward(h));
}

LlamaBodyImpl::LlamaBodyImpl(const ModelConfig& c) {
  embed_tokens_ = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.d_model));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (uint32_t i = 0; i < c.layers; ++i) layers_->push_back(LlamaLayer(c));
  norm_ = register_module("norm", RmsNorm(c.d_model, c.norm_eps));
}

torch::Tensor LlamaBodyImpl::Layer(int64_t i, const torch::Tensor& x, const torch::Tensor& cos,
                                   const torch::Tensor& sin) {
  return (*layers_)[static_cast<size_t>(i)]->as<LlamaLayerImpl>()->forward(x, cos, sin);
}

LlamaImpl::LlamaImpl(const ModelConfig& c) : LanguageModel(c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  TS_CHECK(c.family == ModelFamily::kLlama);
  model_ = register_module("model", LlamaBody(c));
  if (!c.tie_embeddings) lm_head_ = register_module("lm_head", Projection(c.d_model, c.vocab));
  auto [cos, sin] = RotaryTables(c.context, c.d_model / c.heads, c.rope_theta);
  cos_ = register_buffer("rope_cos", cos);
  sin_ = register_buffer("rope_sin", sin);
  CheckLayout();
}

torch::Tensor LlamaImpl::Embed(const torch::Tensor& tokens) { return model_->Embed(tokens); }

torch::Tensor LlamaImpl::Layer(int64_t i, const torch::Tensor& x) {
  const int64_t t = x.size(1);
  return model_->Layer(i, x, cos_.slice(0, 0, t), sin_.slice(0, 0, t));
}

torch::Tensor LlamaImpl::Head(const torch::Tensor& x) {
  const torch::Tensor h = model_->Norm(x);
  if (lm_head_) return lm_head_->forward(h);
  return torch::matmul(h, model_->embedding().t());  // tied head
}

// ---------------------------------------------------------------------------------------------

absl::Status LoadParams(LanguageModel& model, std::span<const float> flat) {
  const ModelConfig& c = model.config();
  if (flat.size() != ParameterCount(c)) {
    return absl::InvalidArgumentError(absl::StrCat("params: ", flat.size(), " values, the model ",
                                                   ModelConfigString(c), " has ",
                                                   ParameterCount(c)));
  }
  torch::NoGradGuard no_grad;
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  std::vector<torch::Tensor> params = model.parameters();
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::vector<int64_t> shape(layout[i].shape.begin(), layout[i].shape.end());
    // from_blob wants a mutable pointer; the tensor is only read (copied from).
    const torch::Tensor src = torch::from_blob(const_cast<float*>(flat.data() + layout[i].offset),
                                               shape, torch::kFloat32);
    params[i].copy_(src);
  }
  return absl::OkStatus();
}

std::vector<float> StoreParams(const LanguageModel& model) {
  const std::vector<TensorSpec> layout = ParameterLayout(model.config());
  const std::vector<torch::Tensor> params = model.parameters();
  std::vector<float> flat(ParameterCount(model.config()));
  for (size_t i = 0; i < layout.size(); ++i) {
    const torch::Tensor cpu = params[i].detach().to(torch::kCPU).contiguous();
    std::memcpy(flat.data() + layout[i].offset, cpu.data_ptr<float>(),
                layout[i].numel * sizeof(float));
  }
  return flat;
}

}  // namespace ts::worker
