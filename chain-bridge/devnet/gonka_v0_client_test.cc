// The gonka-v0 client (chain-bridge/client/gonka_v0_client.h) against a real devnet node of the
// gonka-v0 profile over gRPC: hosts opt in publishing their endpoint URLs, governance passes
// Gonka's proposal, the creator assembles, and the client's module view of the trainshard is
// checked field by field (members, weights, endpoints, certificate pins, the run spec pinned by
// the base image), then after a host kicks its own node and after the creator settles. The
// translation's pure parts (URLs, base images, a node serving two models) are checked alone.
#include "chain-bridge/client/gonka_v0_client.h"

#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "chain-bridge/devnet/devnet_test_util.h"
#include "chain-bridge/devnet/services.h"
#include "chain-bridge/module/tx.h"
#include "common/hex.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gtest/gtest.h"
#include "inference/inference/trainshard.grpc.pb.h"

namespace ts::bridge {
namespace {

using namespace devnet_test;  // NOLINT: the devnet's test keys and genesis

namespace gv0 = ::inference::inference;

constexpr char kProfile[] = "cpu-small";
constexpr int kCreator = 0;
constexpr int kVoter = 1;
// Hosts 2..5 have one node each; 2..4 publish endpoints, 5 none.
constexpr int kFirstHost = 2;
constexpr int kHosts = 4;

std::string Pin(int host) { return common::Sha256("cert of host " + std::to_string(host)); }
std::string EndpointOf(int host) { return "127.0.0.1:" + std::to_string(7000 + host); }
std::string RunSpecHash() { return common::Sha256("a run spec document"); }

std::string FieldOf(const cosmos::base::abci::v1beta1::TxResponse& r, const std::string& type,
                    const std::string& key) {
  for (const auto& e : r.events()) {
    if (e.type() != type) continue;
    for (const auto& a : e.attributes()) {
      if (a.key() == key) return a.value();
    }
  }
  return "";
}

class GonkaV0ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pb::Genesis genesis = TestGenesis(kFirstHost + kHosts);
    // Gonka's rules tie the opt-in TTL and the retention to the epoch.
    genesis.mutable_params()->set_epoch_length_blocks(10);
    // Every tx below is priced from the node's Config, as on any Cosmos node.
    genesis.mutable_params()->set_min_gas_price("0.001");
    pb::GonkaV0Genesis* gonka = genesis.mutable_gonka_v0();
    gv0::TrainingParams* p = gonka->mutable_params();
    p->set_training_enabled(true);
    p->set_max_nodes_per_shard(8);
    p->set_max_active_shards(4);
    p->set_min_duration_blocks(10);
    p->set_max_duration_blocks(10000);
    p->set_max_active_shards_per_creator(2);
    p->set_max_total_reserved_nodes(8);
    p->set_max_reserved_share_per_model_bps(7500);
    p->set_max_reserved_share_per_profile_bps(7500);
    p->set_max_expirations_per_block(8);
    p->set_settled_shard_retention_blocks(100);
    p->set_opt_in_ttl_blocks(200);
    p->set_release_buffer_blocks(5);
    for (int i = 0; i < kHosts; ++i) {
      pb::GonkaMlNode* node = gonka->add_ml_nodes();
      node->set_participant(Addr(kFirstHost + i));
      node->set_node_id("node-1");
      node->set_model_id("m");
      node->set_gpu_profile_id(kProfile);
      node->set_poc_weight(100 + i);
    }
    const std::string home = dir_.path() + "/home";
    ASSERT_TRUE(InitHome(home, genesis).ok());
    auto node = DevnetNode::Open(home, FastNode());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    ASSERT_TRUE(node_->Start().ok());
    client_ = NewChainClient(ChainProfile::kGonkaV0, node_->listen_address(), FastClient());
    query_ = gv0::Query::NewStub(
        grpc::CreateChannel(node_->listen_address(), grpc::InsecureChannelCredentials()));
  }

