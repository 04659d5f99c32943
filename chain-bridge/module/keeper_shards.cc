// The Keeper's shards: reading and writing them, a host's reservation, assembly, the
// settlement (docs/chain-module.md "MsgSettleTrainshard") and the shards' end-block deadlines.
// The rest of the Keeper is in keeper.cc.
#include "chain-bridge/module/keeper.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "chain-bridge/module/keeper_util.h"
#include "chain-bridge/module/member_key.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/protocol.h"
#include "common/status.h"

namespace ts::bridge {

using keeper_util::Invalid;
using keeper_util::kBps;
using keeper_util::KeyName;
using keeper_util::Load;
using keeper_util::LoadU64;
using keeper_util::StoredAmount;
using keeper_util::u128;
using keeper_util::U128ToString;

absl::StatusOr<pb::Shard> Keeper::GetShard(uint64_t id, bool with_members) const {
  TS_ASSIGN_OR_RETURN(auto shard, Load<pb::Shard>(*kv_, keys::Shard(id)));
  if (!shard.has_value()) return absl::NotFoundError(Cat("shard ", id, " not found"));
  if (with_members) {
    std::string prefix = Cat(keys::kMemberPrefix, Be64(id));
    for (const auto& [key, value] : kv_->Scan(prefix)) {
      if (!shard->add_reservations()->ParseFromString(value)) {
        return absl::DataLossError(
            Cat("state key ", KeyName(key), " does not hold a valid Reservation"));
      }
    }
  }
  return *std::move(shard);
}

void Keeper::PutShard(const pb::Shard& shard) {
  // Members live under their own keys so a reservation does not rewrite every other one.
  if (shard.reservations_size() == 0) {
    kv_->Set(keys::Shard(shard.id()), DeterministicBytes(shard));
    return;
  }
  pb::Shard record = shard;
  record.clear_reservations();
  kv_->Set(keys::Shard(shard.id()), DeterministicBytes(record));
}

absl::StatusOr<pb::SettlementRecord> Keeper::GetSettlement(uint64_t shard_id) const {
  TS_ASSIGN_OR_RETURN(auto record, Load<pb::SettlementRecord>(*kv_, keys::Settlement(shard_id)));
  if (!record.has_value()) {
    return absl::NotFoundError(Cat("shard ", shard_id, " has no settlement"));
  }
  return *std::move(record);
}

absl::StatusOr<uint64_t> Keeper::MemberCount(uint64_t shard_id) const {
  return LoadU64(*kv_, keys::MemberCount(shard_id), 0);
}

absl::StatusOr<std::optional<pb::Reservation>> Keeper::GetMember(uint64_t shard_id,
                                                                 std::string_view host) const {
  return Load<pb::Reservation>(*kv_, keys::Member(shard_id, host));
}

absl::Status Keeper::StartShard(pb::Shard* shard, uint64_t members) {
  shard->set_status(pb::SHARD_STATUS_RUNNING);
  kv_->Delete(keys::ReservationDeadline(shard->reservation_deadline_height(), shard->id()));
  PutShard(*shard);
  Emit(protocol::kEventShardRunning, {{"shard_id", Cat(shard->id())},
                                      {"members", Cat(members)},
                                      {"total_weight", Cat(shard->total_weight())}});
  return absl::OkStatus();
}

absl::Status Keeper::ExpireShard(pb::Shard* shard, pb::CloseReason reason) {
  TS_ASSIGN_OR_RETURN(uint64_t held, StoredAmount("escrow_held", shard->escrow_held()));
  TS_RETURN_IF_ERROR(Transfer(env_.escrow_address, shard->creator(), held));
  shard->set_escrow_held("0");
  shard->set_status(pb::SHARD_STATUS_EXPIRED);
  shard->set_close_reason(reason);
  shard->set_closed_height(height_);
  kv_->Delete(keys::ReservationDeadline(shard->reservation_deadline_height(), shard->id()));
  kv_->Delete(keys::Deadline(shard->deadline_height(), shard->id()));
  PutShard(*shard);
  Emit(protocol::kEventShardExpired,
       {{"shard_id", Cat(shard->id())},
        {"reason", reason == pb::CLOSE_REASON_TIMEOUT ? "timeout" : "not_enough_nodes"},
        {"refund", Cat(held)}});
  return absl::OkStatus();
}

absl::Status Keeper::Reserve(const pb::MsgReserveTrainshard& msg) {
  if (!msg.has_reservation()) return Invalid("reservation", "missing");
  const pb::Reservation& r = msg.reservation();
  TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(r.shard_id(), false));
  TS_ASSIGN_OR_RETURN(uint64_t members, MemberCount(shard.id()));
  // A shard that filled up went RUNNING at once; "full" is the reason a host cares about.
  if (shard.status() == pb::SHARD_STATUS_RUNNING && members >= shard.spec().max_nodes()) {
    return absl::ResourceExhaustedError(
        Cat("shard ", shard.id(), " is full: max_nodes ", shard.spec().max_nodes()));
  }
  if (shard.status() != pb::SHARD_STATUS_OPEN) {
    return absl::FailedPreconditionError(
        Cat("shard ", shard.id(), " is ", ShardStatusName(shard.status()), ", not open"));
  }
  if (height_ > shard.reservation_deadline_height()) {
    return absl::FailedPreconditionError(Cat("shard ", shard.id(),
                                             ": the reservation window closed at height ",
                                             shard.reservation_deadline_height()));
  }
  TS_RETURN_IF_ERROR(ValidateAddress("reservation.host", r.host()));
  TS_RETURN_IF_ERROR(ValidateEndpoint("reservation.endpoint", r.endpoint()));
  if (r.tls_cert_sha256().size() != common::kSha256Size) {
    return Invalid("reservation.tls_cert_sha256", r.tls_cert_sha256().size(), " bytes, want ",
                   common::kSha256Size);
  }
  if (r.valid_until_height() < height_) {
    return absl::FailedPreconditionError(Cat(
        "reservation.valid_until_height: ", r.valid_until_height(), " is before height ", height_));
  }
  if (r.frozen_weight() != 0) {
    return Invalid("reservation.frozen_weight", r.frozen_weight(),
                   " must be 0 in the statement (the chain sets it)");
  }
  if (r.reserved_height() != 0) {
    return Invalid("reservation.reserved_height", r.reserved_height(),
                   " must be 0 in the statement (the chain sets it)");
  }
  if (r.signature().size() != common::kRecoverableSignatureSize) {
    return absl::UnauthenticatedError(Cat("reservation.signature: ", r.signature().size(),
                                          " bytes, want ", common::kRecoverableSignatureSize));
  }
  pb::Reservation statement = r;
  statement.clear_signature();
  TS_ASSIGN_OR_RETURN(std::string sign_bytes,
                      common::SignBytes(protocol::kSignReservation, env_.genesis.chain_id(),
                                        shard.id(), DeterministicBytes(statement)));
  kv_->ConsumeGas(gas::kSigVerifySecp256k1, "reservation signature: secp256k1");
  auto recovered = env_.sig_cache->Recover(common::Sha256(sign_bytes), r.signature());
  if (!recovered.ok() || recovered->address != r.host()) {
    return absl::UnauthenticatedError(
        Cat("reservation.signature: does not verify for host ", r.host()));
  }
  // A recovered key is a point, so this cannot fail; the settlement verifies against it.
  TS_ASSIGN_OR_RETURN(std::string member_key, UncompressMemberKey(recovered->public_key));
  TS_ASSIGN_OR_RETURN(auto existing, GetMember(shard.id(), r.host()));
  if (existing.has_value()) {
    return absl::AlreadyExistsError(
        Cat("host ", r.host(), " already holds a place in shard ", shard.id()));
  }
  if (members >= shard.spec().max_nodes()) {
    return absl::ResourceExhaustedError(
        Cat("shard ", shard.id(), " is full: max_nodes ", shard.spec().max_nodes()));
  }
  TS_ASSIGN_OR_RETURN(uint64_t epoch, EpochInForce(height_));
  TS_ASSIGN_OR_RETURN(uint64_t weight, Weight(epoch, r.host()));
  uint64_t floor = std::max<uint64_t>(shard.spec().min_host_weight(), 1);
  if (weight < floor) {
    return absl::FailedPreconditionError(Cat("host ", r.host(), ": weight ", weight,
                                             " below the floor ", floor, " (epoch ", epoch, ")"));
  }
  pb::Reservation stored = r;
  stored.set_frozen_weight(weight);
  stored.set_reserved_height(height_);
  kv_->Set(keys::Member(shard.id(), r.host()), DeterministicBytes(stored));
  kv_->Set(keys::MemberKey(shard.id(), r.host()), std::move(member_key));
  members += 1;
  kv_->Set(keys::MemberCount(shard.id()), Be64(members));
  TS_ASSIGN_OR_RETURN(uint64_t total,
                      common::CheckedAdd("total_weight", shard.total_weight(), weight));
  shard.set_total_weight(total);
  Emit(protocol::kEventReservationAdded, {{"shard_id", Cat(shard.id())},
                                          {"host", r.host()},
                                          {"frozen_weight", Cat(weight)},
                                          {"endpoint", r.endpoint()},
                                          {"members", Cat(members)}});
  // The reservation that fills the shard starts it and writes the record once, as every other
  // reservation does: its gas differs from theirs by one delete, which the client's margin
  // covers even when another host's reservation lands between its simulation and its delivery.
  if (members == shard.spec().max_nodes()) return StartShard(&shard, members);
  PutShard(shard);
  return absl::OkStatus();
}

