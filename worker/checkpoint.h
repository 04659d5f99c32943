// The canonical checkpoint encoding and its root. A checkpoint is the model config, the
// parameters as one flat fp32 vector in ParameterLayout order, and optionally the outer
// optimizer's momentum buffer (same length). Its encoding (docs/worker.md "Checkpoint
// encoding") is a pure function of those values, so every honest member of a shard that holds
// the same parameters produces the same bytes and the same root = SHA-256(encoding).
//
// Plain C++ (no libtorch). Thread-safety: pure functions.
#ifndef TS_WORKER_CHECKPOINT_H_
#define TS_WORKER_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model_config.h"

namespace ts::worker {

inline constexpr char kCheckpointMagic[4] = {'T', 'S', 'C', 'K'};
// Version 1: the gpt family's header (unchanged since the first checkpoint, so gpt roots are
// too); version 2: a family field and the llama family's fields.
inline constexpr uint32_t kCheckpointVersionGpt = 1;
inline constexpr uint32_t kCheckpointVersion = 2;
// Default cap on an encoding DecodeCheckpoint reads: 1 GiB (a 128M-parameter model with its
// momentum). Callers that expect larger models pass their own cap.
inline constexpr uint64_t kCheckpointBytesMax = uint64_t{1} << 30;

struct Checkpoint {
  ModelConfig config;
  std::vector<float> params;                   // ParameterCount(config) values
  std::optional<std::vector<float>> momentum;  // outer Nesterov buffer, same length
};

// The canonical bytes. `checkpoint` must be consistent (valid config, lengths matching it):
// a programmer error otherwise.
std::string EncodeCheckpoint(const Checkpoint& checkpoint);

// The encoding's header: everything before the values (magic, version, config, flags, tensor
// table). The values follow it: the parameters, then the momentum, fp32 little-endian.
std::string EncodeCheckpointHeader(const ModelConfig& config, bool has_momentum);

struct CheckpointHeader {
  ModelConfig config;
  bool has_momentum = false;
  uint64_t header_bytes = 0;  // where the values start
  uint64_t value_bytes = 0;   // how many bytes of values must follow, exactly
};
// Parses the header at the start of `bytes` (which may go on with the values, or stop anywhere
// after the header). INVALID_ARGUMENT as DecodeCheckpoint, "truncated" when `bytes` ends inside
// the header.
absl::StatusOr<CheckpointHeader> DecodeCheckpointHeader(std::string_view bytes);

// Parses untrusted bytes. INVALID_ARGUMENT naming what is wrong: more than bytes_max bytes
// (checked first), wrong magic, unknown version, an invalid config, unknown flags, a tensor
// name or shape that differs from ParameterLayout(config), a size that is not exactly what the
// header implies, or a non-finite value (naming its index).
absl::StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes,
                                            uint64_t bytes_max = kCheckpointBytesMax);

// SHA-256 of an encoding: the 32-byte root a round certificate signs.
std::string CheckpointRoot(std::string_view encoded);
// Encodes and hashes.
std::string CheckpointRootOf(const Checkpoint& checkpoint);

}  // namespace ts::worker

#endif  // TS_WORKER_CHECKPOINT_H_
