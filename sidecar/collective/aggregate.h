// Aggregation of gathered contributions for untrusted shards, and the commitments that make
// contributions binding before any is revealed.
//
// Every aggregator is a deterministic function of the contributions in the order given (the
// group's member order), using only IEEE arithmetic in a fixed order, so every honest
// participant computes bit-identical output from the same inputs on any x86-64/ARM64 build
// (no FMA contraction: the library is built with -ffp-contract=off). Mean, median and trimmed
// mean compute in fp32; centered clipping keeps its center, differences and norms in fp64 so
// that values near FLT_MAX cannot overflow a difference or a squared norm into Inf/NaN.
//
// Aggregators (n contributions, f the number an aggregator is meant to tolerate):
//   kMean          plain mean (fp32 sum in contribution order, then one division); no
//                  robustness.
//   kMedian        coordinate-wise median (mean of the two middle values for even n);
//                  tolerates f < n/2.
//   kTrimmedMean   coordinate-wise: drop the `trim` largest and `trim` smallest values, mean
//                  of the rest (summed in ascending order); needs n > 2·trim (trim from
//                  EffectiveTrim).
//   kCenteredClip  centered clipping (Karimireddy et al. 2021): start from the coordinate
//                  median v, then `clip_iterations` times v ← v + mean_i clip_τ(x_i − v) with
//                  clip_τ(d) = d · min(1, τ/‖d‖₂); τ = clip_tau if > 0, else the median of
//                  ‖x_i − median‖₂ over i.
// Stated bounds under attack are tested in aggregate_test.cc and listed in docs/collective.md.
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_COLLECTIVE_AGGREGATE_H_
#define TS_SIDECAR_COLLECTIVE_AGGREGATE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::sidecar {

enum class Aggregator : uint8_t {
  kMean = 0,
  kMedian = 1,
  kTrimmedMean = 2,
  kCenteredClip = 3,
};

// "mean", "median", "trimmed_mean", "centered_clip".
std::string_view AggregatorName(Aggregator a);
// INVALID_ARGUMENT "aggregator: unknown value '<name>' (mean|median|trimmed_mean|centered_clip)".
absl::StatusOr<Aggregator> ParseAggregator(std::string_view name);

struct AggregateSpec {
  Aggregator kind = Aggregator::kMean;
  // kTrimmedMean: values dropped at each end per coordinate; 0 = automatic (EffectiveTrim).
  uint32_t trim = 0;
  // kCenteredClip: radius; 0 = automatic (see file comment).
  float clip_tau = 0;
  uint32_t clip_iterations = 3;
  // kMean: each contribution's weight (the tokens behind it), in contribution order; empty or
  // all equal: the plain mean. The robust aggregators count each contribution once whatever
  // its weight: a weight there would let one heavy contribution outvote the others.
  std::vector<double> weights = {};
  // Contributions gathered and held to their commitments but left out of the aggregate (a
  // loss-delta score under the spec's rule: docs/verification.md "Scoring"), in contribution
  // order; empty: none. At least one must stay; a trim is then taken at most ⌊(kept − 1)/2⌋.
  std::vector<bool> left_out = {};
};

// The trim actually used for n contributions: spec.trim if non-zero, else max(1, (n − 1) / 3)
// for n ≥ 3 and 0 below — the f of n = 3f + 1 (1 of 4, 2 of 7), the usual Byzantine bound.
uint32_t EffectiveTrim(const AggregateSpec& spec, size_t n);

// Aggregates `contributions` (each of out.size() elements) into `out`, which must not overlap
// them.
// INVALID_ARGUMENT: no contributions, a contribution of another length (naming its index and
// length), trim too large for n (naming both), clip_iterations > 100, negative or non-finite
// clip_tau, weights not one positive finite value per contribution, left_out not one flag per
// contribution or leaving out all, or a non-finite value in a contribution (naming contribution
// and index).
absl::Status Aggregate(const AggregateSpec& spec,
                       std::span<const std::span<const float>> contributions, std::span<float> out);

// A contribution's commitment: SHA-256("gonka-trainshard/v1/collective_commit" || u64 op_id ||
// u32 member index || payload), all integers big-endian. Payload is the encoded contribution
// (codec bytes) exactly as it will be sent.
std::string CommitmentOf(uint64_t op_id, uint32_t member_index, std::string_view payload);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_AGGREGATE_H_
