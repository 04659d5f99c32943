// RoundPlanning: how the members of a round agree on its plan (docs/training.md "Rounds"). The
// planners of a round come in an order drawn from the spec's seed and the round
// (PlannerOrder); a member announces itself (signed ShardRound.Announce) to the first that
// answers and polls it for the plan, moving to the next after the planner timeout. When this
// host is the planner it keeps the rendezvous (rendezvous.h, under the context's lock, fed by
// the others' Announce calls) and signs the plan once the rule says so. A member that learns
// it is behind (a planner certified past the round, a member announcing a later round) is told
// whom to catch up from; a planner without a plan long past its window asks the members in turn
// whether the round was certified without it.
//
// Owns nothing of its own; reads the certified state and writes the rendezvous and the
// status's planner fields.
//
// Thread-safety: the run thread's, except PreAnnounce's thread (which only sends).
#ifndef TS_SIDECAR_SHARD_ROUND_PLANNING_H_
#define TS_SIDECAR_SHARD_ROUND_PLANNING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "sidecar/shard/catch_up.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

class RoundPlanning {
 public:
  RoundPlanning(RunContext* run, RunCatchUp* catch_up) : run_(*run), catch_up_(*catch_up) {}

  // Neither a plan nor a member to catch up from: the round was certified meanwhile.
  struct Outcome {
    std::optional<::gonka::trainshard::v1::RoundPlan> plan;
    std::string behind_peer;  // set: catch up from this member
    bool start_over = false;  // (PlanAsPlanner) no plan as a later planner: try the first again
  };

  // The plan of `round` at attempt `min_attempt` or later, from the planner in order that
  // answers (this host included). `has_delta`: this host holds its Δ of the round, so it may
  // join a later attempt a planner is already at.
  absl::StatusOr<Outcome> Obtain(uint64_t round, uint32_t min_attempt, bool has_delta);

  // Sends a preparing announce for `round` to the first two planners in order (not this host),
  // on a thread of its own, best effort: a planner that hears it waits a bounded time for this
  // host's ready announce. The returned thread is joined when it goes out of scope.
  std::jthread PreAnnounce(uint64_t round, uint32_t min_attempt);

 private:
  // `first`: this host is the first planner in order (it never gives up on planning).
  absl::StatusOr<Outcome> PlanAsPlanner(uint64_t round, uint32_t min_attempt, const ShardView& view,
                                        bool first);
  // Whether to go back to the first planner `first`: `planner`, a later one, has answered
  // without a plan for longer than the planning bound (since *no_plan_since).
  bool StartOver(uint64_t round, const std::string& planner, const std::string& first,
                 int64_t* no_plan_since);
  // The planner's signed plan of the members `ready` (address, endpoint).
  absl::StatusOr<::gonka::trainshard::v1::RoundPlan> MakePlan(
      uint64_t round, const std::vector<std::pair<std::string, std::string>>& ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_.mu);
  // Whether planning `round` has become moot: the run ended at the certified round for the
  // shard's deadline (RunContext::WatchDeadline) while this host planned to train it (its
  // settlement is planned instead), or the chain settled or closed the shard while this host
  // planned its settlement.
  bool Moot(uint64_t round);
  // Whether `round` was certified without this host, asking the member `probe` (in turn).
  bool CertifiedWithout(uint64_t round, const ShardView& view, size_t* probe, std::string* peer);
  // The base root and data seed every plan of `round` must carry (the status moved to it).
  absl::StatusOr<std::pair<std::string, std::string>> Expected(uint64_t round,
                                                               uint32_t min_attempt);
  // Checks a planner's plan for `round`; an error says why it is refused.
  absl::Status CheckPlan(const ::gonka::trainshard::v1::RoundPlan& plan, uint64_t round,
                         const std::string& planner, const std::string& base,
                         const std::string& seed, const ShardView& view) const;
  // The planners of `round` in order (ledger.h PlannerOrder), less the hosts excluded from the
  // run (verdicts.h).
  std::vector<std::string> Planners(uint64_t round, const ShardView& view) const;
  absl::StatusOr<::gonka::trainshard::v1::AnnounceRequest> AnnounceTo(const std::string& candidate,
                                                                      uint64_t round,
                                                                      uint32_t min_attempt,
                                                                      bool preparing) const;

  RunContext& run_;
  RunCatchUp& catch_up_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_ROUND_PLANNING_H_
