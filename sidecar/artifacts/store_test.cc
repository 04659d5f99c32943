#include "sidecar/artifacts/store.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "gtest/gtest.h"
#include "tests/util/small_tmpfs.h"
#include "tests/util/temp_dir.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;

constexpr char kChain[] = "trainshard-test";
constexpr uint64_t kShard = 7;
constexpr uint32_t kChunk = kMinChunkSize;  // 4 KiB: many chunks from small files

std::string Msg(const absl::Status& status) { return std::string(status.message()); }

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

void WriteRaw(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Reads a file with the standard library, independently of the store's own I/O.
std::string ReadRaw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xff);
  return out;
}

std::string HexOf(std::string_view bytes) { return common::HexEncode(bytes); }

// Every non-directory entry under `dir` (symlinks not followed), relative, sorted.
std::vector<std::string> FilesUnder(const fs::path& dir) {
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
uint64_t BytesUnder(const fs::path& dir) {
  uint64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && !entry.is_symlink()) bytes += entry.file_size();
  }
  return bytes;
}

std::set<std::string> DistinctChunksOf(const VerifiedManifest& m) {
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

// ---------------------------------------------------------------------------------------------
// Publish, list, verify, export

TEST_F(StoreTest, PublishListVerifyExportByteIdentical) {
  Host host = MakeHost("a");
  const fs::path source = MakeSource("src", 1);
  std::vector<pb::ArtifactProgress> reports;
  auto published = host.store->Publish(
      Options(source, 3), key_, [&](const pb::ArtifactProgress& p) { reports.push_back(p); });
  ASSERT_TRUE(published.ok()) << published.status();

  const uint64_t source_bytes = 3 * kChunk + 1000 + kChunk + 7 + 14;
  EXPECT_EQ(published->id.size(), 32u);
  EXPECT_EQ(published->total_bytes, source_bytes);
  EXPECT_EQ(published->total_chunks, 4u + 2u + 0u + 1u);
  ASSERT_EQ(published->body.files_size(), 4);
  EXPECT_EQ(published->body.files(0).name(), "config.json");
  EXPECT_EQ(published->body.files(1).name(), "empty");
  EXPECT_EQ(published->body.files(2).name(), "model.bin");
  EXPECT_EQ(published->body.files(3).name(), "opt/state.pt");
  EXPECT_EQ(published->body.publisher(), common::AddressFromPublicKey(key_.public_key()));
  EXPECT_EQ(published->body.round(), 3u);
  EXPECT_EQ(published->body.kind(), "checkpoint");
  // The first chunk of model.bin is the SHA-256 of its first 4 KiB, as read independently.
  EXPECT_EQ(published->body.files(2).chunks(0),
            common::Sha256(ReadRaw(source / "model.bin").substr(0, kChunk)));

  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.front().phase(), "hashing");
  EXPECT_EQ(reports.back().artifact_id(), published->id);
  bool saw_all = false;
  for (const auto& r : reports) {
    EXPECT_LE(r.bytes_done(), r.bytes_total());
    if (r.phase() == "hashing" && r.bytes_done() == source_bytes && r.chunks_done() == 7) {
      saw_all = true;
    }
  }
  EXPECT_TRUE(saw_all);

  auto listed = host.store->List(/*include_incomplete=*/false);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  const pb::ArtifactSummary& summary = (*listed)[0];
  EXPECT_EQ(summary.artifact_id(), published->id);
  EXPECT_EQ(summary.shard_id(), kShard);
  EXPECT_EQ(summary.round(), 3u);
  EXPECT_EQ(summary.files(), 4u);
  EXPECT_EQ(summary.chunks(), 7u);
  EXPECT_EQ(summary.total_bytes(), source_bytes);
  EXPECT_TRUE(summary.complete());
  EXPECT_GT(summary.stored_unix_ms(), 0);

  // Usage is the chunk files on disk.
  const fs::path chunks = host.store_path / "chunks";
  StoreUsage usage = host.store->Usage();
  EXPECT_EQ(usage.files, FilesUnder(chunks).size());
  EXPECT_EQ(usage.files, DistinctChunksOf(*published).size());
  EXPECT_EQ(usage.bytes, BytesUnder(chunks));
  EXPECT_EQ(usage.bytes, source_bytes);
  EXPECT_EQ(usage.reserved_bytes, 0u);
  EXPECT_EQ(usage.reserved_files, 0u);
  EXPECT_TRUE(fs::is_empty(host.store_path / "tmp"));

  auto report = host.store->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->artifacts_checked(), 1u);
  EXPECT_EQ(report->chunks_ok(), DistinctChunksOf(*published).size());
  ExpectClean(host);

  auto manifest = host.store->GetManifest(published->id, /*complete_only=*/true);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->manifest.SerializeAsString(), published->manifest.SerializeAsString());

  std::vector<pb::ArtifactProgress> export_reports;
  const fs::path out = tmp_.path() / "out";
  absl::Status exported =
      host.store->Export(published->id, out.string(),
                         [&](const pb::ArtifactProgress& p) { export_reports.push_back(p); });
  ASSERT_TRUE(exported.ok()) << exported;
  EXPECT_EQ(FilesUnder(out), FilesUnder(source));
  for (const std::string& name : FilesUnder(source)) {
    EXPECT_EQ(ReadRaw(out / name), ReadRaw(source / name)) << name;
  }
  ASSERT_FALSE(export_reports.empty());
  EXPECT_EQ(export_reports.back().phase(), "exporting");
  EXPECT_EQ(export_reports.back().bytes_done(), source_bytes);
}

