#include "sidecar/shard/round_planning.h"

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sidecar/shard/ledger.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
constexpr int64_t kAnnounceFreshMs = 3000;  // an announce older than this is not counted
// How often a planner without a plan past its window asks a member for newer certificates.
constexpr int64_t kStuckProbeMs = 1000;
constexpr int64_t kPreAnnounceTimeoutMs = 1000;
constexpr int64_t kPollMs = 100;
constexpr int64_t kRetryMs = 200;
constexpr int64_t kPlannerPollMs = 50;

}  // namespace

absl::StatusOr<RoundPlanning::Outcome> RoundPlanning::Obtain(uint64_t round, uint32_t min_attempt,
                                                             bool has_delta) {
  TS_ASSIGN_OR_RETURN(ShardView view, run_.View());
  std::vector<std::string> order = Planners(round, view);
  size_t p = 0;
  int64_t failing_since = -1;
  TS_ASSIGN_OR_RETURN(const auto expected, Expected(round, min_attempt));
  const auto& [base, seed] = expected;
  int64_t no_plan_since = -1;  // a planner past the first answers, without a plan
  while (!run_.stopping) {
    if (Moot(round)) return Outcome{};
    const std::string& candidate = order[p % order.size()];
    const bool first = p % order.size() == 0;
    if (candidate == run_.host.address) {
      TS_ASSIGN_OR_RETURN(Outcome planned, PlanAsPlanner(round, min_attempt, view, first));
      if (!planned.start_over) return planned;
      p = 0;
      continue;
    }
    {
      absl::MutexLock lock(&run_.mu);
      run_.status.set_planner(candidate);
      run_.status.set_planner_round(round);
      if (!run_.ahead_peer.empty()) {
        return Outcome{.plan = std::nullopt, .behind_peer = std::exchange(run_.ahead_peer, "")};
      }
    }
    const ShardMember* member = view.Find(candidate);
    TS_ASSIGN_OR_RETURN(pb::AnnounceRequest request,
                        AnnounceTo(candidate, round, min_attempt, /*preparing=*/false));
    auto answered = run_.peers->Announce(member->endpoint, request, kRpcTimeoutMs);
    if (answered.ok()) {
      failing_since = -1;
      const pb::AnnounceResponse& response = *answered;
      if (response.certified_round() >= round) {
        return Outcome{.plan = std::nullopt, .behind_peer = candidate};
      }
      if (response.settling() != request.settling()) {
        // The planner settles where this host trains (it judged the deadline near), or the
        // other way round: the next planner; a host that trains looks at the deadline again.
        ++p;
        run_.Sleep(kRetryMs);
        if (!request.settling()) return Outcome{};
        continue;
      }
      if (response.cannot_plan() && !response.has_plan()) {
        ++p;
        no_plan_since = -1;
        run_.Sleep(kRetryMs);
        continue;
      }
      if (response.has_plan()) {
        const pb::RoundPlan& plan = response.plan();
        if (absl::Status valid = CheckPlan(plan, round, candidate, base, seed, view); !valid.ok()) {
          // A planner at this host's round on another base: this host's last round may be an
          // attempt the others abandoned (docs/training.md "Why this is safe").
          if (plan.base_root() != base && response.certified_round() + 1 == round && round > 1 &&
              catch_up_.Supersede(candidate, round - 1)) {
            return Outcome{};
          }
          run_.Transition(absl::StrCat("round ", round, ": plan from ", Short(candidate),
                                       " refused: ", valid.message()));
          ++p;
          continue;
        }
        if (plan.attempt() >= min_attempt) return Outcome{.plan = plan, .behind_peer = {}};
      } else if (response.attempt() > min_attempt && has_delta) {
        // A planner already past the attempts this host knows of: join its attempt.
        min_attempt = response.attempt();
      }
      if (!first && StartOver(round, candidate, order[0], &no_plan_since)) {
        p = 0;
        continue;
      }
      run_.Sleep(kPollMs);
      continue;
    }
    no_plan_since = -1;
    if (failing_since < 0) failing_since = run_.host.clock->MonotonicMs();
    if (run_.host.clock->MonotonicMs() - failing_since > run_.spec.spec.planner_timeout_ms()) {
      run_.Transition(absl::StrCat("round ", round, ": planner ", Short(candidate),
                                   " does not answer (", answered.status().message(),
                                   "); next in order: ", Short(order[(p + 1) % order.size()])));
      ++p;
      failing_since = -1;
    }
    run_.Sleep(kRetryMs);
  }
  return absl::CancelledError("stopping");
}

