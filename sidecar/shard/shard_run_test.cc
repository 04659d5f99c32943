// The run's lifetimes under calls on gRPC threads. (1) The manager: a call in progress and
// StopAll (which the shard process calls on SIGTERM) at the same time; the host's artifact store
// is a fake whose List blocks until the test lets it go, so the call is held inside the run while
// the runs are stopped. (2) The run: evaluations of a checkpoint artifact while the run thread
// replaces its dying worker again and again; the worker is a fake whose calls take a moment, so
// an evaluation is inside the worker when it is replaced. Real RocksDB records and a real
// collective transport; under the sanitizer build, a run or a worker freed under a call is a
// heap-use-after-free report here.
#include "sidecar/shard/shard_run_manager.h"

#include <stdlib.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
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
#include "sidecar/peer/shard_directory.h"
#include "sidecar/shard/run_worker.h"

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

// A worker that answers at once but for Evaluate and InnerSteps, which take a moment, and dies
// in every InnerSteps (so the run restarts it until it gives up).
class DyingWorker final : public RunWorker {
 public:
  explicit DyingWorker(std::atomic<int>* evaluations) : evaluations_(evaluations) {}
  ~DyingWorker() override { alive_ = 0; }

  absl::StatusOr<pb::PrepareDataResponse> PrepareData(const pb::PrepareDataRequest&) override {
    pb::PrepareDataResponse data;
    data.add_shard_files("data/train-0.bin");
    data.add_shard_ids(std::string(32, 's'));
    data.set_eval_file("data/eval.bin");
    data.set_eval_id(std::string(32, 'e'));
    return data;
  }
  absl::StatusOr<pb::InitModelResponse> InitModel(const pb::InitModelRequest&) override {
    pb::InitModelResponse made;
    made.set_root(std::string(32, 'r'));
    made.set_parameters(16);
    return made;
  }
  absl::StatusOr<pb::LoadCheckpointResponse> LoadCheckpoint(
      const pb::LoadCheckpointRequest&) override {
    return pb::LoadCheckpointResponse();
  }
  absl::StatusOr<pb::InnerStepsResponse> InnerSteps(const pb::InnerStepsRequest&,
                                                    int64_t) override {
    common::SystemClock().SleepMs(5);  // evaluations come in meanwhile
    running_ = false;
    return absl::UnavailableError("worker: killed");
  }
  absl::StatusOr<pb::OuterStepResponse> OuterStep(const pb::OuterStepRequest&) override {
    return absl::UnimplementedError("outer step");
  }
  absl::StatusOr<pb::EvaluateResponse> Evaluate(const pb::EvaluateRequest& request) override {
    common::SystemClock().SleepMs(2);
    // Reads this object after the wait: freed meanwhile, the sanitizer reports it.
    if (alive_ != kAlive) return absl::InternalError("evaluated by a destroyed worker");
    evaluations_->fetch_add(1);
    pb::EvaluateResponse ev;
    ev.set_mean_loss(4.5);
    ev.set_tokens(64);
    ev.set_root(std::string(32, 'r'));
    ev.set_eval_id(request.eval_file());
    return ev;
  }
  absl::StatusOr<pb::WorkerStatusResponse> Status() override {
    pb::WorkerStatusResponse about;
    about.set_device("cpu");
    return about;
  }
  bool Running() override { return running_; }
  absl::Status Stop() override { return absl::AbortedError("killed by signal 9"); }
  pid_t pid() const override { return 0; }

 private:
  static constexpr int kAlive = 0x5a5a;
  std::atomic<int>* evaluations_;
  std::atomic<bool> running_{true};
  volatile int alive_ = kAlive;
};

// The host's store: List waits until released (after telling it was entered); nothing is held.
class BlockingArtifacts final : public ShardArtifacts {
 public:
  absl::Notification entered, release;
  std::atomic<bool> blocking{true};
  absl::StatusOr<std::string> Publish(uint64_t, const std::string&, std::string_view,
                                      uint64_t) override {
    return absl::UnimplementedError("publish");
  }
  absl::StatusOr<pb::ArtifactProgress> Fetch(uint64_t, const std::string&,
                                             const std::vector<std::string>&,
                                             const std::function<bool()>&) override {
    return absl::UnimplementedError("fetch");
  }
  absl::Status Export(uint64_t, const std::string&, const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<pb::ArtifactSummary>> List(uint64_t) override {
    if (!blocking) return Held();
    entered.Notify();
    release.WaitForNotification();
    return Held();
  }
  static std::vector<pb::ArtifactSummary> Held() {
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

TEST_F(ShardRunTest, EvaluationsOutliveTheWorkersTheRunReplaces) {
  artifacts_.blocking = false;
  StaticShardDirectory directory;
  ShardView view;
  view.shard_id = kShard;
  view.status = pb::SHARD_STATUS_RUNNING;
  view.members.push_back({host_.address, "127.0.0.1:1", 10});
  directory.Set(view);
  host_.directory = &directory;
  std::atomic<int> evaluations{0};
  std::atomic<int> workers{0};
  host_.start_worker =
      [&](const worker::WorkerProcessOptions&) -> absl::StatusOr<std::shared_ptr<RunWorker>> {
    workers.fetch_add(1);
    return std::make_shared<DyingWorker>(&evaluations);
  };
  ShardRunManager manager(host_, options_);
  manager.Activate("test-chain");
  ASSERT_TRUE(manager.StartRun(kShard, kSpec).ok());

  // Evaluations on another thread until the run has given up on its workers.
  std::atomic<bool> done{false};
  int answered = 0, refused = 0;
  std::string unexpected;
  std::thread caller([&] {
    while (!done) {
      pb::EvaluateCheckpointRequest request;
      request.set_shard_id(kShard);
      request.set_artifact_id(std::string(32, 'a'));
      pb::EvaluateCheckpointResponse response;
      grpc::Status result = manager.Evaluate(nullptr, &request, &response);
      if (result.ok()) {
        ++answered;
      } else if (result.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ++refused;  // between a worker's end and the next one's data
      } else {
        unexpected = result.error_message();
      }
    }
  });
  pb::ShardRunStatusRequest status_request;
  status_request.set_shard_id(kShard);
  pb::ShardRunStatus status;
  for (int i = 0; i < 3000 && status.state() != "failed"; ++i) {
    common::SystemClock().SleepMs(10);
    ASSERT_TRUE(manager.Status(nullptr, &status_request, &status).ok());
  }
  done = true;
  caller.join();
  manager.StopAll();
  EXPECT_EQ(status.state(), "failed");
  EXPECT_THAT(status.error(), HasSubstr("the worker died 6 times"));
  EXPECT_EQ(workers.load(), 6);
  EXPECT_GT(answered, 0);
  EXPECT_EQ(unexpected, "");
  EXPECT_EQ(evaluations.load(), answered + 6);  // each worker also evaluated round 0
}

}  // namespace
}  // namespace ts::sidecar