  cosmos::base::abci::v1beta1::TxResponse Send(int signer,
                                               const std::vector<google::protobuf::Any>& msgs) {
    auto r = client_->SignAndBroadcast(Key(signer), msgs, /*wait=*/true);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->code(), 0u) << r->raw_log();
    return *r;
  }

  void OptIn(int host, bool publish) {
    gv0::MsgSetTrainingNodeOptIn opt_in;
    opt_in.set_creator(Addr(host));
    opt_in.set_node_id("node-1");
    opt_in.set_opt_in(true);
    gv0::MsgRefreshTrainingNodeOptIn refresh;
    refresh.set_creator(Addr(host));
    refresh.add_node_ids("node-1");
    if (publish) refresh.set_endpoint(GonkaV0EndpointUrl(EndpointOf(host), Pin(host), true));
    Send(host, {PackMsg(opt_in), PackMsg(refresh)});
  }

  // Passes Gonka's proposal through governance; its v0 proposal id.
  uint64_t PassProposal() {
    auto params = client_->Params();
    EXPECT_TRUE(params.ok()) << params.status();
    gv0::MsgCreateTrainshardProposal create;
    create.set_authority(params->gov_address());
    create.set_creator(Addr(kCreator));
    create.set_gpu_profile_id(kProfile);
    create.set_max_nodes(3);
    create.set_max_duration_blocks(2000);
    create.set_base_image(RunSpecBaseImage(RunSpecHash()));
    auto submitted =
        Send(kCreator, {GovProposalMsg(Addr(kCreator), "train", "", "1000", {PackMsg(create)})});
    const std::string gov_id = FieldOf(submitted, "gov.proposal_submitted", "proposal_id");
    EXPECT_FALSE(gov_id.empty());
    cosmos::gov::v1::MsgVote vote;
    vote.set_proposal_id(std::stoull(gov_id));
    vote.set_voter(Addr(kVoter));
    vote.set_option(cosmos::gov::v1::VOTE_OPTION_YES);
    Send(kVoter, {PackMsg(vote)});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      gv0::QueryGetTrainshardProposalRequest req;
      req.set_proposal_id(1);
      gv0::QueryGetTrainshardProposalResponse resp;
      grpc::ClientContext ctx;
      if (query_->TrainshardProposal(&ctx, req, &resp).ok() && resp.found()) return 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "the v0 proposal never appeared";
    return 0;
  }

  TempDir dir_;
  std::unique_ptr<DevnetNode> node_;
  std::unique_ptr<ChainClient> client_;
  std::unique_ptr<gv0::Query::Stub> query_;
};

TEST_F(GonkaV0ClientTest, StatusAndPricesFromWhatAnyCosmosNodeServes) {
  auto status = client_->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->chain_id, kChainId);
  const int64_t before = status->latest_height;
  auto params = client_->Params();
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->params().min_gas_price(), "0.001000000000000000");
  EXPECT_EQ(params->gov_address(), common::ModuleAddress("gov"));
  // A tx priced that way pays its fee and lands.
  const uint64_t balance = client_->Balance(Addr(kVoter)).value();
  auto sent = client_->SignAndBroadcast(Key(kVoter), {devnet_test::Send(kVoter, 0, 5)}, true);
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_EQ(sent->code(), 0u) << sent->raw_log();
  EXPECT_LT(client_->Balance(Addr(kVoter)).value(), balance - 5) << "a fee was paid";
  status = client_->Status();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_GT(status->latest_height, before);
  EXPECT_EQ(status->app_hash.size(), 32u);
}