absl::StatusOr<std::pair<std::string, std::string>> RoundPlanning::Expected(uint64_t round,
                                                                            uint32_t min_attempt) {
  absl::MutexLock lock(&run_.mu);
  run_.status.set_current_round(round);
  run_.status.set_attempt(min_attempt);
  TS_ASSIGN_OR_RETURN(std::string data_root, run_.DataRoot(round));
  return std::make_pair(run_.certified_root, DataSeedOf(run_.spec.spec.seed(), round, data_root));
}

bool RoundPlanning::StartOver(uint64_t round, const std::string& planner, const std::string& first,
                              int64_t* no_plan_since) {
  const int64_t now = run_.host.clock->MonotonicMs();
  if (*no_plan_since < 0) *no_plan_since = now;
  if (now - *no_plan_since <= run_.PlanningBoundMs()) return false;
  *no_plan_since = -1;
  run_.Transition(absl::StrCat("round ", round, ": planner ", Short(planner),
                               " has made no plan; back to the first planner in order, ",
                               Short(first)));
  return true;
}

absl::Status RoundPlanning::CheckPlan(const pb::RoundPlan& plan, uint64_t round,
                                      const std::string& planner, const std::string& base,
                                      const std::string& seed, const ShardView& view) const {
  TS_RETURN_IF_ERROR(VerifyPlan(run_.host.chain_id, plan, view));
  if (plan.round() != round || plan.planner() != planner || plan.base_root() != base ||
      plan.data_seed() != seed) {
    return absl::InvalidArgumentError("the plan is for another round, planner or base");
  }
  absl::MutexLock lock(&run_.mu);
  if (plan.settlement() != run_.Settling(round)) {
    return absl::FailedPreconditionError(
        plan.settlement() ? "the plan settles where this host trains (its deadline is not near)"
                          : "the plan trains where this host settles");
  }
  TS_ASSIGN_OR_RETURN(const VerdictTally* tally, run_.Tally());
  for (const pb::RoundMember& m : plan.members()) {
    if (tally->Excluded(m.address())) {
      return absl::PermissionDeniedError(absl::StrCat("the plan has ", m.address(),
                                                      ", excluded from the run (",
                                                      tally->Marks(m.address()), " marks)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RoundPlanning::Outcome> RoundPlanning::PlanAsPlanner(uint64_t round,
                                                                    uint32_t min_attempt,
                                                                    const ShardView& view,
                                                                    bool first) {
  const int64_t start = run_.host.clock->MonotonicMs();
  int64_t last_probe = start;
  size_t probe = 0;
  const int64_t preparing_wait_ms =
      run_.spec.spec.join_window_ms() + static_cast<int64_t>(run_.round_inner_seconds * 1000.0);
  const Rendezvous::Timing timing{.join_window_ms = run_.spec.spec.join_window_ms(),
                                  .preparing_wait_ms = preparing_wait_ms,
                                  .fresh_ms = kAnnounceFreshMs};
  {
    absl::MutexLock lock(&run_.mu);
    run_.rendezvous.Enter(round, min_attempt);
    run_.status.set_planner(run_.host.address);
    run_.status.set_planner_round(round);
  }
  while (!run_.stopping) {
    if (Moot(round)) return Outcome{};
    {
      absl::MutexLock lock(&run_.mu);
      Rendezvous& rendezvous = run_.rendezvous;
      // Certified meanwhile (a catch-up stored the round's certificate): nothing to plan.
      if (run_.certified_round >= round) return Outcome{};
      if (!run_.ahead_peer.empty()) {
        return Outcome{.plan = std::nullopt, .behind_peer = std::exchange(run_.ahead_peer, "")};
      }
      if (const pb::RoundPlan* made = rendezvous.PlanFor(min_attempt); made != nullptr) {
        return Outcome{.plan = *made, .behind_peer = {}};
      }
      const int64_t now = run_.host.clock->MonotonicMs();
      rendezvous.Announce(run_.host.address,
                          {.endpoint = run_.collective_endpoint,
                           .min_attempt = rendezvous.attempt(),
                           .at_ms = now,
                           .preparing = false,
                           .worker_threads = static_cast<uint32_t>(run_.options.worker_threads),
                           .verdicts = {}});  // its own are carried from pending_verdicts
      const Rendezvous::Decision decision = rendezvous.Decide(view, now, start, timing);
      if (decision.plan) {
        TS_ASSIGN_OR_RETURN(pb::RoundPlan p, MakePlan(round, decision.ready));
        rendezvous.set_plan(p);
        return Outcome{.plan = std::move(p), .behind_peer = {}};
      }
    }
    // No plan long past the window: the others may have certified this round without this
    // host (it failed its attempt while they completed theirs) and be waiting on the next
    // round's planner, so nobody announces this round here again. Ask one member a second,
    // in turn, for certificates past this host's.
    const int64_t now = run_.host.clock->MonotonicMs();
    if (now - start > run_.PlanningBoundMs() && now - last_probe >= kStuckProbeMs) {
      last_probe = now;
      std::string peer;
      if (CertifiedWithout(round, view, &probe, &peer)) {
        return Outcome{.plan = std::nullopt, .behind_peer = peer};
      }
      // A planner past the first (an earlier one did not answer for a while) without a quorum:
      // the members may be split between planners; meet again at the first that answers.
      if (!first) {
        run_.Transition(absl::StrCat("round ", round, ": no quorum announced to this host as a ",
                                     "later planner; back to the first planner in order"));
        return Outcome{.plan = std::nullopt, .behind_peer = {}, .start_over = true};
      }
    }
    run_.Sleep(kPlannerPollMs);
  }
  return absl::CancelledError("stopping");
}

absl::StatusOr<pb::RoundPlan> RoundPlanning::MakePlan(
    uint64_t round, const std::vector<std::pair<std::string, std::string>>& ready) {
  pb::RoundPlan p;
  p.set_shard_id(run_.shard_id);
  p.set_round(round);
  p.set_attempt(run_.rendezvous.attempt());
  p.set_planner(run_.host.address);
  for (const auto& [address, endpoint] : ready) {
    pb::RoundMember* m = p.add_members();
    m->set_address(address);
    m->set_collective_endpoint(endpoint);
    const Rendezvous::Announcement* announced = run_.rendezvous.AnnounceOf(address);
    m->set_worker_threads(announced != nullptr ? announced->worker_threads : 0);
  }
  p.set_base_root(run_.certified_root);
  p.set_settlement(run_.Settling(round));
  TS_ASSIGN_OR_RETURN(std::string data_root, run_.DataRoot(round));
  p.set_data_seed(DataSeedOf(run_.spec.spec.seed(), round, data_root));
  // The verdicts announced (this host's own among them) that no certificate carries yet, in a
  // fixed order, as many as a plan may carry.
  TS_ASSIGN_OR_RETURN(const VerdictTally* tally, run_.Tally());
  std::map<std::tuple<uint64_t, std::string, std::string>, const pb::SignedVerdict*> carried;
  auto carry = [&](const pb::SignedVerdict& s) {
    const pb::Verdict& v = s.verdict();
    if (v.round() >= round || v.round() + kVerdictRounds < round) return;
    if (tally->Has(v.round(), v.member(), v.validator())) return;
    carried.emplace(std::make_tuple(v.round(), v.member(), v.validator()), &s);
  };
  for (const pb::SignedVerdict& s : run_.pending_verdicts) carry(s);
  for (const auto& [address, endpoint] : ready) {
    const Rendezvous::Announcement* announced = run_.rendezvous.AnnounceOf(address);
    if (announced == nullptr) continue;
    for (const pb::SignedVerdict& s : announced->verdicts) carry(s);
  }
  for (const auto& [key, s] : carried) {
    if (p.verdicts_size() == kVerdictsPerPlanMax) break;
    *p.add_verdicts() = *s;
  }
  TS_RETURN_IF_ERROR(SignPlan(*run_.host.key, run_.host.chain_id, &p));
  return p;
}

bool RoundPlanning::Moot(uint64_t round) {
  bool settling = false;
  {
    absl::MutexLock lock(&run_.mu);
    settling = run_.Settling(round);
  }
  if (settling) return run_.ShardClosed();
  run_.WatchDeadline();
  absl::MutexLock lock(&run_.mu);
  return run_.Settling(round);
}

bool RoundPlanning::CertifiedWithout(uint64_t round, const ShardView& view, size_t* probe,
                                     std::string* peer) {
  const size_t n = view.members.size();
  if (n < 2) return false;
  if (view.members[*probe % n].address == run_.host.address) ++*probe;
  *peer = view.members[(*probe)++ % n].address;
  // The certificates count even when the checkpoint could not be fetched yet.
  catch_up_.CatchUp(*peer).IgnoreError();
  if (run_.CertifiedRound() < round) return false;
  run_.Transition(absl::StrCat("round ", round, " was certified without this host; caught up from ",
                               Short(*peer)));
  return true;
}

std::vector<std::string> RoundPlanning::Planners(uint64_t round, const ShardView& view) const {
  std::vector<std::string> order = PlannerOrder(run_.spec.spec.seed(), round, view.members);
  absl::MutexLock lock(&run_.mu);
  absl::StatusOr<const VerdictTally*> tally = run_.Tally();
  if (!tally.ok()) return order;
  std::vector<std::string> kept = order;
  std::erase_if(kept, [&](const std::string& a) { return (*tally)->Excluded(a); });
  return kept.empty() ? order : kept;
}

absl::StatusOr<pb::AnnounceRequest> RoundPlanning::AnnounceTo(const std::string& candidate,
                                                              uint64_t round, uint32_t min_attempt,
                                                              bool preparing) const {
  pb::AnnounceRequest request;
  request.set_shard_id(run_.shard_id);
  request.set_round(round);
  request.set_min_attempt(min_attempt);
  request.set_collective_endpoint(run_.collective_endpoint);
  request.set_worker_threads(static_cast<uint32_t>(run_.options.worker_threads));
  request.set_preparing(preparing);
  {
    absl::MutexLock lock(&run_.mu);
    request.set_settling(run_.Settling(round));
    for (const pb::SignedVerdict& v : run_.pending_verdicts) {
      if (request.verdicts_size() == kVerdictsPerAnnounceMax) break;
      if (v.verdict().round() < round && v.verdict().round() + kVerdictRounds >= round) {
        *request.add_verdicts() = v;
      }
    }
  }
  TS_RETURN_IF_ERROR(run_.Sign(&request, kAnnounceMethod, candidate));
  return request;
}

std::jthread RoundPlanning::PreAnnounce(uint64_t round, uint32_t min_attempt) {
  auto view = run_.View();
  if (!view.ok()) return {};
  std::vector<std::pair<std::string, pb::AnnounceRequest>> sends;  // endpoint, request
  for (const std::string& candidate : Planners(round, *view)) {
    if (sends.size() == 2) break;
    if (candidate == run_.host.address) continue;
    const ShardMember* member = view->Find(candidate);
    if (member == nullptr) continue;
    auto request = AnnounceTo(candidate, round, min_attempt, /*preparing=*/true);
    if (!request.ok()) return {};
    sends.emplace_back(member->endpoint, std::move(*request));
  }
  return run_.peers->AnnounceInBackground(std::move(sends), kPreAnnounceTimeoutMs);
}

}  // namespace ts::sidecar
