#include "chain-bridge/module/app.h"

#include <utility>

#include <algorithm>

#include "absl/strings/escaping.h"
#include "chain-bridge/module/gas.h"
#include "chain-bridge/module/gonka_v0.h"
#include "chain-bridge/module/keeper.h"
#include "chain-bridge/module/kv_overlay.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"

namespace ts::bridge {
namespace {

using cosmos::base::abci::v1beta1::TxResponse;

void AppendU32Be(std::string* out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// SHA256 over the sorted change set: u32be(len key) key u8(present) [u32be(len value) value].
// Everything but the value goes through one reused buffer, so each change is two updates.
std::string ChangesDigest(const std::vector<StateChange>& changes) {
  common::Sha256Hasher hasher;
  std::string head;
  for (const auto& change : changes) {
    head.clear();
    AppendU32Be(&head, static_cast<uint32_t>(change.key.size()));
    head.append(change.key);
    head.push_back(change.value.has_value() ? '\x01' : '\x00');
    if (change.value.has_value()) {
      AppendU32Be(&head, static_cast<uint32_t>(change.value->size()));
    }
    hasher.Update(head);
    if (change.value.has_value()) hasher.Update(*change.value);
  }
  return hasher.Finish();
}

std::string NextAppHash(std::string_view previous, int64_t height,
                        const std::vector<StateChange>& changes) {
  return common::Sha256(Cat(previous, Be64(static_cast<uint64_t>(height)), ChangesDigest(changes)));
}

absl::StatusOr<ChainEnv> MakeEnv(const pb::Genesis& genesis) {
  ChainEnv env;
  env.genesis = genesis;
  TS_RETURN_IF_ERROR(ValidateParams(genesis.params()));
  TS_ASSIGN_OR_RETURN(env.min_deposit,
                      common::ParseAmount("params.min_deposit", genesis.params().min_deposit()));
  env.gov_address = common::ModuleAddress(kGovModule);
  env.escrow_address = common::ModuleAddress(kEscrowModule);
  env.community_pool_address = common::ModuleAddress(kCommunityPoolModule);
  env.fee_collector_address = common::ModuleAddress(kFeeCollectorModule);
  TS_ASSIGN_OR_RETURN(env.min_gas_price,
                      ParseGasPrice("params.min_gas_price", genesis.params().min_gas_price()));
  if (genesis.has_gonka_v0()) {
    auto gonka = std::make_shared<GonkaV0Env>();
    gonka->params = genesis.gonka_v0().params();
    gonka->authority = env.gov_address;
    for (const auto& node : genesis.gonka_v0().ml_nodes()) {
      gonka->ml_nodes.push_back(GonkaMlNode{node.participant(), node.node_id(), node.model_id(),
                                            node.gpu_profile_id(), node.poc_weight()});
    }
    for (const auto& guardian : genesis.gonka_v0().guardians()) gonka->guardians.insert(guardian);
    absl::Status valid = GonkaV0Keeper::ValidateEnv(*gonka);
    if (valid.ok()) {
      valid = GonkaV0Keeper::ValidateParams(
          gonka->params, static_cast<int64_t>(genesis.params().epoch_length_blocks()));
    }
    if (!valid.ok()) return PrefixStatus("gonka_v0: ", valid);
    env.gonka_v0 = std::move(gonka);
  }
  return env;
}

enum class RunMode { kCheck, kDeliver, kSimulate };

void SetError(TxResponse* response, const absl::Status& status) {
  TxCode code = TxCodeOf(status);
  response->set_codespace(code.codespace);
  response->set_code(code.code);
  response->set_raw_log(std::string(status.message()));
  response->clear_events();
}

}  // namespace

struct App::Impl {
  ChainEnv env;
  SigCache sig_cache;
  KvState state;
  int64_t height = 0;
  std::string app_hash = std::string(common::kSha256Size, '\0');
  // Txs accepted by CheckTx since the last Commit, over the finalized state.
  std::unique_ptr<KvOverlay> check;

