#include "sidecar/peer/shard_directory.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

class FakeClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return 1'700'000'000'000 + now_ms_.load(); }
  int64_t MonotonicMs() override { return now_ms_.load(); }
  void SleepMs(int64_t ms) override { now_ms_ += ms; }
  void Advance(int64_t ms) { now_ms_ += ms; }

 private:
  std::atomic<int64_t> now_ms_{1000};
};

// The shard queries of a chain, scripted; the host sidecar's FakeChainClient does not answer
// them. Everything else is unimplemented.
class ShardChain final : public bridge::ChainClient {
 public:
  void SetShard(pb::Shard shard) {
    absl::MutexLock l(&mu_);
    shards_[shard.id()] = std::move(shard);
  }
  void RemoveShard(uint64_t id) {
    absl::MutexLock l(&mu_);
    shards_.erase(id);
  }
  void SetUnavailable(bool v) {
    absl::MutexLock l(&mu_);
    unavailable_ = v;
  }
  int shard_calls() const {
    absl::MutexLock l(&mu_);
    return shard_calls_;
  }
  // While held, Shard() waits (as a chain that answers slowly) until Release().
  void Hold() {
    absl::MutexLock l(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock l(&mu_);
    held_ = false;
  }
  int waiting() const {
    absl::MutexLock l(&mu_);
    return waiting_;
  }

  absl::StatusOr<pb::Shard> Shard(uint64_t shard_id) override {
    absl::MutexLock l(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
    --waiting_;
    ++shard_calls_;
    if (unavailable_) return absl::UnavailableError("chain is down");
    auto it = shards_.find(shard_id);
    if (it == shards_.end()) return absl::NotFoundError(absl::StrCat("shard ", shard_id));
    return it->second;
  }

  absl::StatusOr<bridge::ChainStatus> Status() override { return Unimplemented(); }
  absl::StatusOr<std::vector<tendermint::abci::Event>> EventsAt(int64_t) override {
    return Unimplemented();
  }
  absl::StatusOr<bridge::AccountInfo> Account(const std::string&) override {
    return Unimplemented();
  }
  absl::StatusOr<uint64_t> Balance(const std::string&) override { return Unimplemented(); }
  absl::StatusOr<std::vector<pb::Shard>> Shards(pb::ShardStatus) override {
    return Unimplemented();
  }
  absl::StatusOr<pb::EpochWeights> Weights(uint64_t, bool) override { return Unimplemented(); }
  absl::StatusOr<pb::Proposal> Proposal(uint64_t) override { return Unimplemented(); }
  absl::StatusOr<pb::QueryEscrowResponse> Escrow(uint64_t) override { return Unimplemented(); }
  absl::StatusOr<pb::SettlementRecord> Settlement(uint64_t) override { return Unimplemented(); }
  absl::StatusOr<pb::QueryParamsResponse> Params() override { return Unimplemented(); }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> BroadcastRaw(
      const std::string&) override {
    return Unimplemented();
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> Simulate(const std::string&) override {
    return Unimplemented();
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> GetTx(const std::string&) override {
    return Unimplemented();
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> SignAndBroadcast(
      const common::PrivateKey&, const std::vector<google::protobuf::Any>&, bool) override {
    return Unimplemented();
  }

 private:
  static absl::Status Unimplemented() { return absl::UnimplementedError("not scripted"); }

  mutable absl::Mutex mu_;
  std::map<uint64_t, pb::Shard> shards_ ABSL_GUARDED_BY(mu_);
  bool unavailable_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int shard_calls_ ABSL_GUARDED_BY(mu_) = 0;
};

pb::Shard MakeShard(uint64_t id, pb::ShardStatus status, std::vector<std::string> hosts) {
  pb::Shard shard;
  shard.set_id(id);
  shard.set_status(status);
  shard.mutable_spec()->mutable_artifact_quota()->set_bytes_max(1 << 30);
  shard.mutable_spec()->mutable_artifact_quota()->set_files_max(5000);
  uint64_t weight = 10;
  for (const std::string& host : hosts) {
    pb::Reservation* r = shard.add_reservations();
    r->set_shard_id(id);
    r->set_host(host);
    r->set_endpoint(absl::StrCat("10.0.0.", weight, ":7000"));
    r->set_frozen_weight(weight);
    weight += 10;
  }
  return shard;
}

TEST(ShardViewTest, FromChain) {
  ShardView view =
      ShardViewFromChain(MakeShard(3, pb::SHARD_STATUS_RUNNING, {"gonka1a", "gonka1b"}));
  EXPECT_EQ(view.shard_id, 3u);
  EXPECT_EQ(view.status, pb::SHARD_STATUS_RUNNING);
  ASSERT_EQ(view.members.size(), 2u);
  EXPECT_EQ(view.members[0].address, "gonka1a");
  EXPECT_EQ(view.members[0].endpoint, "10.0.0.10:7000");
  EXPECT_EQ(view.members[0].weight, 10u);
  EXPECT_EQ(view.members[1].address, "gonka1b");
  EXPECT_EQ(view.members[1].weight, 20u);
  EXPECT_EQ(view.quota_bytes_max, 1u << 30);
  EXPECT_EQ(view.quota_files_max, 5000u);
  ASSERT_NE(view.Find("gonka1b"), nullptr);
  EXPECT_EQ(view.Find("gonka1b")->endpoint, "10.0.0.20:7000");
  EXPECT_EQ(view.Find("gonka1c"), nullptr);
}

TEST(StaticShardDirectoryTest, MembersStatusAndUnknownShards) {
  StaticShardDirectory directory;
  directory.Set(ShardViewFromChain(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a"})));
  directory.Set(ShardViewFromChain(MakeShard(2, pb::SHARD_STATUS_PROPOSED, {"gonka1a"})));
  directory.Set(ShardViewFromChain(MakeShard(4, pb::SHARD_STATUS_OPEN, {"gonka1a"})));
  directory.Set(ShardViewFromChain(MakeShard(5, pb::SHARD_STATUS_SETTLED, {"gonka1a"})));
  directory.Set(ShardViewFromChain(MakeShard(6, pb::SHARD_STATUS_REJECTED, {"gonka1a"})));

  EXPECT_TRUE(directory.CheckMember(1, "gonka1a").ok());
  EXPECT_TRUE(directory.CheckMember(4, "gonka1a").ok());
  // Members keep access to a closed shard's artifacts (the final checkpoint).
  EXPECT_TRUE(directory.CheckMember(5, "gonka1a").ok());
  EXPECT_EQ(directory.CheckMember(6, "gonka1a").code(), absl::StatusCode::kFailedPrecondition);
  absl::Status s = directory.CheckMember(1, "gonka1z");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "host gonka1z is not a member of shard 1");
  s = directory.CheckMember(2, "gonka1a");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "shard 2 is SHARD_STATUS_PROPOSED, it has no members");
  s = directory.CheckMember(3, "gonka1a");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(directory.Get(3).status().code(), absl::StatusCode::kNotFound);

  auto view = directory.Get(1);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->members.size(), 1u);
  // Set replaces.
  directory.Set(ShardViewFromChain(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1z"})));
  EXPECT_TRUE(directory.CheckMember(1, "gonka1z").ok());
  EXPECT_FALSE(directory.CheckMember(1, "gonka1a").ok());
}

class ChainShardDirectoryTest : public ::testing::Test {
 protected:
  ChainShardDirectoryTest()
      : directory_(&chain_, &clock_, {/*ttl_ms=*/5000, /*min_refresh_ms=*/1000}) {}
  FakeClock clock_;
  ShardChain chain_;
  ChainShardDirectory directory_;
};

TEST_F(ChainShardDirectoryTest, CachesForTtl) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a", "gonka1b"}));
  for (int i = 0; i < 5; ++i) {
    auto view = directory_.Get(1);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->members.size(), 2u);
    EXPECT_TRUE(directory_.CheckMember(1, "gonka1b").ok());
    clock_.Advance(900);
  }
  EXPECT_EQ(chain_.shard_calls(), 1);
  clock_.Advance(1000);  // 5500 ms since the read
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a"}));
  auto view = directory_.Get(1);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->members.size(), 1u);
  EXPECT_EQ(chain_.shard_calls(), 2);
}

TEST_F(ChainShardDirectoryTest, NonMemberRefreshesAtMostOncePerInterval) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_OPEN, {"gonka1a"}));
  EXPECT_TRUE(directory_.CheckMember(1, "gonka1a").ok());
  EXPECT_EQ(chain_.shard_calls(), 1);
  // Right after a read, a stranger costs no chain query.
  for (int i = 0; i < 10; ++i) {
    absl::Status s = directory_.CheckMember(1, "gonka1new");
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(s.message(), HasSubstr("host gonka1new is not a member of shard 1"));
  }
  EXPECT_EQ(chain_.shard_calls(), 1);
  // The host reserves; after min_refresh_ms its first request refreshes and is recognised.
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_OPEN, {"gonka1a", "gonka1new"}));
  clock_.Advance(1000);
  EXPECT_TRUE(directory_.CheckMember(1, "gonka1new").ok());
  EXPECT_EQ(chain_.shard_calls(), 2);
  // A stranger again: no refresh within the interval, one after it.
  EXPECT_FALSE(directory_.CheckMember(1, "gonka1x").ok());
  EXPECT_EQ(chain_.shard_calls(), 2);
  clock_.Advance(1000);
  EXPECT_FALSE(directory_.CheckMember(1, "gonka1x").ok());
  EXPECT_FALSE(directory_.CheckMember(1, "gonka1x").ok());
  EXPECT_EQ(chain_.shard_calls(), 3);
}

