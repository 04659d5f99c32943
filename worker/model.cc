#include "worker/model.h"

#include <cmath>
#include <cstring>

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

GptImpl::GptImpl(const ModelConfig& c) : config_(c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  wte_ = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
  wpe_ = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (uint32_t i = 0; i < c.layers; ++i) blocks_->push_back(Block(c));
  ln_f_ = register_module("ln_f",
                          torch::nn::LayerNorm(torch::nn::LayerNormOptions({int64_t{c.d_model}})));
  // The flat vector's order is the registration order; a change here must change the layout.
  const auto named = named_parameters(/*recurse=*/true);
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  TS_CHECK(named.size() == layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    TS_CHECK(named[i].key() == layout[i].name);
    TS_CHECK(static_cast<uint64_t>(named[i].value().numel()) == layout[i].numel);
  }
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  const torch::Tensor pos =
      torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  torch::Tensor x = wte_->forward(tokens) + wpe_->forward(pos);
  for (const auto& block : *blocks_) x = block->as<BlockImpl>()->forward(x);
  x = ln_f_->forward(x);
  return torch::matmul(x, wte_->weight.t());  // tied output head
}

absl::Status LoadParams(GptImpl& model, std::span<const float> flat) {
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

std::vector<float> StoreParams(const GptImpl& model) {
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