  // Runs one tx in branches of `parent` at `height`, metering its gas. On success the tx's
  // writes are folded into `parent`; on a message failure only the ante writes (the fee and
  // the sequence bump) are, and only in delivery (CheckTx refuses such a tx outright).
  TxResponse RunTx(KvOverlay* parent, std::string_view tx_bytes, int64_t height, RunMode mode);
  // The ante step: caps, fee, account, sequence, signature (not in a simulation: its gas is
  // charged all the same), then the fee paid and the sequence bumped; `msgs` gets the parsed
  // messages.
  absl::Status Ante(Keeper& keeper, KvOverlay& kv, const DecodedTx& tx, size_t tx_size,
                    int64_t height, RunMode mode, std::vector<TxMsg>* msgs);
  // Queries read through a keeper that emits nothing.
  mutable Events query_events;
  Keeper ReadKeeper(KvOverlay* kv) const { return Keeper(env, kv, height, &query_events); }
};

absl::Status App::Impl::Ante(Keeper& keeper, KvOverlay& kv, const DecodedTx& tx, size_t tx_size,
                             int64_t height, RunMode mode, std::vector<TxMsg>* msgs) {
  const bool simulate = mode == RunMode::kSimulate;
  if (tx.body.memo().size() > kMaxMemoBytes) {
    return SdkError(SdkCode::kMemoTooLarge,
                    Cat("tx.body.memo: ", tx.body.memo().size(), " bytes exceed ", kMaxMemoBytes));
  }
  if (tx.body.timeout_height() != 0 && static_cast<uint64_t>(height) > tx.body.timeout_height()) {
    return SdkError(
        SdkCode::kTxTimeoutHeight,
        Cat("tx.body.timeout_height: ", tx.body.timeout_height(), " is below height ", height));
  }
  const uint64_t gas_limit = tx.auth_info.fee().gas_limit();
  if (!simulate) {
    if (gas_limit > kMaxTxGas) {
      return SdkError(SdkCode::kInvalidGasLimit, Cat("tx.auth_info.fee.gas_limit: ", gas_limit,
                                                     " exceeds the cap of ", kMaxTxGas));
    }
    uint64_t required = RequiredFee(env.min_gas_price, gas_limit);
    if (tx.fee_amount < required) {
      return SdkError(
          SdkCode::kInsufficientFee,
          Cat("insufficient fees; got: ", tx.fee_amount, common::kDenom, " required: ", required,
              common::kDenom, " (gas limit ", gas_limit, " at the minimum gas price of ",
              env.genesis.params().min_gas_price(), common::kDenom, ")"));
    }
  }
  kv.ConsumeGas(gas::kTxSizePerByte * tx_size, "txSize");
  for (int i = 0; i < tx.body.messages_size(); ++i) {
    auto msg = ParseTxMsg(Cat("tx.body.messages[", i, "]"), tx.body.messages(i));
    if (!msg.ok()) return SdkError(SdkCode::kTxDecode, msg.status());
    msgs->push_back(*std::move(msg));
  }
  const auto& signer_info = tx.auth_info.signer_infos(0);
  cosmos::crypto::secp256k1::PubKey pub;
  pub.ParseFromString(signer_info.public_key().value());  // checked by DecodeTx
  std::string signer = common::AddressFromPublicKey(pub.key());

  TS_ASSIGN_OR_RETURN(auto account, keeper.GetAccount(signer));
  if (!account.has_value()) {
    return SdkError(
        SdkCode::kUnknownAddress,
        Cat("account ", signer, " not found: it must receive funds before it can sign"));
  }
  if (account->has_pub_key()) {
    cosmos::crypto::secp256k1::PubKey stored;
    if (!stored.ParseFromString(account->pub_key().value()) || stored.key() != pub.key()) {
      return SdkError(SdkCode::kInvalidPubKey,
                      Cat("public key does not match the one recorded for ", signer));
    }
  }
  if (signer_info.sequence() != account->sequence()) {
    return SdkError(SdkCode::kWrongSequence,
                    Cat("account sequence mismatch, expected ", account->sequence(), ", got ",
                        signer_info.sequence()));
  }
  for (size_t i = 0; i < msgs->size(); ++i) {
    const TxMsg& msg = (*msgs)[i];
    if (msg.signer != signer) {
      return SdkError(SdkCode::kUnauthorized,
                      Cat("tx.body.messages[", i, "] (", msg.type_url, "): signer '",
                          msg.signer.substr(0, 128), "' is not the tx signer ", signer));
    }
  }
  kv.ConsumeGas(gas::kDeductFee, "DeductFee");
  if (tx.fee_amount > 0) {
    GasMeter* meter = kv.gas_meter();
    kv.set_gas_meter(nullptr);  // charged flat above
    absl::Status paid = keeper.Transfer(signer, env.fee_collector_address, tx.fee_amount);
    kv.set_gas_meter(meter);
    if (!paid.ok()) return PrefixStatus("fee: ", paid);
  }
  kv.ConsumeGas(gas::kSigVerifySecp256k1, "ante verify: secp256k1");
  if (!simulate) {
    auto sign_bytes = SignBytes(tx, env.genesis.chain_id(), account->account_number());
    if (!sign_bytes.ok()) return SdkError(SdkCode::kTxDecode, sign_bytes.status());
    if (!common::VerifyCompact(pub.key(), common::Sha256(*sign_bytes), tx.raw.signatures(0)).ok()) {
      return SdkError(SdkCode::kUnauthorized,
                      Cat("signature verification failed; please verify account number (",
                          account->account_number(), ") and chain-id (", env.genesis.chain_id(),
                          ") for ", signer));
    }
  }
  if (!account->has_pub_key()) *account->mutable_pub_key() = PackMsg(pub);
  account->set_sequence(account->sequence() + 1);
  keeper.PutAccount(*account);
  keeper.Emit("tx", {{"fee", tx.fee_amount == 0 ? "" : Cat(tx.fee_amount, common::kDenom)},
                     {"fee_payer", signer}});
  keeper.Emit("tx", {{"acc_seq", Cat(signer, "/", signer_info.sequence())}});
  keeper.Emit("tx", {{"signature", absl::Base64Escape(tx.raw.signatures(0))}});
  return absl::OkStatus();
}

TxResponse App::Impl::RunTx(KvOverlay* parent, std::string_view tx_bytes, int64_t height,
                            RunMode mode) {
  TxResponse response;
  response.set_txhash(TxHash(tx_bytes));
  auto decoded =
      DecodeTx(tx_bytes, mode == RunMode::kSimulate ? DecodeMode::kSimulate : DecodeMode::kSigned);
  if (!decoded.ok()) {
    SetError(&response, decoded.status());
    return response;
  }
  const uint64_t gas_limit = decoded->auth_info.fee().gas_limit();
  response.set_gas_wanted(static_cast<int64_t>(std::min<uint64_t>(gas_limit, INT64_MAX)));
  // A simulation measures: its meter has no limit.
  GasMeter meter(mode == RunMode::kSimulate ? UINT64_MAX : gas_limit);
  auto finish = [&](const absl::Status& status) {
    response.set_gas_used(static_cast<int64_t>(std::min<uint64_t>(meter.consumed(), INT64_MAX)));
    if (!status.ok()) SetError(&response, status);
  };
  KvOverlay ante_kv(parent);
  ante_kv.set_gas_meter(&meter);
  Events ante_events;
  Keeper ante_keeper(env, &ante_kv, height, &ante_events);
  std::vector<TxMsg> msgs;
  absl::Status ante = Ante(ante_keeper, ante_kv, *decoded, tx_bytes.size(), height, mode, &msgs);
  if (ante.ok() && meter.exhausted()) ante = meter.OutOfGas();
  if (!ante.ok()) {
    finish(ante);
    return response;
  }
  KvOverlay msg_kv(&ante_kv);
  Events events;
  Keeper keeper(env, &msg_kv, height, &events);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const size_t first = events.size();
    keeper.EmitMessage(msgs[i], i);
    absl::Status status = keeper.Execute(&msgs[i]);
    if (status.ok() && meter.exhausted()) status = meter.OutOfGas();
    if (!status.ok()) {
      if (msgs.size() > 1) {
        status = PrefixStatus(Cat("message ", i, " (", msgs[i].type_url, "): "), status);
      }
      finish(status);
      // Delivery keeps what the ante step did (the fee and the sequence), as Cosmos does, and
      // reports its events.
      if (mode == RunMode::kDeliver) {
        ante_kv.Commit();
        for (auto& event : ante_events) *response.add_events() = std::move(event);
      }
      return response;
    }
    // The SDK marks every event a message emitted with the message's index.
    for (size_t e = first + 1; e < events.size(); ++e) {
      auto* attribute = events[e].add_attributes();
      attribute->set_key("msg_index");
      attribute->set_value(Cat(i));
      attribute->set_index(true);
    }
  }
  finish(absl::OkStatus());
  msg_kv.Commit();
  ante_kv.Commit();
  for (auto& event : ante_events) *response.add_events() = std::move(event);
  for (auto& event : events) *response.add_events() = std::move(event);
  return response;
}

App::App(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
App::~App() = default;

absl::StatusOr<std::unique_ptr<App>> App::InitChain(const pb::Genesis& genesis) {
  auto impl = std::make_unique<Impl>();
  TS_ASSIGN_OR_RETURN(impl->env, MakeEnv(genesis));
  impl->env.sig_cache = &impl->sig_cache;
  KvOverlay kv(&impl->state);
  Events events;
  Keeper keeper(impl->env, &kv, 0, &events);
  TS_RETURN_IF_ERROR(keeper.InitGenesis());
  KvState::Map state;
  for (const auto& [key, value] : kv.writes()) {
    if (value.has_value()) state.emplace(key, *value);
  }
  impl->state.Assign(std::move(state));
  impl->check = std::make_unique<KvOverlay>(&impl->state);
  return std::unique_ptr<App>(new App(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<App>> App::Restore(const pb::Genesis& genesis,
                                                  std::map<std::string, std::string> state,
                                                  int64_t height, std::string app_hash) {
  auto impl = std::make_unique<Impl>();
  TS_ASSIGN_OR_RETURN(impl->env, MakeEnv(genesis));
  impl->env.sig_cache = &impl->sig_cache;
  if (height < 0) return absl::InvalidArgumentError(Cat("height: ", height, " < 0"));
  if (app_hash.size() != common::kSha256Size) {
    return absl::InvalidArgumentError(
        Cat("app_hash: ", app_hash.size(), " bytes, want ", common::kSha256Size));
  }
  auto stored = state.find(std::string(keys::kGenesisHash));
  if (stored == state.end() || stored->second != common::Sha256(DeterministicBytes(genesis))) {
    return absl::InvalidArgumentError(
        "genesis: does not match the genesis the persisted state was created from");
  }
  impl->state.Assign(std::move(state));
  impl->height = height;
  impl->app_hash = std::move(app_hash);
  impl->check = std::make_unique<KvOverlay>(&impl->state);
  return std::unique_ptr<App>(new App(std::move(impl)));
}

cosmos::base::abci::v1beta1::TxResponse App::CheckTx(std::string_view tx_bytes) {
  return impl_->RunTx(impl_->check.get(), tx_bytes, impl_->height + 1, RunMode::kCheck);
}

cosmos::base::abci::v1beta1::TxResponse App::Simulate(std::string_view tx_bytes) {
  KvOverlay scratch(impl_->check.get());
  return impl_->RunTx(&scratch, tx_bytes, impl_->height + 1, RunMode::kSimulate);
}

absl::StatusOr<BlockOutcome> App::FinalizeBlock(const tendermint::types::Header& header,
                                                const std::vector<std::string>& txs) {
  Impl& impl = *impl_;
  if (header.height() != impl.height + 1) {
    return absl::InvalidArgumentError(
        Cat("header.height: ", header.height(), " is not the next height ", impl.height + 1));
  }
  if (!header.chain_id().empty() && header.chain_id() != impl.env.genesis.chain_id()) {
    return absl::InvalidArgumentError(Cat("header.chain_id: '", header.chain_id(),
                                          "' is not this chain '", impl.env.genesis.chain_id(),
                                          "'"));
  }
  if (txs.size() > kMaxTxsPerBlock) {
    return absl::InvalidArgumentError(
        Cat("txs: ", txs.size(), " txs exceed the cap of ", kMaxTxsPerBlock));
  }
  const int64_t height = header.height();
  BlockOutcome outcome;
  outcome.results.set_height(height);
  KvOverlay block(&impl.state);
  for (const auto& tx : txs) {
    TxResponse response = impl.RunTx(&block, tx, height, RunMode::kDeliver);
    response.set_height(height);
    *outcome.results.add_tx_results() = std::move(response);
  }
  Events end_events;
  Keeper keeper(impl.env, &block, height, &end_events);
  TS_RETURN_IF_ERROR(keeper.EndBlock());
  for (auto& event : end_events) *outcome.results.add_end_block_events() = std::move(event);

  // The change set: what differs from the previous block's state, in key order, applied to the
  // state as it is found (nothing can fail from here on). The block's writes are moved into
  // it, not copied.
  KvOverlay::Writes writes = block.TakeWrites();
  outcome.changes.reserve(writes.size());
  for (auto& [key, value] : writes) {
    if (!impl.state.Apply(key, value)) continue;
    outcome.changes.push_back(StateChange{key, std::move(value)});
  }
  std::string app_hash = NextAppHash(impl.app_hash, height, outcome.changes);
  impl.height = height;
  impl.app_hash = app_hash;
  outcome.results.set_app_hash(app_hash);
  return outcome;
}

void App::Commit() { impl_->check = std::make_unique<KvOverlay>(&impl_->state); }

int64_t App::height() const { return impl_->height; }
const std::string& App::app_hash() const { return impl_->app_hash; }
const pb::Genesis& App::genesis() const { return impl_->env.genesis; }
std::string App::chain_id() const { return impl_->env.genesis.chain_id(); }

absl::StatusOr<pb::Shard> App::GetShard(uint64_t shard_id) const {
  KvOverlay kv(&impl_->state);
  return impl_->ReadKeeper(&kv).GetShard(shard_id, /*with_members=*/true);
}

std::vector<pb::Shard> App::ListShards(pb::ShardStatus status, uint64_t start_after_id,
                                       uint32_t limit) const {
  constexpr uint32_t kDefaultLimit = 100;
  constexpr uint32_t kLimitMax = 1000;
  if (limit == 0) limit = kDefaultLimit;
  if (limit > kLimitMax) limit = kLimitMax;
  std::vector<pb::Shard> out;
  if (start_after_id == UINT64_MAX) return out;
  KvOverlay kv(&impl_->state);
  Keeper keeper = impl_->ReadKeeper(&kv);
  const KvState::Map& state = impl_->state.map();
  auto begin = state.lower_bound(keys::Shard(start_after_id + 1));
  for (auto it = begin; it != state.end() && out.size() < limit; ++it) {
    std::string_view key = it->first;
    if (key.substr(0, keys::kShardPrefix.size()) != keys::kShardPrefix) break;
    auto id = ReadBe64(key, key.substr(keys::kShardPrefix.size()));
    if (!id.ok()) continue;
    pb::Shard record;
    if (!record.ParseFromString(it->second)) continue;
    if (status != pb::SHARD_STATUS_UNSPECIFIED && record.status() != status) continue;
    auto shard = keeper.GetShard(*id, /*with_members=*/true);
    if (shard.ok()) out.push_back(*std::move(shard));
  }
  return out;
}

absl::StatusOr<pb::SettlementRecord> App::GetSettlement(uint64_t shard_id) const {
  KvOverlay kv(&impl_->state);
  return impl_->ReadKeeper(&kv).GetSettlement(shard_id);
}

namespace {

absl::Status NotGonka() {
  return absl::FailedPreconditionError(
      "this chain runs the trainshard module, not Gonka's trainshards v0 (genesis.gonka_v0 is "
      "unset)");
}

}  // namespace

absl::StatusOr<gv0::QueryGetTrainshardResponse> App::GonkaTrainshard(uint64_t id) const {
  if (impl_->env.gonka_v0 == nullptr) return NotGonka();
  KvOverlay kv(&impl_->state);
  Events events;
  return GonkaV0Keeper(*impl_->env.gonka_v0, &kv, impl_->height, &events).GetTrainshard(id);
}

absl::StatusOr<gv0::QueryActiveTrainshardsResponse> App::GonkaActiveTrainshards() const {
  if (impl_->env.gonka_v0 == nullptr) return NotGonka();
  KvOverlay kv(&impl_->state);
  Events events;
  return GonkaV0Keeper(*impl_->env.gonka_v0, &kv, impl_->height, &events).ActiveTrainshards();
}

absl::StatusOr<gv0::QueryGetTrainshardProposalResponse> App::GonkaProposal(uint64_t id) const {
  if (impl_->env.gonka_v0 == nullptr) return NotGonka();
  KvOverlay kv(&impl_->state);
  Events events;
  return GonkaV0Keeper(*impl_->env.gonka_v0, &kv, impl_->height, &events).GetProposal(id);
}

absl::StatusOr<pb::EpochWeights> App::GetWeights(uint64_t epoch) const {
  KvOverlay kv(&impl_->state);
  return impl_->ReadKeeper(&kv).GetEpochWeights(epoch, /*with_weights=*/true);
}

uint64_t App::CurrentEpoch() const {
  KvOverlay kv(&impl_->state);
  auto epoch = impl_->ReadKeeper(&kv).EpochInForce(impl_->height);
  return epoch.ok() ? *epoch : 0;
}

absl::StatusOr<pb::Proposal> App::GetProposal(uint64_t proposal_id) const {
  KvOverlay kv(&impl_->state);
  return impl_->ReadKeeper(&kv).GetProposal(proposal_id);
}

uint64_t App::Balance(std::string_view address) const {
  KvOverlay kv(&impl_->state);
  auto balance = impl_->ReadKeeper(&kv).Balance(address);
  return balance.ok() ? *balance : 0;
}

uint64_t App::TotalSupply() const {
  KvOverlay kv(&impl_->state);
  auto supply = impl_->ReadKeeper(&kv).Supply();
  return supply.ok() ? *supply : 0;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> App::Account(std::string_view address) const {
  KvOverlay kv(&impl_->state);
  TS_ASSIGN_OR_RETURN(auto account, impl_->ReadKeeper(&kv).GetAccount(address));
  if (!account.has_value()) {
    return absl::NotFoundError(Cat("account ", address.substr(0, 128), " not found"));
  }
  return std::make_pair(account->account_number(), account->sequence());
}

std::string App::AccountPublicKey(std::string_view address) const {
  KvOverlay kv(&impl_->state);
  auto account = impl_->ReadKeeper(&kv).GetAccount(address);
  if (!account.ok() || !account->has_value() || !(*account)->has_pub_key()) return "";
  cosmos::crypto::secp256k1::PubKey pub;
  if (!pub.ParseFromString((*account)->pub_key().value())) return "";
  return pub.key();
}

std::string App::GovAddress() const { return impl_->env.gov_address; }
std::string App::EscrowAddress() const { return impl_->env.escrow_address; }
std::string App::FeeCollectorAddress() const { return impl_->env.fee_collector_address; }

const std::map<std::string, std::string>& App::state() const { return impl_->state.map(); }

}  // namespace ts::bridge
