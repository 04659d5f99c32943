// Content-addressed data shards of token ids, the held-out evaluation set (a shard like the
// others), and each host's batch assignment for a round, derived from the shard's committed
// data seed. Formats and the derivation are specified in docs/worker.md ("Data shard format",
// "Batch assignment").
//
// Plain C++ (no libtorch). Thread-safety: pure functions.
#ifndef TS_WORKER_DATA_SHARD_H_
#define TS_WORKER_DATA_SHARD_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::worker {

// Where Debian's `fortunes` package puts the files of the embedded default corpus
// (worker/corpus.h); a host checks it is there before it reserves a shard that trains on it.
inline constexpr std::string_view kFortunesDir = "/usr/share/games/fortunes";

inline constexpr char kDataShardMagic[4] = {'T', 'S', 'D', 'S'};
inline constexpr uint32_t kDataShardVersion = 1;
inline constexpr size_t kDataShardHeaderSize = 24;
// Default cap on the tokens of one decoded shard (256 Mi tokens, 512 MiB as uint16).
inline constexpr uint64_t kDataShardTokensMax = uint64_t{1} << 28;

struct DataShard {
  uint32_t vocab = 0;            // every token is < vocab
  std::vector<uint32_t> tokens;  // the token stream, documents separated by EOS
};

// The canonical bytes: tokens as uint16 when vocab <= 65536, else uint32. `shard` must be
// consistent (vocab >= 1, tokens < vocab): a programmer error otherwise.
std::string EncodeDataShard(const DataShard& shard);
// Parses untrusted bytes. INVALID_ARGUMENT naming what is wrong: wrong magic or version, a token
// width that is not the one the vocab implies, more than tokens_max tokens (checked before
// allocating), a size that is not exactly header + tokens, or a token >= vocab (naming index and
// value).
absl::StatusOr<DataShard> DecodeDataShard(std::string_view bytes,
                                          uint64_t tokens_max = kDataShardTokensMax);
// The shard's id: SHA-256 of its encoding (32 bytes).
std::string DataShardId(std::string_view encoded);

// What the assignment needs to know about a shard of the run's training list.
struct ShardRef {
  std::string id;  // DataShardId, 32 bytes
  uint64_t tokens = 0;
};

struct AssignmentRequest {
  std::string data_seed;  // the round's committed data seed (any length; 32 bytes in practice)
  uint64_t round = 0;
  std::string host;              // the host's address (or any stable member name)
  std::vector<ShardRef> shards;  // the run's training shards, in the run's order
  uint32_t steps = 0;            // H inner steps, 1..kAssignmentWindowsMax
  uint32_t batch_size = 0;       // sequences per step, 1..kAssignmentWindowsMax
  uint32_t context = 0;          // tokens per sequence; each window holds context + 1 tokens
};

// One training sequence: tokens [offset, offset + context + 1) of shards[shard].
struct Window {
  uint32_t shard = 0;
  uint64_t offset = 0;
  friend bool operator==(const Window&, const Window&) = default;
};

struct Assignment {
  uint32_t steps = 0;
  uint32_t batch_size = 0;
  uint32_t context = 0;
  std::vector<Window> windows;  // steps * batch_size, step-major
};

inline constexpr uint64_t kAssignmentWindowsMax = uint64_t{1} << 24;

// Deterministic: the same request gives the same windows on every machine. Window j (step-major)
// is drawn from SHA-256("gonka-trainshard/v1/batch" || u32 len || data_seed || u64 round || u32 len
// || host || u64 j): its first 8 bytes (little-endian) modulo the number of valid windows over all
// shards, mapped to (shard, offset) in list order. INVALID_ARGUMENT for zero or too many
// steps/batch_size/context, an empty shard list, or no shard with at least context + 1 tokens.
absl::StatusOr<Assignment> AssignBatches(const AssignmentRequest& request);

// A batch of token windows, row-major [rows, cols] with cols = context + 1 (inputs are
// [:, :-1], targets [:, 1:]).
struct TokenBatch {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<int64_t> tokens;
};

// Cuts the assignment's windows out of the shards (in the request's order). INVALID_ARGUMENT
// when a window's shard index or range is out of bounds, or the shards' vocabularies differ.
absl::StatusOr<std::vector<TokenBatch>> GatherBatches(const Assignment& assignment,
                                                      std::span<const DataShard> shards);

}  // namespace ts::worker

#endif  // TS_WORKER_DATA_SHARD_H_
