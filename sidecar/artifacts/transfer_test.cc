// Fetching an artifact from the shard's hosts: from one peer and from several, with tampered,
// dead and slow peers, resumed after a failure or a cancel, and refused; and peers that
// misbehave over GetManifest and GetChunks.
#include "sidecar/artifacts/transfer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "sidecar/artifacts/transfer_observer.h"
#include "sidecar/artifacts/transfer_test_util.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using transfer_testing::AddressOf;
using transfer_testing::Host;
using transfer_testing::kChunk;
using transfer_testing::KeyOf;
using transfer_testing::MakeSource;
using transfer_testing::ScriptedPeer;
using transfer_testing::Server;
using transfer_testing::StartServer;
using transfer_testing::TransferTest;

// An endpoint where nothing listens (a server started and stopped).
// A loopback endpoint that refuses connections: its port stays bound, not listening, until the
// test process exits, so no server started later (port 0) is given it. (A port freed by a stopped
// server was handed to the next one, which then answered at the "dead" endpoint.)
std::string DeadEndpoint() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TS_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TS_CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  TS_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  return absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));  // fd held on purpose
}

// ---------------------------------------------------------------------------------------------
// Fetching

TEST_F(TransferTest, FetchFromOnePeer) {
  Host* d = AddHost("d", 0x0d);
  std::vector<pb::ArtifactProgress> progress;
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { progress.push_back(p); };
  auto result = FetchArtifact(context, RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->done());
  EXPECT_EQ(result->phase(), "done");
  EXPECT_EQ(result->artifact_id(), id_);
  EXPECT_EQ(result->chunks_present(), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(result->chunks_total(), total_chunks_);
  EXPECT_EQ(result->bytes_done(), result->bytes_total());
  EXPECT_EQ(result->bytes_fetched(), result->bytes_total());
  EXPECT_EQ(result->bytes_by_peer().at(publisher_->address), result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress.front().phase(), "manifest");
  EXPECT_EQ(progress.back().chunks_done(), total_chunks_);
  for (const auto& p : progress) EXPECT_FALSE(p.done());
  for (size_t i = 1; i < progress.size(); ++i) {
    EXPECT_GE(progress[i].bytes_done(), progress[i - 1].bytes_done());
  }
  EXPECT_TRUE(HasComplete(d));
  ExpectIdentical(d, "out");

  // Again: everything is present, nothing is transferred.
  auto again = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->chunks_present(), total_chunks_);
  EXPECT_EQ(again->chunks_fetched(), 0u);
}

// Counts what the services tell it (sidecar/artifacts/transfer_observer.h).
class CountingObserver final : public TransferObserver {
 public:
  void ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    served_[peer + "/" + std::string(way)] += bytes;
  }
  void TransferStarted(std::string_view) override {}
  void TransferEnded(std::string_view, double, const pb::ArtifactProgress*) override {}
  uint64_t Served(const std::string& peer, std::string_view way) {
    absl::MutexLock lock(&mu_);
    return served_[peer + "/" + std::string(way)];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, uint64_t> served_ ABSL_GUARDED_BY(mu_);
};

// Every chunk byte a fetch received, the serving host's observer saw leave, named by the
// fetching member, on whichever way it went.
TEST_F(TransferTest, TheServingHostCountsEveryByteByPeerAndWay) {
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "chunk stream" : "GetChunks");
    CountingObserver observer;
    Host* server = AddHost(stream ? "s1" : "s2", stream ? 0x21 : 0x22);
    ASSERT_TRUE(FetchArtifact(ContextFor(server), RequestFor({publisher_->AsPeer()})).ok());
    TransferServiceOptions options;
    options.observer = &observer;
    server->Serve(&directory_, options, stream);
    UpdateDirectory();
    Host* reader = AddHost(stream ? "r1" : "r2", stream ? 0x31 : 0x32);
    auto result = FetchArtifact(ContextFor(reader), RequestFor({server->AsPeer()}));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(observer.Served(reader->address, stream ? kServedOverChunkStream : kServedOverGrpc),
              result->bytes_fetched());
    EXPECT_GT(result->bytes_fetched(), 0u);
  }
}

