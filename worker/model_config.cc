#include "worker/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ts::worker {
namespace {

// Counted in 64 bits from 32-bit fields: cannot overflow for fields within their maxima.
uint64_t CountUnchecked(const ModelConfig& c) {
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

}  // namespace

absl::Status ValidateModelConfig(const ModelConfig& c) {
  TS_RETURN_IF_ERROR(Range("layers", c.layers, 1, kLayersMax));
  TS_RETURN_IF_ERROR(Range("d_model", c.d_model, 1, kDModelMax));
  TS_RETURN_IF_ERROR(Range("heads", c.heads, 1, c.d_model));
  if (c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heads: ", c.heads, " does not divide d_model ", c.d_model));
  }
  TS_RETURN_IF_ERROR(Range("context", c.context, 1, kContextMax));
  TS_RETURN_IF_ERROR(Range("vocab", c.vocab, 2, kVocabMax));
  TS_RETURN_IF_ERROR(Range("mlp_ratio", c.mlp_ratio, 1, kMlpRatioMax));
  const uint64_t count = CountUnchecked(c);
  if (count > kParamsMax) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", count, " parameters (",
                                                   ModelConfigString(c), ") exceed ", kParamsMax));
  }
  return absl::OkStatus();
}

std::string ModelConfigString(const ModelConfig& c) {
  return absl::StrCat("layers=", c.layers, " d_model=", c.d_model, " heads=", c.heads,
                      " context=", c.context, " vocab=", c.vocab, " mlp_ratio=", c.mlp_ratio);
}

std::vector<TensorSpec> ParameterLayout(const ModelConfig& c) {
  TS_CHECK(ValidateModelConfig(c).ok());
  const uint32_t d = c.d_model;
  const uint32_t hidden = c.mlp_ratio * d;
  std::vector<TensorSpec> layout;
  uint64_t offset = 0;
  auto add = [&](std::string name, std::vector<uint32_t> shape) {
    uint64_t numel = 1;
    for (uint32_t dim : shape) numel *= dim;
    layout.push_back(TensorSpec{std::move(name), std::move(shape), numel, offset});
    offset += numel;
  };
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

std::vector<float> InitParams(const ModelConfig& c, uint64_t seed) {
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  std::vector<float> params(ParameterCount(c), 0.0f);
  uint64_t state = seed;
  const double residual_std = 0.02 / std::sqrt(2.0 * c.layers);
  for (const TensorSpec& t : layout) {
    double stddev = 0;
    if (t.shape.size() == 2) {
      const bool residual =
          EndsWith(t.name, "attn.proj.weight") || EndsWith(t.name, "mlp.proj.weight");
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
