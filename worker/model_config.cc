#include "worker/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/status.h"

namespace ts::worker {
namespace {

constexpr ModelPreset kPresets[] = {
    {"tiny", 2, 64, 4, 2, 176, true},     {"20m", 6, 384, 6, 2, 1024, true},
    {"125m", 12, 768, 12, 4, 3072, true}, {"350m", 24, 1024, 16, 8, 3072, true},
    {"1b", 16, 2048, 32, 8, 8192, true},
};

uint64_t CountLlama(const ModelConfig& c) {
  const uint64_t d = c.d_model, hd = c.d_model / c.heads, f = c.mlp_hidden;
  const uint64_t per_layer = d * (c.heads * hd)           // q_proj
                             + 2 * d * (c.kv_heads * hd)  // k_proj, v_proj
                             + (c.heads * hd) * d         // o_proj
                             + 3 * d * f                  // gate, up, down
                             + 2 * d;                     // the two RMSNorms
  return uint64_t{c.vocab} * d * (c.tie_embeddings ? 1 : 2) + c.layers * per_layer + d;
}

// Counted in 64 bits from 32-bit fields: cannot overflow for fields within their maxima.
uint64_t CountUnchecked(const ModelConfig& c) {
  if (c.family == ModelFamily::kLlama) return CountLlama(c);
  const uint64_t d = c.d_model;
  const uint64_t hidden = uint64_t{c.mlp_ratio} * d;
  const uint64_t per_block = 2 * d                                    // ln1
                             + 3 * d * d + 3 * d                      // qkv
                             + d * d + d                              // attn proj
                             + 2 * d                                  // ln2
                             + hidden * d + hidden + d * hidden + d;  // mlp
  return uint64_t{c.vocab} * d + uint64_t{c.context} * d + c.layers * per_block + 2 * d;
}

absl::Status Range(absl::string_view field, uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " is outside ", lo, "..", hi));
  }
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

absl::Status ValidateFamilyFields(const ModelConfig& c) {
  auto unused = [&](absl::string_view field, bool set) -> absl::Status {
    if (!set) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": not a field of the ", common::AsAbsl(ModelFamilyName(c.family)), " family"));
  };
  if (c.family == ModelFamily::kGpt) {
    TS_RETURN_IF_ERROR(Range("mlp_ratio", c.mlp_ratio, 1, kMlpRatioMax));
    TS_RETURN_IF_ERROR(unused("kv_heads", c.kv_heads != 0));
    TS_RETURN_IF_ERROR(unused("mlp_hidden", c.mlp_hidden != 0));
    TS_RETURN_IF_ERROR(unused("rope_theta", c.rope_theta != 0));
    TS_RETURN_IF_ERROR(unused("norm_eps", c.norm_eps != 0));
    return unused("tie_embeddings", c.tie_embeddings);
  }
  TS_RETURN_IF_ERROR(unused("mlp_ratio", c.mlp_ratio != 0));
  TS_RETURN_IF_ERROR(Range("kv_heads", c.kv_heads, 1, c.heads));
  if (c.heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_heads: ", c.kv_heads, " does not divide heads ", c.heads));
  }
  if ((c.d_model / c.heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("heads: ", c.heads, " gives a head width of ",
                                                   c.d_model / c.heads,
                                                   ", which rotary positions need even"));
  }
  TS_RETURN_IF_ERROR(Range("mlp_hidden", c.mlp_hidden, 1, kMlpHiddenMax));
  // NaN fails both comparisons.
  if (!(c.rope_theta >= 1 && c.rope_theta <= 1e8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_theta: ", c.rope_theta, " is outside 1..1e8"));
  }
  if (!(c.norm_eps >= 1e-10f && c.norm_eps <= 1e-2f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("norm_eps: ", c.norm_eps, " is outside 1e-10..1e-2"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kGpt:
      return "gpt";
    case ModelFamily::kLlama:
      return "llama";
  }
  return "unknown";
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  if (c.family != ModelFamily::kGpt && c.family != ModelFamily::kLlama) {
    return absl::InvalidArgumentError(
        absl::StrCat("family: ", static_cast<uint32_t>(c.family), " is not gpt or llama"));
  }
  TS_RETURN_IF_ERROR(Range("layers", c.layers, 1, kLayersMax));
  TS_RETURN_IF_ERROR(Range("d_model", c.d_model, 1, kDModelMax));
  TS_RETURN_IF_ERROR(Range("heads", c.heads, 1, c.d_model));
  if (c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads: ", c.heads, " does not divide d_model ", c.d_model));
  }
  TS_RETURN_IF_ERROR(Range("context", c.context, 1, kContextMax));
  TS_RETURN_IF_ERROR(Range("vocab", c.vocab, 2, kVocabMax));
  TS_RETURN_IF_ERROR(ValidateFamilyFields(c));
  const uint64_t count = CountUnchecked(c);
  if (count > kParamsMax) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", count, " parameters (",
                                                   ModelConfigString(c), ") exceed ", kParamsMax));
  }
  return absl::OkStatus();
}