TEST_F(TransferTest, FetchFromThreePeersUsesEach) {
  Host* b = AddCopy("b", 0x0b);
  Host* c = AddCopy("c", 0x0c);
  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 1;
  auto result = FetchArtifact(
      ContextFor(d), RequestFor({publisher_->AsPeer(), b->AsPeer(), c->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  uint64_t sum = 0;
  for (const Host* h : {static_cast<const Host*>(publisher_), static_cast<const Host*>(b),
                        static_cast<const Host*>(c)}) {
    ASSERT_TRUE(result->bytes_by_peer().contains(h->address));
    EXPECT_GT(result->bytes_by_peer().at(h->address), 0u) << h->address;
    sum += result->bytes_by_peer().at(h->address);
  }
  EXPECT_EQ(sum, result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ExpectIdentical(d, "out");
}

// With batches so large that one peer's streams could claim the whole artifact at once, the
// batches shrink to a share of the queue, so every peer serves part of it.
TEST_F(TransferTest, LargeBatchesShareASmallArtifact) {
  Host* b = AddCopy("b", 0x0b);
  Host* c = AddCopy("c", 0x0c);
  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 64;
  ASSERT_GE(static_cast<uint32_t>(options.chunks_per_request) *
                static_cast<uint32_t>(options.streams_per_peer),
            total_chunks_);
  auto result = FetchArtifact(
      ContextFor(d), RequestFor({publisher_->AsPeer(), b->AsPeer(), c->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  for (const Host* h : {static_cast<const Host*>(publisher_), static_cast<const Host*>(b),
                        static_cast<const Host*>(c)}) {
    EXPECT_GT(result->bytes_by_peer().at(h->address), 0u) << h->address;
  }
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, TamperedPeerReportedAndAvoided) {
  Host* t = AddCopy("t", 0x0e);
  // Flip a byte in every chunk file of t: each still has the right size, none the right hash.
  int tampered = 0;
  for (const auto& entry : fs::recursive_directory_iterator(t->dir / "store" / "chunks")) {
    if (!entry.is_regular_file()) continue;
    fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write);
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    char byte = 0;
    f.seekg(0);
    f.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x5a);
    f.seekp(0);
    f.write(&byte, 1);
    ASSERT_TRUE(f.good());
    ++tampered;
  }
  ASSERT_EQ(tampered, static_cast<int>(total_chunks_));

  Host* d = AddHost("d", 0x0d);
  FetcherOptions options;
  options.chunks_per_request = 1;
  // The tampered peer first, so it is given chunks before the honest one can take them all.
  auto result =
      FetchArtifact(ContextFor(d), RequestFor({t->AsPeer(), publisher_->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->peer_faults_size(), 1);
  EXPECT_EQ(result->peer_faults(0).peer(), t->address);
  EXPECT_TRUE(result->peer_faults(0).corrupt());
  EXPECT_THAT(result->peer_faults(0).reason(), HasSubstr("failed verification"));
  EXPECT_EQ(result->bytes_by_peer().at(t->address), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, AllPeersDeadThenResume) {
  Host* d = AddHost("d", 0x0d);
  Host* e = AddHost("e", 0x1e);  // a member that never comes up
  const FetchPeer dead_a{publisher_->address, DeadEndpoint()};
  const FetchPeer dead_e{e->address, DeadEndpoint()};

  // Nothing held yet: no manifest from anyone.
  auto result = FetchArtifact(ContextFor(d), RequestFor({dead_a, dead_e}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(publisher_->address));
  EXPECT_THAT(result.status().message(), HasSubstr(e->address));
  EXPECT_FALSE(HasComplete(d));

  // Part of it from a peer that serves one chunk per call and ends early, then is dropped.
  ScriptedPeer partial(publisher_->store.get(), ScriptedPeer::Mode::kShort);
  Server partial_server = StartServer(&partial);
  FetcherOptions options;
  options.streams_per_peer = 1;
  options.streams_target = 1;
  options.chunks_per_request = 4;
  result =
      FetchArtifact(ContextFor(d),
                    RequestFor({FetchPeer{publisher_->address, partial_server.endpoint}}), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("stream ended after 1 of 4 chunks"));
  const int held = partial.chunks_served();
  EXPECT_EQ(held, 2);  // two calls: the first failure is retried, the second drops it
  EXPECT_FALSE(HasComplete(d));
  partial_server.server->Shutdown();

  // Every peer down: the manifest is held locally, the chunks cannot be had.
  result = FetchArtifact(ContextFor(d), RequestFor({dead_a, dead_e}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("no peer left"));
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(publisher_->address, ": ")));
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(e->address, ": ")));
  EXPECT_FALSE(HasComplete(d));

  // A peer comes back: only the missing chunks are asked for.
  ScriptedPeer counting(publisher_->store.get(), ScriptedPeer::Mode::kHonest);
  Server counting_server = StartServer(&counting);
  result = FetchArtifact(ContextFor(d),
                         RequestFor({FetchPeer{publisher_->address, counting_server.endpoint}}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_present(), static_cast<uint32_t>(held));
  EXPECT_EQ(result->chunks_fetched(), total_chunks_ - held);
  EXPECT_EQ(counting.chunks_served(), static_cast<int>(total_chunks_) - held);
  counting_server.server->Shutdown();
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, CancelThenResume) {
  ScriptedPeer slow(publisher_->store.get(), ScriptedPeer::Mode::kHonest);
  slow.set_delay_ms(5);
  Server slow_server = StartServer(&slow);
  Host* d = AddHost("d", 0x0d);
  std::atomic<uint32_t> seen{0};
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { seen = p.chunks_fetched(); };
  context.cancelled = [&] { return seen.load() >= 5; };
  FetcherOptions options;
  options.chunks_per_request = 2;
  // Two streams, so the slow peer takes long enough for the cancel to land mid-way.
  options.streams_target = 1;
  auto result = FetchArtifact(
      context, RequestFor({FetchPeer{publisher_->address, slow_server.endpoint}}), options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(result.status().message(), HasSubstr("resumable"));
  EXPECT_FALSE(HasComplete(d));
  // Let the server notice the cancelled calls (as many as the fetch had streams) before counting
  // what it sent: wait until the count holds still for 300 ms.
  int first = slow.chunks_served();
  for (int quiet_ms = 0, waited_ms = 0; quiet_ms < 300 && waited_ms < 5000; waited_ms += 50) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int now = slow.chunks_served();
    quiet_ms = now == first ? quiet_ms + 50 : 0;
    first = now;
  }
  EXPECT_GE(first, 5);
  EXPECT_LT(first, static_cast<int>(total_chunks_));

  slow.set_delay_ms(0);
  auto resumed = FetchArtifact(ContextFor(d),
                               RequestFor({FetchPeer{publisher_->address, slow_server.endpoint}}));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->chunks_present() + resumed->chunks_fetched(), total_chunks_);
  EXPECT_GT(resumed->chunks_present(), 0u);
  // Only what was missing went over the wire again (a chunk in flight at the cancel may have
  // been sent and not stored).
  EXPECT_EQ(static_cast<uint32_t>(slow.chunks_served() - first), resumed->chunks_fetched());
  EXPECT_LE(resumed->chunks_present(), static_cast<uint32_t>(first));
  slow_server.server->Shutdown();
  ExpectIdentical(d, "out");
}

TEST_F(TransferTest, PublisherNotAMemberRefused) {
  Host* outsider = AddHost("x", 0x2a, /*member=*/false);
  MakeSource(tmp_.path() / "outsider", /*seed=*/7);
  PublishOptions options;
  options.source_dir = (tmp_.path() / "outsider").string();
  options.chunk_size = kChunk;
  auto published = outsider->store->Publish(options, outsider->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  // Served by a member (who does not check what it relays).
  ScriptedPeer relay(outsider->store.get(), ScriptedPeer::Mode::kHonest);
  Server relay_server = StartServer(&relay);
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(
      ContextFor(d),
      RequestFor({FetchPeer{publisher_->address, relay_server.endpoint}}, published->id));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(result.status().message(),
              HasSubstr(absl::StrCat("host ", outsider->address, " is not a member")));
  EXPECT_EQ(relay.calls(), 0);
  auto list = d->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  relay_server.server->Shutdown();
}

TEST_F(TransferTest, OverQuotaFetchRefused) {
  Host* small = AddHost("s", 0x1f, /*member=*/true, StoreQuota{64 << 10, 1000});
  auto result = FetchArtifact(ContextFor(small), RequestFor({publisher_->AsPeer()}));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  auto list = small->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
  EXPECT_EQ(small->store->Usage().files, 0u);
}

TEST_F(TransferTest, BadRequestsRefused) {
  Host* d = AddHost("d", 0x0d);
  auto r = FetchArtifact(ContextFor(d), RequestFor({}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "peers: empty");
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}, "short"));
  EXPECT_EQ(r.status().message(), "artifact_id: 5 bytes, want 32");
  r = FetchArtifact(ContextFor(d), RequestFor({FetchPeer{d->address, "127.0.0.1:1"}}));
  EXPECT_THAT(r.status().message(), HasSubstr("is this host"));
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer(), publisher_->AsPeer()}));
  EXPECT_THAT(r.status().message(), HasSubstr("listed twice"));
  FetchRequest other_shard = RequestFor({publisher_->AsPeer()});
  other_shard.shard_id = 2;
  r = FetchArtifact(ContextFor(d), other_shard);
  EXPECT_EQ(r.status().message(), "shard_id: 2 is not the store's shard 1");
  FetcherOptions options;
  options.chunks_per_request = 257;
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}), options);
  EXPECT_THAT(r.status().message(), HasSubstr("options.chunks_per_request: 257"));
  // The artifact id nobody has.
  r = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}, std::string(32, 'z')));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(publisher_->address));
}