TEST_F(StoreTest, ReadChunkAndHasChunk) {
  Host host = MakeHost("a");
  const fs::path source = MakeSource("src", 2);
  auto published = Publish(host, source);
  ASSERT_TRUE(published.ok()) << published.status();
  const std::string& hash = published->body.files(2).chunks(1);
  EXPECT_TRUE(host.store->HasChunk(hash));
  auto data = host.store->ReadChunk(hash);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, ReadRaw(source / "model.bin").substr(kChunk, kChunk));

  const std::string absent = common::Sha256("not stored");
  EXPECT_FALSE(host.store->HasChunk(absent));
  EXPECT_EQ(host.store->ReadChunk(absent).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(host.store->ReadChunk("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(host.store->HasChunk("short"));

  // Into caller memory: the size is asked for before the read, the bytes are the same.
  std::string into;
  size_t asked = 0;
  absl::Status read = host.store->ReadChunkInto(hash, [&](size_t size) {
    asked = size;
    into.assign(size + 3, '\0');
    return into.data() + 3;
  });
  ASSERT_TRUE(read.ok()) << read;
  EXPECT_EQ(asked, kChunk);
  EXPECT_EQ(into.substr(3), *data);
  EXPECT_EQ(host.store->ReadChunkInto(hash, [](size_t) { return nullptr; }).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(host.store->ReadChunkInto(absent, [&](size_t) { return into.data(); }).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(host.store->ReadChunkInto("short", [&](size_t) { return into.data(); }).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, ArtifactKeyIsBigEndianShardThenId) {
  const std::string id(32, '\xab');
  const std::string key = ArtifactKey(0x0102030405060708ull, id);
  ASSERT_EQ(key.size(), 40u);
  EXPECT_EQ(key.substr(0, 8), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(key.substr(8), id);
}

TEST_F(StoreTest, DedupAcrossArtifacts) {
  Host host = MakeHost("a");
  const fs::path one = MakeSource("one", 10);
  fs::path two = tmp_.path() / "two";
  fs::create_directories(two);
  // Same model.bin, another extra file.
  fs::copy_file(one / "model.bin", two / "model.bin");
  WriteRaw(two / "extra.bin", RandomBytes(kChunk * 2, 99));

  auto first = Publish(host, one);
  ASSERT_TRUE(first.ok()) << first.status();
  const StoreUsage after_first = host.store->Usage();

  std::vector<pb::ArtifactProgress> reports;
  auto second = host.store->Publish(Options(two), key_,
                                    [&](const pb::ArtifactProgress& p) { reports.push_back(p); });
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->id, second->id);
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().chunks_present(), 4u);  // model.bin's four chunks

  std::set<std::string> all = DistinctChunksOf(*first);
  for (const auto& h : DistinctChunksOf(*second)) all.insert(h);
  const StoreUsage after_second = host.store->Usage();
  EXPECT_EQ(after_second.files, all.size());
  EXPECT_EQ(after_second.files, after_first.files + 2);
  EXPECT_EQ(after_second.bytes, after_first.bytes + 2 * kChunk);
  EXPECT_EQ(FilesUnder(host.store_path / "chunks").size(), all.size());

  // Publishing the same directory again adds nothing and names the same artifact.
  auto again = Publish(host, one);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id, first->id);
  EXPECT_EQ(host.store->Usage().files, all.size());
  auto listed = host.store->List(false);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);
  ExpectClean(host);
}

// ---------------------------------------------------------------------------------------------
// Quota

TEST_F(StoreTest, PublishOverByteQuotaWritesNothing) {
  const fs::path source = MakeSource("src", 3);
  Host host = MakeHost("a", StoreQuota{4 * kChunk, 1000});
  const std::vector<std::string> before = host.StoreFiles();
  auto published = Publish(host, source);
  ASSERT_EQ(published.status().code(), absl::StatusCode::kResourceExhausted) << published.status();
  EXPECT_NE(Msg(published.status()).find("artifact quota: 16384 bytes_max exceeded: 0 used + "),
            std::string::npos)
      << published.status();
  EXPECT_EQ(host.StoreFiles(), before);
  EXPECT_TRUE(FilesUnder(host.store_path / "chunks").empty());
  auto listed = host.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  const StoreUsage usage = host.store->Usage();
  EXPECT_EQ(usage.bytes, 0u);
  EXPECT_EQ(usage.reserved_bytes, 0u);
  EXPECT_EQ(usage.reserved_files, 0u);
}

TEST_F(StoreTest, PublishOverFileQuotaWritesNothing) {
  const fs::path source = MakeSource("src", 4);
  Host host = MakeHost("a", StoreQuota{1u << 30, 6});  // 7 chunks listed
  auto published = Publish(host, source);
  ASSERT_EQ(published.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(Msg(published.status()).find("artifact quota: 6 files_max exceeded: 0 used + 7 needed"),
            std::string::npos)
      << published.status();
  EXPECT_TRUE(FilesUnder(host.store_path / "chunks").empty());
  EXPECT_EQ(host.store->Usage().reserved_files, 0u);

  // Exactly at the quota fits.
  Host roomy = MakeHost("b", StoreQuota{1u << 30, 7});
  auto ok = Publish(roomy, source);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(roomy.store->Usage().files, 7u);
}

TEST_F(StoreTest, QuotaCountsUsedBytesAfterReopen) {
  const fs::path one = MakeSource("one", 5);
  const fs::path two = MakeSource("two", 6);
  Host host = MakeHost("a", StoreQuota{30000, 1000});
  auto first = Publish(host, one);
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t used = host.store->Usage().bytes;
  ASSERT_TRUE(host.Reopen().ok());
  EXPECT_EQ(host.store->Usage().bytes, used);
  auto second = Publish(host, two);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(
      Msg(second.status())
          .find(absl::StrCat("30000 bytes_max exceeded: ", used, " used + ", used, " needed")),
      std::string::npos)
      << second.status();
}

TEST_F(StoreTest, BeginFetchOverQuotaWritesNothing) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 7));
  ASSERT_TRUE(published.ok()) << published.status();
  Host b = MakeHost("b", StoreQuota{published->total_bytes - 1, 1000});
  const std::vector<std::string> before = b.StoreFiles();
  auto plan = b.store->BeginFetch(*published);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_NE(Msg(plan.status()).find("bytes_max exceeded"), std::string::npos);
  EXPECT_EQ(b.StoreFiles(), before);
  auto listed = b.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(b.store->Usage().reserved_bytes, 0u);
  // No fetch was registered.
  EXPECT_EQ(b.store->PutChunk(published->id, published->body.files(0).chunks(0), "x").code(),
            absl::StatusCode::kFailedPrecondition);

  Host c = MakeHost("c", StoreQuota{1u << 30, 3});
  auto plan_c = c.store->BeginFetch(*published);
  ASSERT_EQ(plan_c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(Msg(plan_c.status()).find("3 files_max exceeded: 0 used + 7 needed"), std::string::npos)
      << plan_c.status();
}

TEST_F(StoreTest, ReservationsOfConcurrentFetchesAddUp) {
  Host a = MakeHost("a");
  auto one = Publish(a, MakeSource("one", 8));
  auto two = Publish(a, MakeSource("two", 9));
  ASSERT_TRUE(one.ok() && two.ok());
  Host b = MakeHost("b", StoreQuota{one->total_bytes + two->total_bytes - 1, 1000});
  auto plan = b.store->BeginFetch(*one);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(b.store->Usage().reserved_bytes, one->total_bytes);
  auto plan_two = b.store->BeginFetch(*two);
  ASSERT_EQ(plan_two.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(
      Msg(plan_two.status()).find(absl::StrCat("0 used + ", one->total_bytes, " reserved + ")),
      std::string::npos)
      << plan_two.status();
  b.store->AbandonFetch(one->id);
  EXPECT_EQ(b.store->Usage().reserved_bytes, 0u);
  auto retry = b.store->BeginFetch(*two);
  EXPECT_TRUE(retry.ok()) << retry.status();
}

// ---------------------------------------------------------------------------------------------
// Fetch

TEST_F(StoreTest, FetchFlowBeginPutComplete) {
  Host a = MakeHost("a");
  const fs::path source = MakeSource("src", 11);
  auto published = Publish(a, source);
  ASSERT_TRUE(published.ok()) << published.status();
  Host b = MakeHost("b");

  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::set<std::string> distinct = DistinctChunksOf(*published);
  EXPECT_EQ(plan->missing.size(), distinct.size());
  EXPECT_EQ(plan->present, 0u);
  EXPECT_EQ(plan->missing_bytes, published->total_bytes);
  EXPECT_EQ(std::set<std::string>(plan->missing.begin(), plan->missing.end()), distinct);
  EXPECT_EQ(b.store->Usage().reserved_bytes, published->total_bytes);
  EXPECT_EQ(b.store->Usage().reserved_files, distinct.size());

  // Incomplete: listed only with include_incomplete, never as complete.
  auto complete_only = b.store->List(false);
  ASSERT_TRUE(complete_only.ok());
  EXPECT_TRUE(complete_only->empty());
  auto all = b.store->List(true);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_FALSE((*all)[0].complete());
  EXPECT_EQ(b.store->GetManifest(published->id, true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(b.store->GetManifest(published->id, false).ok());
  EXPECT_EQ(b.store->Export(published->id, (tmp_.path() / "early").string(), nullptr).code(),
            absl::StatusCode::kNotFound);

  for (size_t i = 0; i < plan->missing.size(); ++i) {
    const std::string& hash = plan->missing[i];
    auto data = a.store->ReadChunk(hash);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_TRUE(b.store->PutChunk(published->id, hash, *data).ok());
    // Putting the same chunk twice is harmless.
    if (i == 0) {
      ASSERT_TRUE(b.store->PutChunk(published->id, hash, *data).ok());
    }
    auto still = b.store->List(false);
    ASSERT_TRUE(still.ok());
    EXPECT_TRUE(still->empty()) << "listed complete before CompleteFetch";
  }
  EXPECT_EQ(b.store->Usage().reserved_bytes, 0u);
  ASSERT_TRUE(b.store->CompleteFetch(published->id).ok());
  auto listed = b.store->List(false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE((*listed)[0].complete());
  EXPECT_EQ(b.store->Usage().bytes, published->total_bytes);
  EXPECT_EQ(b.store->Usage().reserved_files, 0u);
  ExpectClean(b);
  ExpectExportIdentical(b, published->id, source, "out");

  // The fetch is over: more chunks are refused, and beginning again finds nothing missing.
  EXPECT_EQ(b.store->PutChunk(published->id, plan->missing[0], "x").code(),
            absl::StatusCode::kFailedPrecondition);
  auto again = b.store->BeginFetch(*published);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->missing.empty());
  EXPECT_EQ(again->present, distinct.size());
  EXPECT_TRUE(b.store->CompleteFetch(published->id).ok());
}

TEST_F(StoreTest, BeginFetchSharesChunksAlreadyStored) {
  Host a = MakeHost("a");
  const fs::path one = MakeSource("one", 12);
  auto first = Publish(a, one);
  fs::path two = tmp_.path() / "two";
  fs::create_directories(two);
  fs::copy_file(one / "model.bin", two / "model.bin");
  WriteRaw(two / "tail", RandomBytes(100, 5));
  auto second = Publish(a, two);
  ASSERT_TRUE(first.ok() && second.ok());

  Host b = MakeHost("b");
  FetchAll(a, b, first->id);
  auto plan = b.store->BeginFetch(*second);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->present, 4u);
  ASSERT_EQ(plan->missing.size(), 1u);
  EXPECT_EQ(plan->missing[0], second->body.files(1).chunks(0));
  EXPECT_EQ(plan->missing_bytes, 100u);
  EXPECT_EQ(b.store->Usage().reserved_bytes, 100u);
}

// The two halves of PutChunk: verifying writes nothing, refuses what PutChunk refuses, and a
// verified chunk is stored only while its fetch is in progress.
TEST_F(StoreTest, VerifyThenPutVerifiedChunk) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 14));
  ASSERT_TRUE(published.ok()) << published.status();
  Host b = MakeHost("b");
  ASSERT_TRUE(b.store->BeginFetch(*published).ok());
  const std::string hash = published->body.files(2).chunks(0);
  auto good = a.store->ReadChunk(hash);
  ASSERT_TRUE(good.ok());
  const std::vector<std::string> before = b.StoreFiles();

  std::string flipped = *good;
  flipped[7] ^= 0x01;
  EXPECT_EQ(b.store->VerifyChunk(published->id, hash, flipped).status().code(),
            absl::StatusCode::kDataLoss);
  auto verified = b.store->VerifyChunk(published->id, hash, *good);
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->hash(), hash);
  EXPECT_EQ(verified->size(), good->size());
  EXPECT_EQ(b.StoreFiles(), before);  // verifying writes nothing
  EXPECT_FALSE(b.store->HasChunk(hash));
  ASSERT_TRUE(b.store->PutVerifiedChunk(*verified).ok());
  EXPECT_TRUE(b.store->HasChunk(hash));

  // Once the fetch has ended, a chunk verified during it is not stored.
  const std::string other = published->body.files(2).chunks(1);
  auto other_data = a.store->ReadChunk(other);
  ASSERT_TRUE(other_data.ok());
  auto late = b.store->VerifyChunk(published->id, other, *other_data);
  ASSERT_TRUE(late.ok()) << late.status();
  b.store->AbandonFetch(published->id);
  EXPECT_EQ(b.store->PutVerifiedChunk(*late).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(b.store->HasChunk(other));
}

