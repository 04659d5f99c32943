#include "sidecar/shard/rendezvous.h"

#include "sidecar/shard/ledger.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

void Rendezvous::Enter(uint64_t round, uint32_t min_attempt) {
  if (round_ != round) {
    round_ = round;
    attempt_ = min_attempt;
    announces_.clear();
    plan_.reset();
  }
  if (min_attempt > attempt_) {
    attempt_ = min_attempt;
    plan_.reset();
  }
}

void Rendezvous::Announce(const std::string& member, const Announcement& announcement) {
  auto [it, added] = announces_.try_emplace(member);
  if (added || !announcement.preparing || it->second.preparing ||
      it->second.min_attempt < announcement.min_attempt) {
    it->second = announcement;
  }
}

Rendezvous::Decision Rendezvous::Decide(const ShardView& view, int64_t now_ms, int64_t started_ms,
                                        const Timing& timing) const {
  Decision d;
  bool waiting_for_preparing = false;
  for (const auto& [address, a] : announces_) {
    const ShardMember* m = view.Find(address);
    if (m == nullptr) continue;
    if (a.preparing) {
      waiting_for_preparing |= now_ms - a.at_ms <= timing.preparing_wait_ms;
      continue;
    }
    if (a.min_attempt < attempt_ || now_ms - a.at_ms > timing.fresh_ms) continue;
    d.ready_weight += m->weight;
    d.ready.emplace_back(address, a.endpoint);
  }
  const bool everyone = d.ready.size() == view.members.size();
  // Past the join window a quorum plans without the others, unless a member said it is running
  // its inner steps: that one is waited for up to preparing_wait_ms from the start, so a host
  // that caught up a little late is not left out round after round.
  const int64_t waited = now_ms - started_ms;
  const bool window = waited >= timing.join_window_ms &&
                      (!waiting_for_preparing || waited >= timing.preparing_wait_ms);
  d.plan =
      d.ready.size() >= 2 && (everyone || (window && HasQuorum(d.ready_weight, TotalWeight(view))));
  return d;
}

const Rendezvous::Announcement* Rendezvous::AnnounceOf(const std::string& member) const {
  auto it = announces_.find(member);
  return it == announces_.end() ? nullptr : &it->second;
}

const pb::RoundPlan* Rendezvous::PlanFor(uint32_t min_attempt) const {
  return plan_ && plan_->attempt() >= min_attempt ? &*plan_ : nullptr;
}

}  // namespace ts::sidecar
