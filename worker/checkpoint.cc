#include "worker/checkpoint.h"

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

std::string EncodeCheckpoint(const Checkpoint& ck) {
  const std::vector<TensorSpec> layout = ParameterLayout(ck.config);  // checks the config
  const uint64_t count = ParameterCount(ck.config);
  TS_CHECK(ck.params.size() == count);
  TS_CHECK(!ck.momentum.has_value() || ck.momentum->size() == count);

  std::string out;
  out.reserve(64 + layout.size() * 48 + count * 4 * (ck.momentum ? 2 : 1));
  out.append(kCheckpointMagic, sizeof(kCheckpointMagic));
  PutLe<uint32_t>(&out, kCheckpointVersion);
  for (uint32_t v : {ck.config.layers, ck.config.d_model, ck.config.heads, ck.config.context,
                     ck.config.vocab, ck.config.mlp_ratio}) {
    PutLe<uint32_t>(&out, v);
  }
  PutLe<uint32_t>(&out, ck.momentum ? kFlagMomentum : 0);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(layout.size()));
  for (const TensorSpec& t : layout) {
    PutLe<uint16_t>(&out, static_cast<uint16_t>(t.name.size()));
    out.append(t.name);
    PutLe<uint8_t>(&out, static_cast<uint8_t>(t.shape.size()));
    for (uint32_t dim : t.shape) PutLe<uint32_t>(&out, dim);
  }
  internal::PutFloats(&out, ck.params);
  if (ck.momentum) internal::PutFloats(&out, *ck.momentum);
  return out;
}

absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes, uint64_t bytes_max) {
  if (bytes.size() > bytes_max) {
    return Bad(absl::StrCat(bytes.size(), " bytes exceed the cap of ", bytes_max));
  }
  ByteReader r(bytes);
  std::string_view magic;
  if (!r.ReadBytes(sizeof(kCheckpointMagic), &magic) ||
      magic != std::string_view(kCheckpointMagic, sizeof(kCheckpointMagic))) {
    return Bad("wrong magic (not a trainshard checkpoint)");
  }
  uint32_t version = 0;
  if (!r.Read(&version)) return Bad("truncated header");
  if (version != kCheckpointVersion) {
    return Bad(absl::StrCat("version ", version, " is not ", kCheckpointVersion));
  }
  Checkpoint ck;
  uint32_t flags = 0;
  uint32_t tensor_count = 0;
  if (!r.Read(&ck.config.layers) || !r.Read(&ck.config.d_model) || !r.Read(&ck.config.heads) ||
      !r.Read(&ck.config.context) || !r.Read(&ck.config.vocab) || !r.Read(&ck.config.mlp_ratio) ||
      !r.Read(&flags) || !r.Read(&tensor_count)) {
    return Bad("truncated header");
  }
  if (absl::Status s = ValidateModelConfig(ck.config); !s.ok()) {
    return Bad(absl::StrCat("config: ", s.message()));
  }
  if ((flags & ~kFlagMomentum) != 0) return Bad(absl::StrCat("unknown flags ", flags));
  const std::vector<TensorSpec> layout = ParameterLayout(ck.config);
  if (tensor_count != layout.size()) {
    return Bad(absl::StrCat("tensor count ", tensor_count, " is not ", layout.size(), " for ",
                            ModelConfigString(ck.config)));
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
  const uint64_t count = ParameterCount(ck.config);
  const bool has_momentum = (flags & kFlagMomentum) != 0;
  const uint64_t values_bytes = count * sizeof(float) * (has_momentum ? 2 : 1);
  if (r.remaining() != values_bytes) {
    return Bad(absl::StrCat(r.remaining(), " bytes of values, expected ", values_bytes));
  }
  const char* p = bytes.data() + r.position();
  ck.params.resize(count);
  internal::GetFloats(p, ck.params);
  TS_RETURN_IF_ERROR(CheckFinite(ck.params, "params"));
  if (has_momentum) {
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
