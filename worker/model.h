// The GPT-style decoder LM in libtorch (docs/worker.md "Model"): token + learned position
// embeddings, pre-LayerNorm blocks with causal self-attention written out (scores, causal mask,
// softmax, weighted sum) and a GELU MLP, a final LayerNorm, and an output head tied to the token
// embedding. No dropout: a forward pass is a function of the parameters and the tokens only.
// Its named_parameters() are exactly ParameterLayout(config), in that order (checked at
// construction).
//
// This header includes libtorch; only worker/ sources include it. Thread-safety: a module is
// used by one thread at a time.
#ifndef TS_WORKER_MODEL_H_
#define TS_WORKER_MODEL_H_

#include <torch/torch.h>

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_config.h"

namespace ts::worker {

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

class GptImpl : public torch::nn::Module {
 public:
  GptImpl(const ModelConfig& config);
  // tokens [B, T] int64 with T <= context -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  const ModelConfig& config() const { return config_; }

 private:
  ModelConfig config_;
  torch::nn::Embedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

// Copies a flat vector (ParameterLayout order) into the model's parameters, on whatever device
// they are. INVALID_ARGUMENT naming both lengths when flat has the wrong length.
absl::Status LoadParams(GptImpl& model, std::span<const float> flat);
// The model's parameters as a flat vector in ParameterLayout order.
std::vector<float> StoreParams(const GptImpl& model);

}  // namespace ts::worker

#endif  // TS_WORKER_MODEL_H_
