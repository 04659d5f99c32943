// Loss-delta scoring (docs/verification.md "Scoring"): what a member's inner steps did to the
// loss — on a few held-out windows of the run's eval set, the same for every member of a round,
// and on its own first batch — claimed by the member beside its commitment before any Δ is
// revealed, fixed by the round's certificate (Contribution.score_micro), reproduced bit for bit
// by a replay (a claim that does not reproduce fails the replay as a wrong Δ does), and the
// spec's rule that leaves a contribution that helped far less than the round's others out of
// the aggregate and the pay.
//
// Thread-safety: pure functions.
#ifndef TS_SIDECAR_SHARD_SCORING_H_
#define TS_SIDECAR_SHARD_SCORING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "gonka/trainshard/v1/worker.pb.h"
#include "sidecar/shard/run_spec.h"

namespace ts::sidecar {

// The loss's fall in nats × 1e6 (rounded as evaluations are, LossMicroOf): positive when the
// steps lowered it.
struct StepScore {
  int64_t held_out_micro = 0;
  int64_t assigned_micro = 0;
  bool operator==(const StepScore&) const = default;
};

// A claim's scores at most this far from 0 (run_spec.h; a diverged model's loss stays far below).
inline constexpr int64_t kScoreMicroMax = kScoreMicroLimit;
// The collective operation id of a round's score claims (beside kDeltaOpId).
inline constexpr uint64_t kScoreOpId = 3;

// Whether the run scores (VerificationSpec.scoring not "off").
bool Scores(const ParsedRunSpec& spec);

// Asks `request` (a round's inner steps, InnerStepsRequestOf) for its score on the run's
// held-out set `eval_file`: the spec's windows from window round × windows on.
void AddScoreRequest(const ParsedRunSpec& spec, const std::string& eval_file,
                     ::gonka::trainshard::v1::InnerStepsRequest* request);
// The scores of the steps a worker reported.
StepScore StepScoreOf(const ::gonka::trainshard::v1::InnerStepsResponse& done);
StepScore StepScoreOf(const ::gonka::trainshard::v1::Contribution& c);

// A claim as the members gather it: 16 bytes, the two scores big-endian two's complement.
inline constexpr size_t kScoreClaimBytes = 16;
std::string EncodeScoreClaim(const StepScore& score);
// INVALID_ARGUMENT for a block of another size or a score beyond kScoreMicroMax, naming `who`.
absl::StatusOr<StepScore> DecodeScoreClaim(std::string_view block, std::string_view who);

// Per contribution of a round, whether the spec's rule leaves it out of the aggregate and the
// pay: under "drop", those whose held-out score is below m − score_margin_micro − |m| / 2, m the
// round's lower median score (an honest score where fewer than half the members lie, so no
// coalition the shard tolerates can push honest contributions out by claiming high); the half
// of |m| scales the line with the round's improvement, which the honest scores' spread follows.
// Never the median one itself. Empty when none is left out.
std::vector<bool> LeftOut(const ::gonka::trainshard::v1::VerificationSpec& verification,
                          const std::vector<StepScore>& scores);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_SCORING_H_