TEST_F(StoreTest, PutChunkRefusesBadData) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 13));
  ASSERT_TRUE(published.ok()) << published.status();
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string hash = published->body.files(2).chunks(0);  // a full model.bin chunk
  auto good = a.store->ReadChunk(hash);
  ASSERT_TRUE(good.ok());
  const std::vector<std::string> before = b.StoreFiles();

  std::string flipped = *good;
  flipped[100] ^= 0x01;
  absl::Status wrong = b.store->PutChunk(published->id, hash, flipped);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kDataLoss) << wrong;
  EXPECT_NE(Msg(wrong).find(HexOf(hash)), std::string::npos);
  EXPECT_EQ(b.StoreFiles(), before);
  EXPECT_FALSE(b.store->HasChunk(hash));

  absl::Status short_data = b.store->PutChunk(published->id, hash, good->substr(1));
  EXPECT_EQ(short_data.code(), absl::StatusCode::kDataLoss) << short_data;
  EXPECT_EQ(b.StoreFiles(), before);

  // Data that hashes to its name but is not in this manifest.
  const std::string foreign_data = RandomBytes(kChunk, 77);
  absl::Status foreign =
      b.store->PutChunk(published->id, common::Sha256(foreign_data), foreign_data);
  EXPECT_EQ(foreign.code(), absl::StatusCode::kInvalidArgument) << foreign;
  EXPECT_EQ(b.StoreFiles(), before);

  EXPECT_EQ(b.store->PutChunk(published->id, "short", *good).code(),
            absl::StatusCode::kInvalidArgument);
  const std::string other_id(32, '\x01');
  EXPECT_EQ(b.store->PutChunk(other_id, hash, *good).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.StoreFiles(), before);

  ASSERT_TRUE(b.store->PutChunk(published->id, hash, *good).ok());
  EXPECT_TRUE(b.store->HasChunk(hash));
  EXPECT_EQ(ReadRaw(b.ChunkPath(hash)), *good);
}

