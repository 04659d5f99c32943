#include "chain-bridge/module/app.h"

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

namespace ts::bridge {
namespace {

using cosmos::base::abci::v1beta1::TxResponse;
using ::testing::HasSubstr;

constexpr char kChainId[] = "trainshard-test-1";
constexpr uint32_t kOk = 0;
constexpr uint32_t kInvalidArgument = 3;
constexpr uint32_t kNotFound = 5;
constexpr uint32_t kAlreadyExists = 6;
constexpr uint32_t kPermissionDenied = 7;
constexpr uint32_t kResourceExhausted = 8;
constexpr uint32_t kFailedPrecondition = 9;
constexpr uint32_t kUnauthenticated = 16;

common::PrivateKey Key(const std::string& name) {
  return common::PrivateKey::FromBytes(common::Sha256("test-key/" + name)).value();
}
std::string Addr(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

std::map<std::string, std::string> Attributes(const tendermint::abci::Event& event) {
  std::map<std::string, std::string> out;
  for (const auto& attribute : event.attributes()) out[attribute.key()] = attribute.value();
  return out;
}

// All events of a given type, in order.
std::vector<std::map<std::string, std::string>> EventsOf(
    const google::protobuf::RepeatedPtrField<tendermint::abci::Event>& events,
    const std::string& type) {
  std::vector<std::map<std::string, std::string>> out;
  for (const auto& event : events) {
    if (event.type() == type) out.push_back(Attributes(event));
  }
  return out;
}

pb::ShardSpec DefaultSpec() {
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

  // Signs msgs with the account's number and finalized sequence (plus `sequence_offset`).
  std::string SignTx(const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
                     int64_t sequence_offset = 0, const std::string& chain_id = kChainId) {
    auto account = app_->Account(Addr(key));
    EXPECT_TRUE(account.ok()) << account.status();
    if (!account.ok()) return "";
    return BuildSignedTx(key, chain_id, account->first,
                         account->second + static_cast<uint64_t>(sequence_offset), msgs);
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
  void ExpectRefusedTx(const std::string& tx, const std::string& signer, uint32_t code,
                       const std::string& fragment, bool bumps_sequence) {
    TxResponse checked = app_->CheckTx(tx);
    EXPECT_EQ(checked.code(), code) << checked.raw_log();
    EXPECT_THAT(checked.raw_log(), HasSubstr(fragment));
    EXPECT_EQ(checked.codespace(), "trainshard");
    std::map<std::string, std::string> before = app_->state();
    uint64_t sequence_before = 0;
    if (!signer.empty() && app_->Account(signer).ok()) {
      sequence_before = app_->Account(signer)->second;
    }
    BlockOutcome outcome = Block({tx});
    ASSERT_EQ(outcome.results.tx_results_size(), 1);
    const TxResponse& response = outcome.results.tx_results(0);
    EXPECT_EQ(response.code(), code) << response.raw_log();
    EXPECT_THAT(response.raw_log(), HasSubstr(fragment));
    EXPECT_EQ(response.codespace(), "trainshard");
    EXPECT_EQ(response.events_size(), 0);
    std::map<std::string, std::string> after = app_->state();
    std::string account_key = keys::Account(signer);
    if (bumps_sequence) {
      ASSERT_TRUE(app_->Account(signer).ok());
      EXPECT_EQ(app_->Account(signer)->second, sequence_before + 1);
      before.erase(account_key);
      after.erase(account_key);
    }
    EXPECT_EQ(before, after) << "state changed beyond the signer's sequence";
  }

  void ExpectRefused(const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
                     uint32_t code, const std::string& fragment) {
    ExpectRefusedTx(SignTx(key, msgs), Addr(key), code, fragment, /*bumps_sequence=*/true);
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
    cosmos::gov::v1::MsgSubmitProposal msg;
    msg.set_proposer(Addr(proposer));
    msg.set_title("train a small model");
    msg.set_summary("a shard");
    if (!deposit.empty()) {
      auto* coin = msg.add_initial_deposit();
      coin->set_denom("ngonka");
      coin->set_amount(deposit);
    }
    for (const auto& spec : specs) {
      pb::MsgCreateTrainshardProposal create;
      create.set_authority(app_->GovAddress());
      create.set_creator(Addr(proposer));
      *create.mutable_spec() = spec;
      *msg.add_messages() = PackMsg(create);
    }
    return PackMsg(msg);
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

// ---------------------------------------------------------------------------------------------
// Genesis

TEST_F(ChainTest, GenesisStateAndAccountNumbers) {
  EXPECT_EQ(app_->height(), 0);
  EXPECT_EQ(app_->app_hash(), std::string(32, '\0'));
  EXPECT_EQ(app_->TotalSupply(), 10'000'000u + 5000 + 1000 + 1000 + 5 * 1000);
  EXPECT_EQ(app_->Balance(Addr(creator_)), 10'000'000u);
  // Account numbers in genesis order, then the module accounts.
  EXPECT_EQ(app_->Account(Addr(creator_))->first, 0u);
  EXPECT_EQ(app_->Account(Addr(hosts_[4]))->first, 8u);
  EXPECT_EQ(app_->Account(app_->GovAddress())->first, 9u);
  EXPECT_EQ(app_->Account(app_->EscrowAddress())->first, 10u);
  EXPECT_EQ(app_->GovAddress(), common::ModuleAddress("gov"));
  EXPECT_EQ(app_->EscrowAddress(), common::ModuleAddress("trainshard"));
  auto weights = app_->GetWeights(0);
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(weights->total_weight(), 450u);
  EXPECT_EQ(weights->weights_size(), 5);
  EXPECT_EQ(app_->CurrentEpoch(), 0u);
  EXPECT_EQ(app_->GetWeights(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(app_->Account(Addr(Key("nobody"))).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(app_->AccountPublicKey(Addr(creator_)), "");
}

TEST_F(ChainTest, BadGenesisIsRefusedNamingTheField) {
  pb::Genesis bad = genesis_;
  bad.mutable_params()->set_quorum_ppm(2'000'000);
  auto app = App::InitChain(bad);
  EXPECT_EQ(app.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("params.quorum_ppm"));

  bad = genesis_;
  bad.mutable_accounts(1)->set_address(bad.accounts(0).address());
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("appears twice"));

  bad = genesis_;
  bad.mutable_accounts(0)->set_balance("-5");
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("accounts[0].balance"));

  bad = genesis_;
  bad.mutable_poc_weights(0)->set_weight(0);
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("poc_weights[0].weight"));

  bad = genesis_;
  bad.mutable_params()->set_poc_authority("not-an-address");
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("params.poc_authority"));

  bad = genesis_;
  bad.mutable_accounts(0)->set_address(common::ModuleAddress("trainshard"));
  app = App::InitChain(bad);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("module account"));
}

// ---------------------------------------------------------------------------------------------
// Happy path

TEST_F(ChainTest, ProposalVotesOpenReserveRunSettle) {
  const uint64_t supply = app_->TotalSupply();
  const uint64_t creator_start = app_->Balance(Addr(creator_));

  TxResponse submitted = Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  auto proposed = EventsOf(submitted.events(), "trainshard.shard_proposed");
  ASSERT_EQ(proposed.size(), 1u);
  EXPECT_EQ(proposed[0]["shard_id"], "1");
  EXPECT_EQ(proposed[0]["proposal_id"], "1");
  EXPECT_EQ(proposed[0]["creator"], Addr(creator_));
  EXPECT_EQ(proposed[0]["hardware_profile"], "cpu-small");
  EXPECT_EQ(proposed[0]["max_nodes"], "3");
  EXPECT_EQ(proposed[0]["escrow"], "900000");
  auto proposal = app_->GetProposal(1);
  ASSERT_TRUE(proposal.ok());
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_VOTING_PERIOD);
  EXPECT_EQ(proposal->voting_end_height(), 1 + 3);
  EXPECT_EQ(proposal->total_weight(), 450u);
  EXPECT_EQ(proposal->weight_epoch(), 0u);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_PROPOSED);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 1000u);