// ---------------------------------------------------------------------------------------------
// Misbehaving peers

class MisbehavingPeerTest : public TransferTest {
 protected:
  // Fetches with `mode` as the only peer; returns the result.
  absl::StatusOr<pb::ArtifactProgress> FetchFrom(ScriptedPeer::Mode mode, Host* fetcher,
                                                 std::string other_id = "") {
    ScriptedPeer peer(publisher_->store.get(), mode);
    peer.set_other_artifact(std::move(other_id));
    Server server = StartServer(&peer);
    FetcherOptions options;
    options.chunks_per_request = 4;
    auto result = FetchArtifact(ContextFor(fetcher),
                                RequestFor({FetchPeer{bad_address_, server.endpoint}}), options);
    server.server->Shutdown();
    return result;
  }

  // Nothing unverified was stored: whatever the fetcher holds verifies.
  void ExpectNothingCorrupt(Host* host) {
    auto verify = host->store->Verify();
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_EQ(verify->modified_size(), 0);
    EXPECT_FALSE(HasComplete(host));
  }

  // After the bad peer, the publisher completes the fetch.
  void ExpectHonestCompletes(Host* host) {
    auto result = FetchArtifact(ContextFor(host), RequestFor({publisher_->AsPeer()}));
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectIdentical(host, "out");
  }

