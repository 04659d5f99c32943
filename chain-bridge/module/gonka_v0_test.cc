// Tests of GonkaV0Keeper (Gonka's trainshards v0) over a real KvOverlay: each message runs in a
// branch that is committed only when it succeeds, as the App runs a tx.
#include "chain-bridge/module/gonka_v0.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "chain-bridge/module/kv_overlay.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ts::bridge {
namespace {

using ::testing::HasSubstr;

constexpr char kProfile[] = "H100 x8";
constexpr char kOtherProfile[] = "A100 x4";
const std::string kImage = "registry.example/train@sha256:" + std::string(64, 'a');

std::string Account(const std::string& name) {
  return common::AddressFromBytes(common::Sha256("gonka-v0-test/" + name).substr(0, 20));
}

std::map<std::string, std::string> Attributes(const tendermint::abci::Event& event) {
  std::map<std::string, std::string> out;
  for (const auto& attribute : event.attributes()) out[attribute.key()] = attribute.value();
  return out;
}

// Gonka's ordering key, written out here rather than taken from the keeper: SHA-256 over the
// shard id as 8 big-endian bytes, the participant, one zero byte and the node id.
std::string ExpectedSortKey(uint64_t shard_id, const std::string& participant,
                            const std::string& node_id) {
  std::string bytes;
  for (int shift = 56; shift >= 0; shift -= 8) {
    bytes.push_back(static_cast<char>((shard_id >> shift) & 0xff));
  }
  bytes += participant;
  bytes.push_back('\0');
  bytes += node_id;
  return common::Sha256(bytes);
}

class GonkaV0Test : public ::testing::Test {
 protected:
  GonkaV0Test() : kv_(&state_) {
    env_.params = DefaultTrainingParams();
    env_.params.set_training_enabled(true);
    env_.params.set_min_duration_blocks(10);
    env_.params.set_max_duration_blocks(1000);
    // Shares at 100% so that only the "one node per model stays free" rule limits a shard
    // unless a test lowers them.
    env_.params.set_max_reserved_share_per_model_bps(10000);
    env_.params.set_max_reserved_share_per_profile_bps(10000);
    env_.authority = common::ModuleAddress("gov");
    creator_ = Account("creator");
    other_creator_ = Account("creator2");
    run_key_ = Account("run-key");
    outsider_ = Account("outsider");
    // Four hosts with two nodes each of kProfile serving model m1 (8 nodes), and host 4 has a
    // third node of another profile.
    for (int h = 1; h <= 4; ++h) {
      hosts_.push_back(Account("host" + std::to_string(h)));
      for (int n = 0; n < 2; ++n) {
        AddNode(hosts_.back(), "n" + std::to_string(n), "m1", kProfile, 100 * h + n);
      }
    }
    // Its own model, so it never counts toward m1's capacity.
    AddNode(hosts_[3], "other", "m3", kOtherProfile, 7);
  }

  void AddNode(const std::string& host, const std::string& node, const std::string& model,
               const std::string& profile, int64_t weight) {
    env_.ml_nodes.push_back(GonkaMlNode{host, node, model, profile, weight});
  }

  GonkaV0Keeper KeeperAt(int64_t height) { return GonkaV0Keeper(env_, &kv_, height, &events_); }

  // Runs `fn` on a keeper over a branch of the state, committed only when it succeeds; the
  // events it emitted are kept only then too.
  template <typename Fn>
  auto Run(int64_t height, Fn fn) {
    KvOverlay branch(&kv_);
    Events events;
    GonkaV0Keeper keeper(env_, &branch, height, &events);
    auto result = fn(keeper);
    if (result.ok()) {
      branch.Commit();
      events_.insert(events_.end(), events.begin(), events.end());
    }
    return result;
  }

  gv0::MsgCreateTrainshardProposal ProposalMsg(uint32_t max_nodes, int64_t duration = 100,
                                               const std::string& creator = "") {
    gv0::MsgCreateTrainshardProposal msg;
    msg.set_authority(env_.authority);
    msg.set_creator(creator.empty() ? creator_ : creator);
    msg.set_gpu_profile_id(kProfile);
    msg.set_max_nodes(max_nodes);
    msg.set_max_duration_blocks(duration);
    msg.set_base_image(kImage);
    msg.set_run_key(run_key_);
    return msg;
  }

  absl::StatusOr<uint64_t> Propose(int64_t height, const gv0::MsgCreateTrainshardProposal& msg) {
    auto response = Run(height, [&](GonkaV0Keeper& k) { return k.CreateProposal(msg); });
    if (!response.ok()) return response.status();
    return response->proposal_id();
  }

  absl::StatusOr<uint64_t> Assemble(int64_t height, uint64_t proposal_id,
                                    const std::string& creator = "") {
    gv0::MsgAssembleTrainshard msg;
    msg.set_creator(creator.empty() ? creator_ : creator);
    msg.set_proposal_id(proposal_id);
    auto response = Run(height, [&](GonkaV0Keeper& k) { return k.Assemble(msg); });
    if (!response.ok()) return response.status();
    return response->trainshard_id();
  }

  // Proposes and assembles a shard of `max_nodes` for `creator`.
  absl::StatusOr<uint64_t> Open(int64_t height, uint32_t max_nodes, int64_t duration = 100,
                                const std::string& creator = "") {
    auto proposal = Propose(height, ProposalMsg(max_nodes, duration, creator));
    if (!proposal.ok()) return proposal.status();
    return Assemble(height, *proposal, creator);
  }

  absl::Status OptIn(int64_t height, const std::string& host, const std::string& node,
                     bool opt_in = true) {
    gv0::MsgSetTrainingNodeOptIn msg;
    msg.set_creator(host);
    msg.set_node_id(node);
    msg.set_opt_in(opt_in);
    return Run(height, [&](GonkaV0Keeper& k) { return k.SetOptIn(msg); });
  }

  // Every kProfile node opts in at `height`.
  void OptInAll(int64_t height) {
    for (const auto& n : env_.ml_nodes) ASSERT_TRUE(OptIn(height, n.participant, n.node_id).ok());
  }

  absl::Status Settle(int64_t height, uint64_t id, const std::string& creator = "") {
    gv0::MsgSettleTrainshard msg;
    msg.set_creator(creator.empty() ? creator_ : creator);
    msg.set_trainshard_id(id);
    return Run(height, [&](GonkaV0Keeper& k) { return k.Settle(msg); });
  }

  absl::Status Kick(int64_t height, const std::string& signer, uint64_t id,
                    const std::string& participant, const std::string& node,
                    const std::string& request_id, const std::string& reason = "nccl timeout") {
    gv0::MsgAutokickTrainshardNode msg;
    msg.set_creator(signer);
    msg.set_trainshard_id(id);
    msg.set_participant(participant);
    msg.set_node_id(node);
    msg.set_reason(reason);
    msg.set_request_id(request_id);
    return Run(height, [&](GonkaV0Keeper& k) { return k.Autokick(msg); });
  }