  TxResponse vote = Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)});
  auto vote_events = EventsOf(vote.events(), "gov.vote");
  ASSERT_EQ(vote_events.size(), 1u);
  EXPECT_EQ(vote_events[0]["option"], "yes");
  EXPECT_EQ(vote_events[0]["weight"], "100");
  Deliver(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_YES)});
  BlockOutcome end = Block();  // height 4 = voting_end_height
  ASSERT_EQ(app_->height(), 4);
  auto finalized = EventsOf(end.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "passed");
  EXPECT_EQ(finalized[0]["yes"], "200");
  EXPECT_EQ(finalized[0]["no"], "0");
  auto opened = EventsOf(end.results.end_block_events(), "trainshard.shard_opened");
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0]["reservation_deadline_height"], "14");
  EXPECT_EQ(opened[0]["deadline_height"], "44");
  EXPECT_EQ(opened[0]["min_host_weight"], "60");
  EXPECT_EQ(app_->GetProposal(1)->status(), pb::PROPOSAL_STATUS_PASSED);
  auto shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_OPEN);
  EXPECT_EQ(shard->escrow_held(), "900000");
  EXPECT_EQ(shard->open_height(), 4);
  EXPECT_EQ(app_->Balance(app_->EscrowAddress()), 900000u);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 0u);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_start - 900000);

  // Three reservations; the third fills the shard, which runs.
  for (int i = 0; i < 3; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i)];
    TxResponse reserved = Deliver(host, {ReserveMsg(SignedReservation(host, 1))});
    auto added = EventsOf(reserved.events(), "trainshard.reservation_added");
    ASSERT_EQ(added.size(), 1u);
    EXPECT_EQ(added[0]["host"], Addr(host));
    EXPECT_EQ(added[0]["frozen_weight"], "100");
    EXPECT_EQ(added[0]["members"], std::to_string(i + 1));
    EXPECT_EQ(added[0]["endpoint"], "127.0.0.1:7101");
    auto running = EventsOf(reserved.events(), "trainshard.shard_running");
    EXPECT_EQ(running.size(), i == 2 ? 1u : 0u);
    if (i == 2) {
      EXPECT_EQ(running[0]["total_weight"], "300");
    }
  }
  shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_EQ(shard->total_weight(), 300u);
  ASSERT_EQ(shard->reservations_size(), 3);
  EXPECT_EQ(shard->reservations(0).frozen_weight(), 100u);
  EXPECT_GT(shard->reservations(0).reserved_height(), 4);
  EXPECT_EQ(app_->AccountPublicKey(Addr(hosts_[0])), hosts_[0].public_key());

  // Settlement signed by all three members, submitted by the creator.
  pb::Settlement s = MakeSettlement(1);
  TxResponse settled =
      Deliver(creator_, {SettleMsg(creator_, s,
                                   {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                    SignSettlement(hosts_[2], s)})});
  auto settled_events = EventsOf(settled.events(), "trainshard.shard_settled");
  ASSERT_EQ(settled_events.size(), 1u);
  EXPECT_EQ(settled_events[0]["final_checkpoint_root"],
            common::HexEncode(common::Sha256("final checkpoint")));
  EXPECT_EQ(settled_events[0]["signed_weight"], "300");
  EXPECT_EQ(settled_events[0]["total_weight"], "300");
  EXPECT_EQ(settled_events[0]["refund"], "1");
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.payout").size(), 3u);
  shard = app_->GetShard(1);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(shard->close_reason(), pb::CLOSE_REASON_SETTLED);
  EXPECT_EQ(shard->escrow_held(), "0");
  EXPECT_EQ(app_->Balance(Addr(hosts_[0])), 1000u + 385714);
  EXPECT_EQ(app_->Balance(Addr(hosts_[2])), 1000u + 128571);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_start - 899999);
  EXPECT_EQ(app_->Balance(app_->EscrowAddress()), 0u);
  EXPECT_EQ(app_->TotalSupply(), supply);
  auto record = app_->GetSettlement(1);
  ASSERT_TRUE(record.ok());
  EXPECT_EQ(record->signed_weight(), 300u);
  EXPECT_EQ(record->submitter(), Addr(creator_));
  EXPECT_EQ(record->signatures_size(), 3);
  EXPECT_EQ(app_->ListShards(pb::SHARD_STATUS_SETTLED, 0, 10).size(), 1u);

  // Settling again is refused: the shard is already settled.
  ExpectRefused(creator_, {SettleMsg(creator_, s, {SignSettlement(hosts_[0], s)})}, kAlreadyExists,
                "shard 1 is already settled");
  // Deadline passes without effect on a settled shard.
  AdvanceTo(45);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(ChainTest, SettlementWithJustOverTwoThirdsPays) {
  // Members of weight 100, 100, 100 and 50 (total 350): 100 + 100 + 50 = 250 signs, and
  // 3 * 250 = 750 > 700.
  pb::ShardSpec four = DefaultSpec();
  four.set_max_nodes(4);
  four.set_min_host_weight(1);
  uint64_t shard4 = OpenShard(four);
  std::vector<std::string> txs;
  for (int i = 0; i < 4; ++i) {
    const auto& host = hosts_[static_cast<size_t>(i == 3 ? 4 : i)];
    txs.push_back(SignTx(host, {ReserveMsg(SignedReservation(host, shard4))}));
  }
  Block(txs);
  ASSERT_EQ(app_->GetShard(shard4)->status(), pb::SHARD_STATUS_RUNNING);
  ASSERT_EQ(app_->GetShard(shard4)->total_weight(), 350u);
  pb::Settlement s = MakeSettlement(shard4);
  TxResponse settled =
      Deliver(hosts_[4], {SettleMsg(hosts_[4], s,
                                    {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                     SignSettlement(hosts_[4], s)})});
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.shard_settled")[0]["signed_weight"], "250");
  EXPECT_EQ(app_->GetShard(shard4)->status(), pb::SHARD_STATUS_SETTLED);
}

// ---------------------------------------------------------------------------------------------
// Settlement refusals: each with its code and message, and no state change beyond the sequence

class SettlementRefusals : public ChainTest {
 protected:
  void SetUp() override {
    ChainTest::SetUp();
    // Two shards from one proposal, both run by hosts 1..3.
    uint64_t proposal = PassProposal({DefaultSpec(), DefaultSpec()});
    ASSERT_EQ(app_->GetProposal(proposal)->status(), pb::PROPOSAL_STATUS_PASSED);
    ReserveThree(1);
    ReserveThree(2);
    ASSERT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_RUNNING);
    ASSERT_EQ(app_->GetShard(2)->status(), pb::SHARD_STATUS_RUNNING);
    s_ = MakeSettlement(1);
  }

  std::vector<pb::SettlementSignature> AllThree(const pb::Settlement& s) {
    return {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
            SignSettlement(hosts_[2], s)};
  }

  pb::Settlement s_;
};

TEST_F(SettlementRefusals, ForgedSignature) {
  // An outsider's key signs, claiming to be host 1.
  auto forged = SignSettlement(outsider_, s_, Addr(hosts_[0]));
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {forged, SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, "signature of " + Addr(hosts_[0]) + " does not verify");
  // A corrupted byte in a real signature.
  auto corrupted = SignSettlement(hosts_[0], s_);
  std::string bytes = corrupted.signature();
  bytes[10] ^= 0x01;
  corrupted.set_signature(bytes);
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_,
                 {corrupted, SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
      kUnauthenticated, "does not verify");
  // A truncated signature.
  auto shortened = SignSettlement(hosts_[0], s_);
  shortened.set_signature(shortened.signature().substr(0, 64));
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_,
                 {shortened, SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
      kInvalidArgument, "64 bytes, want 65");
}

TEST_F(SettlementRefusals, SignerOutsideTheShard) {
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[3], s_)})},
      kPermissionDenied, "signer " + Addr(hosts_[3]) + " is not a member of shard 1");
}

TEST_F(SettlementRefusals, SameHostCountedTwice) {
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[0], s_),
                            SignSettlement(hosts_[1], s_)})},
                kInvalidArgument, "host " + Addr(hosts_[0]) + " counted twice");
}

TEST_F(SettlementRefusals, SignedWeightNotMoreThanTwoThirds) {
  ExpectRefused(creator_, {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_)})},
                kFailedPrecondition, "signed weight 100 is not more than 2/3 of 300");
  // Exactly 2/3 is not enough.
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_), SignSettlement(hosts_[1], s_)})},
      kFailedPrecondition, "signed weight 200 is not more than 2/3 of 300");
  ExpectRefused(creator_, {SettleMsg(creator_, s_, {})}, kFailedPrecondition,
                "signed weight 0 is not more than 2/3 of 300");
}

