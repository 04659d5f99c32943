// ReplayChecks: the replays a host owes as a validator once a round is certified
// (docs/verification.md "Replay" and "Verdicts"): those the certified result drew for it
// (verdicts.h VerdictTally::Draws), and one for each failure another validator found that the
// certificates carry and this host has not answered yet. For each, its worker runs the member's
// inner steps again — from the round's base checkpoint, on the member's assignment and with the
// member's thread count, on a trainer of its own (worker.proto
// InnerStepsRequest.replay_checkpoint_file) — the Δ, encoded with the spec's codec, is held to
// the commitment the certificate carries; where the certificate carries the member's evaluation
// of the round, the round's checkpoint is evaluated again with the member's threads and held to
// it (docs/verification.md "Evaluations"); the outcome is signed as a verdict that this
// host's announces carry until a certificate does. The outcome also goes into the run's status
// and log.
//
// Thread-safety: the run thread.
#ifndef TS_SIDECAR_SHARD_REPLAY_CHECKS_H_
#define TS_SIDECAR_SHARD_REPLAY_CHECKS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/shard/run_context.h"
#include "sidecar/shard/scoring.h"

namespace ts::sidecar {

class ReplayChecks {
 public:
  explicit ReplayChecks(RunContext* run) : run_(*run) {}

  // The replays owed once `certificate` (just stored) is certified.
  void Run(const ::gonka::trainshard::v1::RoundCertificate& certificate);

  // What a replay computed: the commitment of its Δ and, where the run scores, its score.
  struct Replayed {
    std::string commitment;
    StepScore score;
  };
  // One replay of contribution `member` of `result`. FAILED_PRECONDITION when this host no
  // longer holds the round's base checkpoint; the worker's error when the replay could not run.
  absl::StatusOr<Replayed> Replay(const ::gonka::trainshard::v1::RoundResult& result,
                                  size_t member);

 private:
  // Replays contribution `member` of the certified round — and re-evaluates the member's
  // evaluation of it, when the certificate carries one — signs the verdict and keeps it for the
  // announces. FAILED_PRECONDITION when the round's base is no longer held; the worker's error
  // when it could not run the replay (a drawn replay is then tried again after the next
  // certificate, while the round is within the verdicts' window).
  absl::Status Check(const ::gonka::trainshard::v1::RoundCertificate& certificate, size_t member,
                     absl::string_view why);
  // Drawn replays to try again: (round, the member's index in its contributions).
  std::vector<std::pair<uint64_t, size_t>> retries_;
  // The round's checkpoint evaluated as its members do, with `threads`: the loss in micro-nats.
  absl::StatusOr<int64_t> Reevaluate(uint64_t round, uint32_t threads);
  // This host's stored certificate of `round`, if it holds one.
  std::optional<::gonka::trainshard::v1::RoundCertificate> StoredCertificate(uint64_t round) const;

  RunContext& run_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_REPLAY_CHECKS_H_
