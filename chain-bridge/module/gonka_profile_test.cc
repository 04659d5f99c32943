// The gonka-v0 profile through the App: a chain whose genesis sets gonka_v0 runs Gonka's
// trainshards v0 (gonka_v0.h) behind the same ante, gov and end block as the module: a gov
// proposal carrying Gonka's MsgCreateTrainshardProposal, hosts opting in, the creator assembling
// and settling, Gonka's refusals in codespace "inference" with its numbers; the module's shard
// messages refused there, and Gonka's refused on a chain of the module.
#include "chain-bridge/module/chain_test_util.h"
#include "chain-bridge/module/gonka_v0.h"

namespace ts::bridge::chain_test {
namespace {

constexpr char kProfile[] = "H100 x8";
constexpr char kModel[] = "Qwen/Qwen3-32B";
constexpr char kImage[] =
    "ghcr.io/gonka/train@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

class GonkaProfileTest : public ChainTest {
 protected:
  void SetUp() override {
    genesis_ = MakeGenesis(kChainId);
    pb::GonkaV0Genesis* gonka = genesis_.mutable_gonka_v0();
    *gonka->mutable_params() = DefaultTrainingParams();
    gonka->mutable_params()->set_training_enabled(true);
    gonka->mutable_params()->set_min_duration_blocks(10);
    // Gonka's epoch rules: the opt-in outlives an epoch (10 blocks here), the retention two.
    gonka->mutable_params()->set_opt_in_ttl_blocks(200);
    gonka->mutable_params()->set_settled_shard_retention_blocks(100);
    // Four hosts with one node each: three may be reserved (3/4 of the model's and the
    // profile's nodes), one stays free for the model.
    gonka->mutable_params()->set_max_reserved_share_per_model_bps(7500);
    gonka->mutable_params()->set_max_reserved_share_per_profile_bps(7500);
    for (int i = 0; i < 4; ++i) {
      pb::GonkaMlNode* node = gonka->add_ml_nodes();
      node->set_participant(Addr(hosts_[static_cast<size_t>(i)]));
      node->set_node_id("node-1");
      node->set_model_id(kModel);
      node->set_gpu_profile_id(kProfile);
      node->set_poc_weight(100 + i);
    }
    auto app = App::InitChain(genesis_);
    ASSERT_TRUE(app.ok()) << app.status();
    app_ = *std::move(app);
    CheckInvariants();
  }

  google::protobuf::Any CreateMsg(uint32_t max_nodes) {
    gv0::MsgCreateTrainshardProposal create;
    create.set_authority(app_->GovAddress());
    create.set_creator(Addr(creator_));
    create.set_gpu_profile_id(kProfile);
    create.set_max_nodes(max_nodes);
    create.set_max_duration_blocks(40);
    create.set_base_image(kImage);
    return PackMsg(create);
  }

  google::protobuf::Any GovProposal(const google::protobuf::Any& create) {
    return GovProposalMsg(Addr(creator_), "train on gonka", "", "1000", {create});
  }

  // Submits, votes yes with hosts 1..3 and runs to the end of voting; the proposal's status.
  pb::ProposalStatus PassGov(const google::protobuf::Any& create) {
    TxResponse submitted = Deliver(creator_, {GovProposal(create)});
    auto events = EventsOf(submitted.events(), "gov.proposal_submitted");
    EXPECT_EQ(events.size(), 1u);
    if (events.empty()) return pb::PROPOSAL_STATUS_UNSPECIFIED;
    const uint64_t id = std::stoull(events[0]["proposal_id"]);
    std::vector<std::string> votes;
    for (int i = 0; i < 3; ++i) {
      const auto& host = hosts_[static_cast<size_t>(i)];
      votes.push_back(SignTx(host, {VoteMsg(host, id, cosmos::gov::v1::VOTE_OPTION_YES)}));
    }
    Block(votes);
    AdvanceTo(std::stoll(events[0]["voting_end_height"]));
    return app_->GetProposal(id)->status();
  }

  google::protobuf::Any OptIn(int host) {
    gv0::MsgSetTrainingNodeOptIn msg;
    msg.set_creator(Addr(hosts_[static_cast<size_t>(host)]));
    msg.set_node_id("node-1");
    msg.set_opt_in(true);
    return PackMsg(msg);
  }