TEST_F(GonkaV0ClientTest, TrainshardSeenAsARunningShardThroughItsLife) {
  for (int i = 0; i < kHosts; ++i) OptIn(kFirstHost + i, /*publish=*/kFirstHost + i != 5);
  const uint64_t proposal = PassProposal();
  ASSERT_EQ(proposal, 1u);
  gv0::MsgAssembleTrainshard assemble;
  assemble.set_creator(Addr(kCreator));
  assemble.set_proposal_id(proposal);
  auto assembled = Send(kCreator, {PackMsg(assemble)});
  ASSERT_EQ(FieldOf(assembled, "trainshard_assembled", "trainshard_id"), "1");

  auto shard = client_->Shard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->id(), 1u);
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_EQ(shard->creator(), Addr(kCreator));
  EXPECT_EQ(shard->spec().run_spec_hash(), RunSpecHash());
  EXPECT_EQ(shard->spec().hardware_profile(), kProfile);
  EXPECT_EQ(shard->spec().max_nodes(), 3u);
  EXPECT_EQ(shard->spec().escrow().amount(), "0");
  EXPECT_EQ(shard->deadline_height() - shard->open_height(), 2000);
  // Three of the four nodes (one stays free for the model), each its host's only one.
  ASSERT_EQ(shard->reservations_size(), 3);
  uint64_t total = 0;
  for (const pb::Reservation& r : shard->reservations()) {
    int host = -1;
    for (int i = kFirstHost; i < kFirstHost + kHosts; ++i) {
      if (Addr(i) == r.host()) host = i;
    }
    ASSERT_NE(host, -1) << r.host();
    EXPECT_EQ(r.frozen_weight(), static_cast<uint64_t>(100 + host - kFirstHost));
    if (host == 5) {
      EXPECT_EQ(r.endpoint(), "") << "host 5 published no endpoint";
      EXPECT_EQ(r.tls_cert_sha256(), "");
    } else {
      EXPECT_EQ(r.endpoint(), EndpointOf(host));
      EXPECT_EQ(r.tls_cert_sha256(), Pin(host));
    }
    total += r.frozen_weight();
  }
  EXPECT_EQ(shard->total_weight(), total);

  auto running = client_->Shards(pb::SHARD_STATUS_RUNNING);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ(running->front().reservations_size(), 3);
  EXPECT_TRUE(client_->Shards(pb::SHARD_STATUS_OPEN)->empty());
  EXPECT_EQ(client_->Escrow(1)->shard_escrow(), "0");
  EXPECT_EQ(client_->Settlement(1).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(client_->Proposal(1).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(client_->Shard(99).status().code(), absl::StatusCode::kNotFound);

  // A host kicks its own node: no longer a member.
  const std::string kicked = shard->reservations(0).host();
  int kicked_key = -1;
  for (int i = kFirstHost; i < kFirstHost + kHosts; ++i) {
    if (Addr(i) == kicked) kicked_key = i;
  }
  gv0::MsgAutokickTrainshardNode kick;
  kick.set_creator(kicked);
  kick.set_trainshard_id(1);
  kick.set_participant(kicked);
  kick.set_node_id("node-1");
  kick.set_reason("worker failed");
  kick.set_request_id("k1");
  Send(kicked_key, {PackMsg(kick)});
  shard = client_->Shard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ(shard->reservations_size(), 2);
  for (const auto& r : shard->reservations()) EXPECT_NE(r.host(), kicked);

  // The creator settles: the shard is SETTLED and its remaining members stay members.
  gv0::MsgSettleTrainshard settle;
  settle.set_creator(Addr(kCreator));
  settle.set_trainshard_id(1);
  Send(kCreator, {PackMsg(settle)});
  shard = client_->Shard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(shard->close_reason(), pb::CLOSE_REASON_SETTLED);
  EXPECT_EQ(shard->reservations_size(), 2);
  EXPECT_TRUE(client_->Shards(pb::SHARD_STATUS_UNSPECIFIED)->empty());
}

TEST(GonkaV0Translation, EndpointUrlsRoundTripAndBadOnesAreNamed) {
  const std::string pin = common::Sha256("cert");
  const std::string url = GonkaV0EndpointUrl("10.0.0.2:7001", pin, /*tls=*/true);
  EXPECT_EQ(url, "https://10.0.0.2:7001/tls-sha256/" + common::HexEncode(pin));
  auto parsed = ParseGonkaV0EndpointUrl(url);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->endpoint, "10.0.0.2:7001");
  EXPECT_EQ(parsed->tls_cert_sha256, pin);
  // Without a pin, or with a path of Gonka's own daemon: the endpoint alone.
  EXPECT_EQ(GonkaV0EndpointUrl("h:1", "", false), "http://h:1");
  EXPECT_EQ(ParseGonkaV0EndpointUrl("http://h:1")->tls_cert_sha256, "");
  EXPECT_EQ(ParseGonkaV0EndpointUrl("https://h:8443/trainshard")->endpoint, "h:8443");
  for (const std::string bad : {"ftp://h:1", "h:1", "http://h", "http://:80", "http://h:",
                                "https://h:1/tls-sha256/abcd", "https://h:1/tls-sha256/zz"}) {
    auto result = ParseGonkaV0EndpointUrl(bad);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(result.status().message().find(bad), std::string::npos) << result.status();
  }
}

