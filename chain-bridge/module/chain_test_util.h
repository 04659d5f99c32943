// The chain module's test fixture (app_test.cc, settlement_test.cc): a chain under test with
// its accounts, proposal and shard helpers, and the module's invariants checked after every
// block. Test-only.
#ifndef TS_CHAIN_BRIDGE_MODULE_CHAIN_TEST_UTIL_H_
#define TS_CHAIN_BRIDGE_MODULE_CHAIN_TEST_UTIL_H_

#include "chain-bridge/module/app.h"
#include "chain-bridge/module/gas.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chain-bridge/module/keeper.h"
#include "chain-bridge/module/member_key.h"
#include "chain-bridge/module/proto_util.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/validation.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
namespace ts::bridge::chain_test {

using cosmos::base::abci::v1beta1::TxResponse;
using ::testing::HasSubstr;

constexpr char kChainId[] = "trainshard-test-1";
constexpr uint64_t kTestGasLimit = 2'000'000;
constexpr uint32_t kOk = 0;
constexpr uint32_t kInvalidArgument = 3;
constexpr uint32_t kNotFound = 5;
constexpr uint32_t kAlreadyExists = 6;
constexpr uint32_t kPermissionDenied = 7;
constexpr uint32_t kResourceExhausted = 8;
constexpr uint32_t kFailedPrecondition = 9;
constexpr uint32_t kUnauthenticated = 16;

// What a refused tx reports: this module's codespace and an absl::StatusCode number, or the
// SDK's codespace and number (Sdk()).
struct Refusal {
  Refusal(uint32_t module_code) : codespace(kCodespace), code(module_code) {}  // NOLINT
  Refusal(std::string_view space, uint32_t number) : codespace(space), code(number) {}
  std::string codespace;
  uint32_t code;
};
inline Refusal Sdk(SdkCode code) { return Refusal(kSdkCodespace, static_cast<uint32_t>(code)); }

inline common::PrivateKey Key(const std::string& name) {
  return common::PrivateKey::FromBytes(common::Sha256("test-key/" + name)).value();
}
inline std::string Addr(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

inline std::map<std::string, std::string> Attributes(const tendermint::abci::Event& event) {
  std::map<std::string, std::string> out;
  for (const auto& attribute : event.attributes()) out[attribute.key()] = attribute.value();
  return out;
}

// All events of a given type, in order.
inline std::vector<std::map<std::string, std::string>> EventsOf(
    const google::protobuf::RepeatedPtrField<tendermint::abci::Event>& events,
    const std::string& type) {
  std::vector<std::map<std::string, std::string>> out;
  for (const auto& event : events) {
    if (event.type() == type) out.push_back(Attributes(event));
  }
  return out;
}

inline pb::ShardSpec DefaultSpec() {
  pb::ShardSpec spec;
  spec.set_run_spec_hash(common::Sha256("run spec"));
  spec.set_hardware_profile("cpu-small");
  spec.set_min_nodes(2);
  spec.set_max_nodes(3);
  spec.set_min_host_weight(60);
  spec.set_max_duration_blocks(40);
  spec.mutable_escrow()->set_denom("ngonka");
  spec.mutable_escrow()->set_amount("900000");
  spec.mutable_artifact_quota()->set_bytes_max(1 << 20);
  spec.mutable_artifact_quota()->set_files_max(100);
  spec.mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_VERIFIED_WORK);
  spec.mutable_reward_policy()->set_max_host_share_bps(5000);
  spec.set_reservation_window_blocks(10);
  return spec;
}

// A chain under test: genesis with a creator, five hosts with PoC weight, an outsider without
// weight, the PoC authority and an account too poor to fund an escrow. Every block is followed
// by the module's invariants.
class ChainTest : public ::testing::Test {
 protected:
  ChainTest()
      : creator_(Key("creator")),
        poor_(Key("poor")),
        outsider_(Key("outsider")),
        authority_(Key("authority")) {
    for (int i = 1; i <= 5; ++i) hosts_.push_back(Key("host" + std::to_string(i)));
  }

  void SetUp() override {
    genesis_ = MakeGenesis(kChainId);
    auto app = App::InitChain(genesis_);
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
    CheckInvariants();
  }