TEST_F(StoreTest, CompleteFetchWithMissingChunksIsRefused) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 14));
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok());
  for (size_t i = 0; i + 2 < plan->missing.size(); ++i) {
    auto data = a.store->ReadChunk(plan->missing[i]);
    ASSERT_TRUE(data.ok());
    ASSERT_TRUE(b.store->PutChunk(published->id, plan->missing[i], *data).ok());
  }
  absl::Status done = b.store->CompleteFetch(published->id);
  EXPECT_EQ(done.code(), absl::StatusCode::kFailedPrecondition) << done;
  EXPECT_NE(Msg(done).find(absl::StrCat("2 of ", plan->missing.size(), " chunks are missing")),
            std::string::npos)
      << done;
  auto listed = b.store->List(false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // The fetch goes on after the refusal.
  for (size_t i = plan->missing.size() - 2; i < plan->missing.size(); ++i) {
    auto data = a.store->ReadChunk(plan->missing[i]);
    ASSERT_TRUE(b.store->PutChunk(published->id, plan->missing[i], *data).ok());
  }
  EXPECT_TRUE(b.store->CompleteFetch(published->id).ok());
  EXPECT_EQ(b.store->CompleteFetch(std::string(32, '\x02')).code(), absl::StatusCode::kNotFound);
}

TEST_F(StoreTest, BeginFetchRefusesSecondFetchAndOtherShards) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 15));
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  ASSERT_TRUE(b.store->BeginFetch(*published).ok());
  EXPECT_EQ(b.store->BeginFetch(*published).status().code(), absl::StatusCode::kFailedPrecondition);
  b.store->AbandonFetch(published->id);
  EXPECT_EQ(b.store->Usage().reserved_bytes, 0u);
  EXPECT_TRUE(b.store->BeginFetch(*published).ok());

  VerifiedManifest other = *published;
  other.body.set_shard_id(kShard + 1);
  EXPECT_EQ(b.store->BeginFetch(other).status().code(), absl::StatusCode::kInvalidArgument);
  other = *published;
  other.body.set_chain_id("another-chain");
  EXPECT_EQ(b.store->BeginFetch(other).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, CompleteArtifactWithLostChunkBecomesIncompleteOnBeginFetch) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 16));
  ASSERT_TRUE(published.ok());
  // Looked up (and kept in memory) while complete.
  ASSERT_TRUE(a.store->GetManifest(published->id, /*complete_only=*/true).ok());
  const std::string lost = published->body.files(2).chunks(2);
  fs::remove(a.ChunkPath(lost));
  auto plan = a.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->missing.size(), 1u);
  EXPECT_EQ(plan->missing[0], lost);
  auto listed = a.store->List(false);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(a.store->GetManifest(published->id, /*complete_only=*/true).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(a.store->GetManifest(published->id, /*complete_only=*/false).ok());
}

TEST_F(StoreTest, BeginFetchRefusesAManifestNamingAChunkWithTwoSizes) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 24));
  ASSERT_TRUE(published.ok());
  VerifiedManifest forged = *published;
  // config.json's one 14-byte chunk named as model.bin's first, 4096-byte, chunk.
  *forged.body.mutable_files(0)->mutable_chunks(0) = forged.body.files(2).chunks(0);
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(forged);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  auto listed = b.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

TEST_F(StoreTest, GetManifestAfterDropIsNotFound) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 25));
  ASSERT_TRUE(published.ok());
  auto first = host.store->GetManifest(published->id, true);
  auto second = host.store->GetManifest(published->id, true);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->manifest.SerializeAsString(), second->manifest.SerializeAsString());
  EXPECT_EQ(second->id, published->id);
  EXPECT_EQ(second->total_bytes, published->total_bytes);
  auto gc = host.store->Gc({published->id}, false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(host.store->GetManifest(published->id, false).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(host.store->GetManifest("short", false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StoreTest, CorruptIndexRowsAreReportedAndDroppable) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 26));
  ASSERT_TRUE(published.ok());
  // A row whose value is not a StoredArtifact.
  const std::string garbage_id(32, '\x66');
  {
    state::WriteBatch batch;
    batch.Put(kTableArtifacts, ArtifactKey(kShard, garbage_id), "\xff\xff\xff not a proto");
    ASSERT_TRUE(host.db->Write(batch).ok());
  }
  auto listed = host.store->List(true);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kDataLoss) << listed.status();
  EXPECT_NE(Msg(listed.status()).find(HexOf(garbage_id)), std::string::npos);
  EXPECT_EQ(host.store->Verify().status().code(), absl::StatusCode::kDataLoss);
  const std::vector<std::string> before = host.StoreFiles();
  EXPECT_EQ(host.store->Gc({}, true).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(host.StoreFiles(), before);
  auto gc = host.store->Gc({garbage_id}, false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->artifacts_dropped(), 1u);
  EXPECT_EQ(gc->chunks_removed(), 0u);
  ExpectClean(host);

  // A row of another shard is not this store's business.
  {
    state::WriteBatch batch;
    batch.Put(kTableArtifacts, ArtifactKey(kShard + 1, garbage_id), "junk");
    ASSERT_TRUE(host.db->Write(batch).ok());
  }
  auto mine = host.store->List(true);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size(), 1u);

  // A row whose manifest no longer verifies (signature changed on disk).
  pb::StoredArtifact row;
  ASSERT_TRUE(host.db->GetProto(kTableArtifacts, ArtifactKey(kShard, published->id), &row).ok());
  std::string* signature = row.mutable_manifest()->mutable_signature();
  (*signature)[5] ^= 0x01;
  {
    state::WriteBatch batch;
    batch.PutProto(kTableArtifacts, ArtifactKey(kShard, published->id), row);
    ASSERT_TRUE(host.db->Write(batch).ok());
  }
  auto manifest = host.store->GetManifest(published->id, true);
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss) << manifest.status();
  EXPECT_EQ(host.store->Export(published->id, (tmp_.path() / "out").string(), nullptr).code(),
            absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------------------------
// Restart

TEST_F(StoreTest, ReopenListsCompleteAndResumesIncomplete) {
  Host a = MakeHost("a");
  const fs::path source = MakeSource("src", 17);
  auto published = Publish(a, source);
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok());
  const size_t put = plan->missing.size() / 2;
  for (size_t i = 0; i < put; ++i) {
    auto data = a.store->ReadChunk(plan->missing[i]);
    ASSERT_TRUE(b.store->PutChunk(published->id, plan->missing[i], *data).ok());
  }
  // Simulate an unclean stop: leftovers in tmp/.
  WriteRaw(b.store_path / "tmp" / "leftover", "half a chunk");

  ASSERT_TRUE(a.Reopen().ok());
  ASSERT_TRUE(b.Reopen().ok());
  EXPECT_TRUE(fs::is_empty(b.store_path / "tmp"));

  auto listed_a = a.store->List(false);
  ASSERT_TRUE(listed_a.ok());
  ASSERT_EQ(listed_a->size(), 1u);
  EXPECT_EQ((*listed_a)[0].artifact_id(), published->id);
  ExpectClean(a);

  auto listed_b = b.store->List(false);
  ASSERT_TRUE(listed_b.ok());
  EXPECT_TRUE(listed_b->empty());
  auto report = b.store->Verify();
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->incomplete_size(), 1);
  EXPECT_EQ(report->incomplete(0), HexOf(published->id));
  EXPECT_EQ(report->unreferenced_size(), 0);
  EXPECT_EQ(report->chunks_ok(), put);

  // CompleteFetch without a fetch in this process: refused while chunks are missing.
  EXPECT_EQ(b.store->CompleteFetch(published->id).code(), absl::StatusCode::kFailedPrecondition);

  auto manifest = b.store->GetManifest(published->id, /*complete_only=*/false);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto resumed = b.store->BeginFetch(*manifest);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->present, put);
  ASSERT_EQ(resumed->missing.size(), plan->missing.size() - put);
  EXPECT_EQ(std::vector<std::string>(plan->missing.begin() + put, plan->missing.end()),
            resumed->missing);
  for (const std::string& hash : resumed->missing) {
    auto data = a.store->ReadChunk(hash);
    ASSERT_TRUE(b.store->PutChunk(published->id, hash, *data).ok());
  }
  ASSERT_TRUE(b.store->CompleteFetch(published->id).ok());
  ASSERT_TRUE(b.Reopen().ok());
  auto final_list = b.store->List(false);
  ASSERT_TRUE(final_list.ok());
  ASSERT_EQ(final_list->size(), 1u);
  ExpectClean(b);
  ExpectExportIdentical(b, published->id, source, "out");
  EXPECT_EQ(b.store->Usage().bytes, published->total_bytes);
}

