// Damaged stores and unsafe input: Verify and Export on modified, missing and linked chunks;
// sources with links, special files or bad names; invalid options; and publishes that fail
// midway, with what they leave behind.
#include "sidecar/artifacts/store.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/crypto/hash.h"
#include "gtest/gtest.h"
#include "sidecar/artifacts/store_test_util.h"
#include "state/db.h"
#include "tests/util/small_tmpfs.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using store_testing::BytesUnder;
using store_testing::DistinctChunksOf;
using store_testing::FilesUnder;
using store_testing::HexOf;
using store_testing::Host;
using store_testing::kChunk;
using store_testing::Msg;
using store_testing::RandomBytes;
using store_testing::ReadRaw;
using store_testing::StoreTest;
using store_testing::WriteRaw;

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

}  // namespace
}  // namespace ts::sidecar