  absl::StatusOr<gv0::MsgRefreshTrainingNodeOptInResponse> Refresh(
      int64_t height, const std::string& host, const std::vector<std::string>& nodes,
      const std::string& endpoint) {
    gv0::MsgRefreshTrainingNodeOptIn msg;
    msg.set_creator(host);
    for (const auto& node : nodes) msg.add_node_ids(node);
    msg.set_endpoint(endpoint);
    return Run(height, [&](GonkaV0Keeper& k) { return k.RefreshOptIn(msg); });
  }

  absl::Status EndBlock(int64_t height) {
    return Run(height, [&](GonkaV0Keeper& k) { return k.EndBlock(); });
  }

  gv0::Trainshard Shard(uint64_t id) {
    auto response = KeeperAt(0).GetTrainshard(id);
    EXPECT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->found()) << "trainshard " << id;
    return response->trainshard();
  }

  std::vector<std::map<std::string, std::string>> EventsOf(const std::string& type) const {
    std::vector<std::map<std::string, std::string>> out;
    for (const auto& event : events_) {
      if (event.type() == type) out.push_back(Attributes(event));
    }
    return out;
  }

  // The (participant, node) pairs of a shard's entries, in stored order.
  static std::vector<std::pair<std::string, std::string>> NodesOf(const gv0::Trainshard& shard) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& n : shard.nodes()) out.emplace_back(n.participant(), n.node_id());
    return out;
  }

  // The kProfile nodes (one entry each) in Gonka's order for `shard_id`, skipping `excluded`
  // hosts.
  std::vector<std::pair<std::string, std::string>> ExpectedOrder(
      uint64_t shard_id, const std::vector<std::string>& excluded = {}) const {
    std::vector<std::pair<std::string, std::pair<std::string, std::string>>> keyed;
    for (const auto& n : env_.ml_nodes) {
      if (n.gpu_profile_id != kProfile) continue;
      if (std::find(excluded.begin(), excluded.end(), n.participant) != excluded.end()) continue;
      keyed.push_back(
          {ExpectedSortKey(shard_id, n.participant, n.node_id), {n.participant, n.node_id}});
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [key, node] : keyed) out.push_back(node);
    return out;
  }

  static void ExpectGonka(const absl::Status& status, uint32_t code, const std::string& fragment) {
    EXPECT_EQ(GonkaV0CodeOf(status), code) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(fragment)) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("inference " + std::to_string(code)));
  }

  KvState state_;
  KvOverlay kv_;
  Events events_;
  GonkaV0Env env_;
  std::string creator_;
  std::string other_creator_;
  std::string run_key_;
  std::string outsider_;
  std::vector<std::string> hosts_;
};

// ---------------------------------------------------------------------------------------------
// Params, env and errors

TEST(GonkaV0ParamsTest, DefaultsAreGonkas) {
  gv0::TrainingParams p = DefaultTrainingParams();
  EXPECT_FALSE(p.training_enabled());
  EXPECT_EQ(p.max_nodes_per_shard(), 64u);
  EXPECT_EQ(p.max_active_shards(), 16u);
  EXPECT_EQ(p.min_duration_blocks(), 40);
  EXPECT_EQ(p.max_duration_blocks(), 100000);
  EXPECT_EQ(p.allowed_gpu_profile_ids_size(), 0);
  EXPECT_EQ(p.max_active_shards_per_creator(), 4u);
  EXPECT_EQ(p.creator_cooldown_blocks(), 0);
  EXPECT_EQ(p.max_total_reserved_nodes(), 256u);
  EXPECT_EQ(p.max_reserved_share_per_model_bps(), 5000u);
  EXPECT_EQ(p.max_reserved_share_per_profile_bps(), 5000u);
  EXPECT_EQ(p.max_expirations_per_block(), 32u);
  EXPECT_EQ(p.settled_shard_retention_blocks(), 100);
  EXPECT_EQ(p.opt_in_ttl_blocks(), 200);
  EXPECT_EQ(p.release_buffer_blocks(), 20);
  EXPECT_TRUE(GonkaV0Keeper::ValidateParams(p).ok());
  // Gonka's epoch length of 40: retention 100 == 2 * 40 + 20 is just enough once enabled.
  p.set_training_enabled(true);
  EXPECT_TRUE(GonkaV0Keeper::ValidateParams(p, /*epoch_length_blocks=*/40).ok());
  absl::Status longer_epoch = GonkaV0Keeper::ValidateParams(p, /*epoch_length_blocks=*/41);
  EXPECT_THAT(std::string(longer_epoch.message()),
              HasSubstr("training_params.settled_shard_retention_blocks"));
  p.set_settled_shard_retention_blocks(1000);
  absl::Status ttl = GonkaV0Keeper::ValidateParams(p, /*epoch_length_blocks=*/300);
  EXPECT_THAT(std::string(ttl.message()), HasSubstr("training_params.opt_in_ttl_blocks"));
  EXPECT_THAT(std::string(ttl.message()), HasSubstr("200"));
}

