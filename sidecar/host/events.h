// The chain events the host follows, parsed from tendermint.abci.Event into plain structs.
// Attribute names and meanings are those the trainshard module emits (docs/host-sidecar.md,
// "Events"); all numbers are base-10 strings. A parse error is INVALID_ARGUMENT naming the
// event, the attribute and the value, so the follower can record "ignore:<why>" and move on:
// a malformed event must never stop the host from following the chain.
//
// Thread-safety: pure functions; thread-safe.
#ifndef TS_SIDECAR_HOST_EVENTS_H_
#define TS_SIDECAR_HOST_EVENTS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/protocol.h"
#include "tendermint/abci/types.pb.h"

namespace ts::sidecar {

inline constexpr std::string_view kEventShardProposed = protocol::kEventShardProposed;
inline constexpr std::string_view kEventShardOpened = protocol::kEventShardOpened;
inline constexpr std::string_view kEventReservationAdded = protocol::kEventReservationAdded;
inline constexpr std::string_view kEventShardRunning = protocol::kEventShardRunning;
inline constexpr std::string_view kEventShardSettled = protocol::kEventShardSettled;
inline constexpr std::string_view kEventPayout = protocol::kEventPayout;
inline constexpr std::string_view kEventShardExpired = protocol::kEventShardExpired;
inline constexpr std::string_view kEventShardRejected = protocol::kEventShardRejected;
inline constexpr std::string_view kEventWeightsSubmitted = protocol::kEventWeightsSubmitted;

struct ShardProposedEvent {
  uint64_t shard_id = 0;
  uint64_t proposal_id = 0;
  std::string creator;
  std::string hardware_profile;
  uint32_t max_nodes = 0;
  uint64_t escrow = 0;  // ngonka
};

struct ShardOpenedEvent {
  uint64_t shard_id = 0;
  std::string creator;
  std::string hardware_profile;
  uint32_t min_nodes = 0;
  uint32_t max_nodes = 0;
  uint64_t min_host_weight = 0;
  uint64_t escrow = 0;  // ngonka
  int64_t reservation_deadline_height = 0;
  int64_t deadline_height = 0;
};

struct ReservationAddedEvent {
  uint64_t shard_id = 0;
  std::string host;
  uint64_t frozen_weight = 0;
  std::string endpoint;
  uint32_t members = 0;  // members after this reservation
};

struct ShardRunningEvent {
  uint64_t shard_id = 0;
  uint32_t members = 0;
  uint64_t total_weight = 0;
};

struct ShardSettledEvent {
  uint64_t shard_id = 0;
  std::string final_checkpoint_root;  // as emitted (hex)
  uint64_t signed_weight = 0;
  uint64_t total_weight = 0;
  uint64_t refund = 0;
};

struct PayoutEvent {
  uint64_t shard_id = 0;
  std::string host;
  uint64_t amount = 0;
};

struct ShardClosedEvent {  // shard_expired and shard_rejected
  uint64_t shard_id = 0;
  std::string reason;
  uint64_t refund = 0;  // 0 for shard_rejected
};

struct WeightsSubmittedEvent {
  uint64_t epoch = 0;
  uint32_t hosts = 0;
  uint64_t total_weight = 0;
};

absl::StatusOr<ShardProposedEvent> ParseShardProposed(const tendermint::abci::Event& event);
absl::StatusOr<ShardOpenedEvent> ParseShardOpened(const tendermint::abci::Event& event);
absl::StatusOr<ReservationAddedEvent> ParseReservationAdded(const tendermint::abci::Event& event);
absl::StatusOr<ShardRunningEvent> ParseShardRunning(const tendermint::abci::Event& event);
absl::StatusOr<ShardSettledEvent> ParseShardSettled(const tendermint::abci::Event& event);
absl::StatusOr<PayoutEvent> ParsePayout(const tendermint::abci::Event& event);
absl::StatusOr<ShardClosedEvent> ParseShardExpired(const tendermint::abci::Event& event);
absl::StatusOr<ShardClosedEvent> ParseShardRejected(const tendermint::abci::Event& event);
absl::StatusOr<WeightsSubmittedEvent> ParseWeightsSubmitted(const tendermint::abci::Event& event);

// Gonka's trainshards v0 events (the gonka-v0 profile, docs/gonka-v0.md), as its keeper emits
// them: every one names trainshard_id; node events name the participant and node_id too.
inline constexpr std::string_view kEventGonkaAssembled = "trainshard_assembled";
inline constexpr std::string_view kEventGonkaNodeReserved = "trainshard_node_reserved";
inline constexpr std::string_view kEventGonkaNodeKicked = "trainshard_node_autokicked";
inline constexpr std::string_view kEventGonkaSettled = "trainshard_settled";
inline constexpr std::string_view kEventGonkaExpired = "trainshard_expired";

struct GonkaShardEvent {
  uint64_t shard_id = 0;
  std::string participant;  // node events only
  std::string node_id;      // node events only
};
// One of the five events above; INVALID_ARGUMENT naming the event and attribute otherwise.
absl::StatusOr<GonkaShardEvent> ParseGonkaShardEvent(const tendermint::abci::Event& event);

// Value of the first attribute named `key`; NOT_FOUND if absent.
absl::StatusOr<std::string> EventAttribute(const tendermint::abci::Event& event,
                                           std::string_view key);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_EVENTS_H_
