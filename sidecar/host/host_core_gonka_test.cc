// HostCore under the gonka-v0 profile (host_core_gonka.cc) over the in-memory fake chain: the
// opt-in kept armed (both messages, the endpoint URL, once per period, again soon after a
// refusal, never while the policy does not offer), shards learnt from Gonka's events, and the
// settlement signed but never sent.
#include <string>
#include <vector>

#include "chain-bridge/client/gonka_v0_client.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "gtest/gtest.h"
#include "inference/inference/trainshard.pb.h"
#include "sidecar/host/fake_chain_client.h"
#include "sidecar/host/host_core.h"
#include "sidecar/host/host_core_fixture.h"

namespace ts::sidecar {
namespace {

namespace gv0 = ::inference::inference;
using testing::FakeChainClient;
using testing::FakeClock;
using testing::KeyOf;
using testing::MakeEvent;

constexpr char kChainId[] = "gonka-chain-1";
constexpr char kUrl[] = "https://127.0.0.1:7001/tls-sha256/00";

class HostCoreGonkaTest : public testing::HostCoreFixture {
 protected:
  HostCoreGonkaTest() : HostCoreFixture(kChainId) {}
  void SetUp() override {
    HostCoreFixture::SetUp();
    options_.chain_profile = bridge::ChainProfile::kGonkaV0;
    options_.gonka_node_ids = {"n1", "n2"};
    options_.gonka_endpoint_url = kUrl;
    options_.gonka_refresh_every_blocks = 20;
  }

  void StepAt(int64_t height) {
    chain_.SetLatestHeight(height);
    Step();
  }
  std::string ActionAt(int64_t height, uint32_t index) {
    const std::vector<pb::FollowedEvent> events = *core_->store().ListEvents(0, 1000);
    for (const auto& e : events) {
      if (e.height() == height && e.index() == index) return e.action();
    }
    return "";
  }

  // The messages of the opt-in txs broadcast so far, by type URL.
  std::vector<std::vector<google::protobuf::Any>> OptInTxs() {
    std::vector<std::vector<google::protobuf::Any>> out;
    for (const std::string& bytes : chain_.broadcasts()) {
      auto decoded = bridge::DecodeTx(bytes);
      if (!decoded.ok()) continue;
      out.emplace_back(decoded->body.messages().begin(), decoded->body.messages().end());
    }
    return out;
  }

  // What the gonka-v0 client answers for trainshard `id`: this host (weight 100) and other_ (80).
  void SetChainShard(uint64_t id, bool self_member) {
    gv0::Trainshard shard;
    shard.set_trainshard_id(id);
    shard.set_creator("gonka1creator");
    shard.set_gpu_profile_id("cpu-small");
    shard.set_status(gv0::TRAINSHARD_STATUS_ACTIVE);
    shard.set_created_at_height(3);
    shard.set_expires_at_height(503);
    auto add = [&](const std::string& host, int64_t weight) {
      auto* n = shard.add_nodes();
      n->set_participant(host);
      n->set_node_id("n1");
      n->set_poc_weight(weight);
      n->set_status(gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
    };
    if (self_member) add(address_, 100);
    add(other_, 80);
    chain_.SetShard(*bridge::ShardFromGonkaV0(shard));
  }
  void AddAssembly(int64_t height, uint64_t id, bool self_member) {
    SetChainShard(id, self_member);
    const std::string sid = std::to_string(id);
    chain_.AddEvent(height, MakeEvent("trainshard_assembled", {{"trainshard_id", sid}}));
    if (self_member) {
      chain_.AddEvent(height, MakeEvent("trainshard_node_reserved", {{"trainshard_id", sid},
                                                                     {"participant", address_},
                                                                     {"node_id", "n1"}}));
    }
    chain_.AddEvent(
        height, MakeEvent("trainshard_node_reserved",
                          {{"trainshard_id", sid}, {"participant", other_}, {"node_id", "n1"}}));
  }
};

TEST_F(HostCoreGonkaTest, KeepsItsNodesOptedInOncePerPeriod) {
  Open();
  StepAt(1);
  auto pending = Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].purpose(), kPurposeGonkaOptIn);
  auto txs = OptInTxs();
  ASSERT_EQ(txs.size(), 1u);
  ASSERT_EQ(txs[0].size(), 3u);  // two opt-ins, one refresh
  for (int i = 0; i < 2; ++i) {
    gv0::MsgSetTrainingNodeOptIn opt_in;
    ASSERT_EQ(txs[0][i].type_url(), "/inference.inference.MsgSetTrainingNodeOptIn");
    ASSERT_TRUE(opt_in.ParseFromString(txs[0][i].value()));
    EXPECT_EQ(opt_in.creator(), address_);
    EXPECT_EQ(opt_in.node_id(), i == 0 ? "n1" : "n2");
    EXPECT_TRUE(opt_in.opt_in());
  }
  gv0::MsgRefreshTrainingNodeOptIn refresh;
  ASSERT_EQ(txs[0][2].type_url(), "/inference.inference.MsgRefreshTrainingNodeOptIn");
  ASSERT_TRUE(refresh.ParseFromString(txs[0][2].value()));
  EXPECT_EQ(refresh.endpoint(), kUrl);
  EXPECT_EQ(std::vector<std::string>(refresh.node_ids().begin(), refresh.node_ids().end()),
            (std::vector<std::string>{"n1", "n2"}));

