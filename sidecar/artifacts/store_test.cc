// The artifact store: publish, list, verify and export byte for byte, chunks shared between
// artifacts, and the byte and file quotas of publishes and fetches.
#include "sidecar/artifacts/store.h"

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "gtest/gtest.h"
#include "sidecar/artifacts/store_test_util.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using store_testing::BytesUnder;
using store_testing::DistinctChunksOf;
using store_testing::FilesUnder;
using store_testing::Host;
using store_testing::kChunk;
using store_testing::kShard;
using store_testing::Msg;
using store_testing::RandomBytes;
using store_testing::ReadRaw;
using store_testing::StoreTest;
using store_testing::WriteRaw;

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

}  // namespace
}  // namespace ts::sidecar
