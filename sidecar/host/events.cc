#include "sidecar/host/events.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/amount.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

// Reads the attributes of one event, naming the event type in every error.
class Reader {
 public:
  explicit Reader(const tendermint::abci::Event& event) : event_(event) {}

  absl::StatusOr<std::string> String(std::string_view key) const {
    auto value = EventAttribute(event_, key);
    if (!value.ok()) return Missing(key);
    return value;
  }

  absl::StatusOr<std::string> NonEmpty(std::string_view key) const {
    TS_ASSIGN_OR_RETURN(std::string value, String(key));
    if (value.empty()) return Bad(key, value, "empty");
    return value;
  }

  absl::StatusOr<uint64_t> U64(std::string_view key) const {
    TS_ASSIGN_OR_RETURN(std::string value, String(key));
    auto v = common::ParseAmount(key, value);
    if (!v.ok()) return Bad(key, value, "not a base-10 unsigned integer");
    return *v;
  }

  absl::StatusOr<uint32_t> U32(std::string_view key) const {
    TS_ASSIGN_OR_RETURN(uint64_t v, U64(key));
    if (v > std::numeric_limits<uint32_t>::max()) {
      return Bad(key, std::to_string(v), "larger than 2^32-1");
    }
    return static_cast<uint32_t>(v);
  }

  absl::StatusOr<int64_t> Height(std::string_view key) const {
    TS_ASSIGN_OR_RETURN(uint64_t v, U64(key));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(key, std::to_string(v), "larger than 2^63-1");
    }
    return static_cast<int64_t>(v);
  }

  // An ngonka amount; a trailing denom ("123ngonka", as Cosmos coins print) is accepted.
  absl::StatusOr<uint64_t> Amount(std::string_view key) const {
    TS_ASSIGN_OR_RETURN(std::string value, String(key));
    std::string_view digits = value;
    if (digits.size() > common::kDenom.size() &&
        digits.substr(digits.size() - common::kDenom.size()) == common::kDenom) {
      digits.remove_suffix(common::kDenom.size());
    }
    auto v = common::ParseAmount(key, digits);
    if (!v.ok()) return Bad(key, value, "not an ngonka amount");
    return *v;
  }

  absl::StatusOr<uint64_t> ShardId() const {
    TS_ASSIGN_OR_RETURN(uint64_t id, U64("shard_id"));
    if (id == 0) return Bad("shard_id", "0", "shard ids start at 1");
    return id;
  }

 private:
  absl::Status Missing(std::string_view key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(event_.type().substr(0, 64), ": attribute ", common::AsAbsl(key), " missing"));
  }
  absl::Status Bad(std::string_view key, std::string_view value, std::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(event_.type().substr(0, 64), ": attribute ", common::AsAbsl(key), "=\"",
                     common::AsAbsl(value.substr(0, 64)), "\" ", common::AsAbsl(why)));
  }

  const tendermint::abci::Event& event_;
};

}  // namespace

absl::StatusOr<std::string> EventAttribute(const tendermint::abci::Event& event,
                                           std::string_view key) {
  for (const auto& attribute : event.attributes()) {
    if (attribute.key() == key) return attribute.value();
  }
  return absl::NotFoundError(absl::StrCat("attribute ", common::AsAbsl(key), " missing"));
}

absl::StatusOr<ShardProposedEvent> ParseShardProposed(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardProposedEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.proposal_id, r.U64("proposal_id"));
  TS_ASSIGN_OR_RETURN(e.creator, r.String("creator"));
  TS_ASSIGN_OR_RETURN(e.hardware_profile, r.NonEmpty("hardware_profile"));
  TS_ASSIGN_OR_RETURN(e.max_nodes, r.U32("max_nodes"));
  TS_ASSIGN_OR_RETURN(e.escrow, r.Amount("escrow"));
  return e;
}

