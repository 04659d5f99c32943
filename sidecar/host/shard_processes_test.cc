// ShardProcesses with the real ts_shard executable: recorded shards' processes are started and
// served through, a SIGKILLed one is started again while the other shard's goes on untouched, a
// refused run leaves no process or record behind, StopAll stops every process. The chain is
// unreachable (nothing listens on port 1), which a shard process without a run must survive.
#include "sidecar/host/shard_processes.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "sidecar/shard/shard_db.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

bool WaitFor(const std::function<bool()>& done, int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// Exists and is not a zombie.
bool Running(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// Whether a live process runs `ts_shard --shard-id <id> --shards-dir <dir>`.
bool ShardProcessRunning(uint64_t shard_id, const std::string& shards_dir) {
  const std::string want = "--shard-id" + std::string(1, '\0') + std::to_string(shard_id) +
                           std::string(1, '\0') + "--shards-dir" + std::string(1, '\0') +
                           shards_dir + std::string(1, '\0');
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(want) != std::string::npos && Running(std::stoi(name))) return true;
  }
  return false;
}

class ShardProcessesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/ts-shardproc-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    {
      std::ofstream key(dir_ + "/host.key");
      key << std::string(64, '2') << "\n";
    }
    chmod((dir_ + "/host.key").c_str(), 0600);
    state::DbOptions db_options;
    db_options.tables = {std::string(kTableShardProcesses), std::string(kTableRounds),
                         std::string(kTableRunSpecs)};
    auto db = state::Db::Open(dir_ + "/state", db_options);
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    options_.binary = TS_SHARD_BINARY;
    options_.shards_dir = dir_ + "/shards";
    options_.host_socket = dir_ + "/host.sock";
    options_.key_file = dir_ + "/host.key";
    options_.chain_endpoint = "127.0.0.1:1";
    options_.worker_binary = "/bin/false";
    options_.restart_backoff_min_ms = 200;
    options_.stop_grace_ms = 5'000;
  }
  void TearDown() override {
    processes_.reset();
    db_.reset();
    std::system(("rm -rf " + dir_).c_str());
  }

  void Record(uint64_t shard_id) {
    state::WriteBatch batch;
    batch.Put(kTableShardProcesses, state::EncodeU64Key(shard_id), "");
    ASSERT_TRUE(db_->Write(batch).ok());
  }
  bool Recorded(uint64_t shard_id) {
    return db_->Get(kTableShardProcesses, state::EncodeU64Key(shard_id)).ok();
  }
  bool Serving(uint64_t shard_id) {
    auto info = processes_->Info(shard_id);
    return info.has_value() && info->serving;
  }

  std::string dir_;
  std::unique_ptr<state::Db> db_;
  ShardProcessOptions options_;
  std::unique_ptr<ShardProcesses> processes_;
};

