// The names and the one rule the chain module and the sidecar must agree on, in one place: the
// kinds of signed statements (common/crypto/signing.h binds each signature to its kind), the
// types of the events the module emits and the host follows, and the quorum of a shard's
// weight. Spelled once here, a mismatch between the two sides is a compile error rather than a
// signature that never verifies or an event the host never sees (docs/protocol.md).
//
// Thread-safety: constants and a pure function.
#ifndef TS_COMMON_PROTOCOL_H_
#define TS_COMMON_PROTOCOL_H_

#include <cstdint>
#include <string_view>

namespace ts::protocol {

// Signed statement kinds.
inline constexpr std::string_view kSignReservation = "reservation";  // a host's reservation
inline constexpr std::string_view kSignSettlement = "settlement";  // a settlement's canonical bytes
inline constexpr std::string_view kSignRoundPlan = "round_plan";   // a planner's round plan
inline constexpr std::string_view kSignRound = "round";            // a member's round result
inline constexpr std::string_view kSignEvaluation = "evaluation";  // an evaluation result
inline constexpr std::string_view kSignVerdict = "verdict";        // a validator's replay verdict
inline constexpr std::string_view kSignArtifact = "artifact";      // an artifact manifest's id
inline constexpr std::string_view kSignPeerRequest = "peer_request";  // a peer call's envelope
inline constexpr std::string_view kSignCollectiveCommit = "collective_commit";  // a commitment

// End-block event types of the trainshard module (and the PoC weights the devnet emits).
inline constexpr std::string_view kEventShardProposed = "trainshard.shard_proposed";
inline constexpr std::string_view kEventShardRejected = "trainshard.shard_rejected";
inline constexpr std::string_view kEventShardOpened = "trainshard.shard_opened";
inline constexpr std::string_view kEventReservationAdded = "trainshard.reservation_added";
inline constexpr std::string_view kEventShardRunning = "trainshard.shard_running";
inline constexpr std::string_view kEventShardExpired = "trainshard.shard_expired";
inline constexpr std::string_view kEventPayout = "trainshard.payout";
inline constexpr std::string_view kEventShardSettled = "trainshard.shard_settled";
inline constexpr std::string_view kEventWeightsSubmitted = "poc.weights_submitted";

// The quorum of a shard: strictly more than two thirds of its total frozen weight (exactly 2/3
// is not enough). In 128 bits, so no sum of weights overflows.
constexpr bool IsQuorum(unsigned __int128 signed_weight, unsigned __int128 total_weight) {
  return signed_weight * 3 > total_weight * 2;
}
static_assert(!IsQuorum(2, 3) && IsQuorum(3, 4) && IsQuorum(1, 1) && !IsQuorum(0, 0));

// The rounds a run spec may ask for (RunSpec.rounds), and so a settlement's rounds_planned.
inline constexpr uint64_t kRoundsMax = 100000;

// The part of the escrow a settlement pays out: all of it for a run that completed its rounds;
// for one that reached its deadline first (partial settlement), escrow × completed / planned,
// rounded down; the rest is refunded. Needs 1 <= completed <= planned.
constexpr uint64_t PayableOf(uint64_t escrow, uint64_t rounds_completed, uint64_t rounds_planned) {
  if (rounds_planned == 0 || rounds_completed >= rounds_planned) return escrow;
  return static_cast<uint64_t>(static_cast<unsigned __int128>(escrow) * rounds_completed /
                               rounds_planned);
}
static_assert(PayableOf(1000, 3, 3) == 1000 && PayableOf(1000, 1, 3) == 333);

// What a settlement pays a host for (docs/verification.md "Pay"): its work units, and whether
// it forfeits its pay (it has a mark). A settlement counts every host's work in tokens (those
// behind its contributions that the checks could reach) when any host has tokens, else in the
// rounds each signed (a run without commitments): one unit for all, never a mix.
struct HostWork {
  uint64_t units = 0;
  bool forfeit = false;
};
constexpr uint64_t WorkUnits(uint64_t tokens, uint64_t rounds_contributed, bool by_tokens) {
  return by_tokens ? tokens : rounds_contributed;
}

// The amount a host is paid under a reward policy, the same on the chain and in every member's
// draft: by work (`equal_share` false), escrow × units / the units of all hosts, forfeited ones
// included (so what one forfeits is refunded, not shared out); or an equal share of the escrow
// among the hosts with work. Rounded down, capped at max_host_share_bps of the escrow; 0 for a
// host that forfeits or has no work.
constexpr uint64_t PayoutOf(uint64_t escrow, bool equal_share, uint32_t max_host_share_bps,
                            const HostWork& host, unsigned __int128 all_units, uint64_t workers) {
  if (host.forfeit || host.units == 0 || all_units == 0 || workers == 0) return 0;
  const unsigned __int128 cap = static_cast<unsigned __int128>(escrow) * max_host_share_bps / 10000;
  const unsigned __int128 amount =
      equal_share ? escrow / workers
                  : static_cast<unsigned __int128>(escrow) * host.units / all_units;
  return static_cast<uint64_t>(amount < cap ? amount : cap);
}
static_assert(PayoutOf(1100, false, 5000, {3, false}, 11, 4) == 300);
static_assert(PayoutOf(1100, false, 5000, {3, true}, 11, 4) == 0);
static_assert(PayoutOf(1000, false, 5000, {1, false}, 1, 1) == 500);
static_assert(PayoutOf(1000, true, 10000, {7, false}, 10, 3) == 333);

}  // namespace ts::protocol

#endif  // TS_COMMON_PROTOCOL_H_
