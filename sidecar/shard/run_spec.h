// The run spec: the document a shard proposal pins by hash (ShardSpec.run_spec_hash = SHA-256 of
// its exact bytes) and every member trains by (docs/training.md "Run spec"). JSON in protobuf's
// mapping of RunSpec; unknown fields, wrong types and out-of-range values are refused with the
// field and value named. Zero timing fields take the documented defaults.
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_SHARD_RUN_SPEC_H_
#define TS_SIDECAR_SHARD_RUN_SPEC_H_

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chain-bridge/module/validation.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/collective/aggregate.h"
#include "sidecar/collective/codec.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

// The chain holds a run spec of at most this many bytes (ShardSpec.run_spec).
using ::ts::bridge::kRunSpecBytesMax;
inline constexpr uint32_t kDefaultJoinWindowMs = 2000;
inline constexpr uint32_t kDefaultPlannerTimeoutMs = 3000;
inline constexpr uint32_t kDefaultExchangeTimeoutMs = 60000;
// The replay rate of a spec without a verification section whose aggregation commits (and
// without overlap): 8 % of the member-rounds, under 10 % more compute with the re-evaluations
// (docs/benchmarks.md "Verification").
inline constexpr uint32_t kDefaultReplayRateBps = 800;
// Marks after which a host is left out of later plans. One: replays run in one determinism
// class, where a replay reproduces honest steps to the bit, so a failure confirmed by more than
// 2/3 of the weight, or a verdict they rejected, is proof rather than noise; waiting for a second
// lets a cheater's Δs into one more round (docs/benchmarks.md "Verification": a stale Δ from
// 2 of 7 hosts cost 6 % of the final loss at two marks, nothing measurable at one). A tolerance
// class (GPU, not calibrated yet) would need more.
inline constexpr uint32_t kDefaultExcludeAfterMarks = 1;
// Held-out windows a member scores its steps on (docs/verification.md "Scoring").
inline constexpr uint32_t kDefaultScoreWindows = 8;
// How far below the round's median held-out score a contribution may fall and stay in (0.1
// nats; docs/verification.md "Scoring").
inline constexpr uint64_t kDefaultScoreMarginMicro = 100'000;
// A score, and the spec's margin, at most this far from 0 (nats × 1e6).
inline constexpr int64_t kScoreMicroLimit = int64_t{1} << 40;

struct ParsedRunSpec {
  ::gonka::trainshard::v1::RunSpec spec;  // with defaults applied
  std::string hash;                       // SHA-256 of the document's bytes
  CodecSpec codec;
  AggregateSpec aggregate;  // as named; for "auto" see RoundAggregate
  bool aggregate_auto = false;
  // Commit before reveal (docs/verification.md): asked for by the spec's verification section,
  // or implied by a robust aggregator (and "auto"), which gathers the contributions anyway.
  bool commitments = false;
};

// The aggregation of a round of `members` in a shard of `shard_members` (frozen, excluded ones
// included): the spec's, or for "auto" (the default) the trimmed mean at the shard's Byzantine
// bound, dropping f = ⌊(shard_members − 1)/3⌋ values at each end per coordinate (at most
// ⌊(members − 1)/2⌋) — the plain mean of the gathered contributions in a shard of up to 3, robust
// from 4 (1 of 4, 2 of 7), a round that lacks a member included.
AggregateSpec RoundAggregate(const ParsedRunSpec& spec, size_t shard_members, size_t members);

// Parses and checks a run spec document. INVALID_ARGUMENT naming the field and value.
absl::StatusOr<ParsedRunSpec> ParseRunSpec(std::string_view document);

// How long a round's inner steps may take: the spec's inner_timeout_ms, or, when 0,
// 600 s plus the round's training compute (6 · parameters · tokens) at 1 GFLOP/s — a floor far
// below any host's, so only a wedged worker runs into it. At most 30 days.
int64_t InnerStepsTimeoutMs(const ::gonka::trainshard::v1::RunSpec& spec);

// Member `host`'s batch (sequences per inner step): its share of the round's batches follows
// its frozen weight, as the network's Proof of Compute intends — the spec's batch_size × N ×
// weight / W for a shard of N members of total weight W, so a host of the mean weight trains the
// spec's batch and one of ten times the weight ten times as many sequences in the same steps
// (docs/training.md "Work by weight"); rounded to a multiple of the micro-batch, at least one,
// at most 4096. The spec's batch for a host `shard` does not name.
uint32_t MemberBatchOf(const ParsedRunSpec& spec, const ShardView& shard, std::string_view host);
// The tokens behind member `host`'s Δ of a round: inner steps × its batch × context.
uint64_t MemberTokensOf(const ParsedRunSpec& spec, const ShardView& shard, std::string_view host);

// The worker request for the inner steps of `round` that the spec asks of member `host` of
// `shard` (its batch: MemberBatchOf), from the checkpoint at `base_root` on the run's
// `shard_files` with the round's `data_seed`. The same function builds a member's own request
// and the one a validator replays (docs/verification.md), so the two cannot drift apart. With
// commitments the inner optimizer starts every round fresh: the Δ is then a function of the
// base, the assignment and the spec alone, and anyone can reproduce it. The caller names the Δ
// file.
::gonka::trainshard::v1::InnerStepsRequest InnerStepsRequestOf(
    const ParsedRunSpec& spec, const ShardView& shard,
    const google::protobuf::RepeatedPtrField<std::string>& shard_files, uint64_t round,
    std::string_view data_seed, std::string_view host, std::string_view base_root);

// The collective operation ids of a round: its Δ exchange and its evaluations' gather. The Δ's
// op id is part of every commitment a member signs.
inline constexpr uint64_t kDeltaOpId = 1;
inline constexpr uint64_t kEvaluationOpId = 2;

// The commitment a member at `index` of a round's plan signs for `delta`: CommitmentOf(kDeltaOpId,
// index, delta as the spec's codec encodes it) (collective/aggregate.h). A validator's replay
// and the simulation's check compute it as the exchange does.
absl::StatusOr<std::string> DeltaCommitmentOf(const ParsedRunSpec& spec, size_t index,
                                              std::span<const float> delta);

// The checks of ParseRunSpec on a message (defaults already applied).
absl::Status ValidateRunSpec(const ::gonka::trainshard::v1::RunSpec& spec);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_RUN_SPEC_H_
