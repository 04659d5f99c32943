// ReplayChecks: the replays a host owes as a validator once a round is certified
// (docs/verification.md "Replay"). The draws come from the certificate (ledger.h DrawReplays);
// for each member this host is drawn to check, its worker runs that member's inner steps again —
// from the round's base checkpoint, on the member's assignment and with the member's thread
// count, on a trainer of its own (worker.proto InnerStepsRequest.replay_checkpoint_file) — and
// the Δ, encoded with the spec's codec, is held to the commitment the certificate carries. The
// outcome goes into the run's status and log.
//
// Thread-safety: the run thread.
#ifndef TS_SIDECAR_SHARD_REPLAY_CHECKS_H_
#define TS_SIDECAR_SHARD_REPLAY_CHECKS_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

class ReplayChecks {
 public:
  explicit ReplayChecks(RunContext* run) : run_(*run) {}

  // The replays of `certificate`'s round that are drawn for this host; `plan` is that round's.
  void Run(const ::gonka::trainshard::v1::RoundPlan& plan,
           const ::gonka::trainshard::v1::RoundCertificate& certificate);

  // One replay of contribution `member`: whether it reproduced the member's commitment.
  // FAILED_PRECONDITION when this host no longer holds the round's base checkpoint; the worker's
  // error when the replay could not run.
  absl::StatusOr<bool> Replay(const ::gonka::trainshard::v1::RoundPlan& plan,
                              const ::gonka::trainshard::v1::RoundResult& result, size_t member);

 private:
  RunContext& run_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_REPLAY_CHECKS_H_