// ---------------------------------------------------------------------------------------------
// Verify

TEST_F(StoreTest, VerifyReportsModifiedMissingUnreferenced) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 18));
  ASSERT_TRUE(published.ok());
  const std::string modified = published->body.files(2).chunks(0);
  const std::string missing = published->body.files(2).chunks(1);
  {
    std::fstream f(host.ChunkPath(modified), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x5a' ^ ReadRaw(host.ChunkPath(modified))[10]);
  }
  fs::remove(host.ChunkPath(missing));
  const std::string stray = RandomBytes(5000, 123);
  WriteRaw(host.ChunkPath(common::Sha256(stray)), stray);

  auto report = host.store->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->modified_size(), 1) << report->DebugString();
  EXPECT_EQ(report->modified(0), HexOf(modified));
  ASSERT_EQ(report->missing_size(), 1) << report->DebugString();
  EXPECT_EQ(report->missing(0), HexOf(missing));
  ASSERT_EQ(report->unreferenced_size(), 1) << report->DebugString();
  EXPECT_EQ(report->unreferenced(0), HexOf(common::Sha256(stray)));
  EXPECT_EQ(report->unreferenced_bytes(), stray.size());
  EXPECT_EQ(report->chunks_ok(), DistinctChunksOf(*published).size() - 2);
  EXPECT_EQ(report->incomplete_size(), 0);

  // The modified chunk is refused on the way out.
  absl::Status exported =
      host.store->Export(published->id, (tmp_.path() / "out").string(), nullptr);
  EXPECT_EQ(exported.code(), absl::StatusCode::kDataLoss) << exported;
}

TEST_F(StoreTest, VerifyReportsPlantedSymlinkWithoutFollowingIt) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 19));
  ASSERT_TRUE(published.ok());
  const std::string hash = published->body.files(2).chunks(0);
  const fs::path chunk = host.ChunkPath(hash);
  // The target holds the chunk's real bytes: a store that followed the link would find it fine.
  const std::string bytes = ReadRaw(chunk);
  const fs::path target = tmp_.path() / "outside";
  WriteRaw(target, bytes);
  fs::remove(chunk);
  fs::create_symlink(target, chunk);

  auto report = host.store->Verify();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->modified_size(), 1) << report->DebugString();
  EXPECT_EQ(report->modified(0), HexOf(hash));
  EXPECT_EQ(report->missing_size(), 0);
  EXPECT_FALSE(host.store->HasChunk(hash));
  EXPECT_EQ(host.store->ReadChunk(hash).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(host.store->Export(published->id, (tmp_.path() / "out").string(), nullptr).code(),
            absl::StatusCode::kDataLoss);

  // Gc removes the link itself; the target is untouched.
  auto gc = host.store->Gc({}, false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_FALSE(fs::exists(fs::symlink_status(chunk)));
  EXPECT_EQ(ReadRaw(target), bytes);

  // A fetch puts the real chunk back (replacing, never writing through, a link).
  fs::create_symlink(target, chunk);
  auto plan = host.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->missing.size(), 1u);
  WriteRaw(target, "something else");
  ASSERT_TRUE(host.store->PutChunk(published->id, hash, bytes).ok());
  EXPECT_FALSE(fs::is_symlink(fs::symlink_status(chunk)));
  EXPECT_EQ(ReadRaw(chunk), bytes);
  EXPECT_EQ(ReadRaw(target), "something else");
  ASSERT_TRUE(host.store->CompleteFetch(published->id).ok());
  ExpectClean(host);
}

TEST_F(StoreTest, HardLinkedChunkIsNotServed) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 20));
  ASSERT_TRUE(published.ok());
  const std::string hash = published->body.files(2).chunks(0);
  fs::create_hard_link(host.ChunkPath(hash), tmp_.path() / "second-link");
  EXPECT_EQ(host.store->ReadChunk(hash).status().code(), absl::StatusCode::kFailedPrecondition);
  auto report = host.store->Verify();
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->modified_size(), 1);
  EXPECT_EQ(report->modified(0), HexOf(hash));
}