TEST_F(SettlementRefusals, ReplayedToAnotherShard) {
  // Signed for shard 1, submitted as shard 2 (same members, same escrow).
  auto sigs = AllThree(s_);
  pb::Settlement replayed = s_;
  replayed.set_shard_id(2);
  ExpectRefused(creator_, {SettleMsg(creator_, replayed, sigs)}, kUnauthenticated,
                "does not verify");
  // Signatures over shard 2's sign bytes but of a statement naming shard 1 do not carry over.
  std::vector<pb::SettlementSignature> cross = {SignSettlement(hosts_[0], s_, "", "", 2),
                                                SignSettlement(hosts_[1], s_, "", "", 2),
                                                SignSettlement(hosts_[2], s_, "", "", 2)};
  ExpectRefused(creator_, {SettleMsg(creator_, replayed, cross)}, kUnauthenticated,
                "does not verify");
}

TEST_F(SettlementRefusals, ReplayedFromAnotherChain) {
  // The statement names chain B: refused on the field itself.
  pb::Settlement other = MakeSettlement(1, "trainshard-other-2");
  ExpectRefused(creator_, {SettleMsg(creator_, other, AllThree(other))}, kInvalidArgument,
                "settlement.chain_id: 'trainshard-other-2' is not this chain 'trainshard-test-1'");
  // Signed for chain B, then the field rewritten to this chain: signatures do not verify.
  pb::Settlement rewritten = other;
  rewritten.set_chain_id(kChainId);
  ExpectRefused(creator_, {SettleMsg(creator_, rewritten, AllThree(other))}, kUnauthenticated,
                "does not verify");
  // Sign bytes made with chain B's id over a statement naming this chain: refused too.
  std::vector<pb::SettlementSignature> cross = {
      SignSettlement(hosts_[0], s_, "", "trainshard-other-2"),
      SignSettlement(hosts_[1], s_, "", "trainshard-other-2"),
      SignSettlement(hosts_[2], s_, "", "trainshard-other-2")};
  ExpectRefused(creator_, {SettleMsg(creator_, s_, cross)}, kUnauthenticated, "does not verify");
}