std::string ModelConfigString(const ModelConfig& c) {
  std::string out = absl::StrCat(common::AsAbsl(ModelFamilyName(c.family)), " layers=", c.layers,
                                 " d_model=", c.d_model, " heads=", c.heads, " context=", c.context,
                                 " vocab=", c.vocab);
  if (c.family == ModelFamily::kGpt) {
    absl::StrAppend(&out, " mlp_ratio=", c.mlp_ratio);
  } else {
    absl::StrAppend(&out, " kv_heads=", c.kv_heads, " mlp_hidden=", c.mlp_hidden,
                    " rope_theta=", c.rope_theta, " norm_eps=", c.norm_eps,
                    c.tie_embeddings ? " tied" : " untied");
  }
  return out;
}

std::span<const ModelPreset> ModelPresets() { return kPresets; }

absl::StatusOr<ModelConfig> PresetConfig(std::string_view name, uint32_t vocab, uint32_t context) {
  for (const ModelPreset& p : kPresets) {
    if (p.name != name) continue;
    ModelConfig c{.family = ModelFamily::kLlama,
                  .layers = p.layers,
                  .d_model = p.d_model,
                  .heads = p.heads,
                  .context = context,
                  .vocab = vocab,
                  .mlp_ratio = 0,
                  .kv_heads = p.kv_heads,
                  .mlp_hidden = p.mlp_hidden,
                  .rope_theta = 10000.0f,
                  .norm_eps = 1e-5f,
                  .tie_embeddings = p.tie_embeddings};
    TS_RETURN_IF_ERROR(ValidateModelConfig(c));
    return c;
  }
  std::string known;
  for (const ModelPreset& p : kPresets) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", common::AsAbsl(p.name));
  }
  return absl::NotFoundError(
      absl::StrCat("preset: \"", common::AsAbsl(name), "\" is not one of ", known));
}

std::vector<TensorSpec> ParameterLayout(const ModelConfig& c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  const uint32_t d = c.d_model;
  std::vector<TensorSpec> layout;
  uint64_t offset = 0;
  auto add = [&](std::string name, std::vector<uint32_t> shape) {
    uint64_t numel = 1;
    for (uint32_t dim : shape) numel *= dim;
    layout.push_back(TensorSpec{std::move(name), std::move(shape), numel, offset});
    offset += numel;
  };
  if (c.family == ModelFamily::kLlama) {
    const uint32_t hd = d / c.heads, q = c.heads * hd, kv = c.kv_heads * hd, f = c.mlp_hidden;
    add("model.embed_tokens.weight", {c.vocab, d});
    for (uint32_t i = 0; i < c.layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      add(p + "self_attn.q_proj.weight", {q, d});
      add(p + "self_attn.k_proj.weight", {kv, d});
      add(p + "self_attn.v_proj.weight", {kv, d});
      add(p + "self_attn.o_proj.weight", {d, q});
      add(p + "mlp.gate_proj.weight", {f, d});
      add(p + "mlp.up_proj.weight", {f, d});
      add(p + "mlp.down_proj.weight", {d, f});
      add(p + "input_layernorm.weight", {d});
      add(p + "post_attention_layernorm.weight", {d});
    }
    add("model.norm.weight", {d});
    if (!c.tie_embeddings) add("lm_head.weight", {c.vocab, d});
    TS_CHECK(offset == CountUnchecked(c));
    return layout;
  }
  const uint32_t hidden = c.mlp_ratio * d;
  add("wte.weight", {c.vocab, d});
  add("wpe.weight", {c.context, d});
  for (uint32_t i = 0; i < c.layers; ++i) {
    const std::string p = absl::StrCat("blocks.", i, ".");
    add(p + "ln1.weight", {d});
    add(p + "ln1.bias", {d});
    add(p + "attn.qkv.weight", {3 * d, d});
    add(p + "attn.qkv.bias", {3 * d});
    add(p + "attn.proj.weight", {d, d});
    add(p + "attn.proj.bias", {d});
    add(p + "ln2.weight", {d});
    add(p + "ln2.bias", {d});
    add(p + "mlp.fc.weight", {hidden, d});
    add(p + "mlp.fc.bias", {hidden});
    add(p + "mlp.proj.weight", {d, hidden});
    add(p + "mlp.proj.bias", {d});
  }
  add("ln_f.weight", {d});
  add("ln_f.bias", {d});
  TS_CHECK(offset == CountUnchecked(c));
  return layout;
}

