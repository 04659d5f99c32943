// The shape of the worker's model — a GPT-style decoder LM or a Llama-style one (RMSNorm, rotary
// positions, SwiGLU, grouped-query attention; docs/worker.md "Model") — its validation, the size
// presets, and the fixed order of its parameters as one flat fp32 vector. Everything here is
// plain C++ (no libtorch), so the shard process can check a checkpoint's layout without the
// worker.
//
// Thread-safety: pure functions.
#ifndef TS_WORKER_MODEL_CONFIG_H_
#define TS_WORKER_MODEL_CONFIG_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::worker {

enum class ModelFamily : uint32_t {
  // Learned positions, LayerNorm with biases, GELU MLP, multi-head attention, tied head.
  kGpt = 1,
  // The Llama layout (Hugging Face's LlamaForCausalLM): RMSNorm, rotary position embeddings,
  // SwiGLU MLP, grouped-query attention, no biases, the head optionally tied.
  kLlama = 2,
};

// "gpt" / "llama".
std::string_view ModelFamilyName(ModelFamily family);

struct ModelConfig {
  ModelFamily family = ModelFamily::kGpt;
  uint32_t layers = 2;     // transformer blocks, 1..kLayersMax
  uint32_t d_model = 64;   // width, 1..kDModelMax, a multiple of heads
  uint32_t heads = 4;      // attention heads, 1..d_model
  uint32_t context = 64;   // tokens per sequence, 1..kContextMax
  uint32_t vocab = 512;    // tokens, 2..kVocabMax
  uint32_t mlp_ratio = 4;  // gpt: MLP hidden width = mlp_ratio * d_model, 1..kMlpRatioMax
  // llama only (0, 0, 0, 0 and false for gpt):
  uint32_t kv_heads = 0;        // key-value heads, 1..heads, dividing heads
  uint32_t mlp_hidden = 0;      // SwiGLU hidden width, 1..kMlpHiddenMax
  float rope_theta = 0;         // rotary base, 1..1e8 (10000 in Llama 2)
  float norm_eps = 0;           // RMSNorm epsilon, 1e-10..1e-2
  bool tie_embeddings = false;  // the output head shares the token embedding

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

inline constexpr uint32_t kLayersMax = 256;
inline constexpr uint32_t kDModelMax = 16384;
inline constexpr uint32_t kContextMax = 65536;
inline constexpr uint32_t kVocabMax = 1u << 24;
inline constexpr uint32_t kMlpRatioMax = 16;
inline constexpr uint32_t kMlpHiddenMax = 1u << 18;
// 2^31 parameters = 8 GiB of fp32: larger models are refused before anything is allocated.
inline constexpr uint64_t kParamsMax = uint64_t{1} << 31;

// INVALID_ARGUMENT naming the field and value ("heads: 3 does not divide d_model 64"), or a
// config whose parameter count exceeds kParamsMax.
absl::Status ValidateModelConfig(const ModelConfig& config);

// "gpt layers=2 d_model=64 heads=4 context=64 vocab=512 mlp_ratio=4", or for llama
// "llama layers=... kv_heads=... mlp_hidden=... rope_theta=... norm_eps=... tied".
std::string ModelConfigString(const ModelConfig& config);

// A named size of the llama family (docs/worker.md "Presets"): everything but vocab and
// context, which come from the run's data and spec. NOT_FOUND naming the preset and the known
// ones for an unknown name.
struct ModelPreset {
  std::string_view name;  // "tiny", "20m", "125m", "350m", "1b"
  uint32_t layers, d_model, heads, kv_heads, mlp_hidden;
  bool tie_embeddings;
};
absl::StatusOr<ModelConfig> PresetConfig(std::string_view name, uint32_t vocab, uint32_t context);
// Every preset, smallest first.
std::span<const ModelPreset> ModelPresets();

// One named parameter tensor. `offset` is where it starts in the flat vector.
struct TensorSpec {
  std::string name;
  std::vector<uint32_t> shape;
  uint64_t numel = 0;
  uint64_t offset = 0;
};

// The parameters in their fixed order — module registration order, the order PyTorch's
// named_parameters() gives for the same module tree. gpt:
//   wte.weight [vocab, d], wpe.weight [context, d],
//   per block i: blocks.i.ln1.{weight,bias} [d], blocks.i.attn.qkv.{weight [3d, d], bias [3d]},
//     blocks.i.attn.proj.{weight [d, d], bias [d]}, blocks.i.ln2.{weight,bias} [d],
//     blocks.i.mlp.fc.{weight [r*d, d], bias [r*d]}, blocks.i.mlp.proj.{weight [d, r*d], bias [d]},
//   ln_f.weight [d], ln_f.bias [d]
// (the output head is tied to wte.weight and has no parameters of its own). llama, with Hugging
// Face's LlamaForCausalLM names, head width hd = d / heads, hidden width f:
//   model.embed_tokens.weight [vocab, d],
//   per layer i: model.layers.i.self_attn.{q_proj [heads*hd, d], k_proj [kv*hd, d],
//     v_proj [kv*hd, d], o_proj [d, heads*hd]}.weight, model.layers.i.mlp.{gate_proj [f, d],
//     up_proj [f, d], down_proj [d, f]}.weight, model.layers.i.input_layernorm.weight [d],
//     model.layers.i.post_attention_layernorm.weight [d],
//   model.norm.weight [d], lm_head.weight [vocab, d] (untied only).
// `config` must be valid (checked: a programmer error otherwise).
std::vector<TensorSpec> ParameterLayout(const ModelConfig& config);

// Total number of fp32 parameters (sum of numel over ParameterLayout). `config` must be valid.
uint64_t ParameterCount(const ModelConfig& config);

// The fp32 training state a worker holds for the model: parameters, gradients and AdamW's two
// moments, 16 bytes a parameter (activations come on top and follow the micro-batch). The figure
// a host's declared memory is checked against before it reserves (docs/host-sidecar.md) and a
// worker's --memory-bytes-max before it trains. `config` must be valid.
uint64_t TrainingStateBytes(const ModelConfig& config);

// How one forward and backward pass is run, for ActivationBytes.
struct ActivationShape {
  uint64_t rows = 1;             // windows per pass (the micro-batch)
  uint64_t cols = 2;             // tokens per window (context + 1)
  bool checkpointing = false;    // only each layer's input kept, one layer recomputed at a time
  bool bf16 = false;             // the layers' activations in bf16 (the logits stay fp32)
  bool fused_attention = false;  // no attention scores kept (libtorch 2's fused kernels)
};

// An estimate of the activation memory of one pass, what a worker holds on top of
// TrainingStateBytes at the peak of a step: per token, each layer's kept tensors (norms,
// queries, keys and values, attention output, the MLP's hidden tensors; the attention scores and
// probabilities unless fused) and the head's logits with their log-softmax and gradients
// (docs/worker.md "Memory"). Checked before round 0 against what the device has free, and by a
// host against the memory it declares before it reserves. `config` must be valid.
uint64_t ActivationBytes(const ModelConfig& config, const ActivationShape& shape);

// Initial parameters, a pure function of (config, seed) computed in plain C++ (no libtorch), in
// ParameterLayout order. GPT-2's scheme: embeddings and Linear weights ~ N(0, 0.02²), the two
// residual projections (gpt: attn.proj, mlp.proj; llama: o_proj, down_proj)
// ~ N(0, (0.02/sqrt(2·layers))²), biases 0, LayerNorm and RMSNorm weights 1. Normals come from one
// SplitMix64 stream seeded with `seed`, drawn in layout order, two uniforms per value (Box-Muller,
// in double); docs/worker.md "Initialization" has the exact recipe. `config` must be valid.
std::vector<float> InitParams(const ModelConfig& config, uint64_t seed);

}  // namespace ts::worker

#endif  // TS_WORKER_MODEL_CONFIG_H_
