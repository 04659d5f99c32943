// Gc of unreferenced chunks and dropped artifacts, the store under concurrent puts and
// publishes, and a child process killed at random moments leaving no broken complete artifact.
#include "sidecar/artifacts/store.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "gtest/gtest.h"
#include "sidecar/artifacts/store_test_util.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using store_testing::BytesUnder;
using store_testing::DistinctChunksOf;
using store_testing::FilesUnder;
using store_testing::HexOf;
using store_testing::Host;
using store_testing::kChunk;
using store_testing::RandomBytes;
using store_testing::StoreTest;
using store_testing::TestClock;
using store_testing::WriteRaw;

// ---------------------------------------------------------------------------------------------
// Gc

TEST_F(StoreTest, GcRemovesUnreferencedKeepsShared) {
  Host host = MakeHost("a");
  const fs::path one = MakeSource("one", 50);
  fs::path two = tmp_.path() / "two";
  fs::create_directories(two);
  fs::copy_file(one / "model.bin", two / "model.bin");
  WriteRaw(two / "only-two", RandomBytes(2 * kChunk, 151));
  auto first = Publish(host, one);
  auto second = Publish(host, two);
  ASSERT_TRUE(first.ok() && second.ok());

  // Strays: a temporary in tmp/ and a non-chunk name among the chunks.
  WriteRaw(host.store_path / "tmp" / "stray.tmp", "x");
  WriteRaw(host.store_path / "chunks" / "ab" / ".tmp-123", "y");

  auto nothing = host.store->Gc({}, false);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->chunks_removed(), 0u);
  EXPECT_EQ(nothing->artifacts_dropped(), 0u);
  EXPECT_TRUE(fs::is_empty(host.store_path / "tmp"));
  EXPECT_FALSE(fs::exists(host.store_path / "chunks" / "ab" / ".tmp-123"));

  const StoreUsage before = host.store->Usage();
  auto gc = host.store->Gc({second->id}, false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->artifacts_dropped(), 1u);
  EXPECT_EQ(gc->chunks_removed(), 2u);  // only-two's chunks; model.bin's are shared
  EXPECT_EQ(gc->bytes_freed(), 2u * kChunk);
  EXPECT_EQ(host.store->Usage().bytes, before.bytes - 2 * kChunk);
  EXPECT_EQ(host.store->Usage().files, before.files - 2);
  EXPECT_EQ(FilesUnder(host.store_path / "chunks").size(), DistinctChunksOf(*first).size());
  auto listed = host.store->List(true);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].artifact_id(), first->id);
  ExpectClean(host);
  ExpectExportIdentical(host, first->id, one, "out");

  EXPECT_EQ(host.store->Gc({second->id}, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(host.store->Gc({"short"}, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, GcKeepsFetchesInProgressAndDropsIncompleteOnRequest) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 52));
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok());
  for (size_t i = 0; i < 3; ++i) {
    auto data = a.store->ReadChunk(plan->missing[i]);
    ASSERT_TRUE(b.store->PutChunk(published->id, plan->missing[i], *data).ok());
  }
  auto gc = b.store->Gc({}, /*drop_incomplete=*/true);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->chunks_removed(), 0u);
  EXPECT_EQ(gc->artifacts_dropped(), 0u);
  EXPECT_EQ(FilesUnder(b.store_path / "chunks").size(), 3u);
  EXPECT_EQ(b.store->Gc({published->id}, false).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Abandoned: the incomplete row stays (resumable) and keeps its chunks...
  b.store->AbandonFetch(published->id);
  auto kept = b.store->Gc({}, false);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->chunks_removed(), 0u);
  // ...until it is dropped.
  auto dropped = b.store->Gc({}, /*drop_incomplete=*/true);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->artifacts_dropped(), 1u);
  EXPECT_EQ(dropped->chunks_removed(), 3u);
  EXPECT_TRUE(FilesUnder(b.store_path / "chunks").empty());
  auto listed = b.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(b.store->Usage().bytes, 0u);
  EXPECT_EQ(b.store->Usage().files, 0u);
}

// ---------------------------------------------------------------------------------------------
// Concurrency