TEST_F(SettlementRefusals, PayoutRules) {
  pb::Settlement above = s_;
  above.set_refund("2");
  ExpectRefused(creator_, {SettleMsg(creator_, above, AllThree(above))}, kInvalidArgument,
                "payouts 899999 + refund 2 exceed escrow 900000");
  pb::Settlement below = s_;
  below.set_refund("0");
  ExpectRefused(creator_, {SettleMsg(creator_, below, AllThree(below))}, kInvalidArgument,
                "payouts 899999 + refund 0 do not add up to escrow 900000");
  // The amounts follow from the stats beside them: moved between hosts, refused.
  pb::Settlement moved = s_;
  moved.mutable_payouts(0)->set_amount("385713");
  moved.mutable_payouts(2)->set_amount("128572");
  ExpectRefused(creator_, {SettleMsg(creator_, moved, AllThree(moved))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385713 does not follow from its stats");
  // A marked host forfeits its pay: still paid, refused; paid nothing, its share is refunded.
  pb::Settlement marked = s_;
  marked.mutable_payouts(2)->set_marks(1);
  ExpectRefused(creator_, {SettleMsg(creator_, marked, AllThree(marked))}, kInvalidArgument,
                "settlement.payouts[2].amount: 128571 does not follow from its stats (tokens 1000, "
                "rounds 10, marks 1, rejected 0) under the reward policy: want 0");
  // Work is counted in one unit for all: beside hosts with tokens, a host without (its work all
  // in rounds no check could reach) has none, whatever rounds it signed.
  pb::Settlement no_tokens = s_;
  no_tokens.mutable_payouts(2)->set_tokens(0);
  ExpectRefused(creator_, {SettleMsg(creator_, no_tokens, AllThree(no_tokens))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385714 does not follow from its stats (tokens "
                "3000, rounds 10, marks 0, rejected 0) under the reward policy: want 450000");
  pb::Settlement share = s_;
  share.mutable_payouts(0)->set_amount("450001");  // max_host_share_bps 5000 of 900000
  share.set_refund("0");
  share.mutable_payouts(2)->set_amount("149999");
  ExpectRefused(creator_, {SettleMsg(creator_, share, AllThree(share))}, kInvalidArgument,
                "settlement.payouts[0].amount: 450001 exceeds the host share 450000");
  pb::Settlement outsider = s_;
  outsider.mutable_payouts(2)->set_host(Addr(hosts_[3]));
  ExpectRefused(creator_, {SettleMsg(creator_, outsider, AllThree(outsider))}, kInvalidArgument,
                "settlement.payouts[2].host: '" + Addr(hosts_[3]) + "' is not a member of shard 1");
  pb::Settlement twice = s_;
  twice.mutable_payouts(2)->set_host(Addr(hosts_[0]));
  ExpectRefused(creator_, {SettleMsg(creator_, twice, AllThree(twice))}, kInvalidArgument,
                "is paid twice");
  pb::Settlement bad_amount = s_;
  bad_amount.mutable_payouts(1)->set_amount("3e5");
  ExpectRefused(creator_, {SettleMsg(creator_, bad_amount, AllThree(bad_amount))}, kInvalidArgument,
                "settlement.payouts[1].amount");
  pb::Settlement bad_root = s_;
  bad_root.set_final_checkpoint_root("short");
  ExpectRefused(creator_, {SettleMsg(creator_, bad_root, AllThree(bad_root))}, kInvalidArgument,
                "settlement.final_checkpoint_root: 5 bytes, want 32");
  pb::Settlement unknown = s_;
  unknown.set_shard_id(99);
  ExpectRefused(creator_, {SettleMsg(creator_, unknown, AllThree(unknown))}, kNotFound,
                "shard 99 not found");
  // The marked host paid nothing and its share refunded: accepted.
  marked.mutable_payouts(2)->set_amount("0");
  marked.set_refund("128572");
  Deliver(creator_, {SettleMsg(creator_, marked, AllThree(marked))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(SettlementRefusals, APartialSettlementPaysForTheRoundsItCompleted) {
  pb::Settlement none = s_;
  none.set_rounds_planned(0);
  ExpectRefused(creator_, {SettleMsg(creator_, none, AllThree(none))}, kInvalidArgument,
                "settlement.rounds_planned: 0 is outside 1..100000");
  pb::Settlement more = s_;
  more.set_rounds_completed(11);
  ExpectRefused(creator_, {SettleMsg(creator_, more, AllThree(more))}, kInvalidArgument,
                "settlement.rounds_completed: 11 is outside 1..10 (rounds_planned)");
  // 10 rounds of 20: half the escrow is payable. The whole run's amounts are refused, and so
  // is a host's share of the half moved to another host.
  pb::Settlement half = s_;
  half.set_rounds_planned(20);
  ExpectRefused(creator_, {SettleMsg(creator_, half, AllThree(half))}, kInvalidArgument,
                "settlement.payouts[0].amount: 385714 exceeds the host share 225000 "
                "(max_host_share_bps 5000 of 450000 payable of escrow 900000)");
  pb::Settlement moved = half;
  const char* shifted[] = {"192858", "192857", "64284"};
  for (int i = 0; i < 3; ++i) moved.mutable_payouts(i)->set_amount(shifted[i]);
  moved.set_refund("450001");
  ExpectRefused(creator_, {SettleMsg(creator_, moved, AllThree(moved))}, kInvalidArgument,
                "settlement.payouts[0].amount: 192858 does not follow from its stats");
  // 450000 × 3000 / 7000, × 3000 / 7000, × 1000 / 7000, rounded down; the rest refunded.
  const char* amounts[] = {"192857", "192857", "64285"};
  for (int i = 0; i < 3; ++i) half.mutable_payouts(i)->set_amount(amounts[i]);
  half.set_refund("450001");
  const uint64_t creator_before = app_->Balance(Addr(creator_));
  const uint64_t host_before = app_->Balance(Addr(hosts_[2]));
  Deliver(creator_, {SettleMsg(creator_, half, AllThree(half))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Balance(Addr(hosts_[2])) - host_before, 64285u);
  EXPECT_EQ(app_->Balance(Addr(creator_)) - creator_before, 450001u);
}

TEST_F(SettlementRefusals, TooManySignatures) {
  auto sigs = AllThree(s_);
  sigs.push_back(SignSettlement(hosts_[0], s_));
  ExpectRefused(creator_, {SettleMsg(creator_, s_, sigs)}, kInvalidArgument,
                "4 signatures for 3 members");
}

TEST_F(SettlementRefusals, SubmitterMustSignTheTx) {
  pb::MsgSettleTrainshard msg;
  msg.set_submitter(Addr(hosts_[0]));
  *msg.mutable_settlement() = s_;
  for (const auto& sig : AllThree(s_)) *msg.add_signatures() = sig;
  // Signed by the creator while naming host 1 as submitter: refused before execution.
  ExpectRefusedTx(SignTx(creator_, {PackMsg(msg)}), Addr(creator_), kUnauthenticated,
                  "is not the tx signer", /*bumps_sequence=*/false);
}

TEST_F(SettlementRefusals, RefusedSettlementThenValidOneInTheSameBlock) {
  // A bad settlement and a good one in one block: the first fails alone, the second pays.
  std::string bad = SignTx(creator_, {SettleMsg(creator_, s_, {SignSettlement(hosts_[0], s_)})});
  std::string good = SignTx(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, 1);
  BlockOutcome outcome = Block({bad, good});
  ASSERT_EQ(outcome.results.tx_results_size(), 2);
  EXPECT_EQ(outcome.results.tx_results(0).code(), kFailedPrecondition);
  EXPECT_EQ(outcome.results.tx_results(1).code(), kOk) << outcome.results.tx_results(1).raw_log();
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Account(Addr(creator_))->second, 3u);  // proposal, bad, good
}

// ---------------------------------------------------------------------------------------------
// Settlement signatures against the members' stored keys

// n - S for the big-endian S in bytes 32..63: the high-S twin of a low-S signature, which
// recovers the same key with the other V.
std::string HighSTwin(std::string signature) {
  const std::string n =
      common::HexDecode("FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141").value();
  int borrow = 0;
  for (int i = 31; i >= 0; --i) {
    int diff = static_cast<uint8_t>(n[static_cast<size_t>(i)]) -
               static_cast<uint8_t>(signature[32 + static_cast<size_t>(i)]) - borrow;
    borrow = diff < 0 ? 1 : 0;
    signature[32 + static_cast<size_t>(i)] = static_cast<char>(diff + 256 * borrow);
  }
  signature[64] = static_cast<char>(signature[64] ^ 1);
  return signature;
}

class MemberKeys : public SettlementRefusals {
 protected:
  // Replaces app_ by an App restored from its state after `edit`: a node whose state was
  // written by an earlier layout, or was corrupted.
  void RestoreEdited(const std::function<void(std::map<std::string, std::string>&)>& edit) {
    std::map<std::string, std::string> state = app_->state();
    edit(state);
    auto restored = App::Restore(genesis_, std::move(state), app_->height(), app_->app_hash());
    ASSERT_TRUE(restored.ok()) << restored.status();
    app_ = *std::move(restored);
  }

  static void EraseMemberKeys(std::map<std::string, std::string>& state, uint64_t shard_id) {
    std::string prefix = keys::MemberKey(shard_id, "");
    for (auto it = state.lower_bound(prefix);
         it != state.end() && it->first.rfind(prefix, 0) == 0;) {
      it = state.erase(it);
    }
  }

  pb::SettlementSignature WithSignature(pb::SettlementSignature sig, std::string bytes) {
    sig.set_signature(std::move(bytes));
    return sig;
  }
};

TEST_F(MemberKeys, StoredWhenTheReservationIsAccepted) {
  for (uint64_t shard = 1; shard <= 2; ++shard) {
    for (size_t i = 0; i < 3; ++i) {
      auto it = app_->state().find(keys::MemberKey(shard, Addr(hosts_[i])));
      ASSERT_NE(it, app_->state().end()) << "shard " << shard << " host " << i;
      EXPECT_EQ(it->second, UncompressMemberKey(hosts_[i].public_key()).value());
    }
  }
  EXPECT_EQ(app_->state().count(keys::MemberKey(1, Addr(hosts_[3]))), 0u);
  // The key lives beside the member record, which is unchanged (GetShard lists no key).
  EXPECT_EQ(app_->GetShard(1)->reservations_size(), 3);
}

TEST_F(MemberKeys, SignaturesAreCheckedAgainstTheStoredKey) {
  // Swapping two members' stored keys makes their genuine signatures fail: the stored key, not
  // the claimed host, is what a signature must match.
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    std::swap(state[keys::MemberKey(1, Addr(hosts_[0]))],
              state[keys::MemberKey(1, Addr(hosts_[1]))]);
  });
  ExpectRefused(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, kUnauthenticated,
                "signature of " + Addr(hosts_[0]) + " does not verify");
}

TEST_F(MemberKeys, ForgedMalleatedOrBadRecoveryByteIsRefused) {
  auto genuine = SignSettlement(hosts_[0], s_);
  const std::string refused = "signature of " + Addr(hosts_[0]) + " does not verify";
  // An outsider's key over the same settlement, claiming host 1.
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(outsider_, s_, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // Host 1's own signature over another settlement (a different digest).
  pb::Settlement other = s_;
  other.set_rounds_completed(11);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(hosts_[0], other, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // V outside 0..3.
  std::string bad_v = genuine.signature();
  bad_v[64] = 4;
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, bad_v), SignSettlement(hosts_[1], s_),
                            SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // The high-S twin of the genuine signature.
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, HighSTwin(genuine.signature())),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // And the genuine one passes.
  Deliver(creator_, {SettleMsg(creator_, s_, AllThree(s_))});
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(MemberKeys, MembersRecordedWithoutAKeyAreCheckedByRecovery) {
  // State written before member keys were stored: none for shard 1, and shard 2 lacks only
  // host 2's.
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    EraseMemberKeys(state, 1);
    state.erase(keys::MemberKey(2, Addr(hosts_[1])));
  });
  ASSERT_EQ(app_->state().count(keys::MemberKey(1, Addr(hosts_[0]))), 0u);
  auto genuine = SignSettlement(hosts_[0], s_);
  const std::string refused = "signature of " + Addr(hosts_[0]) + " does not verify";
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {SignSettlement(outsider_, s_, Addr(hosts_[0])),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  // Recovery binds V: the genuine signature with the other parity recovers another key.
  std::string flipped = genuine.signature();
  flipped[64] = static_cast<char>(flipped[64] ^ 1);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, flipped), SignSettlement(hosts_[1], s_),
                            SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);
  ExpectRefused(creator_,
                {SettleMsg(creator_, s_,
                           {WithSignature(genuine, HighSTwin(genuine.signature())),
                            SignSettlement(hosts_[1], s_), SignSettlement(hosts_[2], s_)})},
                kUnauthenticated, refused);

  TxResponse settled = Deliver(creator_, {SettleMsg(creator_, s_, AllThree(s_))});
  EXPECT_EQ(EventsOf(settled.events(), "trainshard.shard_settled")[0]["signed_weight"], "300");
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->Balance(Addr(hosts_[0])), 1000u + 385714);

  // Shard 2 mixes both: hosts 1 and 3 by their stored keys, host 2 by recovery.
  pb::Settlement s2 = MakeSettlement(2);
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s2,
                 {SignSettlement(hosts_[0], s2), SignSettlement(outsider_, s2, Addr(hosts_[1])),
                  SignSettlement(hosts_[2], s2)})},
      kUnauthenticated, "signature of " + Addr(hosts_[1]) + " does not verify");
  Deliver(creator_, {SettleMsg(creator_, s2, AllThree(s2))});
  EXPECT_EQ(app_->GetShard(2)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(MemberKeys, StoredKeyOfTheWrongSizeIsDataLoss) {
  RestoreEdited([&](std::map<std::string, std::string>& state) {
    state[keys::MemberKey(1, Addr(hosts_[0]))] = hosts_[0].public_key();  // 33 bytes
  });
  constexpr uint32_t kDataLoss = 15;
  ExpectRefused(creator_, {SettleMsg(creator_, s_, AllThree(s_))}, kDataLoss, "33 bytes, want 65");
}

TEST_F(ChainTest, SettleAfterExpiry) {
  uint64_t shard = OpenShard(DefaultSpec());
  ReserveThree(shard);
  ASSERT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  int64_t deadline = app_->GetShard(shard)->deadline_height();
  uint64_t creator_before = app_->Balance(Addr(creator_));
  AdvanceTo(deadline);
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "timeout");
  EXPECT_EQ(expired[0]["refund"], "900000");
  EXPECT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_EXPIRED);
  EXPECT_EQ(app_->GetShard(shard)->close_reason(), pb::CLOSE_REASON_TIMEOUT);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before + 900000);
  pb::Settlement s = MakeSettlement(shard);
  ExpectRefused(
      creator_,
      {SettleMsg(creator_, s,
                 {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                  SignSettlement(hosts_[2], s)})},
      kFailedPrecondition,
      "shard " + std::to_string(shard) + " expired at height " + std::to_string(deadline));
}

