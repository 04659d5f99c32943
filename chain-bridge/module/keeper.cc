#include "chain-bridge/module/keeper.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "chain-bridge/module/gonka_v0.h"
#include "chain-bridge/module/keeper_util.h"
#include "chain-bridge/module/member_key.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/protocol.h"
#include "common/status.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"

namespace ts::bridge {

using keeper_util::Invalid;
using keeper_util::KeyName;
using keeper_util::kPpm;
using keeper_util::Load;
using keeper_util::LoadU64;
using keeper_util::StoredAmount;
using keeper_util::u128;
using keeper_util::U128ToString;

namespace {

using cosmos::auth::v1beta1::BaseAccount;

// Chain ids go into sign bytes and keys of other systems: printable ASCII, no spaces.
absl::Status ValidateChainId(std::string_view chain_id) {
  if (chain_id.empty() || chain_id.size() > 64) {
    return Invalid("chain_id", "'", chain_id.substr(0, 80), "' must be 1..64 bytes");
  }
  for (char c : chain_id) {
    if (c < 0x21 || c > 0x7e) {
      return Invalid("chain_id", "'", chain_id, "' holds a character outside printable ASCII");
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace keeper_util {

std::string KeyName(std::string_view key) {
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos) return common::HexEncode(key);
  return Cat(key.substr(0, slash + 1), common::HexEncode(key.substr(slash + 1)));
}

absl::StatusOr<uint64_t> LoadU64(const KvOverlay& kv, std::string_view key, uint64_t absent) {
  std::optional<std::string> bytes = kv.Get(key);
  if (!bytes.has_value()) return absent;
  return ReadBe64(key, *bytes);
}

absl::StatusOr<uint64_t> StoredAmount(std::string_view what, std::string_view value) {
  auto parsed = common::ParseAmount(what, value);
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  return *parsed;
}

std::string U128ToString(u128 value) {
  if (value == 0) return "0";
  std::string out;
  while (value > 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace keeper_util

std::string Be64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
  return out;
}

absl::StatusOr<uint64_t> ReadBe64(std::string_view key, std::string_view bytes) {
  if (bytes.size() != 8) {
    return absl::DataLossError(
        Cat("state key ", KeyName(key), ": ", bytes.size(), " bytes, want 8"));
  }
  uint64_t value = 0;
  for (char c : bytes) value = (value << 8) | static_cast<uint8_t>(c);
  return value;
}

namespace keys {
namespace {
std::string HeightBytes(int64_t height) { return Be64(static_cast<uint64_t>(height)); }
}  // namespace

std::string Account(std::string_view address) { return Cat(kAccountPrefix, address); }
std::string Balance(std::string_view address) { return Cat(kBalancePrefix, address); }
std::string Epoch(uint64_t epoch) { return Cat(kEpochPrefix, Be64(epoch)); }
std::string Weight(uint64_t epoch, std::string_view address) {
  return Cat(kWeightPrefix, Be64(epoch), address);
}
std::string Proposal(uint64_t id) { return Cat(kProposalPrefix, Be64(id)); }
std::string Vote(uint64_t proposal_id, std::string_view voter) {
  return Cat(kVotePrefix, Be64(proposal_id), voter);
}
std::string Deposit(uint64_t proposal_id, std::string_view depositor) {
  return Cat(kDepositPrefix, Be64(proposal_id), depositor);
}
std::string VotingEnd(int64_t height, uint64_t proposal_id) {
  return Cat(kVotingEndPrefix, HeightBytes(height), Be64(proposal_id));
}
std::string Shard(uint64_t id) { return Cat(kShardPrefix, Be64(id)); }
std::string Member(uint64_t shard_id, std::string_view host) {
  return Cat(kMemberPrefix, Be64(shard_id), host);
}
std::string MemberKey(uint64_t shard_id, std::string_view host) {
  return Cat(kMemberKeyPrefix, Be64(shard_id), host);
}
std::string MemberCount(uint64_t shard_id) { return Cat(kMemberCountPrefix, Be64(shard_id)); }
std::string ReservationDeadline(int64_t height, uint64_t shard_id) {
  return Cat(kReservationDeadlinePrefix, HeightBytes(height), Be64(shard_id));
}
std::string Deadline(int64_t height, uint64_t shard_id) {
  return Cat(kDeadlinePrefix, HeightBytes(height), Be64(shard_id));
}
std::string Settlement(uint64_t shard_id) { return Cat(kSettlementPrefix, Be64(shard_id)); }
}  // namespace keys

absl::StatusOr<SigCache::Recovered> SigCache::Recover(std::string_view digest,
                                                      std::string_view signature) {
  scratch_.assign(digest);
  scratch_.append(signature);
  auto it = recovered_.find(absl::string_view(scratch_));
  if (it != recovered_.end()) return it->second;
  Recovered recovered;
  TS_ASSIGN_OR_RETURN(recovered.public_key, common::RecoverPublicKey(digest, signature));
  recovered.address = common::AddressFromPublicKey(recovered.public_key);
  if (recovered_.size() >= kEntriesMax) recovered_.clear();
  recovered_.emplace(scratch_, recovered);
  return recovered;
}

bool SigCache::Verify(std::string_view member_key, std::string_view digest,
                      std::string_view signature) {
  scratch_.assign(digest);
  scratch_.append(signature);
  scratch_.append(member_key);
  if (verified_.contains(absl::string_view(scratch_))) return true;
  if (!VerifyWithMemberKey(member_key, digest, signature)) return false;
  if (verified_.size() >= kEntriesMax) verified_.clear();
  verified_.insert(scratch_);
  return true;
}

std::string ShardStatusName(pb::ShardStatus status) {
  switch (status) {
    case pb::SHARD_STATUS_PROPOSED:
      return "proposed";
    case pb::SHARD_STATUS_OPEN:
      return "open";
    case pb::SHARD_STATUS_RUNNING:
      return "running";
    case pb::SHARD_STATUS_SETTLED:
      return "settled";
    case pb::SHARD_STATUS_EXPIRED:
      return "expired";
    case pb::SHARD_STATUS_REJECTED:
      return "rejected";
    default:
      return "unspecified";
  }
}

// ---------------------------------------------------------------------------------------------
// Message parsing

namespace {

// Parses `any` as a Msg, refusing unknown fields, and fills `out` with it and its signer.
template <typename Msg, typename SignerOf>
absl::Status ParseInto(std::string_view field, const google::protobuf::Any& any, MsgKind kind,
                       SignerOf signer_of, TxMsg* out) {
  auto msg = std::make_unique<Msg>();
  TS_RETURN_IF_ERROR(ParseMessageStrict(field, any.value(), msg.get()));
  out->signer = signer_of(*msg);
  out->kind = kind;
  out->msg = std::move(msg);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TxMsg> ParseTxMsg(std::string_view field, const google::protobuf::Any& any) {
  TxMsg out;
  out.type_url = any.type_url();
  const std::string& url = any.type_url();
  absl::Status parsed;
  if (url == kMsgSendType) {
    parsed = ParseInto<cosmos::bank::v1beta1::MsgSend>(
        field, any, MsgKind::kSend, [](const auto& m) { return m.from_address(); }, &out);
  } else if (url == kMsgSubmitProposalType) {
    parsed = ParseInto<cosmos::gov::v1::MsgSubmitProposal>(
        field, any, MsgKind::kSubmitProposal, [](const auto& m) { return m.proposer(); }, &out);
  } else if (url == kMsgVoteType) {
    parsed = ParseInto<cosmos::gov::v1::MsgVote>(
        field, any, MsgKind::kVote, [](const auto& m) { return m.voter(); }, &out);
  } else if (url == kMsgDepositType) {
    parsed = ParseInto<cosmos::gov::v1::MsgDeposit>(
        field, any, MsgKind::kDeposit, [](const auto& m) { return m.depositor(); }, &out);
  } else if (url == kMsgSubmitPocWeightsType) {
    parsed = ParseInto<pb::MsgSubmitPocWeights>(
        field, any, MsgKind::kSubmitPocWeights, [](const auto& m) { return m.authority(); }, &out);
  } else if (url == kMsgReserveType) {
    parsed = ParseInto<pb::MsgReserveTrainshard>(
        field, any, MsgKind::kReserve, [](const auto& m) { return m.reservation().host(); }, &out);
  } else if (url == kMsgAssembleType) {
    parsed = ParseInto<pb::MsgAssembleTrainshard>(
        field, any, MsgKind::kAssemble, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kMsgSettleType) {
    parsed = ParseInto<pb::MsgSettleTrainshard>(
        field, any, MsgKind::kSettle, [](const auto& m) { return m.submitter(); }, &out);
  } else if (url == kGonkaAssembleType) {
    parsed = ParseInto<gv0::MsgAssembleTrainshard>(
        field, any, MsgKind::kGonkaAssemble, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kGonkaSettleType) {
    parsed = ParseInto<gv0::MsgSettleTrainshard>(
        field, any, MsgKind::kGonkaSettle, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kGonkaAutokickType) {
    parsed = ParseInto<gv0::MsgAutokickTrainshardNode>(
        field, any, MsgKind::kGonkaAutokick, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kGonkaSetOptInType) {
    parsed = ParseInto<gv0::MsgSetTrainingNodeOptIn>(
        field, any, MsgKind::kGonkaSetOptIn, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kGonkaRefreshOptInType) {
    parsed = ParseInto<gv0::MsgRefreshTrainingNodeOptIn>(
        field, any, MsgKind::kGonkaRefreshOptIn, [](const auto& m) { return m.creator(); }, &out);
  } else if (url == kMsgCreateTrainshardProposalType || url == kGonkaCreateProposalType) {
    return Invalid(field, url,
                   " is executed by governance only: submit it inside a MsgSubmitProposal");
  } else {
    return Invalid(Cat(field, ".type_url"), "'", url.substr(0, 128),
                   "' is not a message this chain accepts");
  }
  TS_RETURN_IF_ERROR(parsed);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Genesis

namespace {

// Checks a list of host weights (valid distinct addresses, positive weights, no overflow),
// copies it into `weights` and returns the total. Errors name `list`[i] and the value.
absl::StatusOr<uint64_t> CheckWeights(std::string_view list,
                                      const google::protobuf::RepeatedPtrField<pb::HostWeight>& in,
                                      std::vector<pb::HostWeight>* weights) {
  std::set<std::string_view> hosts;
  uint64_t total = 0;
  for (int i = 0; i < in.size(); ++i) {
    const auto& weight = in[i];
    std::string field = Cat(list, "[", i, "]");
    TS_RETURN_IF_ERROR(ValidateAddress(Cat(field, ".host"), weight.host()));
    if (!hosts.insert(weight.host()).second) {
      return Invalid(Cat(field, ".host"), weight.host(), " appears twice");
    }
    if (weight.weight() == 0) return Invalid(Cat(field, ".weight"), "0 must be positive");
    TS_ASSIGN_OR_RETURN(total, common::CheckedAdd(Cat(list, ": total"), total, weight.weight()));
    weights->push_back(weight);
  }
  return total;
}

}  // namespace

absl::Status Keeper::InitGenesis() {
  const pb::Genesis& genesis = env_.genesis;
  TS_RETURN_IF_ERROR(ValidateChainId(genesis.chain_id()));
  TS_RETURN_IF_ERROR(ValidateParams(genesis.params()));
  kv_->Set(keys::kGenesisHash, common::Sha256(DeterministicBytes(genesis)));

  std::set<std::string> module_accounts = {env_.gov_address, env_.escrow_address,
                                           env_.community_pool_address};
  std::set<std::string> seen;
  uint64_t supply = 0;
  for (int i = 0; i < genesis.accounts_size(); ++i) {
    const auto& account = genesis.accounts(i);
    std::string field = Cat("accounts[", i, "]");
    TS_RETURN_IF_ERROR(ValidateAddress(Cat(field, ".address"), account.address()));
    if (module_accounts.count(account.address()) > 0) {
      return Invalid(Cat(field, ".address"), account.address(),
                     " is a module account and cannot be funded at genesis");
    }
    if (!seen.insert(account.address()).second) {
      return Invalid(Cat(field, ".address"), account.address(), " appears twice");
    }
    TS_ASSIGN_OR_RETURN(uint64_t balance,
                        common::ParseAmount(Cat(field, ".balance"), account.balance()));
    TS_ASSIGN_OR_RETURN(supply, common::CheckedAdd("accounts: total supply", supply, balance));
    TS_RETURN_IF_ERROR(EnsureAccount(account.address()));
    SetBalance(account.address(), balance);
  }
  // Module accounts come after the genesis accounts in account-number order.
  TS_RETURN_IF_ERROR(EnsureAccount(env_.gov_address));
  TS_RETURN_IF_ERROR(EnsureAccount(env_.escrow_address));
  TS_RETURN_IF_ERROR(EnsureAccount(env_.community_pool_address));
  kv_->Set(keys::kSupply, Be64(supply));

  std::vector<pb::HostWeight> weights;
  TS_RETURN_IF_ERROR(CheckWeights("poc_weights", genesis.poc_weights(), &weights).status());
  kv_->Set(keys::kLatestEpoch, Be64(0));
  return RecordEpoch(0, weights);
}

// ---------------------------------------------------------------------------------------------
// auth and bank

absl::StatusOr<std::optional<BaseAccount>> Keeper::GetAccount(std::string_view address) const {
  return Load<BaseAccount>(*kv_, keys::Account(address));
}

void Keeper::PutAccount(const BaseAccount& account) {
  kv_->Set(keys::Account(account.address()), DeterministicBytes(account));
}

absl::Status Keeper::EnsureAccount(std::string_view address) {
  if (kv_->Contains(keys::Account(address))) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(uint64_t number, LoadU64(*kv_, keys::kNextAccountNumber, 0));
  kv_->Set(keys::kNextAccountNumber, Be64(number + 1));
  BaseAccount account;
  account.set_address(std::string(address));
  account.set_account_number(number);
  PutAccount(account);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Keeper::Balance(std::string_view address) const {
  return BalanceAt(keys::Balance(address));
}

absl::StatusOr<uint64_t> Keeper::BalanceAt(std::string_view key) const {
  const std::string* bytes = kv_->Find(key);
  if (bytes == nullptr) return 0;
  return ReadBe64(key, *bytes);
}

absl::StatusOr<uint64_t> Keeper::Supply() const {
  std::optional<std::string> bytes = kv_->Get(keys::kSupply);
  if (!bytes.has_value()) return absl::DataLossError("state holds no total supply");
  return ReadBe64(keys::kSupply, *bytes);
}

void Keeper::SetBalance(std::string_view address, uint64_t amount) {
  SetBalanceAt(keys::Balance(address), amount);
}

void Keeper::SetBalanceAt(std::string_view key, uint64_t amount) {
  // Zero balances are absent, so the state has one spelling of "nothing".
  if (amount == 0) {
    kv_->Delete(key);
  } else {
    kv_->Set(key, Be64(amount));
  }
}

absl::Status Keeper::Transfer(std::string_view from, std::string_view to, uint64_t amount) {
  if (amount == 0) return absl::OkStatus();
  const std::string from_key = keys::Balance(from);
  TS_ASSIGN_OR_RETURN(uint64_t have, BalanceAt(from_key));
  if (have < amount) {
    return SdkError(SdkCode::kInsufficientFunds,
                    Cat("spendable balance of ", from, " is ", have, common::kDenom,
                        ", smaller than ", amount, common::kDenom));
  }
  SetBalanceAt(from_key, have - amount);
  TS_RETURN_IF_ERROR(Credit(to, amount));
  EmitTransfer(from, to, amount);
  return absl::OkStatus();
}

void Keeper::EmitTransfer(std::string_view from, std::string_view to, uint64_t amount) {
  const std::string coins = Cat(amount, common::kDenom);
  Emit("coin_spent", {{"spender", from}, {"amount", coins}});
  Emit("coin_received", {{"receiver", to}, {"amount", coins}});
  Emit("transfer", {{"recipient", to}, {"sender", from}, {"amount", coins}});
}

void Keeper::EmitMessage(const TxMsg& msg, size_t index) {
  std::string_view module = "trainshard";
  switch (msg.kind) {
    case MsgKind::kSend:
      module = "bank";
      break;
    case MsgKind::kSubmitProposal:
    case MsgKind::kVote:
    case MsgKind::kDeposit:
      module = "gov";
      break;
    default:
      break;
  }
  Emit("message", {{"action", msg.type_url},
                   {"sender", msg.signer},
                   {"module", module},
                   {"msg_index", Cat(index)}});
}

absl::Status Keeper::Credit(std::string_view to, uint64_t amount) {
  const std::string to_key = keys::Balance(to);
  TS_ASSIGN_OR_RETURN(uint64_t to_have, BalanceAt(to_key));
  // Only an account can hold a balance (EnsureAccount runs before any credit), so a recipient
  // with funds needs no second lookup.
  if (to_have == 0) TS_RETURN_IF_ERROR(EnsureAccount(to));
  auto sum = common::CheckedAdd("balance", to_have, amount);
  if (!sum.ok()) return absl::InternalError(sum.status().message());  // bounded by the supply
  SetBalanceAt(to_key, *sum);
  return absl::OkStatus();
}

absl::Status Keeper::Send(const cosmos::bank::v1beta1::MsgSend& msg) {
  // The bank's refusals report as the SDK's (invalid address, invalid coins, unauthorized).
  for (auto [field, address] : {std::pair{"from_address", &msg.from_address()},
                                std::pair{"to_address", &msg.to_address()}}) {
    absl::Status valid = ValidateAddress(field, *address);
    if (!valid.ok()) return SdkError(SdkCode::kInvalidAddress, valid);
  }
  if (msg.to_address() == env_.gov_address || msg.to_address() == env_.escrow_address ||
      msg.to_address() == env_.community_pool_address ||
      msg.to_address() == env_.fee_collector_address) {
    return SdkError(SdkCode::kUnauthorized,
                    Cat("to_address: ", msg.to_address(),
                        " is a module account and is not allowed to receive funds"));
  }
  auto amount = ParseCoins("amount", msg.amount(), /*positive=*/true);
  if (!amount.ok()) return SdkError(SdkCode::kInvalidCoins, amount.status());
  return Transfer(msg.from_address(), msg.to_address(), *amount);
}

// ---------------------------------------------------------------------------------------------
// PoC weights

absl::StatusOr<uint64_t> Keeper::LatestEpoch() const {
  std::optional<std::string> bytes = kv_->Get(keys::kLatestEpoch);
  if (!bytes.has_value()) return absl::DataLossError("state holds no PoC epoch");
  return ReadBe64(keys::kLatestEpoch, *bytes);
}

absl::StatusOr<uint64_t> Keeper::EpochInForce(int64_t height) const {
  uint64_t chain_epoch = static_cast<uint64_t>(height) / params().epoch_length_blocks();
  TS_ASSIGN_OR_RETURN(uint64_t latest, LatestEpoch());
  if (latest <= chain_epoch) return latest;
  // Submissions are at most one epoch ahead, so the one before the latest is in force.
  std::optional<std::string> bytes = kv_->Get(keys::kPreviousEpoch);
  if (!bytes.has_value()) {
    return absl::DataLossError(Cat("latest epoch ", latest, " is ahead of chain epoch ",
                                   chain_epoch, " and no previous epoch is recorded"));
  }
  return ReadBe64(keys::kPreviousEpoch, *bytes);
}

absl::StatusOr<uint64_t> Keeper::Weight(uint64_t epoch, std::string_view host) const {
  return LoadU64(*kv_, keys::Weight(epoch, host), 0);
}

absl::StatusOr<pb::EpochWeights> Keeper::GetEpochWeights(uint64_t epoch, bool with_weights) const {
  TS_ASSIGN_OR_RETURN(auto record, Load<pb::EpochWeights>(*kv_, keys::Epoch(epoch)));
  if (!record.has_value()) {
    return absl::NotFoundError(Cat("epoch ", epoch, " has no recorded weights"));
  }
  if (with_weights) {
    std::string prefix = Cat(keys::kWeightPrefix, Be64(epoch));
    for (const auto& [key, value] : kv_->Scan(prefix)) {
      auto* weight = record->add_weights();
      weight->set_host(key.substr(prefix.size()));
      TS_ASSIGN_OR_RETURN(uint64_t w, ReadBe64(key, value));
      weight->set_weight(w);
    }
  }
  return *record;
}

absl::Status Keeper::RecordEpoch(uint64_t epoch, const std::vector<pb::HostWeight>& weights) {
  uint64_t total = 0;
  for (const auto& weight : weights) {
    kv_->Set(keys::Weight(epoch, weight.host()), Be64(weight.weight()));
    total += weight.weight();  // overflow checked by the callers
  }
  pb::EpochWeights record;
  record.set_epoch(epoch);
  record.set_total_weight(total);
  kv_->Set(keys::Epoch(epoch), DeterministicBytes(record));
  if (epoch > 0) {
    TS_ASSIGN_OR_RETURN(uint64_t latest, LatestEpoch());
    kv_->Set(keys::kPreviousEpoch, Be64(latest));
    kv_->Set(keys::kLatestEpoch, Be64(epoch));
  }
  return absl::OkStatus();
}

absl::Status Keeper::SubmitPocWeights(const pb::MsgSubmitPocWeights& msg) {
  if (msg.authority() != params().poc_authority()) {
    return absl::PermissionDeniedError(Cat(
        "unauthorised: authority ", msg.authority().substr(0, 128), " is not the PoC authority"));
  }
  TS_ASSIGN_OR_RETURN(uint64_t latest, LatestEpoch());
  uint64_t chain_epoch = static_cast<uint64_t>(height_) / params().epoch_length_blocks();
  if (msg.epoch() <= latest) {
    return absl::FailedPreconditionError(
        Cat("epoch: ", msg.epoch(), " is not after the latest recorded epoch ", latest));
  }
  if (msg.epoch() > chain_epoch + 1) {
    return absl::FailedPreconditionError(
        Cat("epoch: ", msg.epoch(), " is more than one epoch ahead of chain epoch ", chain_epoch));
  }
  if (msg.weights_size() == 0) return Invalid("weights", "empty");
  if (static_cast<uint64_t>(msg.weights_size()) > params().max_weights_per_submission()) {
    return Invalid("weights", msg.weights_size(), " entries exceed max_weights_per_submission ",
                   params().max_weights_per_submission());
  }
  std::vector<pb::HostWeight> weights;
  TS_ASSIGN_OR_RETURN(uint64_t total, CheckWeights("weights", msg.weights(), &weights));
  TS_RETURN_IF_ERROR(RecordEpoch(msg.epoch(), weights));
  Emit(protocol::kEventWeightsSubmitted,
       {{"epoch", Cat(msg.epoch())}, {"hosts", Cat(weights.size())}, {"total_weight", Cat(total)}});
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Dispatch and end of block

namespace {

bool IsGonkaKind(MsgKind kind) {
  switch (kind) {
    case MsgKind::kGonkaAssemble:
    case MsgKind::kGonkaSettle:
    case MsgKind::kGonkaAutokick:
    case MsgKind::kGonkaSetOptIn:
    case MsgKind::kGonkaRefreshOptIn:
      return true;
    default:
      return false;
  }
}

bool IsModuleShardKind(MsgKind kind) {
  return kind == MsgKind::kReserve || kind == MsgKind::kAssemble || kind == MsgKind::kSettle;
}

}  // namespace

absl::Status Keeper::Execute(TxMsg* msg_ptr) {
  const TxMsg& msg = *msg_ptr;
  // Either module runs, as the genesis says: the other's shard messages are refused.
  if (IsGonkaKind(msg.kind) && env_.gonka_v0 == nullptr) {
    return absl::FailedPreconditionError(
        Cat(msg.type_url, ": this chain runs the trainshard module, not Gonka's trainshards v0 ",
            "(genesis.gonka_v0 is unset)"));
  }
  if (IsModuleShardKind(msg.kind) && env_.gonka_v0 != nullptr) {
    return absl::FailedPreconditionError(
        Cat(msg.type_url, ": this chain runs Gonka's trainshards v0 (genesis.gonka_v0), not the ",
            "trainshard module"));
  }
  if (IsGonkaKind(msg.kind)) return ExecuteGonka(msg);
  switch (msg.kind) {
    case MsgKind::kSend:
      return Send(static_cast<const cosmos::bank::v1beta1::MsgSend&>(*msg.msg));
    case MsgKind::kSubmitProposal:
      return SubmitProposal(static_cast<const cosmos::gov::v1::MsgSubmitProposal&>(*msg.msg));
    case MsgKind::kVote:
      return Vote(static_cast<const cosmos::gov::v1::MsgVote&>(*msg.msg));
    case MsgKind::kDeposit:
      return Deposit(static_cast<const cosmos::gov::v1::MsgDeposit&>(*msg.msg));
    case MsgKind::kSubmitPocWeights:
      return SubmitPocWeights(static_cast<const pb::MsgSubmitPocWeights&>(*msg.msg));
    case MsgKind::kReserve:
      return Reserve(static_cast<const pb::MsgReserveTrainshard&>(*msg.msg));
    case MsgKind::kAssemble:
      return Assemble(static_cast<const pb::MsgAssembleTrainshard&>(*msg.msg));
    case MsgKind::kSettle:
      return Settle(static_cast<pb::MsgSettleTrainshard*>(msg_ptr->msg.get()));
    default:
      break;
  }
  return absl::InternalError("unknown message kind");
}

absl::Status Keeper::ExecuteGonka(const TxMsg& msg) {
  GonkaV0Keeper gonka(*env_.gonka_v0, kv_, height_, events_);
  absl::Status status;
  switch (msg.kind) {
    case MsgKind::kGonkaAssemble:
      status = gonka.Assemble(static_cast<const gv0::MsgAssembleTrainshard&>(*msg.msg)).status();
      break;
    case MsgKind::kGonkaSettle:
      status = gonka.Settle(static_cast<const gv0::MsgSettleTrainshard&>(*msg.msg));
      break;
    case MsgKind::kGonkaAutokick:
      status = gonka.Autokick(static_cast<const gv0::MsgAutokickTrainshardNode&>(*msg.msg));
      break;
    case MsgKind::kGonkaSetOptIn:
      status = gonka.SetOptIn(static_cast<const gv0::MsgSetTrainingNodeOptIn&>(*msg.msg));
      break;
    default:
      status = gonka.RefreshOptIn(static_cast<const gv0::MsgRefreshTrainingNodeOptIn&>(*msg.msg))
                   .status();
  }
  // Gonka's own refusals report in its codespace with its numbers, as its node reports them.
  if (std::optional<uint32_t> code = GonkaV0CodeOf(status); code.has_value()) {
    return WithCodespace(std::move(status), kGonkaV0Codespace, *code);
  }
  return status;
}

absl::Status Keeper::EndBlock() {
  std::string at = Be64(static_cast<uint64_t>(height_));
  auto ids_under = [&](std::string_view prefix) -> absl::StatusOr<std::vector<uint64_t>> {
    std::string full = Cat(prefix, at);
    std::vector<uint64_t> ids;
    for (const auto& [key, value] : kv_->Scan(full)) {
      TS_ASSIGN_OR_RETURN(uint64_t id, ReadBe64(key, std::string_view(key).substr(full.size())));
      ids.push_back(id);
    }
    return ids;
  };
  TS_ASSIGN_OR_RETURN(std::vector<uint64_t> proposals, ids_under(keys::kVotingEndPrefix));
  for (uint64_t id : proposals) TS_RETURN_IF_ERROR(Tally(id));
  TS_ASSIGN_OR_RETURN(std::vector<uint64_t> reservation_ends,
                      ids_under(keys::kReservationDeadlinePrefix));
  for (uint64_t id : reservation_ends) TS_RETURN_IF_ERROR(ReservationDeadline(id));
  TS_ASSIGN_OR_RETURN(std::vector<uint64_t> deadlines, ids_under(keys::kDeadlinePrefix));
  for (uint64_t id : deadlines) TS_RETURN_IF_ERROR(Deadline(id));
  if (env_.gonka_v0 != nullptr) {
    TS_RETURN_IF_ERROR(GonkaV0Keeper(*env_.gonka_v0, kv_, height_, events_).EndBlock());
  }
  return absl::OkStatus();
}

void Keeper::Emit(std::string_view type,
                  std::initializer_list<std::pair<std::string_view, std::string_view>> attributes) {
  AppendEvent(events_, type, attributes);
}

void AppendEvent(Events* events, std::string_view type,
                 std::initializer_list<std::pair<std::string_view, std::string_view>> attributes) {
  tendermint::abci::Event& event = events->emplace_back();
  event.set_type(std::string(type));
  event.mutable_attributes()->Reserve(static_cast<int>(attributes.size()));
  for (const auto& [key, value] : attributes) {
    auto* attribute = event.add_attributes();
    attribute->set_key(std::string(key));
    attribute->set_value(std::string(value));
    attribute->set_index(true);
  }
}

}  // namespace ts::bridge
