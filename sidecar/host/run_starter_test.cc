#include "sidecar/host/run_starter.h"

#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sidecar/host/fake_chain_client.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

using testing::FakeChainClient;
using ::testing::HasSubstr;

class RunStarterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-runstarter-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    auto store = HostStore::Open(dir_ + "/state");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    starter_ = std::make_unique<RunStarter>(
        store_.get(), &chain_, [this](uint64_t id) { return known_.count(id) > 0; },
        [this](uint64_t id, const std::string& doc) {
          starts_.push_back({id, doc});
          return start_result_;
        },
        RunStarterOptions{.poll_interval_ms = 10, .retry_min_ms = 100, .retry_max_ms = 400});
  }
  void TearDown() override {
    starter_.reset();
    store_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  // The follower's records after height `height`: the shard in `status`, this host a member.
  void Record(uint64_t id, pb::ShardStatus status, int64_t height, bool reserved = true) {
    pb::HostShardRecord rec;
    rec.set_shard_id(id);
    rec.set_status(status);
    rec.set_reserved(reserved);
    state::WriteBatch batch;
    batch.PutProto(kTableShards, ShardKey(id), rec);
    batch.Put(kTableMeta, kMetaCursorHeight, state::EncodeU64Key(static_cast<uint64_t>(height)));
    ASSERT_TRUE(store_->db().Write(batch).ok());
  }
  void OnChain(uint64_t id, pb::ShardStatus status, const std::string& run_spec) {
    pb::Shard shard;
    shard.set_id(id);
    shard.set_status(status);
    shard.mutable_spec()->set_run_spec(run_spec);
    chain_.SetShard(shard);
  }

  std::string dir_;
  std::unique_ptr<HostStore> store_;
  FakeChainClient chain_;
  std::set<uint64_t> known_;
  std::vector<std::pair<uint64_t, std::string>> starts_;
  absl::Status start_result_;
  std::unique_ptr<RunStarter> starter_;
};

TEST_F(RunStarterTest, StartsEachRunningShardOnceWithTheDocumentOnChain) {
  Record(1, pb::SHARD_STATUS_RUNNING, 10);
  Record(2, pb::SHARD_STATUS_OPEN, 10);                         // not running yet
  Record(3, pb::SHARD_STATUS_RUNNING, 10, /*reserved=*/false);  // not a member
  OnChain(1, pb::SHARD_STATUS_RUNNING, "{doc 1}");
  OnChain(2, pb::SHARD_STATUS_OPEN, "{doc 2}");
  OnChain(3, pb::SHARD_STATUS_RUNNING, "{doc 3}");
  EXPECT_EQ(starter_->Pass(0), 1);
  ASSERT_EQ(starts_.size(), 1u);
  EXPECT_EQ(starts_[0], std::make_pair(uint64_t{1}, std::string("{doc 1}")));
  EXPECT_EQ(starter_->Pass(1), 0);  // nothing new in the records

  // Shard 2 runs at the next height: started; shard 1 is not started twice.
  Record(2, pb::SHARD_STATUS_RUNNING, 11);
  OnChain(2, pb::SHARD_STATUS_RUNNING, "{doc 2}");
  EXPECT_EQ(starter_->Pass(2), 1);
  ASSERT_EQ(starts_.size(), 2u);
  EXPECT_EQ(starts_[1].first, 2u);
  auto snapshot = starter_->Snapshot();
  EXPECT_TRUE(snapshot[1].started);
  EXPECT_TRUE(snapshot[2].started);
  EXPECT_EQ(snapshot.count(3), 0u);
}