  pb::Genesis MakeGenesis(const std::string& chain_id) {
    pb::Genesis genesis;
    genesis.set_chain_id(chain_id);
    auto* params = genesis.mutable_params();
    params->set_epoch_length_blocks(10);
    params->set_voting_period_blocks(3);
    params->set_min_deposit("1000");
    params->set_quorum_ppm(334000);
    params->set_threshold_ppm(500000);
    params->set_veto_threshold_ppm(334000);
    params->set_poc_authority(Addr(authority_));
    params->set_max_nodes_limit(16);
    params->set_max_weights_per_submission(100);
    params->set_max_duration_blocks_limit(1000);
    auto add_account = [&](const common::PrivateKey& key, const std::string& balance) {
      auto* account = genesis.add_accounts();
      account->set_address(Addr(key));
      account->set_balance(balance);
    };
    add_account(creator_, "10000000");
    add_account(poor_, "5000");
    add_account(outsider_, "1000");
    add_account(authority_, "1000");
    for (const auto& host : hosts_) add_account(host, "1000");
    // Four hosts of weight 100 and one of 50 (below the default spec's floor of 60).
    for (size_t i = 0; i < hosts_.size(); ++i) {
      auto* weight = genesis.add_poc_weights();
      weight->set_host(Addr(hosts_[i]));
      weight->set_weight(i == 4 ? 50 : 100);
    }
    return genesis;
  }

  // The test's txs ask for kTestGasLimit and pay the genesis's minimum gas price for it.
  TxFee TestFee() const {
    auto price = ParseGasPrice("min_gas_price", genesis_.params().min_gas_price());
    EXPECT_TRUE(price.ok()) << price.status();
    return TxFee{kTestGasLimit, price.ok() ? RequiredFee(*price, kTestGasLimit) : 0};
  }

  // Signs msgs with the account's number and finalized sequence (plus `sequence_offset`).
  std::string SignTx(const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
                     int64_t sequence_offset = 0, const std::string& chain_id = kChainId) {
    auto account = app_->Account(Addr(key));
    EXPECT_TRUE(account.ok()) << account.status();
    if (!account.ok()) return "";
    return BuildSignedTx(key, chain_id, account->first,
                         account->second + static_cast<uint64_t>(sequence_offset), msgs, TestFee());
  }

  // Finalizes a block of txs, commits, and checks the invariants.
  BlockOutcome Block(const std::vector<std::string>& txs = {}) {
    tendermint::types::Header header;
    header.set_chain_id(kChainId);
    header.set_height(app_->height() + 1);
    auto outcome = app_->FinalizeBlock(header, txs);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    app_->Commit();
    blocks_.push_back(txs);
    CheckInvariants();
    last_ = outcome.ok() ? *outcome : BlockOutcome{};
    return last_;
  }

  void AdvanceTo(int64_t height) {
    while (app_->height() < height) Block();
  }

  // CheckTx must accept the tx; then it is delivered alone in a block and must succeed.
  TxResponse Deliver(const common::PrivateKey& key,
                     const std::vector<google::protobuf::Any>& msgs) {
    std::string tx = SignTx(key, msgs);
    TxResponse checked = app_->CheckTx(tx);
    EXPECT_EQ(checked.code(), kOk) << checked.raw_log();
    BlockOutcome outcome = Block({tx});
    EXPECT_EQ(outcome.results.tx_results_size(), 1);
    if (outcome.results.tx_results_size() != 1) return TxResponse();
    const TxResponse& response = outcome.results.tx_results(0);
    EXPECT_EQ(response.code(), kOk) << response.raw_log();
    EXPECT_EQ(response.txhash(), TxHash(tx));
    return response;
  }

  // The tx must be refused by CheckTx and by FinalizeBlock with `code` and a raw_log holding
  // `fragment`, and leave the state as it was except the signer's sequence (bumped by one when
  // `bumps_sequence`, i.e. when the refusal comes after the ante checks).
  void ExpectRefusedTx(const std::string& tx, const std::string& signer, const Refusal& refusal,
                       const std::string& fragment, bool bumps_sequence) {
    TxResponse checked = app_->CheckTx(tx);
    EXPECT_EQ(checked.code(), refusal.code) << checked.raw_log();
    EXPECT_THAT(checked.raw_log(), HasSubstr(fragment));
    EXPECT_EQ(checked.codespace(), refusal.codespace) << checked.raw_log();
    std::map<std::string, std::string> before = app_->state();
    uint64_t sequence_before = 0;
    if (!signer.empty() && app_->Account(signer).ok()) {
      sequence_before = app_->Account(signer)->second;
    }
    BlockOutcome outcome = Block({tx});
    ASSERT_EQ(outcome.results.tx_results_size(), 1);
    const TxResponse& response = outcome.results.tx_results(0);
    EXPECT_EQ(response.code(), refusal.code) << response.raw_log();
    EXPECT_THAT(response.raw_log(), HasSubstr(fragment));
    EXPECT_EQ(response.codespace(), refusal.codespace) << response.raw_log();
    // A tx refused after its ante step reports that step's events (the fee, the sequence, the
    // signature) and nothing of its messages; one refused before reports none.
    for (const auto& event : response.events()) {
      EXPECT_TRUE(bumps_sequence) << event.type();
      EXPECT_NE(event.type(), "message");
    }
    std::map<std::string, std::string> after = app_->state();
    std::string account_key = keys::Account(signer);
    // The fee is paid all the same.
    const TxFee fee = TestFee();
    if (bumps_sequence && fee.amount > 0) {
      for (const std::string& address : {signer, app_->FeeCollectorAddress()}) {
        before.erase(keys::Balance(address));
        after.erase(keys::Balance(address));
      }
    }
    if (bumps_sequence) {
      ASSERT_TRUE(app_->Account(signer).ok());
      EXPECT_EQ(app_->Account(signer)->second, sequence_before + 1);
      before.erase(account_key);
      after.erase(account_key);
    }
    EXPECT_EQ(before, after) << "state changed beyond the signer's sequence";
  }