TEST(GonkaV0ParamsTest, RefusalsNameFieldAndValue) {
  struct Case {
    std::function<void(gv0::TrainingParams*)> change;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {[](auto* p) { p->set_max_nodes_per_shard(0); }, "training_params.max_nodes_per_shard"},
      {[](auto* p) { p->set_max_active_shards(0); }, "training_params.max_active_shards"},
      {[](auto* p) { p->set_max_active_shards_per_creator(0); }, "max_active_shards_per_creator"},
      {[](auto* p) { p->set_max_total_reserved_nodes(0); }, "max_total_reserved_nodes"},
      {[](auto* p) { p->set_max_expirations_per_block(0); }, "max_expirations_per_block"},
      {[](auto* p) { p->set_min_duration_blocks(0); }, "min_duration_blocks: must be > 0, got 0"},
      {[](auto* p) { p->set_opt_in_ttl_blocks(0); }, "opt_in_ttl_blocks"},
      {[](auto* p) { p->set_max_reserved_share_per_model_bps(10001); },
       "max_reserved_share_per_model_bps: must be <= 10000, got 10001"},
      {[](auto* p) { p->set_max_reserved_share_per_profile_bps(0); },
       "max_reserved_share_per_profile_bps"},
      {[](auto* p) { p->set_max_duration_blocks(39); }, "max_duration_blocks"},
      {[](auto* p) { p->set_creator_cooldown_blocks(-1); }, "creator_cooldown_blocks"},
      {[](auto* p) { p->set_release_buffer_blocks(2'000'000'000'000'000); },
       "release_buffer_blocks"},
      {[](auto* p) { p->add_allowed_gpu_profile_ids(""); }, "allowed_gpu_profile_ids[0]"},
  };
  for (const auto& c : cases) {
    gv0::TrainingParams p = DefaultTrainingParams();
    c.change(&p);
    absl::Status status = GonkaV0Keeper::ValidateParams(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.fragment;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.fragment));
  }
}

TEST_F(GonkaV0Test, ValidateEnvRefusesInconsistentNodes) {
  EXPECT_TRUE(GonkaV0Keeper::ValidateEnv(env_).ok());
  GonkaV0Env bad = env_;
  bad.ml_nodes.push_back({hosts_[0], "n0", "m2", kOtherProfile, 1});
  EXPECT_THAT(std::string(GonkaV0Keeper::ValidateEnv(bad).message()),
              HasSubstr("ml_nodes[9].gpu_profile_id"));
  bad = env_;
  bad.ml_nodes.push_back(env_.ml_nodes[0]);
  EXPECT_THAT(std::string(GonkaV0Keeper::ValidateEnv(bad).message()), HasSubstr("listed twice"));
  bad = env_;
  bad.ml_nodes[2].participant = "nope";
  EXPECT_THAT(std::string(GonkaV0Keeper::ValidateEnv(bad).message()),
              HasSubstr("ml_nodes[2].participant"));
  bad = env_;
  bad.authority = "";
  EXPECT_THAT(std::string(GonkaV0Keeper::ValidateEnv(bad).message()), HasSubstr("authority"));
}

TEST(GonkaV0ErrorTest, MessageQuotesCodeAndCodeReadsBack) {
  absl::Status status = GonkaV0Error(GonkaV0Code::kInsufficientCapacity, "2 of 3 nodes");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(), "inference 1203: insufficient free capacity: 2 of 3 nodes");
  EXPECT_EQ(GonkaV0CodeOf(status), 1203u);
  EXPECT_EQ(GonkaV0Error(GonkaV0Code::kTrainshardNotFound, "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(GonkaV0Error(GonkaV0Code::kAutokickNotAllowed, "x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(GonkaV0CodeOf(absl::InvalidArgumentError("creator: bad")), std::nullopt);
  EXPECT_EQ(GonkaV0CodeOf(absl::InvalidArgumentError("inference 99: x")), std::nullopt);
  EXPECT_EQ(GonkaV0CodeOf(absl::OkStatus()), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// CreateTrainshardProposal

TEST_F(GonkaV0Test, CreateProposalStoresOpenProposalsFromOne) {
  EXPECT_EQ(Propose(3, ProposalMsg(2)).value(), 1u);
  EXPECT_EQ(Propose(3, ProposalMsg(3)).value(), 2u);
  auto response = KeeperAt(3).GetProposal(2);
  ASSERT_TRUE(response.ok());
  ASSERT_TRUE(response->found());
  const gv0::TrainshardProposal& p = response->proposal();
  EXPECT_EQ(p.id(), 2u);
  EXPECT_EQ(p.status(), gv0::TRAINSHARD_PROPOSAL_STATUS_OPEN);
  EXPECT_EQ(p.creator(), creator_);
  EXPECT_EQ(p.gpu_profile_id(), kProfile);
  EXPECT_EQ(p.max_nodes(), 3u);
  EXPECT_EQ(p.max_duration_blocks(), 100);
  EXPECT_EQ(p.base_image(), kImage);
  EXPECT_EQ(p.run_key(), run_key_);
  auto events = EventsOf("trainshard_proposal_created");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1],
            (std::map<std::string, std::string>{
                {"proposal_id", "2"}, {"creator", creator_}, {"gpu_profile_id", kProfile}}));
  // No run key is fine too.
  auto no_run_key = ProposalMsg(2);
  no_run_key.clear_run_key();
  EXPECT_TRUE(Propose(3, no_run_key).ok());
}

TEST_F(GonkaV0Test, CreateProposalRefusalsNameFieldAndCode) {
  env_.params.add_allowed_gpu_profile_ids(kProfile);
  auto refuse = [&](auto change) {
    gv0::MsgCreateTrainshardProposal msg = ProposalMsg(2);
    change(&msg);
    auto result = Propose(3, msg);
    EXPECT_FALSE(result.ok());
    return result.status();
  };
  absl::Status s = refuse([&](auto* m) { m->set_authority(creator_); });
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("authority"));
  ExpectGonka(refuse([](auto* m) { m->set_gpu_profile_id(""); }), 1210, "gpu_profile_id");
  ExpectGonka(refuse([](auto* m) { m->set_gpu_profile_id(kOtherProfile); }), 1201, kOtherProfile);
  ExpectGonka(refuse([](auto* m) { m->set_max_nodes(0); }), 1202, "max_nodes 0 not in (0, 64]");
  ExpectGonka(refuse([](auto* m) { m->set_max_nodes(65); }), 1202, "max_nodes 65");
  ExpectGonka(refuse([](auto* m) { m->set_max_duration_blocks(9); }), 1202,
              "max_duration_blocks 9 not in [10, 1000]");
  ExpectGonka(refuse([](auto* m) { m->set_max_duration_blocks(1001); }), 1202,
              "max_duration_blocks 1001");
  s = refuse([](auto* m) { m->set_creator("gonka1notanaddress"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("creator"));
  EXPECT_EQ(GonkaV0CodeOf(s), std::nullopt);
  const std::string digest(64, 'b');
  for (const std::string& image :
       {std::string("registry.example/train:latest"), "@sha256:" + digest,
        "repo@sha256:" + std::string(63, 'b'), "repo@sha256:" + std::string(64, 'B'),
        "repo@sha256:" + std::string(65, 'b'), std::string(448, 'r') + "@sha256:" + digest,
        std::string("repo@sha1:") + digest}) {
    ExpectGonka(refuse([&](auto* m) { m->set_base_image(image); }), 1214, "base_image");
  }
  // 512 characters in all is still accepted.
  auto longest = ProposalMsg(2);
  longest.set_base_image(std::string(512 - 8 - 64, 'r') + "@sha256:" + digest);
  EXPECT_TRUE(Propose(3, longest).ok());
  s = refuse([](auto* m) { m->set_run_key("not-bech32"); });
  EXPECT_THAT(std::string(s.message()), HasSubstr("run_key"));
  // Only the accepted proposal was written.
  auto second = KeeperAt(3).GetProposal(2);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->found());
}

// ---------------------------------------------------------------------------------------------
// AssembleTrainshard

TEST_F(GonkaV0Test, AssembleSelectsInSha256OrderAndFreezesWeights) {
  OptInAll(1);
  auto proposal = Propose(2, ProposalMsg(3, /*duration=*/50));
  ASSERT_TRUE(proposal.ok());
  auto id = Assemble(5, *proposal);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 1u);

  gv0::Trainshard shard = Shard(1);
  auto expected = ExpectedOrder(1);
  expected.resize(3);
  EXPECT_EQ(NodesOf(shard), expected);
  EXPECT_EQ(shard.status(), gv0::TRAINSHARD_STATUS_ACTIVE);
  EXPECT_EQ(shard.creator(), creator_);
  EXPECT_EQ(shard.gpu_profile_id(), kProfile);
  EXPECT_EQ(shard.created_at_height(), 5);
  EXPECT_EQ(shard.expires_at_height(), 55);
  EXPECT_EQ(shard.proposal_id(), 1u);
  EXPECT_EQ(shard.base_image(), kImage);
  EXPECT_EQ(shard.run_key(), run_key_);
  for (const auto& node : shard.nodes()) {
    EXPECT_EQ(node.status(), gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
    EXPECT_EQ(node.model_id(), "m1");
    // Weights were set as 100 * host + node index.
    const auto host = std::find(hosts_.begin(), hosts_.end(), node.participant()) - hosts_.begin();
    EXPECT_EQ(node.poc_weight(), 100 * (host + 1) + (node.node_id() == "n1" ? 1 : 0));
    EXPECT_EQ(KeeperAt(5).ReservationOf(node.participant(), node.node_id()).value(), 1u);
  }
  // A later change of the epoch's weights does not touch the frozen copy.
  for (auto& n : env_.ml_nodes) n.poc_weight = 1;
  EXPECT_NE(Shard(1).nodes(0).poc_weight(), 1);

  EXPECT_EQ(KeeperAt(5).GetProposal(1)->proposal().status(),
            gv0::TRAINSHARD_PROPOSAL_STATUS_CONSUMED);
  auto active = KeeperAt(5).ActiveTrainshards();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->trainshards_size(), 1);
  EXPECT_EQ(active->trainshards(0).trainshard_id(), 1u);

  auto assembled = EventsOf("trainshard_assembled");
  ASSERT_EQ(assembled.size(), 1u);
  EXPECT_EQ(assembled[0], (std::map<std::string, std::string>{{"trainshard_id", "1"},
                                                              {"creator", creator_},
                                                              {"gpu_profile_id", kProfile},
                                                              {"expires_at_height", "55"},
                                                              {"base_image", kImage}}));
  auto reserved = EventsOf("trainshard_node_reserved");
  ASSERT_EQ(reserved.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(reserved[i]["participant"], expected[i].first);
    EXPECT_EQ(reserved[i]["node_id"], expected[i].second);
  }
  // One shard per proposal.
  ExpectGonka(Assemble(6, *proposal).status(), 1200, "proposal_id 1");
}

TEST_F(GonkaV0Test, SecondShardTakesNextNodesInItsOwnOrder) {
  OptInAll(1);
  ASSERT_TRUE(Open(5, 3).ok());
  auto second = Open(6, 2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 2u);
  // Shard 2 orders by its own id and skips shard 1's reserved nodes.
  auto taken = NodesOf(Shard(1));
  std::vector<std::pair<std::string, std::string>> expected;
  for (const auto& node : ExpectedOrder(2)) {
    if (std::find(taken.begin(), taken.end(), node) == taken.end()) expected.push_back(node);
  }
  expected.resize(2);
  EXPECT_EQ(NodesOf(Shard(2)), expected);
}

TEST_F(GonkaV0Test, NodeServingTwoModelsYieldsOneEntryPerModel) {
  // host1/n0 also serves m2; m2 has a second node elsewhere so one stays free.
  AddNode(hosts_[0], "n0", "m2", kProfile, 55);
  AddNode(hosts_[1], "n1", "m2", kProfile, 66);
  env_.params.set_max_nodes_per_shard(64);
  OptInAll(1);
  // Seven of eight m1 nodes may be taken (one stays free) and at most one of the two m2 nodes.
  ASSERT_TRUE(Open(5, 7).ok());
  gv0::Trainshard shard = Shard(1);
  std::map<std::string, int> per_model;
  for (const auto& n : shard.nodes()) ++per_model[n.model_id()];
  EXPECT_EQ(per_model["m1"], 7);
  EXPECT_EQ(per_model["m2"], 1);
  EXPECT_EQ(EventsOf("trainshard_node_reserved").size(), 7u);
  for (const auto& n : shard.nodes()) {
    if (n.model_id() == "m2") {
      EXPECT_EQ(n.poc_weight(), n.participant() == hosts_[0] ? 55 : 66);
    }
  }
}

TEST_F(GonkaV0Test, AssembledNodesCarryTheirLastRefreshedEndpoint) {
  OptInAll(1);
  ASSERT_TRUE(Refresh(2, hosts_[0], {"n0"}, "https://host1.example:8443/shard").ok());
  ASSERT_TRUE(Refresh(2, hosts_[1], {"n0", "n1"}, "http://10.0.0.2:7001").ok());
  auto proposal = Propose(3, ProposalMsg(6, /*duration=*/50));
  ASSERT_TRUE(proposal.ok());
  auto id = Assemble(5, *proposal);
  ASSERT_TRUE(id.ok()) << id.status();
  int with_endpoint = 0;
  const gv0::Trainshard shard = Shard(*id);
  for (const auto& node : shard.nodes()) {
    std::string expected;
    if (node.participant() == hosts_[0] && node.node_id() == "n0") {
      expected = "https://host1.example:8443/shard";
    } else if (node.participant() == hosts_[1]) {
      expected = "http://10.0.0.2:7001";
    }
    EXPECT_EQ(node.endpoint(), expected) << node.participant() << " " << node.node_id();
    with_endpoint += expected.empty() ? 0 : 1;
  }
  EXPECT_GT(with_endpoint, 0);
}

TEST_F(GonkaV0Test, AssembleRefusals) {
  OptInAll(1);
  auto proposal = Propose(2, ProposalMsg(2));
  ASSERT_TRUE(proposal.ok());
  ExpectGonka(Assemble(5, 42).status(), 1199, "proposal_id 42");
  ExpectGonka(Assemble(5, *proposal, outsider_).status(), 1205, outsider_);
  // Governance tightened the caps after the vote.
  env_.params.set_max_nodes_per_shard(1);
  ExpectGonka(Assemble(5, *proposal).status(), 1202, "max_nodes 2 not in (0, 1]");
  env_.params.set_max_nodes_per_shard(64);
  env_.params.set_training_enabled(false);
  ExpectGonka(Assemble(5, *proposal).status(), 1198, "training_enabled");
  env_.params.set_training_enabled(true);
  EXPECT_TRUE(Assemble(5, *proposal).ok());
}

TEST_F(GonkaV0Test, InsufficientCapacityIsAllOrNothing) {
  OptInAll(1);
  // Eight m1 nodes of the profile, but one must stay free for inference.
  auto proposal = Propose(2, ProposalMsg(8));
  ASSERT_TRUE(proposal.ok());
  absl::Status status = Assemble(5, *proposal).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  ExpectGonka(status, 1203, "insufficient free capacity: 7 of 8 nodes");
  // Nothing was reserved and the proposal is still open.
  EXPECT_EQ(KeeperAt(5).ReservationOf(hosts_[0], "n0").value(), std::nullopt);
  EXPECT_EQ(KeeperAt(5).GetProposal(*proposal)->proposal().status(),
            gv0::TRAINSHARD_PROPOSAL_STATUS_OPEN);
  EXPECT_TRUE(EventsOf("trainshard_assembled").empty());
}

TEST_F(GonkaV0Test, ShareAndTotalCapsLimitSelection) {
  OptInAll(1);
  // Model share 50% of 8 -> 4.
  env_.params.set_max_reserved_share_per_model_bps(5000);
  ExpectGonka(Open(5, 5).status(), 1203, "4 of 5");
  ASSERT_TRUE(Open(5, 4).ok());
  ExpectGonka(Open(5, 1).status(), 1203, "0 of 1");
  // Profile share 75% of 8 -> 6 (the model share no longer binds).
  env_.params.set_max_reserved_share_per_model_bps(10000);
  env_.params.set_max_reserved_share_per_profile_bps(7500);
  ExpectGonka(Open(6, 3).status(), 1203, "2 of 3");
  ASSERT_TRUE(Open(6, 2).ok());
  // The total cap counts every active shard's nodes.
  env_.params.set_max_reserved_share_per_profile_bps(10000);
  env_.params.set_max_total_reserved_nodes(6);
  ExpectGonka(Open(7, 1).status(), 1203, "0 of 1");
}

TEST_F(GonkaV0Test, CooldownAndActiveCaps) {
  OptInAll(1);
  env_.params.set_max_active_shards_per_creator(1);
  ASSERT_TRUE(Open(5, 1).ok());
  ExpectGonka(Open(5, 1).status(), 1207, "creator active shards 1");
  EXPECT_EQ(Open(5, 1).status().code(), absl::StatusCode::kResourceExhausted);
  env_.params.set_max_active_shards(2);
  ASSERT_TRUE(Open(5, 1, 100, other_creator_).ok());
  ExpectGonka(Open(5, 1, 100, Account("creator3")).status(), 1207, "global active shards 2");

  env_.params.set_creator_cooldown_blocks(10);
  ASSERT_TRUE(Settle(10, 1).ok());
  auto proposal = Propose(11, ProposalMsg(1));
  ASSERT_TRUE(proposal.ok());
  ExpectGonka(Assemble(15, *proposal).status(), 1206, "until height 20");
  ExpectGonka(Assemble(19, *proposal).status(), 1206, "until height 20");
  EXPECT_TRUE(Assemble(20, *proposal).ok());
}

TEST_F(GonkaV0Test, GuardiansAndLapsedOptInsAreExcluded) {
  env_.guardians.insert(hosts_[0]);
  OptInAll(1);  // expiry 201
  // host2's nodes refreshed later.
  ASSERT_TRUE(Refresh(150, hosts_[1], {"n0", "n1"}, "").ok());  // expiry 350
  auto proposal = Propose(2, ProposalMsg(1));
  ASSERT_TRUE(proposal.ok());
  // At 201 only host2 (not a guardian, opt-in live) has candidates.
  ASSERT_TRUE(Assemble(201, *proposal).ok());
  EXPECT_EQ(Shard(1).nodes(0).participant(), hosts_[1]);
  // host2 has two nodes; 7 would need guardians' or lapsed nodes.
  ExpectGonka(Open(201, 2).status(), 1203, "1 of 2");

  // Before the lapse, every non-guardian node is a candidate, and never a guardian's.
  KvState fresh;
  KvOverlay kv(&fresh);
  GonkaV0Env env = env_;
  Events events;
  GonkaV0Keeper keeper(env, &kv, 1, &events);
  for (const auto& n : env.ml_nodes) {
    gv0::MsgSetTrainingNodeOptIn msg;
    msg.set_creator(n.participant);
    msg.set_node_id(n.node_id);
    msg.set_opt_in(true);
    ASSERT_TRUE(keeper.SetOptIn(msg).ok());
  }
  auto created = keeper.CreateProposal(ProposalMsg(5));
  ASSERT_TRUE(created.ok());
  gv0::MsgAssembleTrainshard assemble;
  assemble.set_creator(creator_);
  assemble.set_proposal_id(created->proposal_id());
  GonkaV0Keeper at_100(env, &kv, 100, &events);
  ASSERT_TRUE(at_100.Assemble(assemble).ok());
  auto shard = at_100.GetTrainshard(1).value().trainshard();
  auto expected = ExpectedOrder(1, {hosts_[0]});
  expected.resize(5);
  EXPECT_EQ(NodesOf(shard), expected);
}

// ---------------------------------------------------------------------------------------------
// SettleTrainshard

TEST_F(GonkaV0Test, SettleByCreatorOnlyAndIdempotent) {
  OptInAll(1);
  ASSERT_TRUE(Open(5, 3).ok());
  ExpectGonka(Settle(10, 9), 1204, "trainshard_id 9");
  ExpectGonka(Settle(10, 1, run_key_), 1205, run_key_);
  ASSERT_TRUE(Settle(10, 1).ok());
  gv0::Trainshard shard = Shard(1);
  EXPECT_EQ(shard.status(), gv0::TRAINSHARD_STATUS_SETTLED);
  EXPECT_EQ(shard.close_reason(), gv0::TRAINSHARD_CLOSE_REASON_SETTLED);
  EXPECT_EQ(shard.closed_at_height(), 10);
  for (const auto& node : shard.nodes()) {
    EXPECT_EQ(node.status(), gv0::TRAINSHARD_NODE_STATUS_RELEASED_ON_CLOSE);
    EXPECT_EQ(node.released_at_height(), 10);
    EXPECT_EQ(node.release_reason(), "TRAINSHARD_CLOSE_REASON_SETTLED");
    EXPECT_EQ(node.reserved_until_height(), 30);
    // Still reserved through the return buffer.
    EXPECT_EQ(KeeperAt(10).ReservationOf(node.participant(), node.node_id()).value(), 1u);
  }
  EXPECT_EQ(KeeperAt(10).ActiveTrainshards()->trainshards_size(), 0);
  auto settled = EventsOf("trainshard_settled");
  ASSERT_EQ(settled.size(), 1u);
  EXPECT_EQ(settled[0],
            (std::map<std::string, std::string>{
                {"trainshard_id", "1"}, {"creator", creator_}, {"closed_at_height", "10"}}));
  // Again: success, nothing written, no event.
  const KvOverlay::Writes before = kv_.writes();
  EXPECT_TRUE(Settle(12, 1).ok());
  EXPECT_EQ(kv_.writes(), before);
  EXPECT_EQ(EventsOf("trainshard_settled").size(), 1u);
  // Only the creator, even when closed.
  ExpectGonka(Settle(12, 1, outsider_), 1205, outsider_);
}

// ---------------------------------------------------------------------------------------------
// AutokickTrainshardNode

TEST_F(GonkaV0Test, AutokickSignersAndIdempotency) {
  OptInAll(1);
  ASSERT_TRUE(Open(5, 4).ok());
  auto nodes = NodesOf(Shard(1));
  // An outsider may not kick; a host may not kick another host's node.
  ExpectGonka(Kick(6, outsider_, 1, nodes[0].first, nodes[0].second, "r0"), 1213, outsider_);
  std::string other_host;
  for (const auto& h : hosts_) {
    if (h != nodes[0].first) other_host = h;
  }
  ExpectGonka(Kick(6, other_host, 1, nodes[0].first, nodes[0].second, "r0"), 1213, "signer");
  // The creator, the run key, and the node's own host each may.
  ASSERT_TRUE(Kick(6, creator_, 1, nodes[0].first, nodes[0].second, "r1").ok());
  ASSERT_TRUE(Kick(7, run_key_, 1, nodes[1].first, nodes[1].second, "r2").ok());
  ASSERT_TRUE(Kick(8, nodes[2].first, 1, nodes[2].first, nodes[2].second, "r3").ok());
  gv0::Trainshard shard = Shard(1);
  EXPECT_EQ(shard.status(), gv0::TRAINSHARD_STATUS_ACTIVE);
  EXPECT_EQ(shard.nodes(0).status(), gv0::TRAINSHARD_NODE_STATUS_AUTOKICKED);
  EXPECT_EQ(shard.nodes(0).release_reason(), "nccl timeout");
  EXPECT_EQ(shard.nodes(0).released_at_height(), 6);
  EXPECT_EQ(shard.nodes(0).reserved_until_height(), 26);
  EXPECT_EQ(shard.nodes(1).released_at_height(), 7);
  EXPECT_EQ(shard.nodes(3).status(), gv0::TRAINSHARD_NODE_STATUS_ACTIVE);
  auto kicked = EventsOf("trainshard_node_autokicked");
  ASSERT_EQ(kicked.size(), 3u);
  EXPECT_EQ(kicked[0], (std::map<std::string, std::string>{{"trainshard_id", "1"},
                                                           {"participant", nodes[0].first},
                                                           {"node_id", nodes[0].second},
                                                           {"reason", "nccl timeout"},
                                                           {"height", "6"}}));
  // A retry of r1 is a no-op; r1 aimed at another node is refused.
  const KvOverlay::Writes before = kv_.writes();
  EXPECT_TRUE(Kick(9, creator_, 1, nodes[0].first, nodes[0].second, "r1").ok());
  EXPECT_EQ(kv_.writes(), before);
  EXPECT_EQ(EventsOf("trainshard_node_autokicked").size(), 3u);
  absl::Status reused = Kick(9, creator_, 1, nodes[3].first, nodes[3].second, "r1");
  EXPECT_EQ(reused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(reused.message()), HasSubstr("request_id \"r1\""));
  // A kicked node under a new request id is no longer active in the shard.
  ExpectGonka(Kick(9, creator_, 1, nodes[0].first, nodes[0].second, "r9"), 1212, nodes[0].second);
  ExpectGonka(Kick(9, creator_, 7, nodes[0].first, nodes[0].second, "r9"), 1204, "7");
  // Malformed fields (SDK errors, no inference code).
  absl::Status empty_request = Kick(9, creator_, 1, nodes[3].first, nodes[3].second, "");
  EXPECT_THAT(std::string(empty_request.message()), HasSubstr("request_id"));
  EXPECT_EQ(GonkaV0CodeOf(empty_request), std::nullopt);
  EXPECT_THAT(
      std::string(
          Kick(9, creator_, 1, nodes[3].first, nodes[3].second, std::string(129, 'x')).message()),
      HasSubstr("request_id"));
  EXPECT_THAT(
      std::string(Kick(9, creator_, 1, nodes[3].first, nodes[3].second, "r4", std::string(257, 'x'))
                      .message()),
      HasSubstr("reason"));
  EXPECT_THAT(std::string(Kick(9, creator_, 1, nodes[3].first, "", "r4").message()),
              HasSubstr("node_id"));
}

TEST_F(GonkaV0Test, KickingTheLastNodeExpiresTheShard) {
  OptInAll(1);
  env_.params.set_creator_cooldown_blocks(5);
  ASSERT_TRUE(Open(5, 2).ok());
  auto nodes = NodesOf(Shard(1));
  ASSERT_TRUE(Kick(6, creator_, 1, nodes[0].first, nodes[0].second, "a").ok());
  EXPECT_TRUE(EventsOf("trainshard_expired").empty());
  ASSERT_TRUE(Kick(8, nodes[1].first, 1, nodes[1].first, nodes[1].second, "b", "oom").ok());
  gv0::Trainshard shard = Shard(1);
  EXPECT_EQ(shard.status(), gv0::TRAINSHARD_STATUS_EXPIRED);
  EXPECT_EQ(shard.close_reason(), gv0::TRAINSHARD_CLOSE_REASON_NO_ACTIVE_NODES);
  EXPECT_EQ(shard.closed_at_height(), 8);
  // The kicked node keeps its kick, not the close.
  EXPECT_EQ(shard.nodes(1).status(), gv0::TRAINSHARD_NODE_STATUS_AUTOKICKED);
  EXPECT_EQ(shard.nodes(1).release_reason(), "oom");
  auto expired = EventsOf("trainshard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], (std::map<std::string, std::string>{
                            {"trainshard_id", "1"},
                            {"creator", creator_},
                            {"close_reason", "TRAINSHARD_CLOSE_REASON_NO_ACTIVE_NODES"},
                            {"closed_at_height", "8"}}));
  EXPECT_EQ(KeeperAt(8).ActiveTrainshards()->trainshards_size(), 0);
  // The retry is still a no-op; a new request on a closed shard is 1211.
  EXPECT_TRUE(Kick(9, creator_, 1, nodes[0].first, nodes[0].second, "a").ok());
  ExpectGonka(Kick(9, creator_, 1, nodes[0].first, nodes[0].second, "c"), 1211,
              "TRAINSHARD_STATUS_EXPIRED");
  // The close started the creator's cooldown.
  ExpectGonka(Open(12, 1).status(), 1206, "until height 13");
}