// The creator and the spec's readers may read; a member is a member first; a reader named after
// the last read is recognised after one refresh; a proposed shard has no readers either.
TEST_F(ChainShardDirectoryTest, CreatorAndReadersMayRead) {
  pb::Shard shard = MakeShard(1, pb::SHARD_STATUS_SETTLED, {"gonka1a"});
  shard.set_creator("gonka1payer");
  shard.mutable_spec()->add_readers("gonka1friend");
  chain_.SetShard(shard);
  EXPECT_EQ(*directory_.CheckReader(1, "gonka1a"), ShardRole::kMember);
  EXPECT_EQ(*directory_.CheckReader(1, "gonka1payer"), ShardRole::kReader);
  EXPECT_EQ(*directory_.CheckReader(1, "gonka1friend"), ShardRole::kReader);
  EXPECT_EQ(directory_.CheckMember(1, "gonka1payer").code(), absl::StatusCode::kPermissionDenied);
  auto stranger = directory_.CheckReader(1, "gonka1x");
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(stranger.status().message(), "gonka1x is neither a member nor a reader of shard 1");
  EXPECT_EQ(chain_.shard_calls(), 1);
  ShardView view = ShardViewFromChain(shard);
  EXPECT_EQ(view.creator, "gonka1payer");
  EXPECT_EQ(view.readers, std::vector<std::string>{"gonka1friend"});
  EXPECT_FALSE(view.IsReader(""));

  shard.set_id(2);
  shard.set_status(pb::SHARD_STATUS_PROPOSED);
  chain_.SetShard(shard);
  EXPECT_EQ(directory_.CheckReader(2, "gonka1payer").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ChainShardDirectoryTest, StatusChecked) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_REJECTED, {"gonka1a"}));
  absl::Status s = directory_.CheckMember(1, "gonka1a");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("SHARD_STATUS_REJECTED"));
}