// ---------------------------------------------------------------------------------------------
// Reservations

TEST_F(ChainTest, ReservationRefusals) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_reservation_window_blocks(30);  // room for every refusal below, one block each
  uint64_t shard = OpenShard(spec);
  // Below the weight floor (host 5 holds 50 < 60), and no weight at all.
  ExpectRefused(hosts_[4], {ReserveMsg(SignedReservation(hosts_[4], shard))}, kFailedPrecondition,
                "weight 50 below the floor 60");
  ExpectRefused(outsider_, {ReserveMsg(SignedReservation(outsider_, shard))}, kFailedPrecondition,
                "weight 0 below the floor 60");
  // A signature by another key, a signature for another shard, for another chain.
  pb::Reservation forged = SignedReservation(hosts_[0], shard);
  forged.set_signature(SignedReservation(hosts_[1], shard).signature());
  ExpectRefused(hosts_[0], {ReserveMsg(forged)}, kUnauthenticated,
                "reservation.signature: does not verify for host " + Addr(hosts_[0]));
  pb::Reservation tampered = SignedReservation(hosts_[0], shard);
  tampered.set_endpoint("10.0.0.1:9999");
  ExpectRefused(hosts_[0], {ReserveMsg(tampered)}, kUnauthenticated, "does not verify");
  pb::Reservation other_chain = SignedReservation(hosts_[0], shard, "trainshard-other-2");
  ExpectRefused(hosts_[0], {ReserveMsg(other_chain)}, kUnauthenticated, "does not verify");
  pb::Reservation short_sig = SignedReservation(hosts_[0], shard);
  short_sig.set_signature("x");
  ExpectRefused(hosts_[0], {ReserveMsg(short_sig)}, kUnauthenticated, "1 bytes, want 65");
  // Field checks.
  pb::Reservation r = SignedReservation(hosts_[0], shard);
  r.set_endpoint("no-port");
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument,
                "reservation.endpoint: 'no-port' is not host:port");
  r = SignedReservation(hosts_[0], shard);
  r.set_tls_cert_sha256("abc");
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument,
                "reservation.tls_cert_sha256: 3 bytes, want 32");
  r = SignedReservation(hosts_[0], shard);
  r.set_frozen_weight(1000);
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kInvalidArgument, "reservation.frozen_weight: 1000");
  r = SignedReservation(hosts_[0], shard);
  r.set_valid_until_height(1);
  ExpectRefused(hosts_[0], {ReserveMsg(r)}, kFailedPrecondition,
                "reservation.valid_until_height: 1 is before height");
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], 77))}, kNotFound,
                "shard 77 not found");
  // Twice by the same host.
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))}, kAlreadyExists,
                "already holds a place in shard " + std::to_string(shard));
  // Beyond max nodes.
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], shard))});
  Deliver(hosts_[2], {ReserveMsg(SignedReservation(hosts_[2], shard))});
  ASSERT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  ExpectRefused(hosts_[3], {ReserveMsg(SignedReservation(hosts_[3], shard))}, kResourceExhausted,
                "shard " + std::to_string(shard) + " is full: max_nodes 3");
  // A reservation whose host is not the tx signer is refused before execution.
  ExpectRefusedTx(SignTx(hosts_[3], {ReserveMsg(SignedReservation(hosts_[0], shard))}),
                  Addr(hosts_[3]), kUnauthenticated, "is not the tx signer",
                  /*bumps_sequence=*/false);
}

TEST_F(ChainTest, ReservationWindowAndAssembly) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_max_nodes(4);
  uint64_t shard = OpenShard(spec);
  int64_t window_end = app_->GetShard(shard)->reservation_deadline_height();
  // Two reservations (min_nodes 2), the second in the last block of the window.
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  AdvanceTo(window_end - 1);
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], shard))});
  ASSERT_EQ(app_->height(), window_end);
  auto running = EventsOf(last_.results.end_block_events(), "trainshard.shard_running");
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0]["members"], "2");
  EXPECT_EQ(app_->GetShard(shard)->status(), pb::SHARD_STATUS_RUNNING);
  // After the window a host is refused.
  ExpectRefused(hosts_[2], {ReserveMsg(SignedReservation(hosts_[2], shard))}, kFailedPrecondition,
                "is running, not open");

  // Assembly before the window ends, by a member; refused below min_nodes and for strangers.
  uint64_t second = OpenShard(spec);
  pb::MsgAssembleTrainshard assemble;
  assemble.set_creator(Addr(hosts_[0]));
  assemble.set_shard_id(second);
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], second))});
  ExpectRefused(hosts_[0], {PackMsg(assemble)}, kFailedPrecondition,
                "has 1 members, below min_nodes 2");
  Deliver(hosts_[1], {ReserveMsg(SignedReservation(hosts_[1], second))});
  pb::MsgAssembleTrainshard stranger = assemble;
  stranger.set_creator(Addr(outsider_));
  ExpectRefused(outsider_, {PackMsg(stranger)}, kPermissionDenied,
                "is neither the creator nor a member");
  TxResponse assembled = Deliver(hosts_[0], {PackMsg(assemble)});
  EXPECT_EQ(EventsOf(assembled.events(), "trainshard.shard_running").size(), 1u);
  EXPECT_EQ(app_->GetShard(second)->status(), pb::SHARD_STATUS_RUNNING);
  ExpectRefused(hosts_[0], {PackMsg(assemble)}, kFailedPrecondition, "is running, not open");
}

TEST_F(ChainTest, ShardWithoutEnoughNodesExpiresAndRefunds) {
  uint64_t shard = OpenShard(DefaultSpec());
  Deliver(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))});
  uint64_t creator_before = app_->Balance(Addr(creator_));
  AdvanceTo(app_->GetShard(shard)->reservation_deadline_height());
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "not_enough_nodes");
  EXPECT_EQ(expired[0]["refund"], "900000");
  auto record = app_->GetShard(shard);
  EXPECT_EQ(record->status(), pb::SHARD_STATUS_EXPIRED);
  EXPECT_EQ(record->close_reason(), pb::CLOSE_REASON_NOT_ENOUGH_NODES);
  EXPECT_EQ(record->escrow_held(), "0");
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before + 900000);
  // Nothing more happens at the old deadline.
  AdvanceTo(record->deadline_height());
  EXPECT_TRUE(EventsOf(last_.results.end_block_events(), "trainshard.shard_expired").empty());
}

TEST_F(ChainTest, OpenShardWhoseWindowEndsAtItsDeadlineExpiresOnce) {
  // Window == duration: at the deadline an OPEN shard without min_nodes expires once.
  pb::ShardSpec spec = DefaultSpec();
  spec.set_max_duration_blocks(5);
  spec.set_reservation_window_blocks(5);
  uint64_t shard = OpenShard(spec);
  AdvanceTo(app_->GetShard(shard)->deadline_height());
  auto expired = EventsOf(last_.results.end_block_events(), "trainshard.shard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]["reason"], "not_enough_nodes");
}

TEST_F(ChainTest, ShardKeepsItsRunSpecAndReaders) {
  pb::ShardSpec spec = DefaultSpec();
  spec.set_run_spec(R"({"model": {"family": "llama", "preset": "tiny"}})");
  spec.set_run_spec_hash(common::Sha256(spec.run_spec()));
  spec.add_readers(Addr(Key("reader-a")));
  spec.add_readers(Addr(Key("reader-b")));
  uint64_t shard = OpenShard(spec);
  auto record = app_->GetShard(shard);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->spec().run_spec(), spec.run_spec());
  EXPECT_EQ(record->spec().run_spec_hash(), spec.run_spec_hash());
  ASSERT_EQ(record->spec().readers_size(), 2);
  EXPECT_EQ(record->spec().readers(1), Addr(Key("reader-b")));
}

// ---------------------------------------------------------------------------------------------
// Governance