TEST(GonkaV0Translation, NodeConfigGasPrices) {
  EXPECT_EQ(devnet::MinimumGasPriceText("0.002"), "0.002000000000000000ngonka");
  EXPECT_EQ(devnet::MinimumGasPriceText("3"), "3.000000000000000000ngonka");
  EXPECT_EQ(devnet::MinimumGasPriceText("0"), "");
  EXPECT_EQ(devnet::MinimumGasPriceText(""), "");
  EXPECT_EQ(GasPriceFromNodeConfig("0.002000000000000000ngonka").value(), "0.002000000000000000");
  EXPECT_EQ(GasPriceFromNodeConfig("0.1uatom,0.25ngonka").value(), "0.25");
  EXPECT_EQ(GasPriceFromNodeConfig("").value(), "");
  EXPECT_EQ(GasPriceFromNodeConfig("0.1uatom").value(), "");
  auto bad = GasPriceFromNodeConfig("-1ngonka");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("minimum_gas_price"), std::string::npos);
}

TEST(GonkaV0Translation, BaseImagePinsTheRunSpec) {
  const std::string hash = common::Sha256("spec");
  EXPECT_EQ(RunSpecBaseImage(hash), "trainshard-run@sha256:" + common::HexEncode(hash));
  EXPECT_EQ(RunSpecHashFromBaseImage(RunSpecBaseImage(hash)).value(), hash);
  EXPECT_EQ(RunSpecHashFromBaseImage("ghcr.io/x/y@sha256:" + common::HexEncode(hash)).value(),
            hash);
  for (const std::string& bad :
       {std::string("ghcr.io/x/y:latest"), "@sha256:" + std::string(64, 'a'),
        "x@sha256:" + std::string(63, 'a'), "x@sha256:" + std::string(64, 'g')}) {
    auto result = RunSpecHashFromBaseImage(bad);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(result.status().message().find("base_image"), std::string::npos);
  }
}

TEST(GonkaV0Translation, ANodeServingTwoModelsCountsOnceAndKickedNodesAreNotMembers) {
  gv0::Trainshard shard;
  shard.set_trainshard_id(7);
  shard.set_status(gv0::TRAINSHARD_STATUS_ACTIVE);
  shard.set_created_at_height(10);
  shard.set_expires_at_height(110);
  shard.set_base_image("not a digest");
  auto add = [&](const std::string& host, const std::string& node, const std::string& model,
                 int64_t weight, gv0::TrainshardNodeStatus status) {
    gv0::TrainshardReservedNode* n = shard.add_nodes();
    n->set_participant(host);
    n->set_node_id(node);
    n->set_model_id(model);
    n->set_poc_weight(weight);
    n->set_status(status);
  };
  add("a", "n1", "m1", 10, gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
  add("a", "n1", "m2", 10, gv0::TRAINSHARD_NODE_STATUS_ACTIVE);  // the same node, second model
  add("b", "n1", "m1", 7, gv0::TRAINSHARD_NODE_STATUS_AUTOKICKED);
  add("a", "n2", "m1", 5, gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
  auto out = ShardFromGonkaV0(shard);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->spec().run_spec_hash(), "") << "a base image without a digest pins nothing";
  EXPECT_EQ(out->spec().max_nodes(), 3u);
  ASSERT_EQ(out->reservations_size(), 1);
  EXPECT_EQ(out->reservations(0).host(), "a");
  EXPECT_EQ(out->reservations(0).frozen_weight(), 15u);
  EXPECT_EQ(out->total_weight(), 15u);
  shard.set_trainshard_id(0);
  EXPECT_EQ(ShardFromGonkaV0(shard).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ts::bridge