// ---------------------------------------------------------------------------------------------
// Opt-in

TEST_F(GonkaV0Test, OptInRules) {
  ExpectGonka(OptIn(1, hosts_[0], "nope"), 1209, "node nope not owned by");
  ExpectGonka(OptIn(1, hosts_[0], "other"), 1209, "other");  // host4's node
  ExpectGonka(OptIn(1, hosts_[0], ""), 1215, "node_id");
  EXPECT_THAT(std::string(OptIn(1, "bad", "n0").message()), HasSubstr("creator"));
  ASSERT_TRUE(OptIn(3, hosts_[0], "n0").ok());
  EXPECT_EQ(KeeperAt(3).OptInExpiry(hosts_[0], "n0").value(), 203);
  // Opting out of a node that never opted in, or twice, is fine.
  EXPECT_TRUE(OptIn(3, hosts_[0], "n1", false).ok());

  OptInAll(4);
  ASSERT_TRUE(Open(5, 7).ok());
  auto nodes = NodesOf(Shard(1));
  ExpectGonka(OptIn(6, nodes[0].first, nodes[0].second, false), 1208, nodes[0].second);
  // Once released (kicked) the node is only in its return buffer: opting out is allowed.
  ASSERT_TRUE(Kick(6, creator_, 1, nodes[0].first, nodes[0].second, "k").ok());
  EXPECT_TRUE(OptIn(7, nodes[0].first, nodes[0].second, false).ok());
  EXPECT_EQ(KeeperAt(7).OptInExpiry(nodes[0].first, nodes[0].second).value(), std::nullopt);
}