TEST_F(ChainTest, MalformedSpecsAreRefusedNamingTheField) {
  struct Case {
    std::function<void(pb::ShardSpec*)> mutate;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {[](pb::ShardSpec* s) { s->set_min_nodes(0); }, "spec.min_nodes: 0 is below 1"},
      {[](pb::ShardSpec* s) { s->set_max_nodes(1); }, "spec.max_nodes: 1 is below min_nodes 2"},
      {[](pb::ShardSpec* s) { s->set_max_nodes(17); },
       "spec.max_nodes: 17 exceeds max_nodes_limit 16"},
      {[](pb::ShardSpec* s) { s->set_run_spec_hash("abc"); },
       "spec.run_spec_hash: 3 bytes, want 32"},
      {[](pb::ShardSpec* s) { s->set_hardware_profile("GPU_big"); },
       "spec.hardware_profile: 'GPU_big' does not match [a-z0-9-]{1,64}"},
      {[](pb::ShardSpec* s) { s->set_max_duration_blocks(0); },
       "spec.max_duration_blocks: 0 is outside 1..1000"},
      {[](pb::ShardSpec* s) { s->set_reservation_window_blocks(41); },
       "spec.reservation_window_blocks: 41 is outside 1..max_duration_blocks 40"},
      {[](pb::ShardSpec* s) { s->mutable_escrow()->set_denom("uatom"); },
       "spec.escrow.denom: 'uatom' is not ngonka"},
      {[](pb::ShardSpec* s) { s->mutable_escrow()->set_amount("0"); },
       "spec.escrow.amount: 0 must be positive"},
      {[](pb::ShardSpec* s) { s->mutable_artifact_quota()->set_files_max(0); },
       "spec.artifact_quota.files_max: 0 must be positive"},
      {[](pb::ShardSpec* s) {
         s->mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_UNSPECIFIED);
       },
       "spec.reward_policy.kind: 0 is not a specified kind"},
      {[](pb::ShardSpec* s) { s->mutable_reward_policy()->set_max_host_share_bps(3000); },
       "spec.reward_policy.max_host_share_bps: 3000 times max_nodes 3 is below 10000"},
      {[](pb::ShardSpec* s) { s->mutable_reward_policy()->set_max_host_share_bps(10001); },
       "spec.reward_policy.max_host_share_bps: 10001 is outside 1..10000"},
      {[](pb::ShardSpec* s) { s->set_run_spec("another run spec"); },
       "spec.run_spec: its SHA-256 is not spec.run_spec_hash"},
      {[](pb::ShardSpec* s) {
         s->set_run_spec(std::string(kRunSpecBytesMax + 1, 'x'));
         s->set_run_spec_hash(common::Sha256(s->run_spec()));
       },
       "spec.run_spec: 65537 bytes is more than 65536"},
      {[](pb::ShardSpec* s) { s->add_readers("cosmos1qqqq"); }, "spec.readers[0]"},
      {[](pb::ShardSpec* s) {
         for (size_t i = 0; i <= kReadersMax; ++i)
           s->add_readers(Addr(Key(absl::StrCat("reader-", i))));
       },
       "spec.readers: 17 addresses is more than 16"},
      {[](pb::ShardSpec* s) {
         std::string reader = Addr(Key("reader"));
         s->add_readers(reader);
         s->add_readers(reader);
       },
       "spec.readers[1]: gonka1"},
  };
  for (const auto& c : cases) {
    pb::ShardSpec spec = DefaultSpec();
    c.mutate(&spec);
    SCOPED_TRACE(c.fragment);
    ExpectRefused(creator_, {ProposalMsg(creator_, {spec})}, kInvalidArgument,
                  "messages[0]: " + c.fragment);
  }
  ExpectRefused(creator_, {ProposalMsg(creator_, {DefaultSpec()}, "999")}, kInvalidArgument,
                "initial_deposit: 999 is below min_deposit 1000");
  ExpectRefused(creator_, {ProposalMsg(creator_, {})}, kInvalidArgument,
                "messages: 0 messages, want 1..4");
  ExpectRefused(creator_,
                {ProposalMsg(creator_, {DefaultSpec(), DefaultSpec(), DefaultSpec(), DefaultSpec(),
                                        DefaultSpec()})},
                kInvalidArgument, "messages: 5 messages, want 1..4");
  // A proposal message that is not a shard creation, and one with the wrong authority.
  cosmos::gov::v1::MsgSubmitProposal wrong;
  wrong.set_proposer(Addr(creator_));
  *wrong.add_messages() = SendMsg(creator_, Addr(hosts_[0]), "1");
  auto* coin = wrong.add_initial_deposit();
  coin->set_denom("ngonka");
  coin->set_amount("1000");
  ExpectRefused(creator_, {PackMsg(wrong)}, kInvalidArgument, "messages[0].type_url");
  pb::MsgCreateTrainshardProposal create;
  create.set_authority(Addr(creator_));
  create.set_creator(Addr(creator_));
  *create.mutable_spec() = DefaultSpec();
  wrong.clear_messages();
  *wrong.add_messages() = PackMsg(create);
  ExpectRefused(creator_, {PackMsg(wrong)}, kInvalidArgument, "is not the gov account");
  // Shard creation outside a proposal.
  ExpectRefusedTx(SignTx(creator_, {PackMsg(create)}), Addr(creator_), kInvalidArgument,
                  "executed by governance only", /*bumps_sequence=*/false);
}

TEST_F(ChainTest, TallyQuorumFailureRefundsDeposit) {
  uint64_t creator_before = app_->Balance(Addr(creator_));
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)});  // 100 of 450
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "rejected");
  EXPECT_EQ(finalized[0]["reason"], "quorum_not_reached");
  EXPECT_EQ(app_->GetProposal(1)->status(), pb::PROPOSAL_STATUS_REJECTED);
  EXPECT_EQ(app_->GetShard(1)->status(), pb::SHARD_STATUS_REJECTED);
  EXPECT_EQ(app_->GetShard(1)->close_reason(), pb::CLOSE_REASON_REJECTED);
  auto rejected = EventsOf(last_.results.end_block_events(), "trainshard.shard_rejected");
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0]["reason"], "proposal_rejected");
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before);
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 0u);
}

TEST_F(ChainTest, TallyVetoSendsDepositToCommunityPool) {
  uint64_t creator_before = app_->Balance(Addr(creator_));
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  Block({SignTx(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO)}),
         SignTx(hosts_[2], {VoteMsg(hosts_[2], 1, cosmos::gov::v1::VOTE_OPTION_YES)})});
  // Veto 100 of 300 voted (333333 ppm) would not pass the 334000 veto threshold; a deposit
  // top-up and a fourth vote (veto) in one tx make it 200 of 400.
  cosmos::gov::v1::MsgDeposit deposit;
  deposit.set_proposal_id(1);
  deposit.set_depositor(Addr(hosts_[3]));
  auto* coin = deposit.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount("500");
  Deliver(hosts_[3],
          {PackMsg(deposit), VoteMsg(hosts_[3], 1, cosmos::gov::v1::VOTE_OPTION_NO_WITH_VETO)});
  EXPECT_EQ(app_->GetProposal(1)->deposit(), "1500");
  EXPECT_EQ(app_->Balance(app_->GovAddress()), 1500u);
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "rejected");
  EXPECT_EQ(finalized[0]["reason"], "vetoed");
  EXPECT_EQ(finalized[0]["no_with_veto"], "200");
  EXPECT_EQ(app_->Balance(common::ModuleAddress("distribution")), 1500u);
  EXPECT_EQ(app_->Balance(Addr(creator_)), creator_before - 1000);
  EXPECT_EQ(app_->Balance(Addr(hosts_[3])), 500u);
}

TEST_F(ChainTest, TallyRejectAndRevote) {
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  // Host 1 first votes yes, then changes to no: only the last vote counts.
  Block({SignTx(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[1], {VoteMsg(hosts_[1], 1, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(hosts_[2], {VoteMsg(hosts_[2], 1, cosmos::gov::v1::VOTE_OPTION_NO)}),
         SignTx(hosts_[3], {VoteMsg(hosts_[3], 1, cosmos::gov::v1::VOTE_OPTION_ABSTAIN)})});
  Deliver(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_NO)});
  AdvanceTo(app_->GetProposal(1)->voting_end_height());
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["yes"], "100");
  EXPECT_EQ(finalized[0]["no"], "200");
  EXPECT_EQ(finalized[0]["abstain"], "100");
  EXPECT_EQ(finalized[0]["reason"], "threshold_not_reached");
  auto proposal = app_->GetProposal(1);
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_REJECTED);
  EXPECT_EQ(proposal->final_tally().no(), 200u);
  // Voting after the end, and with no weight, are refused.
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 1, cosmos::gov::v1::VOTE_OPTION_YES)},
                kFailedPrecondition, "proposal 1 is not in its voting period");
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 7, cosmos::gov::v1::VOTE_OPTION_YES)}, kNotFound,
                "proposal 7 not found");
  // Two refusals inside the next proposal's voting period (its end block tallies it).
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  ExpectRefused(outsider_, {VoteMsg(outsider_, 2, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "has no weight in epoch 0");
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], 2, cosmos::gov::v1::VoteOption(9))},
                kInvalidArgument, "option: 9");
}

