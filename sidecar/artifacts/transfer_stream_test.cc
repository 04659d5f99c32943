// The chunk stream: fetches over it and the fallback to GetChunks, attacks on the real chunk
// stream server (refused and malformed requests, TLS, idle and slow connections), and chunk
// stream peers that misbehave.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/crypto/tls_identity.h"
#include "common/crypto/tls_session.h"
#include "common/hex.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "sidecar/artifacts/chunk_stream.h"
#include "sidecar/artifacts/chunk_stream_wire.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/artifacts/transfer_test_util.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using transfer_testing::AddressOf;
using transfer_testing::Clock;
using transfer_testing::Host;
using transfer_testing::kChain;
using transfer_testing::kChunk;
using transfer_testing::KeyOf;
using transfer_testing::kShard;
using transfer_testing::RandomBytes;
using transfer_testing::Server;
using transfer_testing::StartServer;
using transfer_testing::TransferTest;
using transfer_testing::Tree;
using transfer_testing::WriteFile;

// A plain TCP connection to 127.0.0.1:`port`, from `source` (any address of 127.0.0.0/8: each
// is a source of its own to the chunk stream's bounds) when given. Returns the descriptor.
int ConnectTo(uint16_t port, const std::string& source = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TS_CHECK(fd >= 0);
  if (!source.empty()) {
    struct sockaddr_in from = {};
    from.sin_family = AF_INET;
    TS_CHECK(::inet_pton(AF_INET, source.c_str(), &from.sin_addr) == 1);
    TS_CHECK(::bind(fd, reinterpret_cast<struct sockaddr*>(&from), sizeof(from)) == 0);
  }
  struct sockaddr_in to = {};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  TS_CHECK(::connect(fd, reinterpret_cast<struct sockaddr*>(&to), sizeof(to)) == 0);
  return fd;
}