TEST_F(ShardProcessesTest, StartsRecordedShardsForwardsAndRestartsAKilledProcess) {
  Record(7);
  Record(11);
  processes_ = std::make_unique<ShardProcesses>(db_.get(), options_);
  processes_->Activate("test-chain");
  ASSERT_TRUE(WaitFor([&] { return Serving(7) && Serving(11); }, 20'000));
  const pid_t first = processes_->Info(7)->pid;
  const pid_t other = processes_->Info(11)->pid;
  EXPECT_NE(first, other);
  ASSERT_GT(first, 0);
  EXPECT_TRUE(Running(first));

  // Forwarded to the process, which has no run: its own answer, not the sidecar's.
  grpc::ServerContext context;
  pb::ShardRunStatusRequest request;
  request.set_shard_id(7);
  pb::ShardRunStatus status;
  grpc::Status got;
  ASSERT_TRUE(WaitFor(
      [&] {
        got = processes_->Status(&context, &request, &status);
        return got.error_code() == grpc::StatusCode::NOT_FOUND;
      },
      10'000))
      << got.error_message();
  EXPECT_EQ(got.error_message(), "shard 7: no run on this host");

  // A shard without a process here: the sidecar answers.
  request.set_shard_id(8);
  got = processes_->Status(&context, &request, &status);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_FALSE(processes_->Info(8).has_value());

  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        auto info = processes_->Info(7);
        return info && info->serving && info->pid != first && info->restarts == 1;
      },
      20'000));
  EXPECT_EQ(processes_->Info(7)->last_exit, "was killed by signal 9");
  EXPECT_TRUE(Recorded(7));
  // The other shard's process was not touched.
  EXPECT_EQ(processes_->Info(11)->pid, other);
  EXPECT_EQ(processes_->Info(11)->restarts, 0u);
  EXPECT_TRUE(Running(other));

  const pid_t second = processes_->Info(7)->pid;
  processes_->StopAll();
  EXPECT_FALSE(Running(second));
  EXPECT_FALSE(Running(other));
}

TEST_F(ShardProcessesTest, ARefusedRunLeavesNoProcessAndNoRecord) {
  processes_ = std::make_unique<ShardProcesses>(db_.get(), options_);
  grpc::ServerContext context;
  pb::StartShardRunRequest request;
  request.set_shard_id(9);
  request.set_run_spec("{\"version\": 1, \"rounds\": \"x\"}");
  pb::StartShardRunResponse response;
  // Before the chain id is known nothing starts.
  grpc::Status got = processes_->Start(&context, &request, &response);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(Recorded(9));

  processes_->Activate("test-chain");
  got = processes_->Start(&context, &request, &response);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << got.error_message();
  EXPECT_NE(got.error_message().find("not a RunSpec document"), std::string::npos)
      << got.error_message();
  EXPECT_FALSE(Recorded(9));
  EXPECT_FALSE(processes_->Info(9).has_value());
  // Its process goes: the socket's owner exits (the supervisor reaps it).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  bool gone = WaitFor([&] { return !ShardProcessRunning(9, options_.shards_dir); }, 10'000);
  EXPECT_TRUE(gone);

  // Taken back at once, the shard gets a new process, which refuses the same way.
  got = processes_->Start(&context, &request, &response);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << got.error_message();
}

TEST_F(ShardProcessesTest, TheCertifiedDraftComesFromTheShardProcesssOwnRecords) {
  // Shard 7's process keeps a run spec of 4 rounds and no certificate yet; shard 8 has none.
  {
    std::filesystem::create_directories(options_.shards_dir + "/7");
    auto shard_db = state::Db::Open(options_.shards_dir + "/7/state", ShardDbOptions());
    ASSERT_TRUE(shard_db.ok()) << shard_db.status();
    state::WriteBatch batch;
    batch.Put(kTableRunSpecs, state::EncodeU64Key(7),
              R"({"version": 1, "model": {"kind": "gpt", "seed": "7", "config": {"layers": 1,
                  "dModel": 16, "heads": 2, "context": 8, "vocab": 64, "mlpRatio": 2}},
                  "data": {"corpus": "fortunes", "files": 1, "vocab": 64, "shardTokens": 1024,
                  "evalEvery": 20}, "rounds": 4, "innerSteps": 2, "batchSize": 2,
                  "inner": {"lr": 0.001, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                  "weightDecay": 0.0, "gradClipNorm": 1.0},
                  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": true},
                  "codec": "fp32", "aggregation": "mean", "evalEvery": 2, "evalBatchSize": 2,
                  "evalWindowsMax": "4", "seed": "11"})");
    ASSERT_TRUE((*shard_db)->Write(batch).ok());
  }
  Record(7);
  processes_ = std::make_unique<ShardProcesses>(db_.get(), options_);
  processes_->Activate("test-chain");
  ASSERT_TRUE(WaitFor([&] { return Serving(7); }, 20'000));

  // Asked of the process itself, over its socket: its records certify no round of four, so
  // there is nothing the host would sign yet.
  auto draft = processes_->CertifiedDraft(7, 0, absl::Now() + absl::Seconds(10));
  ASSERT_FALSE(draft.ok());
  EXPECT_EQ(draft.status().code(), absl::StatusCode::kFailedPrecondition) << draft.status();
  EXPECT_NE(draft.status().message().find("certify 0 of 4 rounds"), std::string::npos)
      << draft.status();

  // A shard this host runs no process for: it keeps no training records.
  auto none = processes_->CertifiedDraft(8, 0, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("no training records"), std::string::npos)
      << none.status();

  // Forwarded the same way for the operator's DraftSettlement.
  grpc::ServerContext context;
  pb::DraftSettlementRequest request;
  request.set_shard_id(7);
  pb::DraftSettlementResponse response;
  EXPECT_EQ(processes_->DraftSettlement(&context, &request, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  processes_->StopAll();
}

TEST_F(ShardProcessesTest, RunRecordsInTheHostsDatabaseMoveIntoTheShardsOwn) {
  // As a host kept them before shard processes: shard 5's spec and two certificates, and a
  // certificate of shard 6, whose spec is not there.
  auto key = [](uint64_t shard, uint64_t round) {
    return state::EncodeU64Key(shard) + state::EncodeU64Key(round);
  };
  state::WriteBatch old;
  old.Put(kTableRunSpecs, state::EncodeU64Key(5), "spec of 5");
  old.Put(kTableRounds, key(5, 1), "certificate 5/1");
  old.Put(kTableRounds, key(5, 2), "certificate 5/2");
  old.Put(kTableRounds, key(6, 1), "certificate 6/1");
  ASSERT_TRUE(db_->Write(old).ok());

  processes_ = std::make_unique<ShardProcesses>(db_.get(), options_);
  processes_->Activate("test-chain");
  ASSERT_TRUE(WaitFor([&] { return Serving(5); }, 20'000));
  processes_->StopAll();

  EXPECT_TRUE(Recorded(5));
  EXPECT_FALSE(db_->Get(kTableRunSpecs, state::EncodeU64Key(5)).ok());
  EXPECT_FALSE(db_->Get(kTableRounds, key(5, 1)).ok());
  EXPECT_FALSE(db_->Get(kTableRounds, key(5, 2)).ok());
  EXPECT_TRUE(db_->Get(kTableRounds, key(6, 1)).ok());
  EXPECT_FALSE(Recorded(6));

  auto shard_db = state::Db::Open(options_.shards_dir + "/5/state", ShardDbOptions());
  ASSERT_TRUE(shard_db.ok()) << shard_db.status();
  EXPECT_EQ(*(*shard_db)->Get(kTableRunSpecs, state::EncodeU64Key(5)), "spec of 5");
  EXPECT_EQ(*(*shard_db)->Get(kTableRounds, key(5, 1)), "certificate 5/1");
  EXPECT_EQ(*(*shard_db)->Get(kTableRounds, key(5, 2)), "certificate 5/2");
  EXPECT_FALSE((*shard_db)->Get(kTableRounds, key(6, 1)).ok());
}

}  // namespace
}  // namespace ts::sidecar