TEST_F(ChainTest, PassedProposalWhoseCreatorCannotPayFails) {
  uint64_t proposal_id = PassProposal({DefaultSpec()}, &poor_);
  auto proposal = app_->GetProposal(proposal_id);
  EXPECT_EQ(proposal->status(), pb::PROPOSAL_STATUS_FAILED);
  EXPECT_THAT(proposal->failed_reason(), HasSubstr("insufficient funds"));
  auto finalized = EventsOf(last_.results.end_block_events(), "gov.proposal_finalized");
  ASSERT_EQ(finalized.size(), 1u);
  EXPECT_EQ(finalized[0]["status"], "failed");
  auto shard = app_->GetShard(proposal->shard_id());
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_REJECTED);
  EXPECT_EQ(shard->close_reason(), pb::CLOSE_REASON_ESCROW_UNFUNDED);
  EXPECT_TRUE(EventsOf(last_.results.end_block_events(), "trainshard.shard_opened").empty());
  EXPECT_EQ(app_->Balance(Addr(poor_)), 5000u);  // deposit refunded, nothing escrowed
}

// ---------------------------------------------------------------------------------------------
// PoC weights

TEST_F(ChainTest, WeightSubmissionAndEpochInForce) {
  auto weights_msg = [&](const common::PrivateKey& signer, uint64_t epoch,
                         std::vector<std::pair<std::string, uint64_t>> entries) {
    pb::MsgSubmitPocWeights msg;
    msg.set_authority(Addr(signer));
    msg.set_epoch(epoch);
    for (const auto& [host, weight] : entries) {
      auto* w = msg.add_weights();
      w->set_host(host);
      w->set_weight(weight);
    }
    return PackMsg(msg);
  };
  ExpectRefused(hosts_[0], {weights_msg(hosts_[0], 1, {{Addr(hosts_[0]), 1000}})},
                kPermissionDenied, "unauthorised");
  ExpectRefused(authority_, {weights_msg(authority_, 0, {{Addr(hosts_[0]), 1000}})},
                kFailedPrecondition, "epoch: 0 is not after the latest recorded epoch 0");
  ExpectRefused(authority_, {weights_msg(authority_, 2, {{Addr(hosts_[0]), 1000}})},
                kFailedPrecondition, "epoch: 2 is more than one epoch ahead of chain epoch 0");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {})}, kInvalidArgument, "weights: empty");
  ExpectRefused(authority_,
                {weights_msg(authority_, 1, {{Addr(hosts_[0]), 5}, {Addr(hosts_[0]), 6}})},
                kInvalidArgument, "weights[1].host");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {{Addr(hosts_[0]), 0}})}, kInvalidArgument,
                "weights[0].weight: 0 must be positive");
  ExpectRefused(authority_, {weights_msg(authority_, 1, {{"gonka1bad", 5}})}, kInvalidArgument,
                "weights[0].host");

  // A proposal under epoch 0, then epoch 1 weights recorded ahead of time.
  Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  TxResponse submitted = Deliver(
      authority_,
      {weights_msg(authority_, 1,
                   {{Addr(hosts_[1]), 100}, {Addr(hosts_[4]), 500}, {Addr(outsider_), 300}})});
  auto event = EventsOf(submitted.events(), "poc.weights_submitted");
  ASSERT_EQ(event.size(), 1u);
  EXPECT_EQ(event[0]["epoch"], "1");
  EXPECT_EQ(event[0]["hosts"], "3");
  EXPECT_EQ(event[0]["total_weight"], "900");
  EXPECT_EQ(app_->CurrentEpoch(), 0u);  // height < 10: epoch 0 is still in force
  auto epoch1 = app_->GetWeights(1);
  ASSERT_TRUE(epoch1.ok());
  EXPECT_EQ(epoch1->total_weight(), 900u);
  EXPECT_EQ(epoch1->weights_size(), 3);
  // The outsider has weight only from epoch 1 on; the proposal counts epoch 0.
  ExpectRefused(outsider_, {VoteMsg(outsider_, 1, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "no weight in epoch 0");
  ASSERT_EQ(app_->height(), 10);
  EXPECT_EQ(app_->CurrentEpoch(), 1u);

  // A proposal in epoch 1 counts epoch 1's weights: host 5 and the outsider carry it.
  TxResponse second = Deliver(creator_, {ProposalMsg(creator_, {DefaultSpec()})});
  uint64_t proposal_id =
      std::stoull(EventsOf(second.events(), "gov.proposal_submitted")[0]["proposal_id"]);
  EXPECT_EQ(app_->GetProposal(proposal_id)->weight_epoch(), 1u);
  EXPECT_EQ(app_->GetProposal(proposal_id)->total_weight(), 900u);
  ExpectRefused(hosts_[0], {VoteMsg(hosts_[0], proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)},
                kPermissionDenied, "has no weight in epoch 1");
  Block({SignTx(hosts_[4], {VoteMsg(hosts_[4], proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)}),
         SignTx(outsider_, {VoteMsg(outsider_, proposal_id, cosmos::gov::v1::VOTE_OPTION_YES)})});
  AdvanceTo(app_->GetProposal(proposal_id)->voting_end_height());
  ASSERT_EQ(app_->GetProposal(proposal_id)->status(), pb::PROPOSAL_STATUS_PASSED);
  uint64_t shard = app_->GetProposal(proposal_id)->shard_id();
  // Host 1 holds no weight in epoch 1; host 5 now holds 500 and reserves with it.
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], shard))}, kFailedPrecondition,
                "weight 0 below the floor 60 (epoch 1)");
  TxResponse reserved = Deliver(hosts_[4], {ReserveMsg(SignedReservation(hosts_[4], shard))});
  EXPECT_EQ(EventsOf(reserved.events(), "trainshard.reservation_added")[0]["frozen_weight"], "500");
  // Epoch 2 may be recorded once the chain is in epoch 1, not epoch 3.
  ExpectRefused(authority_, {weights_msg(authority_, 3, {{Addr(hosts_[0]), 1}})},
                kFailedPrecondition, "epoch: 3 is more than one epoch ahead of chain epoch 1");
  Deliver(authority_, {weights_msg(authority_, 2, {{Addr(hosts_[0]), 7}})});
  EXPECT_EQ(app_->CurrentEpoch(), 1u);
  AdvanceTo(20);
  EXPECT_EQ(app_->CurrentEpoch(), 2u);
  EXPECT_EQ(app_->GetWeights(2)->total_weight(), 7u);
}

// ---------------------------------------------------------------------------------------------
// Ante: tx-level refusals leave the state untouched

