// The run manager's lifetimes: a call in progress on a gRPC thread and StopAll (which the
// shard process calls on SIGTERM) at the same time. Real RocksDB records; the host's artifact
// store is a fake whose List blocks until the test lets it go, so the call is held inside the
// run while the runs are stopped. Under the sanitizer build, a run freed under the call is a
// heap-use-after-free report here.
#include "sidecar/shard/shard_run_manager.h"

#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;
namespace pb = ::gonka::trainshard::v1;

constexpr char kSpec[] = R"({
  "version": 1,
  "model": {"kind": "gpt", "seed": "7",
            "config": {"layers": 2, "dModel": 64, "heads": 4, "context": 32, "vocab": 512,
                       "mlpRatio": 4}},
  "data": {"corpus": "fortunes", "files": 4, "vocab": 512, "shardTokens": 8192, "evalEvery": 20},
  "rounds": 4, "innerSteps": 10, "batchSize": 8,
  "inner": {"lr": 0.003, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weightDecay": 0.1,
            "gradClipNorm": 1.0},
  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
  "codec": "int8", "aggregation": "mean", "evalEvery": 2, "evalBatchSize": 16, "seed": "5"
})";
constexpr uint64_t kShard = 3;

// The host's store: List waits until released (after telling it was entered); nothing is held.
class BlockingArtifacts final : public ShardArtifacts {
 public:
  absl::Notification entered, release;
  absl::StatusOr<std::string> Publish(uint64_t, const std::string&, std::string_view,
                                      uint64_t) override {
    return absl::UnimplementedError("publish");
  }
  absl::StatusOr<pb::ArtifactProgress> Fetch(uint64_t, const std::string&,
                                             const std::vector<std::string>&,
                                             const std::function<bool()>&) override {
    return absl::UnimplementedError("fetch");
  }
  absl::Status Export(uint64_t, const std::string&, const std::string&) override {
    return absl::UnimplementedError("export");
  }
  absl::StatusOr<std::vector<pb::ArtifactSummary>> List(uint64_t) override {
    entered.Notify();
    release.WaitForNotification();
    pb::ArtifactSummary held;
    held.set_artifact_id(std::string(32, 'a'));
    held.set_round(1);
    return std::vector<pb::ArtifactSummary>{held};
  }
  absl::Status Drop(uint64_t, const std::vector<std::string>&) override { return {}; }
  absl::StatusOr<pb::FindArtifactsResponse> Find(uint64_t, std::string_view) override {
    return pb::FindArtifactsResponse();
  }
};

class ShardRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-shardrun-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    auto db = state::Db::Open(dir_ + "/state", ShardDbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    host_.key = &key_;
    host_.address = common::AddressFromPublicKey(key_.public_key());
    host_.artifacts = &artifacts_;
    host_.db = db_.get();
    host_.clock = &common::SystemClock();
    host_.chain_shard = [this](uint64_t id) -> absl::StatusOr<pb::Shard> {
      pb::Shard shard;
      shard.set_id(id);
      shard.set_status(pb::SHARD_STATUS_RUNNING);
      shard.mutable_spec()->set_run_spec_hash(common::Sha256(kSpec));
      shard.add_reservations()->set_host(host_.address);
      return shard;
    };
    // A worker that cannot start: the run fails at once, before it reaches the chain or peers.
    options_.worker_binary = dir_ + "/no-such-worker";
    options_.work_root = dir_ + "/shards";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string dir_;
  common::PrivateKey key_ = common::PrivateKey::Generate();
  std::unique_ptr<state::Db> db_;
  BlockingArtifacts artifacts_;
  ShardRunHost host_;
  ShardRunOptions options_;
};

TEST_F(ShardRunTest, AnEvaluationInProgressOutlivesStopAll) {
  ShardRunManager manager(host_, options_);
  manager.Activate("test-chain");
  auto started = manager.StartRun(kShard, kSpec);
  ASSERT_TRUE(started.ok()) << started.status();

  pb::EvaluateCheckpointRequest request;
  request.set_shard_id(kShard);
  request.set_artifact_id(std::string(32, 'a'));
  pb::EvaluateCheckpointResponse response;
  grpc::Status result;
  std::thread call([&] { result = manager.Evaluate(nullptr, &request, &response); });
  ASSERT_TRUE(artifacts_.entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // SIGTERM's path in the shard process, while the call is inside the run.
  manager.StopAll();
  artifacts_.release.Notify();
  call.join();
  // The call ends with a clear refusal on the stopped run, which was not freed under it.
  EXPECT_EQ(result.error_code(), grpc::StatusCode::UNAVAILABLE) << result.error_message();
  EXPECT_THAT(result.error_message(), HasSubstr("the run is stopping"));
  // And the manager has no run left.
  pb::ShardRunStatusRequest status_request;
  status_request.set_shard_id(kShard);
  pb::ShardRunStatus status;
  EXPECT_EQ(manager.Status(nullptr, &status_request, &status).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace ts::sidecar