TEST_F(StoreTest, SymlinkedChunkSubdirIsNeverWrittenThrough) {
  Host a = MakeHost("a");
  auto published = Publish(a, MakeSource("src", 21));
  ASSERT_TRUE(published.ok());
  Host b = MakeHost("b");
  const std::string hash = published->body.files(2).chunks(0);
  const fs::path outside = tmp_.path() / "outside-dir";
  fs::create_directories(outside);
  fs::create_directories(b.store_path / "chunks");
  fs::create_symlink(outside, b.store_path / "chunks" / HexOf(hash).substr(0, 2));
  auto plan = b.store->BeginFetch(*published);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto data = a.store->ReadChunk(hash);
  ASSERT_TRUE(data.ok());
  absl::Status put = b.store->PutChunk(published->id, hash, *data);
  EXPECT_EQ(put.code(), absl::StatusCode::kFailedPrecondition) << put;
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_TRUE(fs::is_empty(b.store_path / "tmp"));
  EXPECT_EQ(b.store->CompleteFetch(published->id).code(), absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------------------------
// Export

TEST_F(StoreTest, ExportRefusesNonEmptyOrBadOutDir) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 22));
  ASSERT_TRUE(published.ok());
  const fs::path out = tmp_.path() / "out";
  WriteRaw(out / "already-here", "x");
  absl::Status status = host.store->Export(published->id, out.string(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(FilesUnder(out), std::vector<std::string>{"already-here"});

  EXPECT_EQ(host.store->Export(published->id, "relative/out", nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      host.store->Export(published->id, (host.store_path / "chunks").string(), nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  fs::create_directories(tmp_.path() / "real");
  fs::create_symlink(tmp_.path() / "real", tmp_.path() / "link");
  EXPECT_EQ(host.store->Export(published->id, (tmp_.path() / "link").string(), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_empty(tmp_.path() / "real"));
  EXPECT_EQ(
      host.store->Export(std::string(32, '\x03'), (tmp_.path() / "o2").string(), nullptr).code(),
      absl::StatusCode::kNotFound);

  // An existing empty directory is fine.
  fs::create_directories(tmp_.path() / "empty-out");
  const fs::path source = tmp_.path() / "src";
  absl::Status ok =
      host.store->Export(published->id, (tmp_.path() / "empty-out").string(), nullptr);
  ASSERT_TRUE(ok.ok()) << ok;
  EXPECT_EQ(ReadRaw(tmp_.path() / "empty-out" / "model.bin"), ReadRaw(source / "model.bin"));
}

TEST_F(StoreTest, ExportDetectsTamperedChunkAndLeavesNoFiles) {
  Host host = MakeHost("a");
  auto published = Publish(host, MakeSource("src", 23));
  ASSERT_TRUE(published.ok());
  // The last chunk of model.bin; config.json and empty come first and are written before it.
  const std::string hash = published->body.files(2).chunks(3);
  const std::string bytes = ReadRaw(host.ChunkPath(hash));
  std::string tampered = bytes;
  tampered[0] ^= 0x80;
  WriteRaw(host.ChunkPath(hash), tampered);  // same size, other bytes
  const fs::path out = tmp_.path() / "out";
  absl::Status status = host.store->Export(published->id, out.string(), nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(Msg(status).find(HexOf(hash)), std::string::npos) << status;
  EXPECT_TRUE(FilesUnder(out).empty()) << "partial export left behind";

  // A truncated chunk, and one removed, too.
  WriteRaw(host.ChunkPath(hash), bytes.substr(0, 10));
  EXPECT_EQ(host.store->Export(published->id, out.string(), nullptr).code(),
            absl::StatusCode::kDataLoss);
  fs::remove(host.ChunkPath(hash));
  EXPECT_EQ(host.store->Export(published->id, out.string(), nullptr).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_TRUE(FilesUnder(out).empty());
}

// ---------------------------------------------------------------------------------------------
// Unsafe sources

class UnsafeSourceTest : public StoreTest {
 protected:
  // Publishing `source` fails with `code` naming `needle`; nothing is indexed or stored.
  void ExpectRefused(const fs::path& source, absl::StatusCode code, const std::string& needle) {
    Host host = MakeHost("h" + std::to_string(counter_++));
    const std::vector<std::string> before = host.StoreFiles();
    auto published = Publish(host, source);
    EXPECT_EQ(published.status().code(), code) << published.status();
    EXPECT_NE(Msg(published.status()).find(needle), std::string::npos) << published.status();
    EXPECT_EQ(host.StoreFiles(), before);
    auto listed = host.store->List(true);
    ASSERT_TRUE(listed.ok());
    EXPECT_TRUE(listed->empty());
    EXPECT_EQ(host.store->Usage().reserved_bytes, 0u);
  }
  int counter_ = 0;
};

TEST_F(UnsafeSourceTest, SymlinkToFileOutside) {
  const fs::path source = MakeSource("src", 30);
  WriteRaw(tmp_.path() / "secret", "do not publish");
  fs::create_symlink(tmp_.path() / "secret", source / "link");
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "link");
}

TEST_F(UnsafeSourceTest, SymlinkToDirectoryOutside) {
  const fs::path source = MakeSource("src", 31);
  WriteRaw(tmp_.path() / "secrets" / "key", "do not publish");
  fs::create_symlink(tmp_.path() / "secrets", source / "opt" / "dirlink");
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "dirlink");
}

TEST_F(UnsafeSourceTest, HardLink) {
  const fs::path source = MakeSource("src", 32);
  WriteRaw(tmp_.path() / "secret", "do not publish");
  fs::create_hard_link(tmp_.path() / "secret", source / "hard");
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "hard link");
}

TEST_F(UnsafeSourceTest, Fifo) {
  const fs::path source = MakeSource("src", 33);
  ASSERT_EQ(::mkfifo((source / "pipe").c_str(), 0600), 0) << std::strerror(errno);
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "FIFO");
}

TEST_F(UnsafeSourceTest, Socket) {
  const fs::path source = MakeSource("src", 34);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = (source / "sock").string();
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "socket");
  ::close(fd);
}

TEST_F(UnsafeSourceTest, DeviceFile) {
  const fs::path source = MakeSource("src", 35);
  if (::mknod((source / "null").c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "mknod needs CAP_MKNOD: " << std::strerror(errno);
  }
  ExpectRefused(source, absl::StatusCode::kFailedPrecondition, "device");
}

TEST_F(UnsafeSourceTest, BadNames) {
  const fs::path spaced = MakeSource("spaced", 36);
  WriteRaw(spaced / "has space", "x");
  ExpectRefused(spaced, absl::StatusCode::kInvalidArgument, "space");
  const fs::path percent = MakeSource("percent", 37);
  WriteRaw(percent / "a%2fb", "x");
  ExpectRefused(percent, absl::StatusCode::kInvalidArgument, "%");
  const fs::path backslash = MakeSource("backslash", 38);
  WriteRaw(backslash / "a\\b", "x");
  ExpectRefused(backslash, absl::StatusCode::kInvalidArgument, "backslash");
}

TEST_F(StoreTest, PublishValidatesOptions) {
  Host host = MakeHost("a");
  const fs::path source = MakeSource("src", 40);
  auto refused = [&](PublishOptions options, const std::string& field) {
    auto published = host.store->Publish(options, key_, nullptr);
    EXPECT_EQ(published.status().code(), absl::StatusCode::kInvalidArgument)
        << field << ": " << published.status();
    EXPECT_NE(Msg(published.status()).find(field), std::string::npos) << published.status();
  };
  PublishOptions o = Options(source);
  o.chunk_size = 0;
  refused(o, "chunk_size: 0");
  o.chunk_size = kMinChunkSize - 1;
  refused(o, "chunk_size");
  o.chunk_size = kMaxChunkSize + 1;
  refused(o, "chunk_size");
  o = Options(source);
  o.kind = "";
  refused(o, "kind");
  o.kind = "Checkpoint";
  refused(o, "kind");
  o.kind = std::string(33, 'a');
  refused(o, "kind");
  o = Options(source);
  o.parent = std::string(5, 'p');
  refused(o, "parent: 5 bytes");
  o = Options(source);
  o.source_dir = "relative";
  refused(o, "source_dir");
  o = Options(tmp_.path() / "does-not-exist");
  EXPECT_EQ(host.store->Publish(o, key_, nullptr).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(tmp_.path() / "empty-src");
  o = Options(tmp_.path() / "empty-src");
  refused(o, "source_dir");
  EXPECT_TRUE(FilesUnder(host.store_path / "chunks").empty());

  // Valid extremes: a parent, another kind, the largest chunk size.
  o = Options(source, 9);
  o.parent = std::string(32, '\x42');
  o.kind = "eval-set-2";
  o.chunk_size = kMaxChunkSize;
  auto published = host.store->Publish(o, key_, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  EXPECT_EQ(published->body.parent(), o.parent);
  EXPECT_EQ(published->body.chunk_size(), kMaxChunkSize);
  EXPECT_EQ(published->total_chunks, 3u);  // one chunk per non-empty file
  auto listed = host.store->List(false);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].parent(), o.parent);
  EXPECT_EQ((*listed)[0].kind(), "eval-set-2");
  EXPECT_EQ((*listed)[0].round(), 9u);
}

TEST_F(StoreTest, PublishAbortsWhenAFileShrinksWhileRead) {
  Host host = MakeHost("a");
  const fs::path source = MakeSource("src", 41);
  const fs::path victim = source / "model.bin";
  bool truncated = false;
  auto published = host.store->Publish(Options(source), key_, [&](const pb::ArtifactProgress& p) {
    // config.json (1 chunk) and empty come first; truncate model.bin after its first chunk.
    if (!truncated && p.chunks_done() >= 2) {
      fs::resize_file(victim, kChunk + 10);
      truncated = true;
    }
  });
  ASSERT_TRUE(truncated);
  EXPECT_EQ(published.status().code(), absl::StatusCode::kAborted) << published.status();
  EXPECT_NE(Msg(published.status()).find("model.bin"), std::string::npos);
  auto listed = host.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  // What it wrote is gone again, and so is its use of the quota.
  EXPECT_NE(Msg(published.status()).find("removed the 2 chunk files it wrote"), std::string::npos)
      << published.status();
  EXPECT_TRUE(FilesUnder(host.store_path / "chunks").empty());
  EXPECT_TRUE(FilesUnder(host.store_path / "tmp").empty());
  const StoreUsage usage = host.store->Usage();
  EXPECT_EQ(usage.bytes, 0u);
  EXPECT_EQ(usage.files, 0u);
  EXPECT_EQ(usage.reserved_bytes, 0u);
  EXPECT_EQ(usage.reserved_files, 0u);
  ExpectClean(host);
}

TEST_F(StoreTest, PublishAbortsWhenAFileGrowsWhileRead) {
  Host host = MakeHost("a");
  const fs::path source = MakeSource("src", 42);
  bool grown = false;
  auto published = host.store->Publish(Options(source), key_, [&](const pb::ArtifactProgress& p) {
    if (!grown && p.chunks_done() >= 3) {
      std::ofstream(source / "model.bin", std::ios::app | std::ios::binary) << "more";
      grown = true;
    }
  });
  ASSERT_TRUE(grown);
  EXPECT_EQ(published.status().code(), absl::StatusCode::kAborted) << published.status();
  auto listed = host.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
}

// A failed publish removes the chunk files it created, but never one that something else names
// by then: a complete artifact (those chunks were there before, so it did not create them), an
// incomplete one, a fetch in progress.
TEST_F(StoreTest, FailedPublishKeepsChunksThatOthersName) {
  Host a = MakeHost("a");
  Host b = MakeHost("b");
  const fs::path kept_source = MakeSource("kept", 61);
  auto kept = Publish(a, kept_source);
  ASSERT_TRUE(kept.ok()) << kept.status();
  // On b, a fetch in progress names a chunk the failing publish is about to create.
  const fs::path fetched_source = tmp_.path() / "fetched";
  WriteRaw(fetched_source / "f.bin", RandomBytes(2 * kChunk, 6201));
  auto fetched = Publish(b, fetched_source);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  auto plan = a.store->BeginFetch(*fetched);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->missing.size(), 2u);
  const StoreUsage before = a.store->Usage();

  // The failing source: a copy of a stored file (present: not created), a copy of the fetch's
  // file (created, but the fetch names it), its own chunks (created), then a file that shrinks.
  const fs::path source = tmp_.path() / "failing";
  fs::create_directories(source);
  fs::copy_file(kept_source / "model.bin", source / "a-shared.bin");
  fs::copy_file(fetched_source / "f.bin", source / "b-fetched.bin");
  WriteRaw(source / "c-own.bin", RandomBytes(3 * kChunk, 6301));
  WriteRaw(source / "d-shrinks.bin", RandomBytes(2 * kChunk, 6302));
  bool truncated = false;
  const uint32_t before_shrink = 4 + 2 + 3 + 1;
  auto failed = a.store->Publish(Options(source), key_, [&](const pb::ArtifactProgress& p) {
    if (!truncated && p.chunks_done() >= before_shrink) {
      fs::resize_file(source / "d-shrinks.bin", 100);
      truncated = true;
    }
  });
  ASSERT_TRUE(truncated);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kAborted) << failed.status();
  // Created: 2 of the fetch's, 3 own, 1 of the shrinking file; removed: all but the fetch's.
  EXPECT_NE(Msg(failed.status()).find("removed 4 of the 6 chunk files it wrote"), std::string::npos)
      << failed.status();
  for (const std::string& hash : DistinctChunksOf(*kept)) {
    EXPECT_TRUE(fs::exists(a.ChunkPath(hash))) << HexOf(hash);
  }
  for (const std::string& hash : plan->missing) {
    EXPECT_TRUE(fs::exists(a.ChunkPath(hash))) << HexOf(hash);
  }
  EXPECT_EQ(FilesUnder(a.store_path / "chunks").size(), DistinctChunksOf(*kept).size() + 2);
  const StoreUsage after = a.store->Usage();
  EXPECT_EQ(after.bytes, before.bytes + 2 * kChunk);
  EXPECT_EQ(after.files, before.files + 2);
  EXPECT_EQ(after.bytes, BytesUnder(a.store_path / "chunks"));
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.reserved_files, before.reserved_files);

  // The fetch finishes with what is there; everything verifies and exports.
  for (const std::string& hash : plan->missing) {
    auto data = b.store->ReadChunk(hash);
    ASSERT_TRUE(data.ok());
    ASSERT_TRUE(a.store->PutChunk(fetched->id, hash, *data).ok());
  }
  ASSERT_TRUE(a.store->CompleteFetch(fetched->id).ok());
  ExpectClean(a);
  ExpectExportIdentical(a, kept->id, kept_source, "out-kept");
  ExpectExportIdentical(a, fetched->id, fetched_source, "out-fetched");
}