absl::StatusOr<ShardOpenedEvent> ParseShardOpened(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardOpenedEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.creator, r.String("creator"));
  TS_ASSIGN_OR_RETURN(e.hardware_profile, r.NonEmpty("hardware_profile"));
  TS_ASSIGN_OR_RETURN(e.min_nodes, r.U32("min_nodes"));
  TS_ASSIGN_OR_RETURN(e.max_nodes, r.U32("max_nodes"));
  TS_ASSIGN_OR_RETURN(e.min_host_weight, r.U64("min_host_weight"));
  TS_ASSIGN_OR_RETURN(e.escrow, r.Amount("escrow"));
  TS_ASSIGN_OR_RETURN(e.reservation_deadline_height, r.Height("reservation_deadline_height"));
  TS_ASSIGN_OR_RETURN(e.deadline_height, r.Height("deadline_height"));
  return e;
}

absl::StatusOr<ReservationAddedEvent> ParseReservationAdded(const tendermint::abci::Event& event) {
  Reader r(event);
  ReservationAddedEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.host, r.NonEmpty("host"));
  TS_ASSIGN_OR_RETURN(e.frozen_weight, r.U64("frozen_weight"));
  TS_ASSIGN_OR_RETURN(e.endpoint, r.String("endpoint"));
  TS_ASSIGN_OR_RETURN(e.members, r.U32("members"));
  return e;
}

absl::StatusOr<ShardRunningEvent> ParseShardRunning(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardRunningEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.members, r.U32("members"));
  TS_ASSIGN_OR_RETURN(e.total_weight, r.U64("total_weight"));
  return e;
}

absl::StatusOr<ShardSettledEvent> ParseShardSettled(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardSettledEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.final_checkpoint_root, r.String("final_checkpoint_root"));
  TS_ASSIGN_OR_RETURN(e.signed_weight, r.U64("signed_weight"));
  TS_ASSIGN_OR_RETURN(e.total_weight, r.U64("total_weight"));
  TS_ASSIGN_OR_RETURN(e.refund, r.Amount("refund"));
  return e;
}

absl::StatusOr<PayoutEvent> ParsePayout(const tendermint::abci::Event& event) {
  Reader r(event);
  PayoutEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.host, r.NonEmpty("host"));
  TS_ASSIGN_OR_RETURN(e.amount, r.Amount("amount"));
  return e;
}

absl::StatusOr<ShardClosedEvent> ParseShardExpired(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardClosedEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.reason, r.String("reason"));
  TS_ASSIGN_OR_RETURN(e.refund, r.Amount("refund"));
  return e;
}

absl::StatusOr<ShardClosedEvent> ParseShardRejected(const tendermint::abci::Event& event) {
  Reader r(event);
  ShardClosedEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.ShardId());
  TS_ASSIGN_OR_RETURN(e.reason, r.String("reason"));
  return e;
}

absl::StatusOr<WeightsSubmittedEvent> ParseWeightsSubmitted(const tendermint::abci::Event& event) {
  Reader r(event);
  WeightsSubmittedEvent e;
  TS_ASSIGN_OR_RETURN(e.epoch, r.U64("epoch"));
  TS_ASSIGN_OR_RETURN(e.hosts, r.U32("hosts"));
  TS_ASSIGN_OR_RETURN(e.total_weight, r.U64("total_weight"));
  return e;
}

absl::StatusOr<GonkaShardEvent> ParseGonkaShardEvent(const tendermint::abci::Event& event) {
  Reader r(event);
  GonkaShardEvent e;
  TS_ASSIGN_OR_RETURN(e.shard_id, r.U64("trainshard_id"));
  if (e.shard_id == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(event.type().substr(0, 64), ": attribute trainshard_id=\"0\" is not an id"));
  }
  if (event.type() == kEventGonkaNodeReserved || event.type() == kEventGonkaNodeKicked) {
    TS_ASSIGN_OR_RETURN(e.participant, r.NonEmpty("participant"));
    TS_ASSIGN_OR_RETURN(e.node_id, r.NonEmpty("node_id"));
  }
  return e;
}

}  // namespace ts::sidecar
