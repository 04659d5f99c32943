#include "worker/checkpoint.h"

#include <bit>
#include <cmath>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/crypto/hash.h"
#include "common/status.h"
#include "worker/bytes.h"

namespace ts::worker {
namespace {

using internal::ByteReader;
using internal::PutLe;

constexpr uint32_t kFlagMomentum = 1;
constexpr uint32_t kNdimMax = 4;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

absl::Status CheckFinite(std::span<const float> values, absl::string_view what) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return Bad(absl::StrCat(what, "[", i, "] is ", values[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncodeCheckpointHeader(const ModelConfig& config, bool has_momentum) {
  const std::vector<TensorSpec> layout = ParameterLayout(config);  // checks the config
  std::string out;
  out.reserve(96 + layout.size() * 64);
  out.append(kCheckpointMagic, sizeof(kCheckpointMagic));
  if (config.family == ModelFamily::kGpt) {
    // Version 1 holds the gpt family alone; its bytes (and so its roots) are as they always were.
    PutLe<uint32_t>(&out, kCheckpointVersionGpt);
    for (uint32_t v : {config.layers, config.d_model, config.heads, config.context, config.vocab,
                       config.mlp_ratio}) {
      PutLe<uint32_t>(&out, v);
    }
  } else {
    PutLe<uint32_t>(&out, kCheckpointVersion);
    for (uint32_t v :
         {static_cast<uint32_t>(config.family), config.layers, config.d_model, config.heads,
          config.kv_heads, config.mlp_hidden, config.context, config.vocab,
          std::bit_cast<uint32_t>(config.rope_theta), std::bit_cast<uint32_t>(config.norm_eps),
          static_cast<uint32_t>(config.tie_embeddings ? 1 : 0)}) {
      PutLe<uint32_t>(&out, v);
    }
  }
  PutLe<uint32_t>(&out, has_momentum ? kFlagMomentum : 0);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(layout.size()));
  for (const TensorSpec& t : layout) {
    PutLe<uint16_t>(&out, static_cast<uint16_t>(t.name.size()));
    out.append(t.name);
    PutLe<uint8_t>(&out, static_cast<uint8_t>(t.shape.size()));
    for (uint32_t dim : t.shape) PutLe<uint32_t>(&out, dim);
  }
  return out;
}

std::string EncodeCheckpoint(const Checkpoint& ck) {
  const uint64_t count = ParameterCount(ck.config);
  TS_CHECK(ck.params.size() == count);
  TS_CHECK(!ck.momentum.has_value() || ck.momentum->size() == count);
  std::string out = EncodeCheckpointHeader(ck.config, ck.momentum.has_value());
  out.reserve(out.size() + count * 4 * (ck.momentum ? 2 : 1));
  internal::PutFloats(&out, ck.params);
  if (ck.momentum) internal::PutFloats(&out, *ck.momentum);
  return out;
}

absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(std::string_view bytes) {
  ByteReader r(bytes);
  std::string_view magic;
  if (!r.ReadBytes(sizeof(kCheckpointMagic), &magic) ||
      magic != std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))) {
    return Bad("wrong magic (not a trainshard checkpoint)");
  }
  uint32_t version = 0;
  if (!r.Read(&version)) return Bad("truncated header");
  CheckpointHeader header;
  ModelConfig& c = header.config;
  if (version == kCheckpointVersionGpt) {
    if (!r.Read(&c.layers) || !r.Read(&c.d_model) || !r.Read(&c.heads) || !r.Read(&c.context) ||
        !r.Read(&c.vocab) || !r.Read(&c.mlp_ratio)) {
      return Bad("truncated header");
    }
  } else if (version == kCheckpointVersion) {
    uint32_t family = 0, rope_bits = 0, eps_bits = 0, tie = 0;
    if (!r.Read(&family) || !r.Read(&c.layers) || !r.Read(&c.d_model) || !r.Read(&c.heads) ||
        !r.Read(&c.kv_heads) || !r.Read(&c.mlp_hidden) || !r.Read(&c.context) ||
        !r.Read(&c.vocab) || !r.Read(&rope_bits) || !r.Read(&eps_bits) || !r.Read(&tie)) {
      return Bad("truncated header");
    }
    if (family != static_cast<uint32_t>(ModelFamily::kLlama)) {
      return Bad(absl::StrCat("family ", family, " in a version ", version, " header"));
    }
    if (tie > 1) return Bad(absl::StrCat("tie_embeddings ", tie, " is not 0 or 1"));
    c.family = ModelFamily::kLlama;
    c.mlp_ratio = 0;
    c.rope_theta = std::bit_cast<float>(rope_bits);
    c.norm_eps = std::bit_cast<float>(eps_bits);
    c.tie_embeddings = tie == 1;
  } else {
    return Bad(absl::StrCat("version ", version, " is not ", kCheckpointVersionGpt, " or ",
                            kCheckpointVersion));
  }
  uint32_t flags = 0;
  uint32_t tensor_count = 0;
  if (!r.Read(&flags) || !r.Read(&tensor_count)) return Bad("truncated header");
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) {
    return Bad(absl::StrCat("config: ", s.message()));
  }
  if ((flags & ~kFlagMomentum) != 0) return Bad(absl::StrCat("unknown flags ", flags));
  const std::vector<TensorSpec> layout = ParameterLayout(c);
  if (tensor_count != layout.size()) {
    return Bad(absl::StrCat("tensor count ", tensor_count, " is not ", layout.size(), " for ",
                            ModelConfigString(c)));
  }
  for (const TensorSpec& t : layout) {
    uint16_t name_len = 0;
    std::string_view name;
    uint8_t ndim = 0;
    if (!r.Read(&name_len) || !r.ReadBytes(name_len, &name) || !r.Read(&ndim)) {
      return Bad("truncated tensor table");
    }
    if (name != t.name) {
      return Bad(absl::StrCat("tensor '", common::AsAbsl(name), "' where '", t.name, "' belongs"));
    }
    if (ndim != t.shape.size() || ndim > kNdimMax) {
      return Bad(absl::StrCat("tensor ", t.name, ": ", int{ndim}, " dimensions, expected ",
                              t.shape.size()));
    }
    for (uint32_t i = 0; i < ndim; ++i) {
      uint32_t dim = 0;
      if (!r.Read(&dim)) return Bad("truncated tensor table");
      if (dim != t.shape[i]) {
        return Bad(absl::StrCat("tensor ", t.name, ": dimension ", i, " is ", dim, ", expected ",
                                t.shape[i]));
      }
    }
  }
  header.has_momentum = (flags & kFlagMomentum) != 0;
  header.header_bytes = r.position();
  header.value_bytes = ParameterCount(c) * sizeof(float) * (header.has_momentum ? 2 : 1);
  return header;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes, uint64_t bytes_max) {
  if (bytes.size() > bytes_max) {
    return Bad(absl::StrCat(bytes.size(), " bytes exceed the cap of ", bytes_max));
  }
  TS_ASSIGN_OR_RETURN(CheckpointHeader header, DecodeCheckpointHeader(bytes));
  const uint64_t remaining = bytes.size() - header.header_bytes;
  if (remaining != header.value_bytes) {
    return Bad(absl::StrCat(remaining, " bytes of values, expected ", header.value_bytes));
  }
  Checkpoint ck;
  ck.config = header.config;
  const uint64_t count = ParameterCount(ck.config);
  const char* p = bytes.data() + header.header_bytes;
  ck.params.resize(count);
  internal::GetFloats(p, ck.params);
  TS_RETURN_IF_ERROR(CheckFinite(ck.params, "params"));
  if (header.has_momentum) {
    ck.momentum.emplace(count);
    internal::GetFloats(p + count * sizeof(float), *ck.momentum);
    TS_RETURN_IF_ERROR(CheckFinite(*ck.momentum, "momentum"));
  }
  return ck;
}

std::string CheckpointRoot(std::string_view encoded) { return common::Sha256(encoded); }

std::string CheckpointRootOf(const Checkpoint& checkpoint) {
  return CheckpointRoot(EncodeCheckpoint(checkpoint));
}

}  // namespace ts::worker
