// The shard's collective operations over a Mesh: allreduce (sum or mean) of fp32 and bf16
// buffers, all-gather of equal-sized byte blocks, and robust allreduce (commit, gather, verify,
// aggregate) for untrusted shards. Algorithms and wire use are in docs/collective.md.
//
// - AllReduce with a dense codec (fp32, fp32-zstd, fp16, bf16, int8, int8-zstd) is a pipelined
//   ring: reduce-scatter then all-gather over the group's member order, the buffer cut into n
//   segments and each segment into chunks sent as they are ready, so every link streams
//   continuously.
//   Segment j is summed in the fixed order x_j + x_{j+1} + … + x_{j+n−1} (member indices mod n) and
//   its final value — after the owner's encoding, for lossy codecs — is what every member gets, so
//   results are bit-identical on all participants.
// - AllReduce with kTopK all-gathers the encoded contributions and averages (or sums) the
//   decoded vectors in member order (sparse contributions do not add up along a ring).
// - RobustAllReduce: each member encodes its contribution, signs its commitment
//   (aggregate.h CommitmentOf, signed with the host key), all commitments are gathered and
//   checked before any contribution is sent, then the contributions are gathered, checked
//   against the commitments and aggregated (aggregate.h) in member order.
//
// Any failure — a peer's death, stall, abort, a deadline, a malformed frame or a contribution
// that does not match its commitment — ends the operation with a status naming the peer
// (FailedPeerOf), aborts the mesh so the others fail fast, and leaves the caller's buffer
// unspecified: a failed operation's partial result must not be used. Retry on a new mesh with
// the survivors.
//
// Thread-safety: one operation at a time per Collective; the object is not thread-safe.
#ifndef TS_SIDECAR_COLLECTIVE_COLLECTIVE_H_
#define TS_SIDECAR_COLLECTIVE_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "sidecar/collective/aggregate.h"
#include "sidecar/collective/codec.h"
#include "sidecar/collective/topology.h"
#include "sidecar/collective/transport.h"

namespace ts::sidecar {

enum class ReduceOp : uint8_t { kSum = 0, kMean = 1 };

struct OpOptions {
  // Unique per operation within a mesh and the same on every member (frames carry it).
  uint64_t op_id = 0;
  CodecSpec codec;
  ReduceOp reduce = ReduceOp::kMean;
  // Absolute deadline on the monotonic clock for the whole operation.
  int64_t deadline_ms = 0;
  // Elements per data frame (before encoding); rounded to whole codec blocks.
  uint32_t chunk_elements = 256u << 10;
};

struct OpStats {
  uint64_t elements = 0;
  uint64_t raw_bytes = 0;           // the fp32 (or bf16) size of this member's buffer
  uint64_t payload_bytes_sent = 0;  // data frame payloads this member sent
  uint64_t wire_bytes_sent = 0;     // the same plus frame headers
  uint64_t payload_bytes_received = 0;
  double seconds = 0;
};

class Collective {
 public:
  // `mesh`, `key` and `clock` are not owned and must outlive this object. `key` signs
  // commitments (RobustAllReduce); `chain_id` goes into their sign bytes.
  Collective(Mesh* mesh, const common::PrivateKey* key, std::string chain_id, common::Clock* clock);

  // In place: data ← reduce over members of data. Every member passes the same size and
  // options. INVALID_ARGUMENT for a bad codec spec or non-finite input (before anything is
  // sent; the mesh is aborted so the others do not wait); the mesh's failure otherwise.
  absl::StatusOr<OpStats> AllReduce(const OpOptions& options, std::span<float> data);
  // bf16 buffers (raw bf16 bits): reduced in fp32, carried as bf16 on the wire unless the
  // codec says otherwise, rounded back to bf16 (nearest even).
  absl::StatusOr<OpStats> AllReduceBf16(const OpOptions& options, std::span<uint16_t> data);
  // out[i·b .. (i+1)·b) ← member i's `mine` (b = mine.size(), the same on every member;
  // out.size() == n·b). Codec and reduce are ignored.
  absl::StatusOr<OpStats> AllGather(const OpOptions& options, std::span<const char> mine,
                                    std::span<char> out);
  // Commit, gather, verify, aggregate (see file comment). DATA_LOSS naming the member whose
  // contribution does not match its commitment; UNAUTHENTICATED naming the member whose
  // commitment is not signed by its key. When `commitments` is set it receives the members'
  // commitments (32 bytes each, member order), each held to its contribution.
  absl::StatusOr<OpStats> RobustAllReduce(const OpOptions& options, const AggregateSpec& aggregate,
                                          std::span<float> data,
                                          std::vector<std::string>* commitments = nullptr);

  // All-gathers one value from every member and returns the smallest (the same on every
  // member). After a failure, members of the retry mesh may have got different distances
  // through the failed run — a member whose last receive arrived before the peer died finished
  // an operation the others did not — so they agree on the step to resume from before any
  // data moves. Uses `options.op_id` and `options.deadline_ms` only.
  absl::StatusOr<uint64_t> MinimumOf(const OpOptions& options, uint64_t value);

  // Measures the rate of every ordered pair of members — n − 1 rounds in which each member
  // sends `probe_bytes` to the member t places after it while receiving from the one t places
  // before — gathers the matrix so every member holds the same bytes, and returns
  // ChooseRingOrder of it (the same order on every member). rates[i][j] is bytes/s from i to
  // j as j measured it. The caller then connects a mesh with the members in that order.
  absl::StatusOr<std::vector<size_t>> MeasureRingOrder(const OpOptions& options, size_t probe_bytes,
                                                       std::vector<std::vector<double>>* rates);

 private:
  Mesh* const mesh_;
  const common::PrivateKey* const key_;
  const std::string chain_id_;
  common::Clock* const clock_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_COLLECTIVE_H_
