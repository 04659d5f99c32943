// The settlement of a run (docs/training.md "Settlement"): after the last round's certificate
// (the spec's last, or the last certified when the deadline came near: a partial settlement)
// each member drafts the settlement its own records imply (DraftFromRecords: every round's
// certificate, the shard's escrow and reward policy as the chain has them), has its host sign
// it (the host checks the draft against the records once more), and the members all-gather
// their signatures over the last round's mesh, keeping those that recover to their member for
// this very draft. Then the run waits for the chain: the first member of the final round
// submits at once, the others after a while if it has not landed, and the run is done when the
// chain says the shard is settled (or no longer running). When no settlement lands (a member
// died under the exchange, so nobody holds the signatures), the run plans a settlement attempt
// like a round's and exchanges them again (shard_run.cc).
//
// Owns the draft and the signatures gathered.
//
// Thread-safety: the run thread's.
#ifndef TS_SIDECAR_SHARD_SETTLEMENT_EXCHANGE_H_
#define TS_SIDECAR_SHARD_SETTLEMENT_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "sidecar/collective/collective.h"
#include "sidecar/shard/run_context.h"

namespace ts::sidecar {

class SettlementExchange {
 public:
  explicit SettlementExchange(RunContext* run) : run_(*run) {}

  // Drafts the settlement of rounds 1..`rounds`, signs it and gathers the members' signatures
  // over `collective` (the last round's, or a settlement attempt's); whether any were gathered.
  bool Exchange(Collective* collective, const GroupSpec& group, int64_t deadline, uint64_t rounds);
  // Submits (at once when `first_member`) and waits until the chain settles or ends the shard:
  // true. False (or the run stopping) after a while when there is nothing to wait for — no
  // signatures here or the chain refused them, and no member's settlement landed: the members
  // then exchange their signatures again.
  bool Settle(bool first_member);

 private:
  RunContext& run_;
  ::gonka::trainshard::v1::Settlement settlement_;
  std::vector<::gonka::trainshard::v1::SettlementSignature> signatures_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_SETTLEMENT_EXCHANGE_H_