// Two publishes of sources sharing a file: the first creates the shared chunks, the second
// finds them present and pins them; the first then fails. The shared chunks stay for the second.
TEST_F(StoreTest, FailedPublishKeepsChunksAnotherPublishInProgressHashed) {
  Host host = MakeHost("a");
  const std::string shared = RandomBytes(3 * kChunk, 6401);
  const fs::path first_source = tmp_.path() / "first";
  WriteRaw(first_source / "a-shared.bin", shared);
  WriteRaw(first_source / "b-shrinks.bin", RandomBytes(2 * kChunk, 6402));
  const fs::path second_source = tmp_.path() / "second";
  WriteRaw(second_source / "a-shared.bin", shared);
  WriteRaw(second_source / "b-own.bin", RandomBytes(2 * kChunk, 6403));

  absl::Mutex mu;
  bool second_hashed_shared = false;
  bool first_done = false;
  absl::StatusOr<VerifiedManifest> second = absl::UnknownError("not run");
  std::thread second_thread;
  bool truncated = false;
  auto first = host.store->Publish(Options(first_source), key_, [&](const pb::ArtifactProgress& p) {
    if (truncated || p.chunks_done() < 4) return;
    // The shared chunks are stored: start the second publish and wait until it has hashed them.
    second_thread = std::thread([&] {
      second =
          host.store->Publish(Options(second_source, 2), key_, [&](const pb::ArtifactProgress& q) {
            if (q.chunks_done() < 3) return;
            absl::MutexLock lock(&mu);
            second_hashed_shared = true;
            mu.Await(absl::Condition(&first_done));
          });
    });
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&second_hashed_shared));
    }
    fs::resize_file(first_source / "b-shrinks.bin", 100);
    truncated = true;
  });
  ASSERT_TRUE(truncated);
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAborted) << first.status();
  // It created 3 shared and 1 own chunk; only its own one goes.
  EXPECT_NE(Msg(first.status()).find("removed 1 of the 4 chunk files it wrote"), std::string::npos)
      << first.status();
  {
    absl::MutexLock lock(&mu);
    first_done = true;
  }
  second_thread.join();
  ASSERT_TRUE(second.ok()) << second.status();
  ExpectClean(host);
  ExpectExportIdentical(host, second->id, second_source, "out");
  EXPECT_EQ(host.store->Usage().bytes, BytesUnder(host.store_path / "chunks"));
  EXPECT_EQ(host.store->Usage().files, DistinctChunksOf(*second).size());
}