TEST_F(StoreTest, ConcurrentPutChunks) {
  Host a = MakeHost("a");
  fs::path source = tmp_.path() / "src";
  // Two files with the same content: every chunk is named twice.
  const std::string content = RandomBytes(40 * kChunk, 60);
  WriteRaw(source / "x", content);
  WriteRaw(source / "y", content);
  auto published = Publish(a, source);
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->missing.size(), 40u);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Every thread puts every chunk, in its own order.
      for (size_t i = 0; i < plan->missing.size(); ++i) {
        const std::string& hash = plan->missing[(i * (t + 1) + t) % plan->missing.size()];
        auto data = a.store->ReadChunk(hash);
        if (!data.ok() || !b.store->PutChunk(published->id, hash, *data).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(b.store->CompleteFetch(published->id).ok());
  const StoreUsage usage = b.store->Usage();
  EXPECT_EQ(usage.files, 40u);
  EXPECT_EQ(usage.bytes, 40u * kChunk);
  EXPECT_EQ(usage.reserved_bytes, 0u);
  EXPECT_EQ(BytesUnder(b.store_path / "chunks"), 40u * kChunk);
  ExpectClean(b);
}

TEST_F(StoreTest, PublishConcurrentWithGcLosesNothing) {
  Host host = MakeHost("a");
  std::vector<fs::path> sources;
  for (int i = 0; i < 6; ++i) {
    fs::path dir = tmp_.path() / ("src" + std::to_string(i));
    // Half of each source is shared with the others, so Gc sees chunks that a publish in
    // progress found already present.
    WriteRaw(dir / "shared", RandomBytes(4 * kChunk, 1000));
    WriteRaw(dir / "own", RandomBytes(4 * kChunk, 2000 + i));
    sources.push_back(dir);
  }
  std::atomic<bool> done{false};
  std::vector<std::string> ids;
  std::thread publisher([&] {
    for (size_t i = 0; i < sources.size(); ++i) {
      auto published = Publish(host, sources[i]);
      EXPECT_TRUE(published.ok()) << published.status();
      if (published.ok()) ids.push_back(published->id);
      // Drop the previous one, so its chunks (shared ones included) become unreferenced.
      if (ids.size() >= 2) {
        auto gc = host.store->Gc({ids[ids.size() - 2]}, false);
        EXPECT_TRUE(gc.ok()) << gc.status();
      }
    }
    done = true;
  });
  int gcs = 0;
  while (!done.load()) {
    auto gc = host.store->Gc({}, false);
    ASSERT_TRUE(gc.ok()) << gc.status();
    ++gcs;
  }
  publisher.join();
  EXPECT_GT(gcs, 0);
  auto listed = host.store->List(false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  ExpectClean(host);
  EXPECT_EQ(host.store->Usage().bytes, BytesUnder(host.store_path / "chunks"));
}

// ---------------------------------------------------------------------------------------------
// Crash test: a child publishes and fetches in a loop and is killed at random moments; after
// each kill the stores are reopened and must hold no complete artifact with data missing.

constexpr char kCrashEnv[] = "TS_STORE_CRASH_DIR";

Host CrashHost(const fs::path& root, const std::string& name, common::Clock* clock) {
  Host host;
  host.db_path = root / (name + "-db");
  host.store_path = root / (name + "-store");
  host.quota = StoreQuota{1u << 30, 1u << 20};
  host.clock = clock;
  return host;
}

// Not a test of its own: the body of the child process of CrashLoop (skipped otherwise).
TEST(StoreCrashChild, Run) {
  const char* dir = std::getenv(kCrashEnv);
  if (dir == nullptr) GTEST_SKIP() << "runs only as the child of StoreCrashTest";
  const fs::path root(dir);
  const common::PrivateKey key = common::PrivateKey::Generate();
  Host a = CrashHost(root, "a", &common::SystemClock());
  Host b = CrashHost(root, "b", &common::SystemClock());
  if (!a.Open().ok() || !b.Open().ok()) _exit(3);
  std::mt19937 rng(static_cast<uint32_t>(::getpid()));
  for (int i = 0;; ++i) {
    const fs::path source = root / ("src-" + std::to_string(::getpid()) + "-" + std::to_string(i));
    fs::create_directories(source);
    WriteRaw(source / "weights", RandomBytes(16 * kChunk + rng() % kChunk, rng()));
    WriteRaw(source / "shared", RandomBytes(4 * kChunk, 7));  // the same in every round
    PublishOptions options;
    options.source_dir = source.string();
    options.round = static_cast<uint64_t>(i);
    options.chunk_size = kChunk;
    auto published = a.store->Publish(options, key, nullptr);
    if (!published.ok()) _exit(4);
    auto plan = b.store->BeginFetch(*published);
    if (!plan.ok()) _exit(5);
    for (const std::string& hash : plan->missing) {
      auto data = a.store->ReadChunk(hash);
      if (!data.ok() || !b.store->PutChunk(published->id, hash, *data).ok()) _exit(6);
    }
    if (!b.store->CompleteFetch(published->id).ok()) _exit(7);
    std::ofstream(root / ("done-" + std::to_string(::getpid()) + "-" + std::to_string(i)));
    if (i % 3 == 2) {
      auto listed = b.store->List(false);
      if (listed.ok() && !listed->empty()) (void)b.store->Gc({(*listed)[0].artifact_id()}, false);
    }
  }
}

// The checks after a crash: every complete artifact is whole and verifies; tmp/ was emptied;
// usage matches the disk; an incomplete artifact resumes.
void CheckAfterCrash(Host& a, Host& b, int* complete_seen) {
  for (Host* host : {&a, &b}) {
    ASSERT_TRUE(host->Open().ok());
    EXPECT_TRUE(fs::is_empty(host->store_path / "tmp"));
    auto listed = host->store->List(false);
    ASSERT_TRUE(listed.ok()) << listed.status();
    *complete_seen += static_cast<int>(listed->size());
    for (const auto& summary : *listed) {
      auto manifest = host->store->GetManifest(summary.artifact_id(), true);
      ASSERT_TRUE(manifest.ok()) << manifest.status();
      for (const std::string& hash : DistinctChunksOf(*manifest)) {
        EXPECT_TRUE(host->store->HasChunk(hash)) << HexOf(hash);
      }
    }
    auto report = host->store->Verify();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->modified_size(), 0) << report->DebugString();
    EXPECT_EQ(report->missing_size(), 0) << report->DebugString();
    EXPECT_EQ(host->store->Usage().bytes, BytesUnder(host->store_path / "chunks"));
    EXPECT_EQ(host->store->Usage().files, FilesUnder(host->store_path / "chunks").size());
  }
  // Resume every incomplete fetch on b from a, when a has the artifact.
  auto all = b.store->List(true);
  ASSERT_TRUE(all.ok());
  for (const auto& summary : *all) {
    if (summary.complete()) continue;
    auto manifest = b.store->GetManifest(summary.artifact_id(), false);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    auto plan = b.store->BeginFetch(*manifest);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const std::string& hash : plan->missing) EXPECT_FALSE(b.store->HasChunk(hash));
    if (!a.store->GetManifest(summary.artifact_id(), true).ok()) {
      b.store->AbandonFetch(summary.artifact_id());
      continue;
    }
    for (const std::string& hash : plan->missing) {
      auto data = a.store->ReadChunk(hash);
      ASSERT_TRUE(data.ok()) << data.status();
      ASSERT_TRUE(b.store->PutChunk(summary.artifact_id(), hash, *data).ok());
    }
    ASSERT_TRUE(b.store->CompleteFetch(summary.artifact_id()).ok());
  }
  a.Close();
  b.Close();
}