uint64_t ParameterCount(const ModelConfig& c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  return CountUnchecked(c);
}

uint64_t TrainingStateBytes(const ModelConfig& c) { return 16 * ParameterCount(c); }

uint64_t ActivationBytes(const ModelConfig& c, const ActivationShape& shape) {
  const uint64_t d = c.d_model, heads = c.heads, cols = shape.cols;
  const bool llama = c.family == ModelFamily::kLlama;
  const uint64_t kv = llama ? d / heads * c.kv_heads : d;
  const uint64_t hidden = llama ? c.mlp_hidden : uint64_t{c.mlp_ratio} * d;
  // Values kept per token by one layer: two norms' inputs and outputs, q, k and v, the
  // attention's output and projection, the MLP's hidden tensors (gate, up, activation, product)
  // and its output; the scores and probabilities of each head over the window unless fused.
  uint64_t layer = 6 * d + 2 * kv + 4 * hidden + (shape.fused_attention ? 0 : 2 * heads * cols);
  if (shape.bf16) layer = (layer + 1) / 2;  // counted in fp32 values: bf16 is half
  // The head: logits, their log-softmax and the two gradients, in fp32 whatever the layers ran.
  const uint64_t head = 4 * uint64_t{c.vocab} + 2 * d;
  const uint64_t kept =
      shape.checkpointing ? uint64_t{c.layers} * d + layer : uint64_t{c.layers} * layer;
  return 4 * shape.rows * cols * (kept + head);
}

std::vector<float> InitParams(const ModelConfig& c, uint64_t seed) {
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  std::vector<float> params(ParameterCount(c), 0.0f);
  uint64_t state = seed;
  const double residual_std = 0.02 / std::sqrt(2.0 * c.layers);
  for (const TensorSpec& t : layout) {
    double stddev = 0;
    if (t.shape.size() == 2) {
      const bool residual =
          EndsWith(t.name, "attn.proj.weight") || EndsWith(t.name, "mlp.proj.weight") ||
          EndsWith(t.name, "o_proj.weight") || EndsWith(t.name, "down_proj.weight");
      stddev = residual ? residual_std : 0.02;
    } else if (EndsWith(t.name, ".weight")) {
      std::fill_n(params.begin() + static_cast<int64_t>(t.offset), t.numel, 1.0f);  // LayerNorm
      continue;
    } else {
      continue;  // biases stay 0
    }
    for (uint64_t i = 0; i < t.numel; ++i) {
      // u1 in (0, 1], u2 in [0, 1): 53 random bits each.
      const double u1 = static_cast<double>((SplitMix64(&state) >> 11) + 1) * 0x1.0p-53;
      const double u2 = static_cast<double>(SplitMix64(&state) >> 11) * 0x1.0p-53;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      params[t.offset + i] = static_cast<float>(stddev * z);
    }
  }
  return params;
}

}  // namespace ts::worker