TEST_F(ChainTest, TxLevelRefusals) {
  google::protobuf::Any send = SendMsg(creator_, Addr(hosts_[0]), "10");
  // A bad signature.
  std::string tx = SignTx(creator_, {send});
  cosmos::tx::v1beta1::TxRaw raw;
  ASSERT_TRUE(raw.ParseFromString(tx));
  std::string sig = raw.signatures(0);
  sig[5] ^= 0x40;
  raw.set_signatures(0, sig);
  ExpectRefusedTx(DeterministicBytes(raw), Addr(creator_), kUnauthenticated,
                  "signature verification failed", /*bumps_sequence=*/false);
  // Signed for another chain.
  ExpectRefusedTx(SignTx(creator_, {send}, 0, "trainshard-other-2"), Addr(creator_),
                  kUnauthenticated, "signature verification failed", /*bumps_sequence=*/false);
  // A wrong sequence.
  ExpectRefusedTx(SignTx(creator_, {send}, 1), Addr(creator_), kFailedPrecondition,
                  "account sequence mismatch, expected 0, got 1", /*bumps_sequence=*/false);
  // A replayed tx.
  std::string once = SignTx(creator_, {send});
  ASSERT_EQ(app_->CheckTx(once).code(), kOk);
  Block({once});
  ASSERT_EQ(last_.results.tx_results(0).code(), kOk);
  ExpectRefusedTx(once, Addr(creator_), kFailedPrecondition,
                  "account sequence mismatch, expected 1, got 0", /*bumps_sequence=*/false);
  // Oversize and garbage bytes.
  ExpectRefusedTx(std::string(kMaxTxBytes + 1, 'x'), "", kInvalidArgument,
                  "exceeds the cap of 1048576 bytes", /*bumps_sequence=*/false);
  ExpectRefusedTx("\xff\xff\xff garbage", "", kInvalidArgument, "not a valid",
                  /*bumps_sequence=*/false);
  ExpectRefusedTx("", "", kInvalidArgument, "tx: empty", /*bumps_sequence=*/false);
  // An unknown account.
  common::PrivateKey stranger = Key("stranger");
  ExpectRefusedTx(BuildSignedTx(stranger, kChainId, 0, 0, {SendMsg(stranger, Addr(creator_), "1")}),
                  Addr(stranger), kNotFound, "not found", /*bumps_sequence=*/false);
  // An unknown message type.
  google::protobuf::Any unknown;
  unknown.set_type_url("/cosmos.staking.v1beta1.MsgDelegate");
  ExpectRefusedTx(SignTx(creator_, {unknown}), Addr(creator_), kInvalidArgument,
                  "is not a message this chain accepts", /*bumps_sequence=*/false);
  // A message with an unknown field appended.
  google::protobuf::Any extra = SendMsg(creator_, Addr(hosts_[0]), "10");
  extra.mutable_value()->append("\xa0\x06\x01");  // field 100, varint 1
  ExpectRefusedTx(SignTx(creator_, {extra}), Addr(creator_), kInvalidArgument, "unknown field 100",
                  /*bumps_sequence=*/false);
}

TEST_F(ChainTest, TransfersCreateAccountsAndFailuresOnlyBumpTheSequence) {
  common::PrivateKey fresh = Key("fresh");
  TxResponse sent = Deliver(creator_, {SendMsg(creator_, Addr(fresh), "5000")});
  auto transfer = EventsOf(sent.events(), "bank.transfer");
  ASSERT_EQ(transfer.size(), 1u);
  EXPECT_EQ(transfer[0]["from"], Addr(creator_));
  EXPECT_EQ(transfer[0]["to"], Addr(fresh));
  EXPECT_EQ(transfer[0]["amount"], "5000");
  EXPECT_EQ(app_->Account(Addr(fresh))->first, 12u);  // after 9 genesis and 3 module accounts
  Deliver(fresh, {SendMsg(fresh, Addr(creator_), "1")});
  EXPECT_EQ(app_->Account(Addr(fresh))->second, 1u);
  ExpectRefused(fresh, {SendMsg(fresh, Addr(creator_), "5000")}, kFailedPrecondition,
                "insufficient funds");
  ExpectRefused(fresh, {SendMsg(fresh, Addr(creator_), "0")}, kInvalidArgument,
                "amount: amount 0 must be positive");
  ExpectRefused(fresh, {SendMsg(fresh, app_->EscrowAddress(), "1")}, kInvalidArgument,
                "is a module account");
  ExpectRefused(fresh, {SendMsg(fresh, "GONKA1XYZ", "1")}, kInvalidArgument, "to_address");
  // Two messages: the second fails, so the first is undone too.
  ExpectRefused(
      fresh, {SendMsg(fresh, Addr(hosts_[0]), "10"), SendMsg(fresh, Addr(hosts_[0]), "9999")},
      kFailedPrecondition, "message 1 (/cosmos.bank.v1beta1.MsgSend): insufficient funds");
  // CheckTx queues several txs of one account.
  ASSERT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")})).code(), kOk);
  ASSERT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")}, 1)).code(), kOk);
  TxResponse stale = app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")}));
  EXPECT_EQ(stale.code(), kFailedPrecondition);
  // The check state also holds the balance effects: a spend beyond what is left is refused.
  TxResponse overspend = app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "4998")}, 2));
  EXPECT_EQ(overspend.code(), kFailedPrecondition) << overspend.raw_log();
  app_->Commit();
  EXPECT_EQ(app_->CheckTx(SignTx(fresh, {SendMsg(fresh, Addr(creator_), "1")})).code(), kOk);
}

// ---------------------------------------------------------------------------------------------
// Determinism

TEST_F(ChainTest, SameBlocksGiveSameAppHashesAndRestoreContinues) {
  // Drive a full scenario on app_, recording blocks and hashes.
  std::vector<std::string> hashes;
  uint64_t shard = OpenShard(DefaultSpec());
  ReserveThree(shard);
  pb::Settlement s = MakeSettlement(shard);
  const int64_t restore_at = app_->height();
  const std::map<std::string, std::string> state_at = app_->state();
  const std::string hash_at = app_->app_hash();
  Deliver(creator_, {SettleMsg(creator_, s,
                               {SignSettlement(hosts_[0], s), SignSettlement(hosts_[1], s),
                                SignSettlement(hosts_[2], s)})});
  Deliver(creator_, {SendMsg(creator_, Addr(Key("fresh")), "77")});
  AdvanceTo(app_->height() + 3);

  // A second app fed the same blocks gives the same hash after every block.
  auto replica = App::InitChain(genesis_);
  ASSERT_TRUE(replica.ok());
  std::unique_ptr<App> restored;
  std::string previous_hash(32, '\0');
  for (size_t i = 0; i < blocks_.size(); ++i) {
    tendermint::types::Header header;
    header.set_chain_id(kChainId);
    header.set_height(static_cast<int64_t>(i) + 1);
    auto outcome = (*replica)->FinalizeBlock(header, blocks_[i]);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    (*replica)->Commit();
    // The hash chain is what the doc says.
    EXPECT_EQ(outcome->results.app_hash(), (*replica)->app_hash());
    EXPECT_NE(outcome->results.app_hash(), previous_hash);
    previous_hash = outcome->results.app_hash();
    hashes.push_back(outcome->results.app_hash());
    if (header.height() > restore_at) {
      if (restored == nullptr) {
        auto app = App::Restore(genesis_, state_at, restore_at, hash_at);
        ASSERT_TRUE(app.ok()) << app.status();
        restored = *std::move(app);
      }
      auto again = restored->FinalizeBlock(header, blocks_[i]);
      ASSERT_TRUE(again.ok());
      restored->Commit();
      EXPECT_EQ(again->results.app_hash(), outcome->results.app_hash()) << "height " << i + 1;
      EXPECT_EQ(again->changes.size(), outcome->changes.size());
    }
  }
  EXPECT_EQ((*replica)->app_hash(), app_->app_hash());
  EXPECT_EQ((*replica)->state(), app_->state());
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(restored->state(), app_->state());
  EXPECT_EQ(restored->GetShard(shard)->status(), pb::SHARD_STATUS_SETTLED);
}

TEST_F(ChainTest, ChangeSetReplaysToTheSameState) {
  std::map<std::string, std::string> mirror = app_->state();
  uint64_t shard = OpenShard(DefaultSpec());
  (void)shard;
  // Re-run the blocks on a fresh app and apply each change set to a copy of the genesis state.
  auto replica = App::InitChain(genesis_);
  ASSERT_TRUE(replica.ok());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    tendermint::types::Header header;
    header.set_height(static_cast<int64_t>(i) + 1);
    auto outcome = (*replica)->FinalizeBlock(header, blocks_[i]);
    ASSERT_TRUE(outcome.ok());
    for (size_t j = 1; j < outcome->changes.size(); ++j) {
      EXPECT_LT(outcome->changes[j - 1].key, outcome->changes[j].key);
    }
    for (const auto& change : outcome->changes) {
      if (change.value.has_value()) {
        mirror[change.key] = *change.value;
      } else {
        EXPECT_EQ(mirror.erase(change.key), 1u);
      }
    }
  }
  EXPECT_EQ(mirror, app_->state());
}

TEST_F(ChainTest, RestoreRefusesAnotherGenesisAndBlocksMustBeInOrder) {
  pb::Genesis other = MakeGenesis("trainshard-other-2");
  auto restored = App::Restore(other, app_->state(), 0, std::string(32, '\0'));
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kInvalidArgument);
  tendermint::types::Header header;
  header.set_height(5);
  EXPECT_EQ(app_->FinalizeBlock(header, {}).status().code(), absl::StatusCode::kInvalidArgument);
  header.set_height(1);
  header.set_chain_id("trainshard-other-2");
  EXPECT_EQ(app_->FinalizeBlock(header, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(app_->height(), 0);
}

}  // namespace
}  // namespace ts::bridge
