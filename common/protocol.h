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

}  // namespace ts::protocol

#endif  // TS_COMMON_PROTOCOL_H_