absl::Status Keeper::Assemble(const pb::MsgAssembleTrainshard& msg) {
  TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(msg.shard_id(), false));
  if (shard.status() != pb::SHARD_STATUS_OPEN) {
    return absl::FailedPreconditionError(
        Cat("shard ", shard.id(), " is ", ShardStatusName(shard.status()), ", not open"));
  }
  TS_ASSIGN_OR_RETURN(auto member, GetMember(shard.id(), msg.creator()));
  if (msg.creator() != shard.creator() && !member.has_value()) {
    return absl::PermissionDeniedError(Cat(
        "signer ", msg.creator(), " is neither the creator nor a member of shard ", shard.id()));
  }
  TS_ASSIGN_OR_RETURN(uint64_t members, MemberCount(shard.id()));
  if (members < shard.spec().min_nodes()) {
    return absl::FailedPreconditionError(Cat("shard ", shard.id(), " has ", members,
                                             " members, below min_nodes ",
                                             shard.spec().min_nodes()));
  }
  return StartShard(&shard, members);
}

namespace {

// Each payout's amount is the one its stats imply under the shard's reward policy
// (PayoutsFromStats, the rule of the members' drafts) for the `payable` part of the escrow;
// `amounts` are the payouts' parsed.
absl::Status CheckPayoutsFollowStats(const pb::Settlement& s, uint64_t payable,
                                     const pb::RewardPolicy& policy,
                                     const std::vector<uint64_t>& amounts) {
  const std::vector<uint64_t> wants = PayoutsFromStats(payable, policy, s.payouts());
  for (int i = 0; i < s.payouts_size(); ++i) {
    const pb::HostPayout& p = s.payouts(i);
    const uint64_t want = wants[static_cast<size_t>(i)];
    if (amounts[static_cast<size_t>(i)] != want) {
      return Invalid(Cat("settlement.payouts[", i, "].amount"), amounts[static_cast<size_t>(i)],
                     " does not follow from its stats (tokens ", p.tokens(), ", rounds ",
                     p.rounds_contributed(), ", marks ", p.marks(), ", rejected ", p.rejected(),
                     ") under the reward policy: want ", want);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Keeper::Settle(pb::MsgSettleTrainshard* msg) {
  TS_RETURN_IF_ERROR(ValidateAddress("submitter", msg->submitter()));
  if (!msg->has_settlement()) return Invalid("settlement", "missing");
  const pb::Settlement& s = msg->settlement();
  const std::string& chain_id = env_.genesis.chain_id();
  if (s.chain_id() != chain_id) {
    return absl::InvalidArgumentError(Cat("settlement.chain_id: '", s.chain_id().substr(0, 80),
                                          "' is not this chain '", chain_id, "'"));
  }
  TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(s.shard_id(), false));
  switch (shard.status()) {
    case pb::SHARD_STATUS_RUNNING:
      break;
    case pb::SHARD_STATUS_EXPIRED:
      return absl::FailedPreconditionError(
          Cat("shard ", shard.id(), " expired at height ", shard.closed_height()));
    case pb::SHARD_STATUS_SETTLED:
      return absl::AlreadyExistsError(
          Cat("shard ", shard.id(), " is already settled at height ", shard.closed_height()));
    default:
      return absl::FailedPreconditionError(
          Cat("shard ", shard.id(), " is ", ShardStatusName(shard.status()), ", not running"));
  }
  if (s.final_checkpoint_root().size() != common::kSha256Size) {
    return Invalid("settlement.final_checkpoint_root", s.final_checkpoint_root().size(),
                   " bytes, want ", common::kSha256Size);
  }
  if (s.rounds_planned() < 1 || s.rounds_planned() > protocol::kRoundsMax) {
    return Invalid("settlement.rounds_planned", s.rounds_planned(), " is outside 1..",
                   protocol::kRoundsMax);
  }
  if (s.rounds_completed() < 1 || s.rounds_completed() > s.rounds_planned()) {
    return Invalid("settlement.rounds_completed", s.rounds_completed(), " is outside 1..",
                   s.rounds_planned(), " (rounds_planned)");
  }
  TS_ASSIGN_OR_RETURN(uint64_t escrow,
                      StoredAmount("spec.escrow.amount", shard.spec().escrow().amount()));
  TS_ASSIGN_OR_RETURN(uint64_t held, StoredAmount("escrow_held", shard.escrow_held()));
  // A run settled before its last round (it reached its deadline) pays for the rounds it
  // certified; the payouts' shares and the per-host cap are of that part.
  const uint64_t payable = protocol::PayableOf(escrow, s.rounds_completed(), s.rounds_planned());
  uint64_t share_max = static_cast<uint64_t>(
      u128{payable} * shard.spec().reward_policy().max_host_share_bps() / kBps);

  // Every host the settlement names, read from the state once: payouts and signatures of the
  // same host share the record. The map only answers lookups (never iterated).
  struct Named {
    uint64_t frozen_weight = 0;
    bool paid = false;
    bool counted = false;
  };
  absl::flat_hash_map<absl::string_view, Named> named;
  named.reserve(static_cast<size_t>(s.payouts_size()) + 1);
  pb::Reservation member;  // parsed into again and again: its strings keep their buffers
  std::string member_key = keys::Member(shard.id(), "");
  const size_t member_prefix = member_key.size();
  // The host's entry, or nullptr when the host is not a member.
  auto lookup = [&](const std::string& host) -> absl::StatusOr<Named*> {
    auto it = named.find(host);
    if (it != named.end()) return &it->second;
    member_key.resize(member_prefix);
    member_key.append(host);
    const std::string* bytes = kv_->Find(member_key);
    if (bytes == nullptr) return nullptr;
    if (!member.ParseFromString(*bytes)) {
      return absl::DataLossError(Cat("state key ", KeyName(member_key), " does not hold a valid ",
                                     pb::Reservation::descriptor()->full_name()));
    }
    return &named.emplace(host, Named{member.frozen_weight()}).first->second;
  };

  // Payouts: members only, once each, within the per-host share, adding up to the escrow.
  std::vector<uint64_t> amounts;
  amounts.reserve(static_cast<size_t>(s.payouts_size()));
  u128 paid = 0;
  for (int i = 0; i < s.payouts_size(); ++i) {
    const auto& payout = s.payouts(i);
    // Field names are only built for an error.
    auto field = [i] { return Cat("settlement.payouts[", i, "]"); };
    TS_ASSIGN_OR_RETURN(Named * payee, lookup(payout.host()));
    if (payee == nullptr) {
      return Invalid(Cat(field(), ".host"), "'", payout.host().substr(0, 128),
                     "' is not a member of shard ", shard.id());
    }
    if (payee->paid) return Invalid(Cat(field(), ".host"), payout.host(), " is paid twice");
    payee->paid = true;
    auto amount = common::ParseAmount("amount", payout.amount());
    if (!amount.ok()) return common::ParseAmount(Cat(field(), ".amount"), payout.amount()).status();
    if (*amount > share_max) {
      return Invalid(Cat(field(), ".amount"), *amount, " exceeds the host share ", share_max,
                     " (max_host_share_bps ", shard.spec().reward_policy().max_host_share_bps(),
                     " of ", payable, " payable of escrow ", escrow, ")");
    }
    amounts.push_back(*amount);
    paid += *amount;
  }
  TS_RETURN_IF_ERROR(CheckPayoutsFollowStats(s, payable, shard.spec().reward_policy(), amounts));
  TS_ASSIGN_OR_RETURN(uint64_t refund, common::ParseAmount("settlement.refund", s.refund()));
  u128 total = paid + refund;
  if (total > held) {
    return absl::InvalidArgumentError(Cat("settlement: payouts ", U128ToString(paid), " + refund ",
                                          refund, " exceed escrow ", held));
  }
  if (total < held) {
    return absl::InvalidArgumentError(Cat("settlement: payouts ", U128ToString(paid), " + refund ",
                                          refund, " do not add up to escrow ", held));
  }

  // Signatures: distinct members whose frozen weight adds up to more than 2/3.
  TS_ASSIGN_OR_RETURN(uint64_t members, MemberCount(shard.id()));
  if (static_cast<uint64_t>(msg->signatures_size()) > members) {
    return Invalid("signatures", msg->signatures_size(), " signatures for ", members,
                   " members of shard ", shard.id());
  }
  // The sign bytes are built and hashed once for all signatures.
  TS_ASSIGN_OR_RETURN(std::string sign_bytes, common::SignBytes(protocol::kSignSettlement, chain_id,
                                                                shard.id(), DeterministicBytes(s)));
  const std::string digest = common::Sha256(sign_bytes);
  std::string key_name = keys::MemberKey(shard.id(), "");  // + host, per signature
  const size_t key_prefix = key_name.size();
  u128 signed_weight = 0;
  for (int i = 0; i < msg->signatures_size(); ++i) {
    const auto& sig = msg->signatures(i);
    TS_ASSIGN_OR_RETURN(Named * signer, lookup(sig.host()));
    if (signer == nullptr) {
      return absl::PermissionDeniedError(
          Cat("signer ", sig.host().substr(0, 128), " is not a member of shard ", shard.id()));
    }
    if (signer->counted) {
      return Invalid(Cat("signatures[", i, "]"), "host ", sig.host(), " counted twice");
    }
    signer->counted = true;
    if (sig.signature().size() != common::kRecoverableSignatureSize) {
      return Invalid(Cat("signatures[", i, "].signature"), sig.signature().size(), " bytes, want ",
                     common::kRecoverableSignatureSize);
    }
    key_name.resize(key_prefix);
    key_name.append(sig.host());
    TS_ASSIGN_OR_RETURN(bool valid, SignedByMember(key_name, sig.host(), digest, sig.signature()));
    if (!valid) {
      return absl::UnauthenticatedError(Cat("signature of ", sig.host(), " does not verify"));
    }
    signed_weight += signer->frozen_weight;
  }
  if (!protocol::IsQuorum(signed_weight, shard.total_weight())) {
    return absl::FailedPreconditionError(Cat("signed weight ", U128ToString(signed_weight),
                                             " is not more than 2/3 of ", shard.total_weight()));
  }

  // The payouts are Transfers from the escrow account, with the escrow's balance read and
  // written once instead of once per payout: same events, errors and final balances.
  const std::string shard_id = Cat(shard.id());
  const std::string& escrow_address = env_.escrow_address;
  const std::string escrow_key = keys::Balance(escrow_address);
  TS_ASSIGN_OR_RETURN(uint64_t escrow_balance, BalanceAt(escrow_key));
  for (int i = 0; i < s.payouts_size(); ++i) {
    const auto& payout = s.payouts(i);
    uint64_t amount = amounts[static_cast<size_t>(i)];
    const std::string amount_text = Cat(amount);
    if (amount > 0) {
      if (escrow_balance < amount) {
        return SdkError(SdkCode::kInsufficientFunds,
                        Cat("spendable balance of ", escrow_address, " is ", escrow_balance,
                            common::kDenom, ", smaller than ", amount, common::kDenom));
      }
      // A transfer to the sender itself moves nothing (but is still reported).
      if (payout.host() != escrow_address) {
        escrow_balance -= amount;
        TS_RETURN_IF_ERROR(Credit(payout.host(), amount));
      }
      EmitTransfer(escrow_address, payout.host(), amount);
    }
    Emit(protocol::kEventPayout,
         {{"shard_id", shard_id}, {"host", payout.host()}, {"amount", amount_text}});
  }
  SetBalanceAt(escrow_key, escrow_balance);
  TS_RETURN_IF_ERROR(Transfer(escrow_address, shard.creator(), refund));
  shard.set_escrow_held("0");
  shard.set_status(pb::SHARD_STATUS_SETTLED);
  shard.set_close_reason(pb::CLOSE_REASON_SETTLED);
  shard.set_closed_height(height_);
  kv_->Delete(keys::Deadline(shard.deadline_height(), shard.id()));
  PutShard(shard);

  // Nothing can fail from here on: the settlement and its signatures move into the record
  // instead of being copied.
  pb::SettlementRecord record;
  record.set_allocated_settlement(msg->release_settlement());
  record.mutable_signatures()->Swap(msg->mutable_signatures());
  record.set_signed_weight(static_cast<uint64_t>(signed_weight));
  record.set_height(height_);
  record.set_submitter(msg->submitter());
  kv_->Set(keys::Settlement(shard.id()), DeterministicBytes(record));
  Emit(protocol::kEventShardSettled,
       {{"shard_id", shard_id},
        {"final_checkpoint_root", common::HexEncode(record.settlement().final_checkpoint_root())},
        {"signed_weight", U128ToString(signed_weight)},
        {"total_weight", Cat(shard.total_weight())},
        {"refund", Cat(refund)}});
  return absl::OkStatus();
}

absl::StatusOr<bool> Keeper::SignedByMember(std::string_view key_name, std::string_view host,
                                            std::string_view digest, std::string_view signature) {
  kv_->ConsumeGas(gas::kSigVerifySecp256k1, "member signature: secp256k1");
  const std::string* member_key = kv_->Find(key_name);
  if (member_key != nullptr) {
    if (member_key->size() != kMemberKeySize) {
      return absl::DataLossError(Cat("state key ", KeyName(key_name), ": ", member_key->size(),
                                     " bytes, want ", kMemberKeySize));
    }
    return env_.sig_cache->Verify(*member_key, digest, signature);
  }
  // A member recorded before keys were stored: its key is only known through recovery.
  auto recovered = env_.sig_cache->Recover(digest, signature);
  return recovered.ok() && recovered->address == host;
}

absl::Status Keeper::ReservationDeadline(uint64_t shard_id) {
  TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(shard_id, false));
  kv_->Delete(keys::ReservationDeadline(height_, shard_id));
  if (shard.status() != pb::SHARD_STATUS_OPEN) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(uint64_t members, MemberCount(shard_id));
  if (members >= shard.spec().min_nodes()) return StartShard(&shard, members);
  return ExpireShard(&shard, pb::CLOSE_REASON_NOT_ENOUGH_NODES);
}

absl::Status Keeper::Deadline(uint64_t shard_id) {
  TS_ASSIGN_OR_RETURN(pb::Shard shard, GetShard(shard_id, false));
  kv_->Delete(keys::Deadline(height_, shard_id));
  if (shard.status() != pb::SHARD_STATUS_OPEN && shard.status() != pb::SHARD_STATUS_RUNNING) {
    return absl::OkStatus();
  }
  return ExpireShard(&shard, pb::CLOSE_REASON_TIMEOUT);
}

}  // namespace ts::bridge