TEST(StoreCrashTest, KilledAtRandomMomentsLeavesNoBrokenCompleteArtifact) {
  if (std::getenv(kCrashEnv) != nullptr) GTEST_SKIP() << "already the child";
  test_util::TempDir tmp{"ts_store_"};
  TestClock clock;
  Host a = CrashHost(tmp.path(), "a", &clock);
  Host b = CrashHost(tmp.path(), "b", &clock);
  std::mt19937 rng(12345);
  int complete_seen = 0;
  constexpr int kRounds = 8;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) {
      // A fresh image: the parent's threads (RocksDB's pools) do not exist in a forked child.
      ::setenv(kCrashEnv, tmp.path().c_str(), 1);
      const int devnull = ::open("/dev/null", O_WRONLY);
      if (devnull >= 0) ::dup2(devnull, STDOUT_FILENO);
      const char* argv[] = {"/proc/self/exe", "--gtest_filter=StoreCrashChild.Run", nullptr};
      ::execv("/proc/self/exe", const_cast<char* const*>(argv));
      _exit(127);
    }
    // Even rounds kill at any moment from the start; odd ones once the child has completed a
    // fetch, so complete artifacts exist whatever the machine's speed.
    if (round % 2 == 1) {
      const fs::path first_done = tmp.path() / ("done-" + std::to_string(pid) + "-0");
      for (int waited_ms = 0; waited_ms < 60000 && !fs::exists(first_done); waited_ms += 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    const int delay_ms = static_cast<int>(rng() % 600);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus))
        << "child exited by itself with " << (WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
    CheckAfterCrash(a, b, &complete_seen);
    if (HasFatalFailure()) return;
  }
  // The child got far enough to complete artifacts (else the test checked nothing).
  EXPECT_GT(complete_seen, 0);
}

}  // namespace
}  // namespace ts::sidecar