TEST_F(RunStarterTest, AKnownRunOrOneWithoutADocumentIsLeftAlone) {
  known_.insert(1);  // the operator's `shard run`, or a run resumed after a restart
  Record(1, pb::SHARD_STATUS_RUNNING, 5);
  Record(2, pb::SHARD_STATUS_RUNNING, 5);
  OnChain(1, pb::SHARD_STATUS_RUNNING, "{doc 1}");
  OnChain(2, pb::SHARD_STATUS_RUNNING, "");
  EXPECT_EQ(starter_->Pass(0), 0);
  EXPECT_TRUE(starts_.empty());
  auto snapshot = starter_->Snapshot();
  EXPECT_TRUE(snapshot[1].started);
  EXPECT_EQ(snapshot[1].attempts, 0u);
  EXPECT_TRUE(snapshot[2].left_alone);
  // A later height does not ask again.
  Record(3, pb::SHARD_STATUS_OPEN, 6);
  EXPECT_EQ(starter_->Pass(1000), 0);
  EXPECT_TRUE(starts_.empty());
}

TEST_F(RunStarterTest, ARefusedStartIsRetriedWithBackoffUntilItStarts) {
  Record(1, pb::SHARD_STATUS_RUNNING, 5);
  OnChain(1, pb::SHARD_STATUS_RUNNING, "{doc}");
  start_result_ = absl::UnavailableError("shard process not up yet");
  EXPECT_EQ(starter_->Pass(0), 0);
  EXPECT_EQ(starts_.size(), 1u);
  EXPECT_THAT(starter_->Snapshot()[1].last_error, HasSubstr("shard process not up yet"));
  EXPECT_EQ(starter_->Snapshot()[1].next_try_ms, 100);
  EXPECT_EQ(starter_->Pass(99), 0);  // not due
  EXPECT_EQ(starts_.size(), 1u);
  EXPECT_EQ(starter_->Pass(100), 0);  // due: tried, refused again, backoff doubles
  EXPECT_EQ(starts_.size(), 2u);
  EXPECT_EQ(starter_->Snapshot()[1].next_try_ms, 300);
  EXPECT_EQ(starter_->Pass(300), 0);
  EXPECT_EQ(starter_->Snapshot()[1].next_try_ms, 700);  // 400, the cap
  EXPECT_EQ(starter_->Pass(700), 0);
  EXPECT_EQ(starter_->Snapshot()[1].next_try_ms, 1100);

  // The chain cannot be reached: also retried, not given up.
  chain_.SetUnavailable(true);
  EXPECT_EQ(starter_->Pass(1100), 0);
  EXPECT_EQ(starts_.size(), 4u);
  EXPECT_FALSE(starter_->Snapshot()[1].last_error.empty());
  chain_.SetUnavailable(false);
  start_result_ = absl::OkStatus();
  EXPECT_EQ(starter_->Pass(1500), 1);
  EXPECT_EQ(starts_.size(), 5u);
  auto state = starter_->Snapshot()[1];
  EXPECT_TRUE(state.started);
  EXPECT_EQ(state.attempts, 6u);
  EXPECT_TRUE(state.last_error.empty());
  EXPECT_EQ(starter_->Pass(100000), 0);
}

TEST_F(RunStarterTest, AShardNoLongerRunningOnChainIsNotStarted) {
  Record(1, pb::SHARD_STATUS_RUNNING, 5);
  OnChain(1, pb::SHARD_STATUS_SETTLED, "{doc}");
  EXPECT_EQ(starter_->Pass(0), 0);
  EXPECT_TRUE(starts_.empty());
  EXPECT_TRUE(starter_->Snapshot()[1].left_alone);
}

TEST_F(RunStarterTest, ItsThreadStartsRunsByItselfAndStops) {
  Record(1, pb::SHARD_STATUS_RUNNING, 5);
  OnChain(1, pb::SHARD_STATUS_RUNNING, "{doc}");
  starter_->Start();
  for (int i = 0; i < 500 && !starter_->Snapshot()[1].started; ++i) usleep(10000);
  starter_->Stop();
  EXPECT_TRUE(starter_->Snapshot()[1].started);
  EXPECT_EQ(starts_.size(), 1u);
}

}  // namespace
}  // namespace ts::sidecar