  google::protobuf::Any Assemble(uint64_t proposal_id) {
    gv0::MsgAssembleTrainshard msg;
    msg.set_creator(Addr(creator_));
    msg.set_proposal_id(proposal_id);
    return PackMsg(msg);
  }
};

TEST_F(GonkaProfileTest, GovernanceOptInAssembleSettle) {
  ASSERT_EQ(PassGov(CreateMsg(3)), pb::PROPOSAL_STATUS_PASSED);
  auto proposal = app_->GonkaProposal(1);
  ASSERT_TRUE(proposal.ok()) << proposal.status();
  ASSERT_TRUE(proposal->found());
  EXPECT_EQ(proposal->proposal().creator(), Addr(creator_));
  EXPECT_EQ(proposal->proposal().status(), gv0::TRAINSHARD_PROPOSAL_STATUS_OPEN);

  // Before anyone opts in there is no capacity: Gonka's 1203, in its codespace.
  ExpectRefused(creator_, {Assemble(1)}, Refusal("inference", 1203), "insufficient free capacity");
  for (int i = 0; i < 4; ++i) Deliver(hosts_[static_cast<size_t>(i)], {OptIn(i)});
  TxResponse assembled = Deliver(creator_, {Assemble(1)});
  EXPECT_EQ(EventsOf(assembled.events(), "trainshard_assembled").size(), 1u);
  auto reserved = EventsOf(assembled.events(), "trainshard_node_reserved");
  ASSERT_EQ(reserved.size(), 3u);
  auto shard = app_->GonkaTrainshard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE(shard->found());
  EXPECT_EQ(shard->trainshard().status(), gv0::TRAINSHARD_STATUS_ACTIVE);
  ASSERT_EQ(shard->trainshard().nodes_size(), 3);
  for (const auto& node : shard->trainshard().nodes()) {
    EXPECT_GE(node.poc_weight(), 100);  // frozen from the epoch's record
    EXPECT_EQ(node.status(), gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
  }
  EXPECT_EQ(app_->GonkaActiveTrainshards()->trainshards_size(), 1);
  // The proposal is spent: a second assembly is Gonka's 1200.
  ExpectRefused(creator_, {Assemble(1)}, Refusal("inference", 1200), "not open");
  // Only the creator settles (1205); then the shard is closed and no longer active.
  gv0::MsgSettleTrainshard settle;
  settle.set_creator(Addr(hosts_[0]));
  settle.set_trainshard_id(1);
  ExpectRefused(hosts_[0], {PackMsg(settle)}, Refusal("inference", 1205), "");
  settle.set_creator(Addr(creator_));
  Deliver(creator_, {PackMsg(settle)});
  EXPECT_EQ(app_->GonkaTrainshard(1)->trainshard().status(), gv0::TRAINSHARD_STATUS_SETTLED);
  EXPECT_EQ(app_->GonkaActiveTrainshards()->trainshards_size(), 0);
}

TEST_F(GonkaProfileTest, AProposalItsKeeperRefusesFailsAndTheModulesMessagesAreRefused) {
  // Over max_nodes_per_shard (64): the gov proposal passes the vote and fails to execute.
  EXPECT_EQ(PassGov(CreateMsg(65)), pb::PROPOSAL_STATUS_FAILED);
  EXPECT_FALSE(app_->GonkaProposal(1)->found());
  // The module's own shard messages and proposal type have no place on this chain.
  ExpectRefused(hosts_[0], {ReserveMsg(SignedReservation(hosts_[0], 1))}, kFailedPrecondition,
                "runs Gonka's trainshards v0");
  ExpectRefused(creator_, {ProposalMsg(creator_, {DefaultSpec()})}, kInvalidArgument,
                "is not /inference.inference.MsgCreateTrainshardProposal");
  EXPECT_EQ(app_->GetShard(1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(GonkaProfileTest, ABadGonkaGenesisIsRefusedNamingTheField) {
  pb::Genesis bad = genesis_;
  bad.mutable_gonka_v0()->mutable_params()->set_max_nodes_per_shard(0);
  auto app = App::InitChain(bad);
  ASSERT_FALSE(app.ok());
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("gonka_v0: "));
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("max_nodes_per_shard"));
}

// A chain of the module refuses Gonka's messages and queries.
TEST_F(ChainTest, GonkaMessagesAreRefusedOnAChainOfTheModule) {
  gv0::MsgSetTrainingNodeOptIn opt_in;
  opt_in.set_creator(Addr(hosts_[0]));
  opt_in.set_node_id("node-1");
  opt_in.set_opt_in(true);
  ExpectRefused(hosts_[0], {PackMsg(opt_in)}, kFailedPrecondition,
                "not Gonka's trainshards v0 (genesis.gonka_v0 is unset)");
  EXPECT_EQ(app_->GonkaTrainshard(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ts::bridge::chain_test