  void ExpectRefused(const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
                     const Refusal& refusal, const std::string& fragment) {
    ExpectRefusedTx(SignTx(key, msgs), Addr(key), refusal, fragment, /*bumps_sequence=*/true);
  }

  // sum(balances) == supply; escrow account == sum(escrow_held); gov account == deposits of
  // proposals in their voting period.
  void CheckInvariants() {
    uint64_t sum = 0;
    for (const auto& [key, value] : app_->state()) {
      if (key.rfind(keys::kBalancePrefix, 0) != 0) continue;
      auto balance = ReadBe64(key, value);
      ASSERT_TRUE(balance.ok());
      sum += *balance;
    }
    EXPECT_EQ(sum, app_->TotalSupply()) << "at height " << app_->height();
    uint64_t held = 0;
    for (const auto& shard : app_->ListShards(pb::SHARD_STATUS_UNSPECIFIED, 0, 1000)) {
      held += std::stoull(shard.escrow_held());
    }
    EXPECT_EQ(app_->Balance(app_->EscrowAddress()), held) << "at height " << app_->height();
    uint64_t deposits = 0;
    for (uint64_t id = 1;; ++id) {
      auto proposal = app_->GetProposal(id);
      if (!proposal.ok()) break;
      if (proposal->status() == pb::PROPOSAL_STATUS_VOTING_PERIOD) {
        deposits += std::stoull(proposal->deposit());
      }
    }
    EXPECT_EQ(app_->Balance(app_->GovAddress()), deposits) << "at height " << app_->height();
  }

  // --- message builders

  google::protobuf::Any ProposalMsg(const common::PrivateKey& proposer,
                                    const std::vector<pb::ShardSpec>& specs,
                                    const std::string& deposit = "1000") {
    std::vector<google::protobuf::Any> creates;
    for (const auto& spec : specs) {
      pb::MsgCreateTrainshardProposal create;
      create.set_authority(app_->GovAddress());
      create.set_creator(Addr(proposer));
      *create.mutable_spec() = spec;
      creates.push_back(PackMsg(create));
    }
    return GovProposalMsg(Addr(proposer), "train a small model", "a shard", deposit, creates);
  }

  google::protobuf::Any VoteMsg(const common::PrivateKey& voter, uint64_t proposal_id,
                                cosmos::gov::v1::VoteOption option) {
    cosmos::gov::v1::MsgVote msg;
    msg.set_proposal_id(proposal_id);
    msg.set_voter(Addr(voter));
    msg.set_option(option);
    return PackMsg(msg);
  }

  google::protobuf::Any SendMsg(const common::PrivateKey& from, const std::string& to,
                                const std::string& amount) {
    cosmos::bank::v1beta1::MsgSend msg;
    msg.set_from_address(Addr(from));
    msg.set_to_address(to);
    auto* coin = msg.add_amount();
    coin->set_denom("ngonka");
    coin->set_amount(amount);
    return PackMsg(msg);
  }

  pb::Reservation SignedReservation(const common::PrivateKey& host, uint64_t shard_id,
                                    const std::string& chain_id = kChainId) {
    pb::Reservation r;
    r.set_shard_id(shard_id);
    r.set_host(Addr(host));
    r.set_endpoint("127.0.0.1:7" + std::to_string(100 + shard_id));
    r.set_tls_cert_sha256(common::Sha256("cert of " + Addr(host)));
    r.set_valid_until_height(app_->height() + 100);
    r.set_signature(
        common::SignStatement(host, "reservation", chain_id, shard_id, DeterministicBytes(r))
            .value());
    return r;
  }

  google::protobuf::Any ReserveMsg(const pb::Reservation& reservation) {
    pb::MsgReserveTrainshard msg;
    *msg.mutable_reservation() = reservation;
    return PackMsg(msg);
  }