TEST_F(GonkaV0Test, RefreshOptInWithEndpoints) {
  auto refreshed = Refresh(10, hosts_[0], {"n0", "n1"}, "https://host1.example:8443/trainshard");
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_EQ(refreshed->expires_at_height(), 210);
  EXPECT_EQ(KeeperAt(10).OptInExpiry(hosts_[0], "n1").value(), 210);
  EXPECT_EQ(KeeperAt(10).Endpoint(hosts_[0], "n0"), "https://host1.example:8443/trainshard");
  // Empty withdraws the endpoint of the nodes named, and re-arms them.
  ASSERT_TRUE(Refresh(20, hosts_[0], {"n1"}, "").ok());
  EXPECT_EQ(KeeperAt(20).Endpoint(hosts_[0], "n1"), "");
  EXPECT_EQ(KeeperAt(20).Endpoint(hosts_[0], "n0"), "https://host1.example:8443/trainshard");
  EXPECT_EQ(KeeperAt(20).OptInExpiry(hosts_[0], "n1").value(), 220);

  for (const std::string& bad :
       {std::string("ftp://host1.example"), std::string("host1.example:80"), std::string("http://"),
        std::string("http://:80"), std::string("http://h/"), std::string("http://h/path/"),
        std::string("http://h?x=1"), std::string("http://h#f"), std::string("http://user:pw@h"),
        std::string("http://h:0"), std::string("http://h:65536"), std::string("http://h:"),
        std::string("http://h:8x"), std::string("http:opaque"), std::string("http://h p"),
        "http://" + std::string(250, 'h')}) {
    auto result = Refresh(30, hosts_[0], {"n0"}, bad);
    ExpectGonka(result.status(), 1215, "endpoint");
  }
  EXPECT_EQ(KeeperAt(30).OptInExpiry(hosts_[0], "n0").value(), 210);  // nothing refreshed
  for (const char* good : {"http://10.0.0.1:7000", "https://[::1]:8443/api", "http://h",
                           "HTTPS://h.example/x/y", "http://h:65535"}) {
    EXPECT_TRUE(ValidateTrainingEndpoint(good).ok()) << good;
  }

  ExpectGonka(Refresh(30, hosts_[0], {}, "").status(), 1215, "node_ids count 0");
  std::vector<std::string> many(257);
  for (size_t i = 0; i < many.size(); ++i) many[i] = "x" + std::to_string(i);
  ExpectGonka(Refresh(30, hosts_[0], many, "").status(), 1215, "node_ids count 257");
  ExpectGonka(Refresh(30, hosts_[0], {"n0", "n0"}, "").status(), 1215, "duplicate node_id n0");
  ExpectGonka(Refresh(30, hosts_[0], {"n0", ""}, "").status(), 1215, "node_id is empty");
  // One unowned node refuses the whole batch.
  ExpectGonka(Refresh(30, hosts_[0], {"n0", "other"}, "").status(), 1209, "other");
  EXPECT_EQ(KeeperAt(30).OptInExpiry(hosts_[0], "n0").value(), 210);
  ExpectGonka(Refresh(30, outsider_, {"n0"}, "").status(), 1209, "no ML nodes");
}