// A listener that accepts every connection and resets it at once (SO_LINGER 0): a chunk stream
// port that refuses everyone, as a host's whose stream is unusable from here.
class ResettingListener {
 public:
  ResettingListener() {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::bind(listen_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    TS_CHECK(::listen(listen_, 64) == 0);
    socklen_t len = sizeof(addr);
    TS_CHECK(::getsockname(listen_, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        ++accepted_;
        const struct linger reset = {1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
        ::close(fd);
      }
    });
  }
  ~ResettingListener() {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  int listen_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int> accepted_{0};
};

TEST_F(TransferTest, ChunksTravelOverTheStreamUnlessGrpcIsAsked) {
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);
  ExpectIdentical(d, "out");

  Host* g = AddHost("g", 0x1f);
  FetcherOptions options;
  options.use_chunk_stream = false;
  result = FetchArtifact(ContextFor(g), RequestFor({publisher_->AsPeer()}), options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);  // none more
  const fs::path out = tmp_.path() / "out-grpc";
  ASSERT_TRUE(g->store->Export(id_, out.string(), nullptr).ok());
  EXPECT_EQ(Tree(out), Tree(tmp_.path() / "source"));
}

TEST_F(TransferTest, PeerWithoutAStreamServedOverGrpc) {
  Host* c = AddHost("c", 0x0c);
  c->Serve(&directory_, {}, /*stream=*/false);
  UpdateDirectory();
  ASSERT_TRUE(FetchArtifact(ContextFor(c), RequestFor({publisher_->AsPeer()})).ok());
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({c->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes_by_peer().at(c->address), result->bytes_fetched());
  ExpectIdentical(d, "out");
}

// A peer whose chunk stream refuses every connection (reset at once, or answered with an error
// frame) is fetched from over GetChunks instead of being dropped, and the fallback is reported.
TEST_F(TransferTest, FetchFallsBackToGrpcWhenTheStreamRefuses) {
  ResettingListener resetter;
  Host* c = AddHost("c", 0x0c);
  ASSERT_TRUE(FetchArtifact(ContextFor(c), RequestFor({publisher_->AsPeer()})).ok());
  TransferServiceOptions announce_resetter;
  announce_resetter.chunk_stream_port = resetter.port();
  c->Serve(&directory_, announce_resetter, /*stream=*/false);
  UpdateDirectory();
  Host* d = AddHost("d", 0x0d);
  std::vector<pb::ArtifactProgress> progress;
  FetchContext context = ContextFor(d);
  context.progress = [&](const pb::ArtifactProgress& p) { progress.push_back(p); };
  auto result = FetchArtifact(context, RequestFor({c->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
  EXPECT_EQ(result->bytes_by_peer().at(c->address), result->bytes_fetched());
  EXPECT_EQ(result->peer_faults_size(), 0);
  ASSERT_EQ(result->stream_fallbacks_size(), 1);
  EXPECT_EQ(result->stream_fallbacks(0).peer(), c->address);
  EXPECT_THAT(result->stream_fallbacks(0).reason(), HasSubstr("unavailable: chunk stream"));
  EXPECT_FALSE(result->stream_fallbacks(0).corrupt());
  // Reported while the fetch ran, not only at its end; and the stream was left alone after
  // the first attempts (one per stream thread at most).
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back().stream_fallbacks_size(), 1);
  EXPECT_GE(resetter.accepted(), 1);
  EXPECT_LE(resetter.accepted(), 4);
  ExpectIdentical(d, "out");

  // A stream that refuses with an error frame (no thread free to serve): the same.
  Host* e = AddHost("e", 0x1e);
  ASSERT_TRUE(FetchArtifact(ContextFor(e), RequestFor({publisher_->AsPeer()})).ok());
  ChunkStreamServerOptions no_thread;
  no_thread.max_connections = 0;
  e->Serve(&directory_, {}, /*stream=*/true, no_thread);
  UpdateDirectory();
  Host* g = AddHost("g", 0x1f);
  result = FetchArtifact(ContextFor(g), RequestFor({e->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->stream_fallbacks_size(), 1);
  EXPECT_THAT(result->stream_fallbacks(0).reason(), HasSubstr("resource exhausted"));
  EXPECT_EQ(e->chunk_stream->chunks_sent(), 0u);
  EXPECT_EQ(result->chunks_fetched(), total_chunks_);
}

// The chunk-stream attack end to end: with more idle connections on the publisher's
// chunk stream port than the old bound of 64, a member's default fetch goes through, over the
// stream itself.
TEST_F(TransferTest, FetchSucceedsWhileIdleConnectionsHoldTheStreamPort) {
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(ConnectTo(publisher_->chunk_stream->port()));
  Host* d = AddHost("d", 0x0d);
  auto result = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->peer_faults_size(), 0);
  EXPECT_EQ(result->stream_fallbacks_size(), 0);
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), total_chunks_);
  ExpectIdentical(d, "out");
  for (int fd : idle) ::close(fd);
}

class ChunkStreamAttackTest : public TransferTest {
 protected:
  void SetUp() override {
    TransferTest::SetUp();
    if (HasFatalFailure()) return;
    member_ = AddHost("m", 0x4d);
    auto manifest = publisher_->store->GetManifest(id_, true);
    ASSERT_TRUE(manifest.ok());
    for (const auto& file : manifest->body.files()) {
      for (const auto& h : file.chunks()) chunks_.push_back(h);
    }
  }

  pb::GetChunksRequest Request(size_t n, const common::PrivateKey& key,
                               std::string_view method = kMethodChunkStream,
                               std::string audience = "") {
    pb::GetChunksRequest request;
    request.set_shard_id(kShard);
    request.set_artifact_id(id_);
    for (size_t i = 0; i < n; ++i) request.add_chunks(chunks_[i]);
    Sign(&request, key, method, std::move(audience));
    return request;
  }

  // Sends `request` on a new connection; returns the chunks received, or the first failure.
  absl::StatusOr<std::vector<std::string>> Call(const pb::GetChunksRequest& request,
                                                const ChunkStreamTls& tls = {}) {
    ChunkStreamCall call(Clock(), Clock()->MonotonicMs() + 10000);
    TS_RETURN_IF_ERROR(call.Start("127.0.0.1", publisher_->chunk_stream->port(), request, tls));
    std::vector<char> buffer(kMaxChunkSize);
    std::vector<std::string> got;
    while (true) {
      TS_ASSIGN_OR_RETURN(ChunkStreamFrame frame, call.Next(buffer.data(), buffer.size()));
      if (frame.type == ChunkStreamFrameType::kEnd) {
        EXPECT_EQ(frame.index, got.size());
        return got;
      }
      EXPECT_EQ(frame.index, got.size());
      std::string data(buffer.data(), frame.size);
      EXPECT_EQ(common::Sha256(data), frame.hash);
      got.push_back(std::move(data));
    }
  }

  // A plain TCP connection to the publisher's chunk stream; `receive_buffer` > 0 sets SO_RCVBUF
  // before the connect, so the window is that small from the start.
  int RawConnect(int receive_buffer = 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TS_CHECK(fd >= 0);
    if (receive_buffer > 0) {
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(publisher_->chunk_stream->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    return fd;
  }

  // Connects and writes raw bytes; returns what the server sent back before closing.
  std::string RawExchange(const std::string& bytes, int64_t wait_ms = 5000) {
    const int fd = RawConnect();
    if (!bytes.empty()) TS_CHECK(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) > 0);
    struct timeval tv = {static_cast<time_t>(wait_ms / 1000),
                         static_cast<suseconds_t>((wait_ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out;
  }

  // The status of the error frame that opens `answer`.
  absl::Status ErrorIn(const std::string& answer) {
    if (answer.size() < kChunkStreamFrameHeaderBytes) {
      return absl::InternalError(absl::StrCat("answer of ", answer.size(), " bytes"));
    }
    auto frame =
        DecodeChunkStreamFrameHeader(answer.substr(0, kChunkStreamFrameHeaderBytes), kMaxChunkSize);
    TS_CHECK(frame.ok() && frame->type == ChunkStreamFrameType::kError);
    return ChunkStreamErrorStatus(*frame, answer.substr(kChunkStreamFrameHeaderBytes));
  }

  Host* member_ = nullptr;
  std::vector<std::string> chunks_;
};

TEST_F(ChunkStreamAttackTest, SignedMemberRequestServedInOrder) {
  auto got = Call(Request(5, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(common::Sha256((*got)[i]), chunks_[i]);
}

std::shared_ptr<const common::TlsContext> NewTlsContext() {
  auto identity = common::NewTlsIdentity("gonka1test");
  TS_CHECK(identity.ok());
  auto context = common::TlsContext::New(*identity);
  TS_CHECK(context.ok());
  return *context;
}

// Under TLS the same request is served to a fetcher that pins the server's certificate; a
// fetcher pinning another one, or speaking in the clear, gets no chunk; and a refusal still
// reaches a TLS fetcher, sealed.
TEST_F(ChunkStreamAttackTest, TlsServesThePinnedAndNoOneElse) {
  auto server_tls = NewTlsContext();
  auto client_tls = NewTlsContext();
  publisher_->Stop();
  ChunkStreamServerOptions options;
  options.tls = server_tls;
  publisher_->Serve(&directory_, {}, true, options);

  auto got = Call(Request(5, member_->key), {client_tls, server_tls->cert_sha256()});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(common::Sha256((*got)[i]), chunks_[i]);

  auto impostor = Call(Request(1, member_->key), {client_tls, client_tls->cert_sha256()});
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kUnauthenticated) << impostor.status();
  EXPECT_THAT(std::string(impostor.status().message()),
              ::testing::HasSubstr(common::HexEncode(server_tls->cert_sha256())));

  auto clear = Call(Request(1, member_->key));
  ASSERT_FALSE(clear.ok());
  EXPECT_EQ(clear.status().code(), absl::StatusCode::kUnavailable) << clear.status();

  // A request signed by a non-member: refused by the service, the refusal in a record.
  auto refused = Call(Request(1, KeyOf(0x77)), {client_tls, server_tls->cert_sha256()});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), 5u);
}

TEST_F(ChunkStreamAttackTest, RefusedRequests) {
  pb::GetChunksRequest unsigned_request = Request(1, member_->key);
  unsigned_request.clear_auth();
  EXPECT_EQ(Call(unsigned_request).status().code(), absl::StatusCode::kUnauthenticated);

  // Signed for GetChunks: not valid on the stream.
  auto wrong_method = Call(Request(1, member_->key, kMethodGetChunks));
  EXPECT_EQ(wrong_method.status().code(), absl::StatusCode::kUnauthenticated)
      << wrong_method.status();

  auto wrong_audience = Call(Request(1, member_->key, kMethodChunkStream, member_->address));
  EXPECT_EQ(wrong_audience.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong_audience.status().message(), HasSubstr("auth.audience"));

  pb::GetChunksRequest once = Request(1, member_->key);
  ASSERT_TRUE(Call(once).ok());
  auto replayed = Call(once);
  EXPECT_EQ(replayed.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(replayed.status().message(), HasSubstr("replay"));

  Host* outsider = AddHost("x", 0x2a, /*member=*/false);
  auto non_member = Call(Request(1, outsider->key));
  EXPECT_EQ(non_member.status().code(), absl::StatusCode::kPermissionDenied);

  pb::GetChunksRequest foreign = Request(0, member_->key);
  foreign.add_chunks(std::string(32, 'z'));
  foreign.clear_auth();
  auto auth = SignPeerRequest(member_->key, kChain, kShard, kMethodChunkStream, publisher_->address,
                              foreign, Clock()->NowUnixMs(), 30000);
  ASSERT_TRUE(auth.ok());
  *foreign.mutable_auth() = *auth;
  auto not_named = Call(foreign);
  EXPECT_EQ(not_named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_named.status().message(), HasSubstr("not named by the manifest"));
}

TEST_F(ChunkStreamAttackTest, MalformedRequestsGetAnErrorAndNoChunk) {
  absl::Status garbage = ErrorIn(RawExchange("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(garbage.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.message(), HasSubstr("magic"));

  absl::Status oversize = ErrorIn(RawExchange(EncodeChunkStreamRequestHeader(1u << 30)));
  EXPECT_EQ(oversize.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(oversize.message(), HasSubstr("length 1073741824"));

  absl::Status junk =
      ErrorIn(RawExchange(EncodeChunkStreamRequestHeader(8) + "\xff\xff\xff\xff\xff\xff\xff\xff"));
  EXPECT_EQ(junk.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.message(), HasSubstr("not a GetChunksRequest"));
  EXPECT_EQ(publisher_->chunk_stream->chunks_sent(), 0u);
}

// A reader that resets the connection while a chunk is on its way: the server's sendfile, which
// has no MSG_NOSIGNAL, meets the reset mid-file. This process does not ignore SIGPIPE (gtest's
// main leaves it as it is), so the test dies if the server lets the signal through; the server
// must go on serving afterwards.
TEST_F(ChunkStreamAttackTest, ReaderThatResetsMidChunkDoesNotKillTheServer) {
  std::mt19937_64 rng(11);
  const fs::path dir = tmp_.path() / "large";
  for (int i = 0; i < 6; ++i) {
    WriteFile(dir / absl::StrCat("f", i, ".bin"), RandomBytes(rng, kMaxChunkSize));
  }
  PublishOptions options;
  options.source_dir = dir.string();
  options.chunk_size = kMaxChunkSize;
  auto published = publisher_->store->Publish(options, publisher_->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  pb::GetChunksRequest request;
  request.set_shard_id(kShard);
  request.set_artifact_id(published->id);
  for (const auto& file : published->body.files()) {
    for (const auto& hash : file.chunks()) request.add_chunks(hash);
  }
  Sign(&request, member_->key, kMethodChunkStream);
  const std::string body = request.SerializeAsString();
  const std::string bytes =
      EncodeChunkStreamRequestHeader(static_cast<uint32_t>(body.size())) + body;

  for (int round = 0; round < 5; ++round) {
    const int fd = RawConnect(/*receive_buffer=*/4096);  // the server blocks inside a chunk
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    // Some of the first chunk arrives, then the server is left blocked in the middle of it.
    char buf[4096];
    ASSERT_GT(::recv(fd, buf, sizeof(buf), 0), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const struct linger reset = {1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    ::close(fd);
  }
  auto got = Call(Request(5, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 5u);
}

TEST_F(ChunkStreamAttackTest, SilentConnectionsAreClosedAndMakeRoomForNewOnes) {
  ChunkStreamServerOptions options;
  options.max_pending_connections = 2;
  options.request_deadline_ms = 300;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();

  // A connection that never sends its request is closed after the deadline, nothing sent.
  const int64_t start_ms = Clock()->MonotonicMs();
  EXPECT_EQ(RawExchange(""), "");
  EXPECT_GE(Clock()->MonotonicMs() - start_ms, 250);
  EXPECT_LT(Clock()->MonotonicMs() - start_ms, 4000);

  // Two silent connections fill the pending pool (with a deadline long enough for the check,
  // even on a slow sanitizer build); a third connection takes the place of the older one, which
  // is closed at once with nothing sent, and is served.
  publisher_->Stop();
  options.request_deadline_ms = 5000;
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  std::vector<int64_t> held_ms(2, 0);
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([this, i, &held_ms] {
      const int64_t begin = Clock()->MonotonicMs();
      EXPECT_EQ(RawExchange(""), "");
      held_ms[i] = Clock()->MonotonicMs() - begin;
    });
    // One after the other, so which one is older is known.
    for (int w = 0; w < 500 && publisher_->chunk_stream->pending_connections() < size_t(i + 1);
         ++w) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), 2u);
  auto got = Call(Request(2, member_->key));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 2u);
  EXPECT_EQ(publisher_->chunk_stream->evictions(), 1u);
  EXPECT_LE(publisher_->chunk_stream->connections(), 2u);
  for (std::thread& t : holders) t.join();
  EXPECT_LT(held_ms[0], 4000);  // evicted for the member's connection
  EXPECT_GE(held_ms[1], 4500);  // kept until its deadline
}

// The chunk-stream lockout of the "Harden the host" issue: more idle connections than the old
// bound of 64 (which closed every further connection at its accept, a member's too). Idle
// connections now only ever evict each other: from the member's own source (above its
// per-source bound) and from many others (above the pool's bound).
TEST_F(ChunkStreamAttackTest, IdleConnectionsCannotKeepAMemberOut) {
  // Bounds as the defaults; a deadline long enough that no idle connection times out during
  // the test (what is checked is who makes room for whom).
  ChunkStreamServerOptions options;
  options.request_deadline_ms = 60000;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(ConnectTo(publisher_->chunk_stream->port()));
  for (int source = 2; source < 12; ++source) {
    for (int i = 0; i < 20; ++i) {
      idle.push_back(ConnectTo(publisher_->chunk_stream->port(), absl::StrCat("127.0.0.", source)));
    }
  }
  const ChunkStreamServerOptions defaults;
  for (int i = 0; i < 500 && publisher_->chunk_stream->evictions() <
                                 idle.size() - defaults.max_pending_connections;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), defaults.max_pending_connections);
  for (int round = 0; round < 3; ++round) {
    auto got = Call(Request(3, member_->key));
    ASSERT_TRUE(got.ok()) << round << ": " << got.status();
    EXPECT_EQ(got->size(), 3u);
  }
  // From sources that hold nothing: once the pool is full again, the flooders' connections
  // make room. (Each member connection above took the place of one idle connection of its own
  // source and then left the pool, so the pool has room for one before anyone is evicted.)
  const uint64_t evicted = publisher_->chunk_stream->evictions();
  const size_t room =
      defaults.max_pending_connections - publisher_->chunk_stream->pending_connections();
  std::vector<int> newcomers;
  for (size_t i = 0; i <= room; ++i) {
    newcomers.push_back(
        ConnectTo(publisher_->chunk_stream->port(), absl::StrCat("127.0.0.", 100 + i)));
  }
  for (int i = 0; i < 500 && publisher_->chunk_stream->evictions() == evicted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(publisher_->chunk_stream->evictions(), evicted + 1);
  EXPECT_EQ(publisher_->chunk_stream->pending_connections(), defaults.max_pending_connections);
  for (int fd : newcomers) ::close(fd);
  for (int fd : idle) ::close(fd);
}

// Connections being served are bounded apart from pending ones: a request beyond the bound is
// told so (RESOURCE_EXHAUSTED) rather than left waiting.
TEST_F(ChunkStreamAttackTest, ServingConnectionsAreBoundedApart) {
  ChunkStreamServerOptions options;
  options.max_connections = 1;
  publisher_->Stop();
  publisher_->Serve(&directory_, {}, /*stream=*/true, options);
  UpdateDirectory();
  // One request of large chunks to a reader that does not read: it holds the only thread.
  std::mt19937_64 rng(12);
  const fs::path dir = tmp_.path() / "large";
  for (int i = 0; i < 4; ++i) {
    WriteFile(dir / absl::StrCat("f", i, ".bin"), RandomBytes(rng, kMaxChunkSize));
  }
  PublishOptions publish;
  publish.source_dir = dir.string();
  publish.chunk_size = kMaxChunkSize;
  auto published = publisher_->store->Publish(publish, publisher_->key, nullptr);
  ASSERT_TRUE(published.ok()) << published.status();
  pb::GetChunksRequest large;
  large.set_shard_id(kShard);
  large.set_artifact_id(published->id);
  for (const auto& file : published->body.files()) {
    for (const auto& hash : file.chunks()) large.add_chunks(hash);
  }
  Sign(&large, member_->key, kMethodChunkStream);
  const std::string body = large.SerializeAsString();
  const std::string bytes =
      EncodeChunkStreamRequestHeader(static_cast<uint32_t>(body.size())) + body;
  const int slow = RawConnect(/*receive_buffer=*/4096);
  ASSERT_EQ(::send(slow, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  for (int i = 0; i < 500 && publisher_->chunk_stream->serving_connections() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(publisher_->chunk_stream->serving_connections(), 1u);
  auto refused = Call(Request(1, member_->key));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("already being served"));
  ::close(slow);
  for (int i = 0; i < 500 && publisher_->chunk_stream->serving_connections() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto served = Call(Request(1, member_->key));
  ASSERT_TRUE(served.ok()) << served.status();
}

// A chunk stream peer that misbehaves in one chosen way, behind an honest gRPC service that
// announces it.
class ScriptedStreamPeer final : public pb::ArtifactTransfer::Service {
 public:
  enum class Mode {
    kBadMagic,       // a frame header that is not one
    kWrongPosition,  // the second chunk where the first belongs
    kWrongData,      // the right header, other bytes
    kOversize,       // a chunk larger than the artifact's chunk size
    kCloseMidChunk,  // half a chunk, then the connection closes
    kShortEnd,       // an end frame after fewer chunks than asked for
    kDataLoss,       // an error frame with DATA_LOSS
  };
  ScriptedStreamPeer(ArtifactStore* store, Mode mode) : store_(store), mode_(mode) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TS_CHECK(::bind(listen_, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0);
    TS_CHECK(::listen(listen_, 16) == 0);
    socklen_t len = sizeof(addr);
    TS_CHECK(::getsockname(listen_, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~ScriptedStreamPeer() override {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
  }
  int connections() const { return connections_.load(); }

  grpc::Status GetManifest(grpc::ServerContext*, const pb::GetManifestRequest* request,
                           pb::GetManifestResponse* response) override {
    auto manifest = store_->GetManifest(request->artifact_id(), /*complete_only=*/true);
    if (!manifest.ok()) return ToGrpcStatus(manifest.status());
    *response->mutable_manifest() = manifest->manifest;
    return grpc::Status::OK;
  }
  grpc::Status GetChunkStream(grpc::ServerContext*, const pb::GetChunkStreamRequest*,
                              pb::GetChunkStreamResponse* response) override {
    response->set_port(port_);
    return grpc::Status::OK;
  }

 private:
  void Loop() {
    while (true) {
      int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      ++connections_;
      Answer(fd);
      ::close(fd);
    }
  }
  static bool ReadAll(int fd, char* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::recv(fd, out + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }
  static void Send(int fd, const std::string& bytes) {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  static std::string Header(uint32_t index, uint32_t size, const std::string& hash) {
    std::string h(kChunkStreamFrameHeaderBytes, '\0');
    EncodeChunkFrameHeader(index, size, hash, h.data());
    return h;
  }
  void Answer(int fd) {
    char header[kChunkStreamRequestHeaderBytes];
    if (!ReadAll(fd, header, sizeof(header))) return;
    auto length = DecodeChunkStreamRequestHeader(std::string_view(header, sizeof(header)), 1 << 16);
    if (!length.ok()) return;
    std::string body(*length, '\0');
    if (!ReadAll(fd, body.data(), body.size())) return;
    pb::GetChunksRequest request;
    if (!request.ParseFromString(body)) return;
    std::vector<std::string> data;
    for (const std::string& hash : request.chunks()) {
      auto chunk = store_->ReadChunk(hash);
      if (!chunk.ok()) return;
      data.push_back(*std::move(chunk));
    }
    const auto& hashes = request.chunks();
    const uint32_t n = static_cast<uint32_t>(hashes.size());
    switch (mode_) {
      case Mode::kBadMagic:
        Send(fd, std::string(kChunkStreamFrameHeaderBytes, 'X'));
        return;
      case Mode::kWrongPosition:
        if (n < 2) break;
        Send(fd, Header(0, static_cast<uint32_t>(data[1].size()), hashes[1]) + data[1]);
        return;
      case Mode::kWrongData: {
        std::string other = data[0];
        other[0] = static_cast<char>(other[0] ^ 1);
        Send(fd, Header(0, static_cast<uint32_t>(other.size()), hashes[0]) + other);
        return;
      }
      case Mode::kOversize:
        Send(fd, Header(0, kChunk + 4096, hashes[0]) + std::string(kChunk + 4096, 'o'));
        return;
      case Mode::kCloseMidChunk:
        Send(fd, Header(0, static_cast<uint32_t>(data[0].size()), hashes[0]) +
                     data[0].substr(0, data[0].size() / 2));
        return;
      case Mode::kShortEnd: {
        std::string end(kChunkStreamFrameHeaderBytes, '\0');
        EncodeEndFrameHeader(n, end.data());
        Send(fd, Header(0, static_cast<uint32_t>(data[0].size()), hashes[0]) + data[0] + end);
        return;
      }
      case Mode::kDataLoss:
        Send(fd, EncodeErrorFrame(absl::DataLossError("chunk file damaged")));
        return;
    }
  }

  ArtifactStore* store_;
  const Mode mode_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int> connections_{0};
};

class MisbehavingStreamPeerTest : public TransferTest {
 protected:
  absl::StatusOr<pb::ArtifactProgress> FetchFrom(ScriptedStreamPeer::Mode mode, Host* fetcher) {
    ScriptedStreamPeer peer(publisher_->store.get(), mode);
    Server server = StartServer(&peer);
    FetcherOptions options;
    options.chunks_per_request = 4;
    auto result = FetchArtifact(ContextFor(fetcher),
                                RequestFor({FetchPeer{bad_address_, server.endpoint}}), options);
    server.server->Shutdown();
    return result;
  }

  // The bad peer is dropped (corrupt or not), nothing unverified is stored, and the publisher
  // then completes the fetch.
  void ExpectDropped(ScriptedStreamPeer::Mode mode, bool corrupt, const std::string& reason) {
    Host* d = AddHost(absl::StrCat("d", static_cast<int>(mode)), 0x0d);
    auto result = FetchFrom(mode, d);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(result.status().message(), HasSubstr(bad_address_));
    EXPECT_THAT(result.status().message(), HasSubstr(reason));
    if (corrupt) {
      EXPECT_THAT(result.status().message(), HasSubstr("(corrupt)"));
    } else {
      EXPECT_THAT(result.status().message(), Not(HasSubstr("(corrupt)")));
    }
    auto verify = d->store->Verify();
    ASSERT_TRUE(verify.ok()) << verify.status();
    EXPECT_EQ(verify->modified_size(), 0);
    EXPECT_FALSE(HasComplete(d));
    auto honest = FetchArtifact(ContextFor(d), RequestFor({publisher_->AsPeer()}));
    ASSERT_TRUE(honest.ok()) << honest.status();
    ExpectIdentical(d, absl::StrCat("out", static_cast<int>(mode)));
  }

  const std::string bad_address_ = AddressOf(KeyOf(0x3b));
};

TEST_F(MisbehavingStreamPeerTest, BadFrameHeader) {
  ExpectDropped(ScriptedStreamPeer::Mode::kBadMagic, true, "malformed chunk stream frame");
}
TEST_F(MisbehavingStreamPeerTest, WrongPosition) {
  ExpectDropped(ScriptedStreamPeer::Mode::kWrongPosition, true, "sent chunk");
}
TEST_F(MisbehavingStreamPeerTest, WrongData) {
  ExpectDropped(ScriptedStreamPeer::Mode::kWrongData, true, "failed verification");
}
TEST_F(MisbehavingStreamPeerTest, OversizeChunk) {
  ExpectDropped(ScriptedStreamPeer::Mode::kOversize, true, "more than the");
}
TEST_F(MisbehavingStreamPeerTest, ClosedMidChunkIsAFailureNotCorruption) {
  ExpectDropped(ScriptedStreamPeer::Mode::kCloseMidChunk, false, "connection closed");
}
TEST_F(MisbehavingStreamPeerTest, ShortEndFrame) {
  ExpectDropped(ScriptedStreamPeer::Mode::kShortEnd, true, "ended its chunk stream");
}
TEST_F(MisbehavingStreamPeerTest, DataLossErrorMarksCorrupt) {
  ExpectDropped(ScriptedStreamPeer::Mode::kDataLoss, true, "chunk file damaged");
}

}  // namespace
}  // namespace ts::sidecar
