// The artifact store tests' shared clock, hosts and fixture (store_test.cc and the
// store_*_test.cc files beside it); for tests only.
#ifndef TS_SIDECAR_ARTIFACTS_STORE_TEST_UTIL_H_
#define TS_SIDECAR_ARTIFACTS_STORE_TEST_UTIL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/hex.h"
#include "gtest/gtest.h"
#include "sidecar/artifacts/store.h"
#include "state/db.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar::store_testing {

namespace fs = std::filesystem;

inline constexpr char kChain[] = "trainshard-test";
inline constexpr uint64_t kShard = 7;
inline constexpr uint32_t kChunk = kMinChunkSize;  // 4 KiB: many chunks from small files

inline std::string Msg(const absl::Status& status) { return std::string(status.message()); }

// A clock whose monotonic time moves 100 ms per reading, so every progress report passes the
// throttle.
class TestClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return 1'700'000'000'000 + now_ms_.load(); }
  int64_t MonotonicMs() override { return now_ms_.fetch_add(100); }
  void SleepMs(int64_t ms) override { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_{0};
};

inline void WriteRaw(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Reads a file with the standard library, independently of the store's own I/O.
inline std::string ReadRaw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

inline std::string HexOf(std::string_view bytes) { return common::HexEncode(bytes); }

// Every non-directory entry under `dir` (symlinks not followed), relative, sorted.
inline std::vector<std::string> FilesUnder(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    if (!it->is_directory() || it->is_symlink()) {
      out.push_back(fs::relative(it->path(), dir).string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Bytes of the regular files under `dir`.
inline uint64_t BytesUnder(const fs::path& dir) {
  uint64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && !entry.is_symlink()) bytes += entry.file_size();
  }
  return bytes;
}

inline std::set<std::string> DistinctChunksOf(const VerifiedManifest& m) {
  std::set<std::string> out;
  for (const auto& file : m.body.files()) {
    for (const auto& hash : file.chunks()) out.insert(hash);
  }
  return out;
}

// One host: a RocksDB with the artifacts table and one shard's store over it.
struct Host {
  fs::path db_path;
  fs::path store_path;
  StoreQuota quota;
  common::Clock* clock = nullptr;
  std::shared_ptr<state::DiskFullFault> db_fault;  // null: a plain database
  std::unique_ptr<state::Db> db;
  std::unique_ptr<ArtifactStore> store;

  absl::Status Open() {
    state::DbOptions options;
    options.tables = {std::string(kTableArtifacts)};
    options.disk_full_fault = db_fault;
    options.recovery_interval_ms = 0;
    auto opened = state::Db::Open(db_path.string(), options);
    if (!opened.ok()) return opened.status();
    db = *std::move(opened);
    auto s = ArtifactStore::Open(store_path.string(), db.get(), kChain, kShard, quota, clock);
    if (!s.ok()) return s.status();
    store = *std::move(s);
    return absl::OkStatus();
  }
  void Close() {
    store.reset();
    db.reset();
  }
  absl::Status Reopen() {
    Close();
    return Open();
  }
  fs::path ChunkPath(std::string_view hash) const {
    const std::string hex = HexOf(hash);
    return store_path / "chunks" / hex.substr(0, 2) / hex;
  }
  std::vector<std::string> StoreFiles() const { return FilesUnder(store_path); }
};

class StoreTest : public ::testing::Test {
 protected:
  Host MakeHost(const std::string& name, StoreQuota quota = {64u << 20, 100000}) {
    Host host;
    host.db_path = tmp_.path() / (name + "-db");
    host.store_path = tmp_.path() / (name + "-store");
    host.quota = quota;
    host.clock = &clock_;
    absl::Status status = host.Open();
    EXPECT_TRUE(status.ok()) << status;
    return host;
  }

  // A source directory with a multi-chunk file, a nested file, an empty file and a
  // one-chunk file.
  fs::path MakeSource(const std::string& name, uint32_t seed) {
    fs::path dir = tmp_.path() / name;
    // Seeds apart from each other and from the small ones tests use directly, so no two
    // sources share a chunk by accident.
    WriteRaw(dir / "model.bin", RandomBytes(3 * kChunk + 1000, seed << 8));
    WriteRaw(dir / "opt/state.pt", RandomBytes(kChunk + 7, (seed << 8) + 1));
    WriteRaw(dir / "empty", "");
    WriteRaw(dir / "config.json", "{\"layers\": 4}\n");
    return dir;
  }

  PublishOptions Options(const fs::path& source, uint64_t round = 1) {
    PublishOptions options;
    options.source_dir = source.string();
    options.round = round;
    options.chunk_size = kChunk;
    return options;
  }

  absl::StatusOr<VerifiedManifest> Publish(Host& host, const fs::path& source, uint64_t round = 1) {
    return host.store->Publish(Options(source, round), key_, nullptr);
  }

  // Copies every missing chunk from `from` into `to` and completes the fetch.
  void FetchAll(Host& from, Host& to, const std::string& id) {
    auto manifest = from.store->GetManifest(id, /*complete_only=*/true);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    auto plan = to.store->BeginFetch(*manifest);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const std::string& hash : plan->missing) {
      auto data = from.store->ReadChunk(hash);
      ASSERT_TRUE(data.ok()) << data.status();
      absl::Status put = to.store->PutChunk(id, hash, *data);
      ASSERT_TRUE(put.ok()) << put;
    }
    absl::Status done = to.store->CompleteFetch(id);
    ASSERT_TRUE(done.ok()) << done;
  }

  void ExpectClean(const Host& host) {
    auto report = host.store->Verify();
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->modified_size(), 0) << report->DebugString();
    EXPECT_EQ(report->missing_size(), 0) << report->DebugString();
    EXPECT_EQ(report->unreferenced_size(), 0) << report->DebugString();
    EXPECT_EQ(report->incomplete_size(), 0) << report->DebugString();
  }

  void ExpectExportIdentical(const Host& host, const std::string& id, const fs::path& source,
                             const std::string& out_name) {
    const fs::path out = tmp_.path() / out_name;
    absl::Status status = host.store->Export(id, out.string(), nullptr);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(FilesUnder(out), FilesUnder(source));
    for (const std::string& name : FilesUnder(source)) {
      EXPECT_EQ(ReadRaw(out / name), ReadRaw(source / name)) << name;
    }
  }

  test_util::TempDir tmp_{"ts_store_"};
  TestClock clock_;
  common::PrivateKey key_ = common::PrivateKey::Generate();
};

}  // namespace ts::sidecar::store_testing

#endif  // TS_SIDECAR_ARTIFACTS_STORE_TEST_UTIL_H_