  const std::string bad_address_ = AddressOf(KeyOf(0x3b));
};

TEST_F(MisbehavingPeerTest, WrongManifest) {
  const std::string other = PublishOther();
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kWrongManifest, d, other);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("bad manifest"));
  auto list = d->store->List(/*include_incomplete=*/true);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());

  // With an honest peer beside it, the fetch goes on and the bad one is reported.
  ScriptedPeer bad(publisher_->store.get(), ScriptedPeer::Mode::kWrongManifest);
  bad.set_other_artifact(other);
  Server server = StartServer(&bad);
  auto both = FetchArtifact(
      ContextFor(d), RequestFor({FetchPeer{bad_address_, server.endpoint}, publisher_->AsPeer()}));
  server.server->Shutdown();
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->peer_faults_size(), 1);
  EXPECT_EQ(both->peer_faults(0).peer(), bad_address_);
  EXPECT_TRUE(both->peer_faults(0).corrupt());
  EXPECT_EQ(bad.calls(), 0);  // dropped: never asked for chunks
  ExpectIdentical(d, "out");
}

TEST_F(MisbehavingPeerTest, OversizeManifestRefusedByTheChannel) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kOversizeManifest, d);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("RESOURCE_EXHAUSTED"));
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, LargeJunkManifestReachesTheChecks) {
  // Above the chunk cap, below the manifest cap: the channel lets it through and the manifest
  // checks refuse it.
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kJunkManifest, d);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("bad manifest"));
  EXPECT_THAT(result.status().message(), Not(HasSubstr("larger than max")));
}

TEST_F(MisbehavingPeerTest, ChunksOutOfOrder) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kReverse, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("out of order or not requested"));
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, UnrequestedChunk) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kUnrequested, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("out of order or not requested"));
  ExpectNothingCorrupt(d);
  auto verify = d->store->Verify();
  ASSERT_TRUE(verify.ok());
  EXPECT_EQ(d->store->Usage().files, 0u);  // the unrequested chunk was not stored
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, ExtraChunk) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kExtra, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr("sent more than the 4 chunks asked for"));
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, OversizeChunkRefusedByTheChannel) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kOversizeChunk, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
  EXPECT_THAT(result.status().message(), HasSubstr("resource exhausted"));
  EXPECT_EQ(d->store->Usage().files, 0u);
  ExpectNothingCorrupt(d);
  ExpectHonestCompletes(d);
}

TEST_F(MisbehavingPeerTest, DataLossStatusMarksCorrupt) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchFrom(ScriptedPeer::Mode::kDataLoss, d);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(), HasSubstr(absl::StrCat(bad_address_, " (corrupt)")));
  EXPECT_THAT(result.status().message(), HasSubstr("chunk file damaged"));
  ExpectHonestCompletes(d);
}

}  // namespace
}  // namespace ts::sidecar
