// Rendezvous: the planner's side of a round's meeting, as plain state — the members' announces
// of the round, the attempt, and the plan once made — and the rule that decides when the
// planner plans (docs/training.md "Rounds"): at once when every member is ready; past the join
// window when the ready members hold a quorum of the shard's weight (more than 2/3), unless a
// member said it is still running its inner steps, which is waited for a bounded time more;
// never with fewer than two members. An announce counts only while fresh and for the current
// attempt; a preparing announce never replaces a ready one of the same attempt.
//
// No I/O and no clock: times are passed in, so the rule is tested on its own and a simulation
// can drive it. The run keeps one under its lock and feeds it the Announce calls of the others
// and its own presence when it plans.
//
// Thread-safety: none; the owner locks.
#ifndef TS_SIDECAR_SHARD_RENDEZVOUS_H_
#define TS_SIDECAR_SHARD_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/peer/shard_directory.h"

namespace ts::sidecar {

class Rendezvous {
 public:
  struct Announcement {
    std::string endpoint;  // the member's collective endpoint for the round
    uint32_t min_attempt = 0;
    int64_t at_ms = 0;
    bool preparing = false;       // running its inner steps, not ready yet
    uint32_t worker_threads = 0;  // its worker's CPU threads (RoundMember.worker_threads)
    // Its verdicts not yet certified (checked when announced), for the plan to carry.
    std::vector<::gonka::trainshard::v1::SignedVerdict> verdicts = {};
  };

  struct Timing {
    int64_t join_window_ms = 0;     // the wait for everyone before a quorum plans
    int64_t preparing_wait_ms = 0;  // how long past the start a preparing member is waited for
    int64_t fresh_ms = 0;           // an announce older than this is not counted
  };

  struct Decision {
    bool plan = false;                                       // plan now, with `ready`
    std::vector<std::pair<std::string, std::string>> ready;  // (address, endpoint), by address
    uint64_t ready_weight = 0;
  };

  // Moves to `round` (a new round forgets the announces and plan of the last one, and starts at
  // `min_attempt`) and to at least `min_attempt` (a later attempt forgets the plan).
  void Enter(uint64_t round, uint32_t min_attempt);
  // A member's announce for the current round and attempt (Enter first).
  void Announce(const std::string& member, const Announcement& announcement);
  // Whether to plan now, `started_ms` being when this host began to plan the round.
  Decision Decide(const ShardView& view, int64_t now_ms, int64_t started_ms,
                  const Timing& timing) const;

  void set_plan(::gonka::trainshard::v1::RoundPlan plan) { plan_ = std::move(plan); }
  // The plan made for the current round, if its attempt is at least `min_attempt`.
  const ::gonka::trainshard::v1::RoundPlan* PlanFor(uint32_t min_attempt) const;

  // The member's announce for the current round, or null.
  const Announcement* AnnounceOf(const std::string& member) const;

  uint64_t round() const { return round_; }
  uint32_t attempt() const { return attempt_; }

 private:
  uint64_t round_ = 0;
  uint32_t attempt_ = 0;
  std::map<std::string, Announcement> announces_;
  std::optional<::gonka::trainshard::v1::RoundPlan> plan_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_RENDEZVOUS_H_