TEST_F(ChainShardDirectoryTest, UnknownShardRememberedBriefly) {
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(directory_.CheckMember(9, "gonka1a").code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(directory_.Get(9).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(chain_.shard_calls(), 1);
  chain_.SetShard(MakeShard(9, pb::SHARD_STATUS_OPEN, {"gonka1a"}));
  clock_.Advance(1000);
  EXPECT_TRUE(directory_.CheckMember(9, "gonka1a").ok());
  EXPECT_EQ(chain_.shard_calls(), 2);
}

TEST_F(ChainShardDirectoryTest, UnreachableChainServesLastView) {
  EXPECT_TRUE(directory_.Get(1).status().code() == absl::StatusCode::kNotFound);
  chain_.SetShard(MakeShard(2, pb::SHARD_STATUS_RUNNING, {"gonka1a"}));
  chain_.SetUnavailable(true);
  // Nothing cached: the chain's error.
  EXPECT_EQ(directory_.Get(2).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(directory_.CheckMember(2, "gonka1a").code(), absl::StatusCode::kUnavailable);
  chain_.SetUnavailable(false);
  EXPECT_TRUE(directory_.CheckMember(2, "gonka1a").ok());
  const int calls = chain_.shard_calls();
  chain_.SetUnavailable(true);
  clock_.Advance(6000);
  // Stale, but better than refusing every peer while the node restarts.
  EXPECT_TRUE(directory_.CheckMember(2, "gonka1a").ok());
  EXPECT_EQ(chain_.shard_calls(), calls + 1);
  // And the down chain is not asked again on every request.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(directory_.Get(2).ok());
  EXPECT_EQ(chain_.shard_calls(), calls + 1);
}

TEST_F(ChainShardDirectoryTest, ShardLeavesTheChain) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a"}));
  EXPECT_TRUE(directory_.CheckMember(1, "gonka1a").ok());
  chain_.RemoveShard(1);
  clock_.Advance(6000);
  EXPECT_EQ(directory_.CheckMember(1, "gonka1a").code(), absl::StatusCode::kNotFound);
}

// Peers choose the shard ids their requests name: a flood naming ids that do not exist (or
// shards this host knows nothing of) must not turn into as many chain queries. Members of a
// cached shard are served throughout, from a stale view once the budget is spent.
TEST_F(ChainShardDirectoryTest, ChainQueriesBoundedWhenPeersNameRandomShards) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a"}));
  ASSERT_TRUE(directory_.CheckMember(1, "gonka1a").ok());
  std::mt19937_64 rng(5);
  int unavailable = 0;
  // 10,000 requests over 2 s (0.2 ms apart), each naming a shard id never seen.
  for (int i = 0; i < 10000; ++i) {
    absl::Status s = directory_.CheckMember(1000 + rng() % 1000000000, "gonka1stranger");
    EXPECT_TRUE(absl::IsNotFound(s) || absl::IsUnavailable(s)) << s;
    unavailable += absl::IsUnavailable(s) ? 1 : 0;
    if (i % 5 == 0) clock_.Advance(1);
    if (i % 500 == 0) {
      EXPECT_TRUE(directory_.CheckMember(1, "gonka1a").ok()) << i;
    }
  }
  // A budget of 20 a second: the first 20, then 20 more a second (2 s), and the member's.
  EXPECT_LE(chain_.shard_calls(), 1 + 20 + 2 * 20 + 2);
  EXPECT_GT(unavailable, 9000);
  // Past the ttl with the budget spent, the member is still recognised (stale view).
  clock_.Advance(6000);
  for (int i = 0; i < 200; ++i) (void)directory_.CheckMember(2000000000 + i, "gonka1stranger");
  EXPECT_TRUE(directory_.CheckMember(1, "gonka1a").ok());
  EXPECT_EQ(directory_.CheckMember(1, "gonka1stranger").code(),
            absl::StatusCode::kPermissionDenied);
}

// A slow chain query (here: one that waits until released) holds up only the lookups that need
// the chain, not a member of a cached shard.
TEST_F(ChainShardDirectoryTest, CachedLookupsDoNotWaitForTheChain) {
  chain_.SetShard(MakeShard(1, pb::SHARD_STATUS_RUNNING, {"gonka1a"}));
  ASSERT_TRUE(directory_.CheckMember(1, "gonka1a").ok());
  chain_.Hold();
  std::thread slow([this] { (void)directory_.Get(77); });
  for (int i = 0; i < 1000 && chain_.waiting() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(chain_.waiting(), 1);
  auto member =
      std::async(std::launch::async, [this] { return directory_.CheckMember(1, "gonka1a"); });
  const bool answered = member.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  chain_.Release();
  slow.join();
  ASSERT_TRUE(answered) << "a cached lookup waited for a chain query of another shard";
  EXPECT_TRUE(member.get().ok());
}

}  // namespace
}  // namespace ts::sidecar
