// The decoder LMs in libtorch (docs/worker.md "Model"), behind one interface (LanguageModel:
// tokens → logits):
// - gpt: token + learned position embeddings, pre-LayerNorm blocks with causal self-attention
//   written out (scores, causal mask, softmax, weighted sum) and a GELU MLP, a final LayerNorm,
//   an output head tied to the token embedding;
// - llama: Hugging Face's LlamaForCausalLM — token embedding, pre-RMSNorm layers with rotary
//   position embeddings, grouped-query attention (libtorch's fused scaled_dot_product_attention
//   where the libtorch at hand has it, the same maths written out otherwise), a SwiGLU MLP, a
//   final RMSNorm and an output head, tied to the embedding or not.
// No dropout: a forward pass is a function of the parameters and the tokens only. A model's
// named_parameters() are exactly ParameterLayout(config), in that order (checked at
// construction).
//
// This header includes libtorch; only worker/ sources include it. Thread-safety: a module is
// used by one thread at a time.
#ifndef TS_WORKER_MODEL_H_
#define TS_WORKER_MODEL_H_

#include <torch/torch.h>

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_config.h"

namespace ts::worker {

// What the trainer needs of a model, whatever its family. The forward pass in stages — the
// embedding, each layer, the head — so the trainer can keep only the layers' inputs and
// recompute each layer in the backward pass (activation checkpointing, trainer.cc).
class LanguageModel : public torch::nn::Module {
 public:
  explicit LanguageModel(const ModelConfig& config) : config_(config) {}
  // tokens [B, T] int64 with T <= context -> logits [B, T, vocab]: Head(Layer(… Embed(tokens))).
  torch::Tensor Logits(const torch::Tensor& tokens);
  // tokens [B, T] -> the first layer's input [B, T, d].
  virtual torch::Tensor Embed(const torch::Tensor& tokens) = 0;
  // Layer i (0 <= i < config().layers) of x [B, T, d] -> [B, T, d].
  virtual torch::Tensor Layer(int64_t i, const torch::Tensor& x) = 0;
  // The final norm and the output head: [B, T, d] -> logits [B, T, vocab].
  virtual torch::Tensor Head(const torch::Tensor& x) = 0;
  const ModelConfig& config() const { return config_; }

 protected:
  // TS_CHECKs that named_parameters() is ParameterLayout(config): the flat vector's order is the
  // registration order, so a change in a constructor must change the layout with it.
  void CheckLayout();

 private:
  ModelConfig config_;
};

// The model of config.family. `config` must be valid.
std::shared_ptr<LanguageModel> MakeModel(const ModelConfig& config);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, d] -> [B, T, d]

 private:
  int64_t heads_;
  torch::nn::Linear qkv_{nullptr};
  torch::nn::Linear proj_{nullptr};
  torch::Tensor mask_;  // [context, context] bool, true on and below the diagonal
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear fc_{nullptr};
  torch::nn::Linear proj_{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm ln1_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::LayerNorm ln2_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public LanguageModel {
 public:
  GptImpl(const ModelConfig& config);
  // tokens [B, T] int64 with T <= context -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens) { return Logits(tokens); }
  torch::Tensor Embed(const torch::Tensor& tokens) override;
  torch::Tensor Layer(int64_t i, const torch::Tensor& x) override;
  torch::Tensor Head(const torch::Tensor& x) override;

 private:
  torch::nn::Embedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

// RMSNorm as Hugging Face's LlamaRMSNorm: x · rsqrt(mean(x²) + eps), computed in fp32, times
// `weight`.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  double eps_;
  torch::Tensor weight_;
};
TORCH_MODULE(RmsNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const ModelConfig& config);
  // x [B, T, d]; cos, sin [T, hd] -> [B, T, d].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  int64_t heads_, kv_heads_, head_dim_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  LlamaMlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(LlamaMlp);

class LlamaLayerImpl : public torch::nn::Module {
 public:
  LlamaLayerImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  LlamaAttention self_attn_{nullptr};
  LlamaMlp mlp_{nullptr};
  RmsNorm input_layernorm_{nullptr};
  RmsNorm post_attention_layernorm_{nullptr};
};
TORCH_MODULE(LlamaLayer);

// LlamaModel: the embedding, the layers and the final norm ("model." in the layout's names).
class LlamaBodyImpl : public torch::nn::Module {
 public:
  LlamaBodyImpl(const ModelConfig& config);
  torch::Tensor Embed(const torch::Tensor& tokens) { return embed_tokens_->forward(tokens); }
  torch::Tensor Layer(int64_t i, const torch::Tensor& x, const torch::Tensor& cos,
                      const torch::Tensor& sin);
  torch::Tensor Norm(const torch::Tensor& x) { return norm_->forward(x); }
  const torch::Tensor& embedding() const { return embed_tokens_->weight; }

 private:
  torch::nn::Embedding embed_tokens_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  RmsNorm norm_{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaImpl : public LanguageModel {
 public:
  LlamaImpl(const ModelConfig& config);
  torch::Tensor Embed(const torch::Tensor& tokens) override;
  torch::Tensor Layer(int64_t i, const torch::Tensor& x) override;
  torch::Tensor Head(const torch::Tensor& x) override;

 private:
  LlamaBody model_{nullptr};
  torch::nn::Linear lm_head_{nullptr};  // null when tied to the embedding
  torch::Tensor cos_, sin_;             // [context, hd] buffers of the rotary embedding
};

// The rotary tables of Hugging Face's LlamaRotaryEmbedding for positions 0..context-1:
// inv_freq[i] = 1 / theta^(2i / hd), angles = position ⊗ inv_freq repeated twice, cos and sin.
std::pair<torch::Tensor, torch::Tensor> RotaryTables(int64_t context, int64_t head_dim,
                                                     double theta);

// Copies a flat vector (ParameterLayout order) into the model's parameters, on whatever device
// they are. INVALID_ARGUMENT naming both lengths when flat has the wrong length.
absl::Status LoadParams(LanguageModel& model, std::span<const float> flat);
// The model's parameters as a flat vector in ParameterLayout order.
std::vector<float> StoreParams(const LanguageModel& model);

}  // namespace ts::worker

#endif  // TS_WORKER_MODEL_H_