// ---------------------------------------------------------------------------------------------
// EndBlock

TEST_F(GonkaV0Test, ExpiryReleaseAfterBufferAndPruning) {
  OptInAll(1);
  ASSERT_TRUE(Open(5, 7, /*duration=*/10).ok());  // expires at 15; all but one node taken
  auto nodes = NodesOf(Shard(1));
  ASSERT_TRUE(Kick(6, creator_, 1, nodes[0].first, nodes[0].second, "req").ok());
  ASSERT_TRUE(EndBlock(14).ok());
  EXPECT_EQ(Shard(1).status(), gv0::TRAINSHARD_STATUS_ACTIVE);
  ASSERT_TRUE(EndBlock(15).ok());
  gv0::Trainshard shard = Shard(1);
  EXPECT_EQ(shard.status(), gv0::TRAINSHARD_STATUS_EXPIRED);
  EXPECT_EQ(shard.close_reason(), gv0::TRAINSHARD_CLOSE_REASON_TIMEOUT);
  EXPECT_EQ(shard.closed_at_height(), 15);
  EXPECT_EQ(shard.nodes(1).reserved_until_height(), 35);
  EXPECT_EQ(shard.nodes(1).release_reason(), "TRAINSHARD_CLOSE_REASON_TIMEOUT");
  auto expired = EventsOf("trainshard_expired");
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0],
            (std::map<std::string, std::string>{
                {"trainshard_id", "1"}, {"creator", creator_}, {"closed_at_height", "15"}}));

  // The kicked node's buffer ended at 26, the others' at 35.
  ASSERT_TRUE(EndBlock(26).ok());
  EXPECT_EQ(KeeperAt(26).ReservationOf(nodes[0].first, nodes[0].second).value(), std::nullopt);
  EXPECT_EQ(KeeperAt(26).ReservationOf(nodes[1].first, nodes[1].second).value(), 1u);
  // In the buffer the nodes are not selectable: only the kicked one and the never-taken node
  // are candidates.
  ASSERT_TRUE(Refresh(30, hosts_[0], {"n0", "n1"}, "").ok());
  for (int h = 1; h < 4; ++h) ASSERT_TRUE(Refresh(30, hosts_[h], {"n0", "n1"}, "").ok());
  ExpectGonka(Open(34, 3).status(), 1203, "2 of 3");
  ASSERT_TRUE(EndBlock(34).ok());
  EXPECT_EQ(KeeperAt(34).ReservationOf(nodes[1].first, nodes[1].second).value(), 1u);
  ASSERT_TRUE(EndBlock(35).ok());
  EXPECT_EQ(KeeperAt(35).ReservationOf(nodes[1].first, nodes[1].second).value(), std::nullopt);
  // Released: selectable again.
  auto again = Open(35, 7);
  ASSERT_TRUE(again.ok()) << again.status();

  // Pruned after retention (100): closed at 15, so at 115.
  ASSERT_TRUE(EndBlock(114).ok());
  EXPECT_TRUE(KeeperAt(114).GetTrainshard(1)->found());
  ASSERT_TRUE(EndBlock(115).ok());
  EXPECT_FALSE(KeeperAt(115).GetTrainshard(1)->found());
  EXPECT_TRUE(kv_.Scan(gv0_keys::Autokick(1, "")).empty());
  EXPECT_TRUE(kv_.Scan(gv0_keys::kClosedPrefix).empty());
  // Shard 2 (assembled at 35, duration 100) is untouched until it expires.
  EXPECT_EQ(Shard(2).status(), gv0::TRAINSHARD_STATUS_ACTIVE);
}