  // Included; nothing more until the period has passed, then one refresh again.
  chain_.MakeBlock(2);
  StepAt(2);
  EXPECT_TRUE(Pending().empty());
  for (int64_t h = 3; h < 21; ++h) StepAt(h);
  EXPECT_EQ(OptInTxs().size(), 1u);
  StepAt(21);
  EXPECT_EQ(OptInTxs().size(), 2u);
  // A restart remembers when the next one is due.
  chain_.MakeBlock(22);
  core_.reset();
  Open();
  StepAt(23);
  EXPECT_EQ(OptInTxs().size(), 2u);
}

TEST_F(HostCoreGonkaTest, ARefusedOptInIsTriedAgainSoon) {
  options_.gonka_refresh_every_blocks = 100;
  Open();
  StepAt(1);
  chain_.MakeBlock(2, /*delivered_code=*/1209, "node n2 not owned", "inference");
  StepAt(2);
  EXPECT_TRUE(Pending().empty());
  StepAt(11);
  EXPECT_EQ(OptInTxs().size(), 1u);
  StepAt(12);  // ten blocks after the refusal, not a hundred
  EXPECT_EQ(OptInTxs().size(), 2u);
}

TEST_F(HostCoreGonkaTest, OffersNothingWhileThePolicyDoesNot) {
  options_.policy.auto_reserve = false;
  Open();
  for (int64_t h = 1; h < 50; ++h) StepAt(h);
  EXPECT_TRUE(chain_.broadcasts().empty());
}

TEST_F(HostCoreGonkaTest, StopsOfferingAtMaxShards) {
  options_.policy.max_shards = 1;
  options_.gonka_refresh_every_blocks = 5;
  Open();
  StepAt(1);
  chain_.MakeBlock(2);
  AddAssembly(3, 1, /*self_member=*/true);
  for (int64_t h = 3; h < 30; ++h) StepAt(h);
  EXPECT_EQ(OptInTxs().size(), 1u)
      << "in a shard at its policy's max_shards, it lets the opt-in lapse";
  chain_.AddEvent(30, MakeEvent("trainshard_settled", {{"trainshard_id", "1"}}));
  StepAt(30);
  EXPECT_EQ(OptInTxs().size(), 2u);
}

TEST_F(HostCoreGonkaTest, LearnsItsShardsFromGonkasEvents) {
  options_.policy.auto_reserve = false;  // events only
  Open();
  AddAssembly(3, 1, /*self_member=*/true);
  AddAssembly(4, 2, /*self_member=*/false);
  chain_.AddEvent(5, MakeEvent("trainshard_assembled", {{"trainshard_id", "x"}}));
  chain_.AddEvent(6, MakeEvent("trainshard_settled", {{"trainshard_id", "1"}}));
  chain_.AddEvent(6, MakeEvent("trainshard_expired", {{"trainshard_id", "2"}}));
  StepAt(4);

  pb::HostShardRecord mine = Shard(1);
  EXPECT_EQ(mine.status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_TRUE(mine.reserved());
  EXPECT_EQ(mine.escrow(), "0");
  EXPECT_EQ(mine.frozen_weight(), 100u);
  EXPECT_EQ(mine.total_weight(), 180u);
  ASSERT_EQ(mine.members_size(), 2);
  EXPECT_EQ(ActionAt(3, 1), "picked:n1");
  pb::HostShardRecord theirs = Shard(2);
  EXPECT_EQ(theirs.status(), pb::SHARD_STATUS_RUNNING);
  EXPECT_FALSE(theirs.reserved());
  EXPECT_EQ(theirs.members_size(), 1);

  // The settlement is checked against those records and signed; it is never sent.
  pb::Settlement draft;
  draft.set_chain_id(kChainId);
  draft.set_shard_id(1);
  draft.set_final_checkpoint_root(std::string(32, '\xab'));
  for (const std::string& host : {address_, other_}) {
    auto* p = draft.add_payouts();
    p->set_host(host);
    p->set_amount("0");
  }
  draft.set_refund("0");
  pb::Settlement paid = draft;
  paid.mutable_payouts(0)->set_amount("1");
  auto refused = core_->SignSettlement(paid);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("escrow"), std::string::npos)
      << "v0 has no escrow to pay from: " << refused.status();
  auto signature = core_->SignSettlement(draft);
  ASSERT_TRUE(signature.ok()) << signature.status();
  auto sent = core_->SubmitSettlement(draft, {*signature});
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->code(), 0u);
  EXPECT_EQ(sent->txhash(), "");
  EXPECT_TRUE(chain_.broadcasts().empty());

  StepAt(6);
  EXPECT_EQ(ActionAt(5, 0).rfind("ignore:", 0), 0u) << ActionAt(5, 0);
  EXPECT_EQ(Shard(1).status(), pb::SHARD_STATUS_SETTLED);
  EXPECT_EQ(Shard(2).status(), pb::SHARD_STATUS_EXPIRED);
}

}  // namespace
}  // namespace ts::sidecar