  // Payouts to hosts 1..3 for 3000 / 3000 / 1000 tokens of work: 385714 / 385714 / 128571
  // (escrow 900000, rounded down), refund 1.
  pb::Settlement MakeSettlement(uint64_t shard_id, const std::string& chain_id = kChainId) {
    pb::Settlement s;
    s.set_chain_id(chain_id);
    s.set_shard_id(shard_id);
    s.set_final_checkpoint_root(common::Sha256("final checkpoint"));
    s.mutable_evaluation()->set_metric("eval_loss");
    s.mutable_evaluation()->set_value_micro(2'345'678);
    s.mutable_evaluation()->set_evaluators(3);
    const char* amounts[] = {"385714", "385714", "128571"};
    const uint64_t tokens[] = {3000, 3000, 1000};
    for (int i = 0; i < 3; ++i) {
      auto* payout = s.add_payouts();
      payout->set_host(Addr(hosts_[static_cast<size_t>(i)]));
      payout->set_amount(amounts[i]);
      payout->set_rounds_contributed(10);
      payout->set_tokens(tokens[i]);
    }
    s.set_refund("1");
    s.set_rounds_completed(10);
    s.set_rounds_planned(10);
    return s;
  }

  pb::SettlementSignature SignSettlement(const common::PrivateKey& key, const pb::Settlement& s,
                                         const std::string& as_host = "",
                                         const std::string& sign_chain_id = "",
                                         uint64_t sign_shard_id = 0) {
    pb::SettlementSignature sig;
    sig.set_host(as_host.empty() ? Addr(key) : as_host);
    sig.set_signature(common::SignStatement(
                          key, "settlement", sign_chain_id.empty() ? s.chain_id() : sign_chain_id,
                          sign_shard_id == 0 ? s.shard_id() : sign_shard_id, DeterministicBytes(s))
                          .value());
    return sig;
  }

  google::protobuf::Any SettleMsg(const common::PrivateKey& submitter, const pb::Settlement& s,
                                  const std::vector<pb::SettlementSignature>& sigs) {
    pb::MsgSettleTrainshard msg;
    msg.set_submitter(Addr(submitter));
    *msg.mutable_settlement() = s;
    for (const auto& sig : sigs) *msg.add_signatures() = sig;
    return PackMsg(msg);
  }

  // Proposes `specs`, has hosts 1..3 vote yes, and runs to the end of voting. Returns the
  // proposal id.
  uint64_t PassProposal(const std::vector<pb::ShardSpec>& specs,
                        const common::PrivateKey* proposer = nullptr) {
    const common::PrivateKey& who = proposer == nullptr ? creator_ : *proposer;
    TxResponse submitted = Deliver(who, {ProposalMsg(who, specs)});
    auto events = EventsOf(submitted.events(), "gov.proposal_submitted");
    EXPECT_EQ(events.size(), 1u);
    if (events.empty()) return 0;
    uint64_t id = std::stoull(events[0]["proposal_id"]);
    std::vector<std::string> votes;
    for (int i = 0; i < 3; ++i) {
      votes.push_back(
          SignTx(hosts_[static_cast<size_t>(i)],
                 {VoteMsg(hosts_[static_cast<size_t>(i)], id, cosmos::gov::v1::VOTE_OPTION_YES)}));
    }
    Block(votes);
    for (const auto& result : last_.results.tx_results()) EXPECT_EQ(result.code(), kOk);
    AdvanceTo(std::stoll(events[0]["voting_end_height"]));
    return id;
  }

  // Opens one shard with `spec` and returns its id.
  uint64_t OpenShard(const pb::ShardSpec& spec) {
    uint64_t proposal_id = PassProposal({spec});
    auto proposal = app_->GetProposal(proposal_id);
    EXPECT_TRUE(proposal.ok());
    EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_PASSED);
    uint64_t shard_id = proposal->shard_id();
    EXPECT_EQ(app_->GetShard(shard_id)->status(), pb::SHARD_STATUS_OPEN);
    return shard_id;
  }

  // Hosts 1..3 reserve `shard_id` in one block (the third fills a max_nodes=3 shard).
  void ReserveThree(uint64_t shard_id) {
    std::vector<std::string> txs;
    for (int i = 0; i < 3; ++i) {
      const auto& host = hosts_[static_cast<size_t>(i)];
      txs.push_back(SignTx(host, {ReserveMsg(SignedReservation(host, shard_id))}));
    }
    Block(txs);
    for (const auto& result : last_.results.tx_results()) {
      EXPECT_EQ(result.code(), kOk) << result.raw_log();
    }
  }

  pb::Genesis genesis_;
  std::unique_ptr<App> app_;
  common::PrivateKey creator_;
  common::PrivateKey poor_;
  common::PrivateKey outsider_;
  common::PrivateKey authority_;
  std::vector<common::PrivateKey> hosts_;
  std::vector<std::vector<std::string>> blocks_;
  BlockOutcome last_;
};

}  // namespace ts::bridge::chain_test

#endif  // TS_CHAIN_BRIDGE_MODULE_CHAIN_TEST_UTIL_H_