// The index row's write fails (its database's disk is full): the row might still appear once
// the database recovers, so the chunks are kept rather than left missing under a complete row.
TEST_F(StoreTest, PublishWhoseIndexRowFailsKeepsItsChunks) {
  Host host;
  host.db_path = tmp_.path() / "a-db";
  host.store_path = tmp_.path() / "a-store";
  host.quota = {64u << 20, 100000};
  host.clock = &clock_;
  host.db_fault = std::make_shared<state::DiskFullFault>();
  ASSERT_TRUE(host.Open().ok());
  const fs::path source = MakeSource("src", 65);
  bool filled = false;
  auto failed = host.store->Publish(Options(source), key_, [&](const pb::ArtifactProgress& p) {
    if (!filled && p.chunks_total() > 0 && p.chunks_done() == p.chunks_total()) {
      host.db_fault->Set(true);
      filled = true;
    }
  });
  ASSERT_TRUE(filled);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_NE(Msg(failed.status()).find("are kept"), std::string::npos) << failed.status();
  EXPECT_EQ(FilesUnder(host.store_path / "chunks").size(), 7u);

  // Space is back: nothing was indexed, the chunks are reported and Gc takes them.
  host.db_fault->Set(false);
  auto listed = host.store->List(true);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  auto report = host.store->Verify();
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->unreferenced_size(), 7);
  EXPECT_EQ(report->unreferenced_bytes(), BytesUnder(host.store_path / "chunks"));
  auto gc = host.store->Gc({}, false);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->chunks_removed(), 7u);
  auto again = Publish(host, source);
  EXPECT_TRUE(again.ok()) << again.status();
}

// The issue as an operator met it: a publish larger than what is left on the store's
// filesystem (a real one, a small tmpfs) fails with ENOSPC and leaves nothing behind, so the
// next, smaller publish fits without a Gc.
TEST_F(StoreTest, PublishOnAFullFilesystemLeavesNothingBehind) {
  std::string why;
  auto tmpfs = test_util::SmallTmpfs::Mount(1 << 20, &why);
  if (tmpfs == nullptr) GTEST_SKIP() << why;
  Host host;
  host.db_path = tmp_.path() / "a-db";
  host.store_path = tmpfs->path() / "store";
  host.quota = {64u << 20, 100000};
  host.clock = &clock_;
  ASSERT_TRUE(host.Open().ok());
  const fs::path big = tmp_.path() / "big";
  WriteRaw(big / "weights.bin", RandomBytes(2 << 20, 6601));
  auto failed = host.store->Publish(Options(big), key_, nullptr);
  ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
  EXPECT_NE(Msg(failed.status()).find("No space left on device"), std::string::npos);
  EXPECT_NE(Msg(failed.status()).find("removed"), std::string::npos) << failed.status();
  EXPECT_TRUE(FilesUnder(host.store_path / "chunks").empty());
  EXPECT_TRUE(FilesUnder(host.store_path / "tmp").empty());
  EXPECT_EQ(host.store->Usage().bytes, 0u);
  EXPECT_EQ(host.store->Usage().files, 0u);
  ExpectClean(host);

  const fs::path small = tmp_.path() / "small";
  WriteRaw(small / "weights.bin", RandomBytes(600 << 10, 6602));
  auto fits = host.store->Publish(Options(small), key_, nullptr);
  ASSERT_TRUE(fits.ok()) << fits.status();
  ExpectClean(host);
}

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