TEST_F(GonkaV0Test, EndBlockHandlesAtMostTheLimitPerStep) {
  OptInAll(1);
  env_.params.set_max_expirations_per_block(2);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Open(5, 1, /*duration=*/10, Account("c" + std::to_string(i))).ok());
  }
  ASSERT_TRUE(EndBlock(15).ok());
  EXPECT_EQ(Shard(1).status(), gv0::TRAINSHARD_STATUS_EXPIRED);
  EXPECT_EQ(Shard(2).status(), gv0::TRAINSHARD_STATUS_EXPIRED);
  EXPECT_EQ(Shard(3).status(), gv0::TRAINSHARD_STATUS_ACTIVE);
  ASSERT_TRUE(EndBlock(16).ok());
  EXPECT_EQ(Shard(3).status(), gv0::TRAINSHARD_STATUS_EXPIRED);
  EXPECT_EQ(Shard(3).closed_at_height(), 16);
  // Settled shards' stale expiry keys are gone too.
  EXPECT_TRUE(kv_.Scan(gv0_keys::kExpiryPrefix).empty());
}

// ---------------------------------------------------------------------------------------------
// Queries and determinism

TEST_F(GonkaV0Test, QueriesFoundAndNotFound) {
  auto missing = KeeperAt(1).GetTrainshard(99);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->found());
  EXPECT_FALSE(missing->has_trainshard());
  auto missing_proposal = KeeperAt(1).GetProposal(99);
  ASSERT_TRUE(missing_proposal.ok());
  EXPECT_FALSE(missing_proposal->found());
  EXPECT_EQ(KeeperAt(1).ActiveTrainshards()->trainshards_size(), 0);
  EXPECT_EQ(KeeperAt(1).Endpoint(hosts_[0], "n0"), "");

  OptInAll(1);
  ASSERT_TRUE(Open(5, 1).ok());
  ASSERT_TRUE(Open(5, 1, 100, other_creator_).ok());
  ASSERT_TRUE(Open(5, 1, 100, Account("creator3")).ok());
  ASSERT_TRUE(Settle(6, 2, other_creator_).ok());
  auto active = KeeperAt(6).ActiveTrainshards();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->trainshards_size(), 2);
  EXPECT_EQ(active->trainshards(0).trainshard_id(), 1u);
  EXPECT_EQ(active->trainshards(1).trainshard_id(), 3u);
  EXPECT_TRUE(KeeperAt(6).GetTrainshard(2)->found());

  // A corrupted record is DATA_LOSS, not "not found".
  kv_.Set(gv0_keys::Shard(2), "\xff\xff");
  EXPECT_EQ(KeeperAt(6).GetTrainshard(2).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(GonkaV0Test, OnlyWritesUnderItsPrefix) {
  OptInAll(1);
  ASSERT_TRUE(Open(5, 3).ok());
  ASSERT_TRUE(Refresh(6, hosts_[2], {"n0"}, "http://h3:9000").ok());
  ASSERT_TRUE(Settle(7, 1).ok());
  ASSERT_TRUE(EndBlock(200).ok());
  for (const auto& [key, value] : kv_.writes()) {
    EXPECT_EQ(key.rfind(gv0_keys::kPrefix, 0), 0u) << key;
  }
}

// The same sequence of messages on two overlays gives the same state, byte for byte.
TEST_F(GonkaV0Test, SameSequenceSameState) {
  auto play = [&](KvOverlay* kv) {
    Events events;
    auto at = [&](int64_t h) { return GonkaV0Keeper(env_, kv, h, &events); };
    for (const auto& n : env_.ml_nodes) {
      gv0::MsgSetTrainingNodeOptIn msg;
      msg.set_creator(n.participant);
      msg.set_node_id(n.node_id);
      msg.set_opt_in(true);
      EXPECT_TRUE(at(1).SetOptIn(msg).ok());
    }
    for (int i = 0; i < 3; ++i) {
      auto created = at(2).CreateProposal(ProposalMsg(2, 20, Account("d" + std::to_string(i))));
      EXPECT_TRUE(created.ok());
      if (!created.ok()) continue;
      gv0::MsgAssembleTrainshard assemble;
      assemble.set_creator(Account("d" + std::to_string(i)));
      assemble.set_proposal_id(created->proposal_id());
      EXPECT_TRUE(at(3 + i).Assemble(assemble).ok());
    }
    gv0::MsgSettleTrainshard settle;
    settle.set_creator(Account("d1"));
    settle.set_trainshard_id(2);
    EXPECT_TRUE(at(10).Settle(settle).ok());
    for (int64_t h = 10; h <= 150; ++h) EXPECT_TRUE(at(h).EndBlock().ok());
    std::string out;
    for (const auto& event : events) out += event.SerializeAsString();
    return out;
  };
  KvState state_a, state_b;
  KvOverlay a(&state_a), b(&state_b);
  std::string events_a = play(&a);
  std::string events_b = play(&b);
  EXPECT_FALSE(a.writes().empty());
  EXPECT_EQ(a.writes(), b.writes());
  EXPECT_EQ(events_a, events_b);
}

}  // namespace
}  // namespace ts::bridge
