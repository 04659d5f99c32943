// Fetching an artifact into the store: BeginFetch, PutChunk and CompleteFetch, the chunks and
// manifests they refuse, corrupt index rows, and a fetch resumed after a reopen.
#include "sidecar/artifacts/store.h"

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "gtest/gtest.h"
#include "sidecar/artifacts/store_test_util.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using store_testing::DistinctChunksOf;
using store_testing::HexOf;
using store_testing::Host;
using store_testing::kChunk;
using store_testing::kShard;
using store_testing::Msg;
using store_testing::RandomBytes;
using store_testing::ReadRaw;
using store_testing::StoreTest;
using store_testing::WriteRaw;

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

}  // namespace
}  // namespace ts::sidecar
