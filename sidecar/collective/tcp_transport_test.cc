// The TCP transport between real listeners on loopback, in one process: handshakes (accepted
// and refused), data both ways, closed, vanished and stalled peers, malformed frames, deadlines
// and back-pressure. Peers that misbehave are hand-rolled on raw sockets.
#include "sidecar/collective/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "gtest/gtest.h"
#include "sidecar/collective/transport_test_util.h"
#include "sidecar/peer/peer_auth.h"

namespace ts::sidecar {
namespace {

using ::gonka::trainshard::v1::CollectiveHello;

// A port nobody listens on right now (bound, read, released).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// ---------------------------------------------------------------------------------------------
// A hand-rolled peer on a raw blocking socket.

class RawConn {
 public:
  explicit RawConn(int fd) : fd_(fd) {}
  RawConn(RawConn&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  RawConn& operator=(RawConn&& o) noexcept {
    Close();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  ~RawConn() { Close(); }
  int fd() const { return fd_; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  static RawConn Dial(const std::string& endpoint) {
    const size_t colon = endpoint.rfind(':');
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
    ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr);
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << errno;
    return RawConn(fd);
  }

  bool Write(std::string_view bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads exactly n bytes within timeout_ms; false on EOF, error or timeout.
  bool ReadExact(char* out, size_t n, int64_t timeout_ms) {
    const int64_t deadline = Now() + timeout_ms;
    size_t done = 0;
    while (done < n) {
      pollfd p{fd_, POLLIN, 0};
      const int64_t left = deadline - Now();
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
      ssize_t r = ::recv(fd_, out + done, n - done, 0);
      if (r <= 0) return false;
      done += static_cast<size_t>(r);
    }
    return true;
  }

  struct RawFrame {
    FrameHeader header;
    std::string payload;
  };
  // The next frame, or an error (EOF / timeout: UNAVAILABLE).
  absl::StatusOr<RawFrame> ReadFrame(int64_t timeout_ms = 3000) {
    char h[kFrameHeaderSize];
    if (!ReadExact(h, sizeof(h), timeout_ms)) return absl::UnavailableError("no frame header");
    absl::StatusOr<FrameHeader> header =
        DecodeFrameHeader(std::string_view(h, sizeof(h)), 64u << 20);
    if (!header.ok()) return header.status();
    RawFrame f{*header, std::string(header->payload_size, '\0')};
    if (!ReadExact(f.payload.data(), f.payload.size(), timeout_ms)) {
      return absl::UnavailableError("no frame payload");
    }
    return f;
  }

  // True if the peer closed the connection (EOF or reset) within timeout_ms, skipping frames.
  bool WaitForClose(int64_t timeout_ms) {
    const int64_t deadline = Now() + timeout_ms;
    char buf[4096];
    while (Now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, deadline - Now()))) <= 0) continue;
      ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
      if (r <= 0) return true;
    }
    return false;
  }

 private:
  int fd_;
};

struct HelloOptions {
  uint32_t member_index = 0;
  std::string audience;  // required
  std::optional<uint64_t> shard_id;
  std::optional<std::string> mesh_id;
  int64_t lifetime_ms = 30000;
  std::string_view method = kCollectiveHelloMethod;
};

std::string FrameOf(FrameType type, std::string_view payload, uint64_t op_id = 0) {
  FrameHeader h;
  h.type = type;
  h.op_id = op_id;
  h.payload_size = static_cast<uint32_t>(payload.size());
  return EncodeFrameHeader(h) + std::string(payload);
}

// A signed kHello frame from `key` for `group`.
std::string HelloFrame(const common::PrivateKey& key, const GroupSpec& group,
                       const HelloOptions& o) {
  CollectiveHello hello;
  hello.set_shard_id(o.shard_id.value_or(group.shard_id));
  hello.set_mesh_id(o.mesh_id.value_or(MeshIdOf(group)));
  hello.set_member_index(o.member_index);
  auto auth = SignPeerRequest(key, kChain, hello.shard_id(), o.method, o.audience, hello,
                              Clock()->NowUnixMs(), o.lifetime_ms);
  EXPECT_TRUE(auth.ok()) << auth.status();
  *hello.mutable_auth() = *auth;
  return FrameOf(FrameType::kHello, hello.SerializeAsString());
}

// The refusal a raw dialer reads after a bad hello: the abort's reason.
std::string ReadRefusal(RawConn* conn) {
  absl::StatusOr<RawConn::RawFrame> f = conn->ReadFrame();
  if (!f.ok()) return absl::StrCat("no frame: ", f.status().ToString());
  if (f->header.type != FrameType::kAbort) {
    return absl::StrCat("frame type ", static_cast<int>(f->header.type));
  }
  absl::StatusOr<AbortPayload> a = DecodeAbort(f->payload);
  if (!a.ok()) return a.status().ToString();
  return a->reason;
}

// Answers a dial on `listen_fd` as member `index` of `group` (key `key`): reads the hello and
// sends a valid ack. The connection is returned open.
RawConn AnswerDial(int listen_fd, const common::PrivateKey& key, const GroupSpec& group,
                   uint32_t index) {
  RawConn conn(::accept(listen_fd, nullptr, nullptr));
  auto hello_frame = conn.ReadFrame();
  EXPECT_TRUE(hello_frame.ok()) << hello_frame.status();
  if (!hello_frame.ok()) return conn;
  auto hello = ParseCollectiveHello(hello_frame->payload);
  EXPECT_TRUE(hello.ok()) << hello.status();
  if (!hello.ok()) return conn;
  CollectiveHello ack;
  ack.set_shard_id(group.shard_id);
  ack.set_mesh_id(MeshIdOf(group));
  ack.set_member_index(index);
  ack.set_answers_nonce(hello->auth().nonce());
  auto auth = SignPeerRequest(key, kChain, group.shard_id, kCollectiveHelloAckMethod,
                              hello->auth().signer(), ack, Clock()->NowUnixMs(), 30000);
  EXPECT_TRUE(auth.ok());
  *ack.mutable_auth() = *auth;
  EXPECT_TRUE(conn.Write(FrameOf(FrameType::kHelloAck, ack.SerializeAsString())));
  return conn;
}

// A listening socket on loopback; *endpoint receives its host:port.
int RawListen(std::string* endpoint) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *endpoint = absl::StrCat("127.0.0.1:", ntohs(a.sin_port));
  return fd;
}

// One transport (member `self`) and raw-socket members for the other places of the group.
struct RawFixture {
  std::vector<common::PrivateKey> keys;  // keys[i] signs for member i
  std::unique_ptr<TcpTransport> transport;
  GroupSpec group;
  size_t self = 0;

  RawFixture(size_t n, size_t self_index, TcpTransportOptions options = TestOptions())
      : self(self_index) {
    for (size_t i = 0; i < n; ++i) keys.push_back(common::PrivateKey::Generate());
    transport = StartOrDie(keys[self], options);
    group.shard_id = 7;
    group.session = 1;
    for (size_t i = 0; i < n; ++i) {
      // Raw members never listen (they only dial: they come first in the order).
      group.members.push_back(
          {AddressOf(keys[i]), i == self ? transport->endpoint() : "127.0.0.1:1"});
    }
  }

  // Starts the transport's Connect in the background.
  std::future<absl::StatusOr<std::unique_ptr<Mesh>>> ConnectAsync(int64_t timeout_ms = 5000) {
    const int64_t deadline = Now() + timeout_ms;
    return std::async(std::launch::async,
                      [this, deadline] { return transport->Connect(group, self, deadline); });
  }

  std::string Hello(size_t signer, HelloOptions o = {}) {
    if (o.audience.empty()) o.audience = transport->address();
    return HelloFrame(keys[signer], group, o);
  }

  // A raw member `index` (< self) that completed the handshake.
  RawConn Handshake(size_t index) {
    RawConn c = RawConn::Dial(transport->endpoint());
    HelloOptions o;
    o.member_index = static_cast<uint32_t>(index);
    EXPECT_TRUE(c.Write(Hello(index, o)));
    absl::StatusOr<RawConn::RawFrame> ack = c.ReadFrame();
    EXPECT_TRUE(ack.ok()) << ack.status();
    if (ack.ok()) {
      EXPECT_EQ(ack->header.type, FrameType::kHelloAck);
      auto hello = ParseCollectiveHello(ack->payload);
      EXPECT_TRUE(hello.ok()) << hello.status();
      if (hello.ok()) {
        EXPECT_EQ(hello->member_index(), self);
      }
    }
    return c;
  }
};

// ---------------------------------------------------------------------------------------------
// Group helpers

TEST(GroupTest, ValidateGroup) {
  GroupSpec g;
  EXPECT_EQ(ValidateGroup(g).code(), absl::StatusCode::kInvalidArgument);
  g.members = {{"a", "h:1"}};
  EXPECT_TRUE(Contains(ValidateGroup(g), "1 members"));
  g.members = {{"a", "h:1"}, {"b", "h:2"}};
  EXPECT_TRUE(ValidateGroup(g).ok());
  g.members = {{"a", "h:1"}, {"a", "h:2"}};
  EXPECT_TRUE(Contains(ValidateGroup(g), "appears twice"));
  g.members = {{"a", "h:1"}, {"", "h:2"}};
  EXPECT_TRUE(Contains(ValidateGroup(g), "members[1].address: empty"));
  g.members = {{"a", "h:1"}, {"b", ""}};
  EXPECT_TRUE(Contains(ValidateGroup(g), "members[1].endpoint: empty"));
  g.members.clear();
  for (size_t i = 0; i <= kMaxGroupMembers; ++i) g.members.push_back({absl::StrCat("m", i), "h:1"});
  EXPECT_TRUE(Contains(ValidateGroup(g), "257 members"));
  g.members.pop_back();
  EXPECT_TRUE(ValidateGroup(g).ok());
}

TEST(GroupTest, MeshIdBindsEverything) {
  GroupSpec g;
  g.shard_id = 1;
  g.session = 2;
  g.members = {{"a", "h:1"}, {"b", "h:2"}};
  const std::string id = MeshIdOf(g);
  EXPECT_EQ(id.size(), 32u);
  EXPECT_EQ(MeshIdOf(g), id);
  GroupSpec other = g;
  other.session = 3;
  EXPECT_NE(MeshIdOf(other), id);
  other = g;
  other.shard_id = 2;
  EXPECT_NE(MeshIdOf(other), id);
  other = g;
  std::swap(other.members[0], other.members[1]);
  EXPECT_NE(MeshIdOf(other), id);
  other = g;
  other.members[1].endpoint = "h:3";
  EXPECT_NE(MeshIdOf(other), id);
  // Lengths are framed: moving a byte between address and endpoint changes the id.
  other = g;
  other.members[0] = {"ah", ":1"};
  EXPECT_NE(MeshIdOf(other), id);
}

TEST(GroupTest, PeerFailureNamesThePeer) {
  absl::Status s = PeerFailure(absl::StatusCode::kUnavailable, "gonka1xyz", "connection closed");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer gonka1xyz: connection closed");
  EXPECT_EQ(FailedPeerOf(s), "gonka1xyz");
  EXPECT_EQ(FailedPeerOf(absl::UnavailableError("x")), "");
  EXPECT_EQ(FailedPeerOf(absl::OkStatus()), "");
}

// ---------------------------------------------------------------------------------------------
// Start and Connect arguments

TEST(TcpTransportTest, StartRefusesBadOptions) {
  common::PrivateKey key = common::PrivateKey::Generate();
  auto with = [&](std::function<void(TcpTransportOptions*)> f) {
    TcpTransportOptions o = TestOptions();
    f(&o);
    return TcpTransport::Start(key, o, Clock()).status();
  };
  EXPECT_TRUE(Contains(with([](auto* o) { o->chain_id = ""; }), "chain_id"));
  EXPECT_TRUE(Contains(with([](auto* o) { o->heartbeat_interval_ms = 0; }), "heartbeat"));
  EXPECT_TRUE(Contains(with([](auto* o) { o->dead_after_ms = 50; }), "dead_after_ms"));
  EXPECT_TRUE(Contains(with([](auto* o) { o->handshake_timeout_ms = -1; }), "handshake"));
  EXPECT_TRUE(Contains(with([](auto* o) { o->listen_address = "nonsense"; }), "listen_address"));
  EXPECT_TRUE(Contains(with([](auto* o) { o->listen_address = "127.0.0.1:99999"; }), "port"));
  auto t = StartOrDie(key);
  const absl::Status taken = with([&](auto* o) { o->listen_address = t->endpoint(); });
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_TRUE(Contains(taken, t->endpoint())) << taken;
}

TEST(TcpTransportTest, ConnectRefusesBadArguments) {
  common::PrivateKey key = common::PrivateKey::Generate();
  auto t = StartOrDie(key);
  GroupSpec g;
  g.members = {{t->address(), t->endpoint()}, {"gonka1other", "127.0.0.1:1"}};
  const int64_t deadline = Now() + 1000;
  EXPECT_TRUE(Contains(t->Connect(g, 2, deadline).status(), "self_index"));
  EXPECT_TRUE(Contains(t->Connect(g, 1, deadline).status(), "is not this host"));
  GroupSpec bad_endpoint = g;
  bad_endpoint.members[1].endpoint = "no-port";
  EXPECT_TRUE(Contains(t->Connect(bad_endpoint, 0, deadline).status(), "members[1].endpoint"));
  GroupSpec one = g;
  one.members.pop_back();
  EXPECT_EQ(t->Connect(one, 0, deadline).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Connect and exchange

void ConnectAndExchange(size_t n, uint32_t seed) {
  SCOPED_TRACE(absl::StrCat("n=", n, " seed=", seed));
  std::mt19937 rng(seed);
  std::vector<common::PrivateKey> keys;
  std::vector<std::unique_ptr<TcpTransport>> owned;
  std::vector<TcpTransport*> transports;
  GroupSpec group;
  group.shard_id = 3;
  group.session = seed;
  // Liveness is not what this test is about: a longer interval keeps a loaded machine (the
  // sanitizer build, two cores) from failing the mesh while 2·n·(n−1) threads copy data.
  TcpTransportOptions options = TestOptions();
  options.heartbeat_interval_ms = 1000;
  options.dead_after_ms = 0;
  for (size_t i = 0; i < n; ++i) {
    keys.push_back(common::PrivateKey::Generate());
    owned.push_back(StartOrDie(keys.back(), options));
    transports.push_back(owned.back().get());
    group.members.push_back({owned.back()->address(), owned.back()->endpoint()});
  }
  std::vector<int64_t> delays;
  for (size_t i = 0; i < n; ++i) delays.push_back(std::uniform_int_distribution<int>(0, 150)(rng));
  auto meshes = ConnectAll(transports, group, Now() + 5000, delays);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(meshes[i].ok()) << i << ": " << meshes[i].status();

  const std::vector<size_t> sizes = {0, 1, 4097, (1u << 20) + 5, 4u << 20, 3};
  // payloads[a][b][k]: what a sends to b, made before the clock starts.
  std::vector<std::vector<std::vector<std::string>>> payloads(n);
  for (size_t a = 0; a < n; ++a) {
    payloads[a].resize(n);
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      for (size_t k = 0; k < sizes.size(); ++k)
        payloads[a][b].push_back(Pattern(a, b, k, sizes[k]));
    }
  }
  // Every member sends every size to every other member while receiving from all of them.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      Mesh* mesh = meshes[a]->get();
      threads.emplace_back([&, mesh, a, b] {
        Link* link = mesh->link(b);
        for (size_t k = 0; k < sizes.size(); ++k) {
          FrameHeader h;
          h.type = FrameType::kData;
          h.op_id = 1000 + a;
          h.step = static_cast<uint32_t>(b);
          h.chunk = static_cast<uint32_t>(k);
          absl::Status s = link->Send(h, payloads[a][b][k], Now() + 10000);
          if (!s.ok()) {
            ADD_FAILURE() << a << "->" << b << ": " << s;
            ++failures;
            return;
          }
        }
      });
      threads.emplace_back([&, mesh, a, b] {
        Link* link = mesh->link(b);
        EXPECT_EQ(link->peer(), group.members[b].address);
        for (size_t k = 0; k < sizes.size(); ++k) {
          absl::StatusOr<Frame> f = link->Recv(Now() + 10000);
          if (!f.ok()) {
            ADD_FAILURE() << a << "<-" << b << ": " << f.status();
            ++failures;
            return;
          }
          EXPECT_EQ(f->header.type, FrameType::kData);
          EXPECT_EQ(f->header.op_id, 1000 + b);
          EXPECT_EQ(f->header.step, a);
          EXPECT_EQ(f->header.chunk, k);
          EXPECT_EQ(f->header.payload_size, sizes[k]);
          EXPECT_TRUE(f->payload == payloads[b][a][k]) << a << "<-" << b << " #" << k;
          link->Recycle(std::move(f->payload));
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);

  // Bytes counted: the frames' headers and payloads, plus whole 32-byte heartbeats.
  uint64_t frame_bytes = 0;
  for (size_t s : sizes) frame_bytes += kFrameHeaderSize + s;
  for (size_t a = 0; a < n; ++a) {
    EXPECT_TRUE(meshes[a].value()->failure().ok()) << meshes[a].value()->failure();
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      Link* link = meshes[a].value()->link(b);
      const uint64_t sent = link->bytes_sent();
      const uint64_t received = link->bytes_received();
      EXPECT_GE(sent, frame_bytes);
      EXPECT_EQ((sent - frame_bytes) % kFrameHeaderSize, 0u) << sent;
      EXPECT_GE(received, frame_bytes);
      EXPECT_EQ((received - frame_bytes) % kFrameHeaderSize, 0u) << received;
    }
  }
  EXPECT_EQ(meshes[0].value()->group().members.size(), n);
  EXPECT_EQ(meshes[n - 1].value()->self_index(), n - 1);
  meshes.clear();
  for (auto& t : owned) EXPECT_TRUE(t->RecentRefusals().empty());
}

TEST(TcpTransportTest, TwoMembersExchange) { ConnectAndExchange(2, 11); }
TEST(TcpTransportTest, ThreeMembersExchange) { ConnectAndExchange(3, 12); }
TEST(TcpTransportTest, FourMembersExchange) { ConnectAndExchange(4, 13); }
TEST(TcpTransportTest, FiveMembersExchange) { ConnectAndExchange(5, 14); }

TEST(TcpTransportTest, DialerRetriesUntilTheListenerStarts) {
  common::PrivateKey k0 = common::PrivateKey::Generate();
  common::PrivateKey k1 = common::PrivateKey::Generate();
  auto t0 = StartOrDie(k0);
  const std::string late_endpoint = absl::StrCat("127.0.0.1:", FreePort());
  GroupSpec g;
  g.members = {{AddressOf(k0), t0->endpoint()}, {AddressOf(k1), late_endpoint}};
  auto first = std::async(std::launch::async, [&] { return t0->Connect(g, 0, Now() + 5000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // member 1 is late
  TcpTransportOptions o = TestOptions();
  o.listen_address = late_endpoint;
  auto t1 = StartOrDie(k1, o);
  ASSERT_NE(t1, nullptr);
  auto second = t1->Connect(g, 1, Now() + 5000);
  auto m0 = first.get();
  ASSERT_TRUE(m0.ok()) << m0.status();
  ASSERT_TRUE(second.ok()) << second.status();
  FrameHeader h;
  ASSERT_TRUE((*m0)->link(1)->Send(h, "late but here", Now() + 1000).ok());
  auto f = (*second)->link(0)->Recv(Now() + 1000);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "late but here");
}

TEST(TcpTransportTest, ConnectDeadlineNamesTheMissingMember) {
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t0 = StartOrDie(keys[0]);
  auto t2 = StartOrDie(keys[2]);
  GroupSpec g;
  // Member 1 never shows up: member 0 cannot reach it, member 2 never hears from it.
  g.members = {{AddressOf(keys[0]), t0->endpoint()},
               {AddressOf(keys[1]), absl::StrCat("127.0.0.1:", FreePort())},
               {AddressOf(keys[2]), t2->endpoint()}};
  const int64_t start = Now();
  auto r0 = std::async(std::launch::async, [&] { return t0->Connect(g, 0, start + 3000); });
  const absl::Status s2 = t2->Connect(g, 2, start + 300).status();
  EXPECT_EQ(s2.code(), absl::StatusCode::kDeadlineExceeded) << s2;
  EXPECT_EQ(FailedPeerOf(s2), g.members[1].address) << s2;
  EXPECT_TRUE(Contains(s2, "not connected by the deadline")) << s2;
  EXPECT_TRUE(Contains(s2, "has not dialed here")) << s2;
  EXPECT_LT(Now() - start, 300 + 100);
  // Member 2 gave up and told member 0, which stops waiting long before its own deadline.
  const absl::Status s0 = r0.get().status();
  EXPECT_LT(Now() - start, 1000);
  EXPECT_EQ(s0.code(), absl::StatusCode::kUnavailable) << s0;
  EXPECT_EQ(FailedPeerOf(s0), g.members[1].address) << s0;
  EXPECT_TRUE(Contains(s0, absl::StrCat("aborted by ", g.members[2].address))) << s0;

  // Alone with the absent member, member 0 reports its dial's last error.
  GroupSpec pair;
  pair.members = {g.members[0], g.members[1]};
  const int64_t again = Now();
  const absl::Status s = t0->Connect(pair, 0, again + 300).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(FailedPeerOf(s), g.members[1].address) << s;
  EXPECT_TRUE(Contains(s, "connect:")) << s;
  EXPECT_LT(Now() - again, 300 + 100);
}

// An owner that stops does not wait out a connect deadline: the Connect in progress ends with
// the owner's status, its linked member hears of it, and later Connects are refused at once.
TEST(TcpTransportTest, StopConnectingEndsConnectsInProgressAndLaterOnes) {
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t0 = StartOrDie(keys[0]);
  auto t1 = StartOrDie(keys[1]);
  GroupSpec g;
  // Member 2 never shows up, so neither Connect can finish before its deadline.
  g.members = {{AddressOf(keys[0]), t0->endpoint()},
               {AddressOf(keys[1]), t1->endpoint()},
               {AddressOf(keys[2]), absl::StrCat("127.0.0.1:", FreePort())}};
  const int64_t start = Now();
  auto r0 = std::async(std::launch::async, [&] { return t0->Connect(g, 0, start + 20000); });
  auto r1 = std::async(std::launch::async, [&] { return t1->Connect(g, 1, start + 20000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const absl::Status stopping =
      PeerFailure(absl::StatusCode::kCancelled, AddressOf(keys[0]), "its run is stopping");
  t0->StopConnecting(stopping);
  const absl::Status s0 = r0.get().status();
  EXPECT_EQ(s0.code(), absl::StatusCode::kCancelled) << s0;
  EXPECT_TRUE(Contains(s0, "its run is stopping")) << s0;
  // Member 1, linked to member 0 by then, is told and gives up too.
  const absl::Status s1 = r1.get().status();
  EXPECT_FALSE(s1.ok());
  EXPECT_EQ(FailedPeerOf(s1), AddressOf(keys[0])) << s1;
  EXPECT_LT(Now() - start, 3000);
  // Later Connects are refused at once with the same status.
  const int64_t again = Now();
  const absl::Status later = t0->Connect(g, 0, again + 20000).status();
  EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
  EXPECT_LT(Now() - again, 100);
}

// ---------------------------------------------------------------------------------------------
// Closed, vanished and stalled peers

TEST(TcpTransportTest, ClosedMeshDrainsThenFailsThatLinkOnly) {
  std::vector<common::PrivateKey> keys;
  std::vector<std::unique_ptr<TcpTransport>> owned;
  GroupSpec g;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(common::PrivateKey::Generate());
    owned.push_back(StartOrDie(keys.back()));
    g.members.push_back({owned.back()->address(), owned.back()->endpoint()});
  }
  auto meshes = ConnectAll({owned[0].get(), owned[1].get(), owned[2].get()}, g, Now() + 5000);
  for (auto& m : meshes) ASSERT_TRUE(m.ok()) << m.status();
  FrameHeader h;
  ASSERT_TRUE(meshes[2].value()->link(0)->Send(h, "last words 1", Now() + 1000).ok());
  ASSERT_TRUE(meshes[2].value()->link(0)->Send(h, "last words 2", Now() + 1000).ok());
  // Member 0 waits on member 2 while member 2 finishes and closes (kClose).
  auto recv = std::async(std::launch::async, [&] {
    Link* link = meshes[0].value()->link(2);
    std::vector<absl::StatusOr<Frame>> got;
    for (int i = 0; i < 3; ++i) got.push_back(link->Recv(Now() + 5000));
    return got;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int64_t closed_at = Now();
  meshes[2].value().reset();
  owned[2].reset();
  auto got = recv.get();
  const int64_t took = Now() - closed_at;
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(got[0]->payload, "last words 1");
  ASSERT_TRUE(got[1].ok()) << got[1].status();
  EXPECT_EQ(got[1]->payload, "last words 2");
  ASSERT_FALSE(got[2].ok());
  EXPECT_EQ(got[2].status().code(), absl::StatusCode::kUnavailable) << got[2].status();
  EXPECT_EQ(FailedPeerOf(got[2].status()), g.members[2].address) << got[2].status();
  EXPECT_TRUE(Contains(got[2].status(), "closed the link")) << got[2].status();
  EXPECT_LT(took, 1000);
  // The mesh has not failed: the others go on; sending to the closed member is refused.
  EXPECT_TRUE(meshes[0].value()->failure().ok());
  EXPECT_EQ(FailedPeerOf(meshes[0].value()->link(2)->Send(h, "x", Now() + 500)),
            g.members[2].address);
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kHeartbeatMs));
  ASSERT_TRUE(meshes[1].value()->link(0)->Send(h, "still here", Now() + 1000).ok());
  auto f = meshes[0].value()->link(1)->Recv(Now() + 1000);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload, "still here");
  EXPECT_TRUE(meshes[0].value()->failure().ok()) << meshes[0].value()->failure();
  EXPECT_TRUE(meshes[1].value()->failure().ok()) << meshes[1].value()->failure();
}

TEST(TcpTransportTest, ClosingWaitsForQueuedDataToArrive) {
  // Member 0 sends its last frames and closes at once, while most of them still sit in its
  // socket (small buffers, a receiver that reads slowly). The receiver must get every byte
  // and then the close, not a reset.
  TcpTransportOptions o = TestOptions();
  o.socket_buffer_bytes = 256 << 10;
  o.max_queued_bytes = 128 << 10;
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t0 = StartOrDie(keys[0], o);
  auto t1 = StartOrDie(keys[1], o);
  GroupSpec g;
  g.members = {{t0->address(), t0->endpoint()}, {t1->address(), t1->endpoint()}};
  auto meshes = ConnectAll({t0.get(), t1.get()}, g, Now() + 5000);
  ASSERT_TRUE(meshes[0].ok() && meshes[1].ok());
  constexpr int kFrames = 20;
  const std::string chunk(64 << 10, 'c');
  auto sender = std::async(std::launch::async, [&] {
    FrameHeader h;
    for (int i = 0; i < kFrames; ++i) {
      h.chunk = static_cast<uint32_t>(i);
      absl::Status s = meshes[0].value()->link(1)->Send(h, chunk, Now() + 10000);
      if (!s.ok()) return s;
    }
    meshes[0].value().reset();  // lingers until the bytes are acknowledged
    t0.reset();
    return absl::OkStatus();
  });
  Link* link = meshes[1].value()->link(0);
  for (int i = 0; i < kFrames; ++i) {
    auto f = link->Recv(Now() + 5000);
    ASSERT_TRUE(f.ok()) << i << ": " << f.status();
    EXPECT_EQ(f->header.chunk, static_cast<uint32_t>(i));
    EXPECT_EQ(f->payload.size(), chunk.size());
    // Slower than the heartbeats this member sends meanwhile (idle link: every 50-75 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const absl::Status end = link->Recv(Now() + 2000).status();
  EXPECT_TRUE(Contains(end, "closed the link")) << end;
  EXPECT_TRUE(sender.get().ok());
  EXPECT_TRUE(meshes[1].value()->failure().ok()) << meshes[1].value()->failure();
}

TEST(TcpTransportTest, ReceivedAbortIsPassedOn) {
  // Raw member 0 aborts towards member 1 only; member 2 learns of it from member 1.
  TcpTransportOptions o = TestOptions();
  o.heartbeat_interval_ms = 5000;  // raw member 0 sends no heartbeats
  o.dead_after_ms = 0;
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t1 = StartOrDie(keys[1], o);
  auto t2 = StartOrDie(keys[2], o);
  GroupSpec g;
  g.members = {{AddressOf(keys[0]), "127.0.0.1:1"},
               {AddressOf(keys[1]), t1->endpoint()},
               {AddressOf(keys[2]), t2->endpoint()}};
  auto m1 = std::async(std::launch::async, [&] { return t1->Connect(g, 1, Now() + 5000); });
  auto m2 = std::async(std::launch::async, [&] { return t2->Connect(g, 2, Now() + 5000); });
  std::vector<RawConn> raw;
  for (size_t j : {1, 2}) {
    raw.push_back(RawConn::Dial(g.members[j].endpoint));
    HelloOptions h;
    h.audience = g.members[j].address;
    ASSERT_TRUE(raw.back().Write(HelloFrame(keys[0], g, h)));
    auto ack = raw.back().ReadFrame();
    ASSERT_TRUE(ack.ok()) << ack.status();
  }
  auto mesh1 = m1.get();
  auto mesh2 = m2.get();
  ASSERT_TRUE(mesh1.ok()) << mesh1.status();
  ASSERT_TRUE(mesh2.ok()) << mesh2.status();
  auto blocked = std::async(std::launch::async,
                            [&] { return (*mesh2)->link(1)->Recv(Now() + 5000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t at = Now();
  ASSERT_TRUE(
      raw[0].Write(FrameOf(FrameType::kAbort, EncodeAbort(g.members[0].address, "NaN in input"))));
  const absl::Status s = blocked.get();
  EXPECT_LT(Now() - at, 500);
  EXPECT_EQ(FailedPeerOf(s), g.members[0].address) << s;
  EXPECT_TRUE(Contains(s, absl::StrCat("aborted by ", g.members[1].address))) << s;
  EXPECT_TRUE(Contains(s, "NaN in input")) << s;
  // Destroying the failed mesh tells the raw member why, instead of closing with a bare EOF.
  mesh1->reset();
  std::string reason;
  for (int i = 0; i < 10 && reason.empty(); ++i) {
    auto frame = raw[0].ReadFrame(1000);
    if (!frame.ok()) break;
    if (frame->header.type != FrameType::kAbort) continue;
    auto abort = DecodeAbort(frame->payload);
    ASSERT_TRUE(abort.ok());
    reason = abort->reason;
  }
  EXPECT_NE(reason.find("NaN in input"), std::string::npos) << reason;
}

TEST(TcpTransportTest, VanishedPeerFailsTheMeshAtOnce) {
  // Member 0 is raw and dials members 1 and 2 (real transports), then its sockets close
  // without kClose, as a killed process's would.
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t1 = StartOrDie(keys[1]);
  auto t2 = StartOrDie(keys[2]);
  GroupSpec g;
  g.members = {{AddressOf(keys[0]), "127.0.0.1:1"},
               {AddressOf(keys[1]), t1->endpoint()},
               {AddressOf(keys[2]), t2->endpoint()}};
  auto m1 = std::async(std::launch::async, [&] { return t1->Connect(g, 1, Now() + 5000); });
  auto m2 = std::async(std::launch::async, [&] { return t2->Connect(g, 2, Now() + 5000); });
  std::vector<RawConn> raw;
  for (size_t j : {1, 2}) {
    raw.push_back(RawConn::Dial(g.members[j].endpoint));
    HelloOptions o;
    o.audience = g.members[j].address;
    ASSERT_TRUE(raw.back().Write(HelloFrame(keys[0], g, o)));
    auto ack = raw.back().ReadFrame();
    ASSERT_TRUE(ack.ok()) << ack.status();
    ASSERT_EQ(ack->header.type, FrameType::kHelloAck);
  }
  auto mesh1 = m1.get();
  auto mesh2 = m2.get();
  ASSERT_TRUE(mesh1.ok()) << mesh1.status();
  ASSERT_TRUE(mesh2.ok()) << mesh2.status();
  // Member 1 is blocked on member 2 (which sends nothing) when member 0 vanishes.
  auto blocked = std::async(std::launch::async,
                            [&] { return (*mesh1)->link(2)->Recv(Now() + 10000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int64_t gone_at = Now();
  raw.clear();
  const absl::Status s = blocked.get();
  const int64_t took = Now() - gone_at;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), g.members[0].address) << s;
  EXPECT_LT(took, 500) << s;
  std::cout << "vanished peer: blocked Recv returned after " << took << " ms: " << s << "\n";
  for (Mesh* m : {mesh1->get(), mesh2->get()}) {
    const int64_t until = Now() + 1000;
    while (m->failure().ok() && Now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(FailedPeerOf(m->failure()), g.members[0].address) << m->failure();
    // Every later call returns the failure at once.
    FrameHeader h;
    EXPECT_EQ(m->link(0)->Send(h, "x", Now() + 1000), m->failure());
    EXPECT_EQ(m->link(0)->Recv(Now() + 1000).status(), m->failure());
  }
}

TEST(TcpTransportTest, StalledPeerIsDetectedWithinTwoHeartbeatIntervals) {
  TcpTransportOptions o = TestOptions();
  o.heartbeat_interval_ms = 200;
  o.dead_after_ms = 0;  // the default: 1.5 intervals, 300 ms
  RawFixture f(2, 1, o);
  auto connect = f.ConnectAsync();
  // The transport last hears from the raw peer when its hello arrives, after this: time
  // measured from here is at least the peer's silence (and the bound below a strict one).
  const int64_t silent_from = Now();
  RawConn raw = f.Handshake(0);
  auto mesh = connect.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const absl::Status s = (*mesh)->link(0)->Recv(Now() + 5000).status();
  const int64_t detected_ms = Now() - silent_from;
  std::cout << "stalled peer detected after " << detected_ms << " ms (heartbeat "
            << o.heartbeat_interval_ms << " ms, dead after 300 ms): " << s << "\n";
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), f.group.members[0].address) << s;
  EXPECT_TRUE(Contains(s, "no frame or heartbeat for")) << s;
  EXPECT_GE(detected_ms, 300);
  EXPECT_LE(detected_ms, 2 * o.heartbeat_interval_ms);
  // The stalled peer was sent heartbeats, then an abort that names it.
  int heartbeats = 0;
  while (true) {
    auto frame = raw.ReadFrame(1000);
    ASSERT_TRUE(frame.ok()) << frame.status();
    if (frame->header.type == FrameType::kHeartbeat) {
      ++heartbeats;
      continue;
    }
    ASSERT_EQ(frame->header.type, FrameType::kAbort);
    auto abort = DecodeAbort(frame->payload);
    ASSERT_TRUE(abort.ok()) << abort.status();
    EXPECT_EQ(abort->blamed_address, f.group.members[0].address);
    EXPECT_NE(abort->reason.find("no frame or heartbeat"), std::string::npos) << abort->reason;
    break;
  }
  EXPECT_GE(heartbeats, 1);
}

TEST(TcpTransportTest, HeartbeatsKeepAnIdleMeshAlive) {
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t0 = StartOrDie(keys[0]);
  auto t1 = StartOrDie(keys[1]);
  GroupSpec g;
  g.members = {{t0->address(), t0->endpoint()}, {t1->address(), t1->endpoint()}};
  auto meshes = ConnectAll({t0.get(), t1.get()}, g, Now() + 5000);
  ASSERT_TRUE(meshes[0].ok() && meshes[1].ok());
  // Recv with a deadline: DEADLINE_EXCEEDED naming the peer, on time; the mesh stays up.
  const int64_t start = Now();
  const int64_t wait_ms = 5 * kHeartbeatMs;  // longer than dead_after_ms
  const absl::Status s = meshes[0].value()->link(1)->Recv(start + wait_ms).status();
  const int64_t took = Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(FailedPeerOf(s), g.members[1].address);
  EXPECT_GE(took, wait_ms);
  EXPECT_LT(took, wait_ms + 100);
  EXPECT_TRUE(meshes[0].value()->failure().ok()) << meshes[0].value()->failure();
  EXPECT_TRUE(meshes[1].value()->failure().ok()) << meshes[1].value()->failure();
  EXPECT_GE(meshes[0].value()->link(1)->bytes_received(), 4 * kFrameHeaderSize);
}

TEST(TcpTransportTest, FullQueuePausesWithoutCountingAsSilence) {
  TcpTransportOptions o = TestOptions();
  o.max_queued_bytes = 256 << 10;
  o.socket_buffer_bytes = 64 << 10;
  std::vector<common::PrivateKey> keys = {common::PrivateKey::Generate(),
                                          common::PrivateKey::Generate()};
  auto t0 = StartOrDie(keys[0], o);
  auto t1 = StartOrDie(keys[1], o);
  GroupSpec g;
  g.members = {{t0->address(), t0->endpoint()}, {t1->address(), t1->endpoint()}};
  auto meshes = ConnectAll({t0.get(), t1.get()}, g, Now() + 5000);
  ASSERT_TRUE(meshes[0].ok() && meshes[1].ok());
  // 8 MiB towards a receiver that does not read for longer than dead_after_ms.
  constexpr int kFrames = 64;
  const std::string chunk(128 << 10, 'q');
  auto sender = std::async(std::launch::async, [&] {
    FrameHeader h;
    for (int i = 0; i < kFrames; ++i) {
      h.chunk = static_cast<uint32_t>(i);
      absl::Status s = meshes[0].value()->link(1)->Send(h, chunk, Now() + 10000);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kHeartbeatMs));
  EXPECT_TRUE(meshes[0].value()->failure().ok()) << meshes[0].value()->failure();
  EXPECT_TRUE(meshes[1].value()->failure().ok()) << meshes[1].value()->failure();
  for (int i = 0; i < kFrames; ++i) {
    auto f = meshes[1].value()->link(0)->Recv(Now() + 5000);
    ASSERT_TRUE(f.ok()) << i << ": " << f.status();
    EXPECT_EQ(f->header.chunk, static_cast<uint32_t>(i));
    EXPECT_EQ(f->payload.size(), chunk.size());
    meshes[1].value()->link(0)->Recycle(std::move(f->payload));
  }
  EXPECT_TRUE(sender.get().ok());
}

TEST(TcpTransportTest, SendDeadlineWhenThePeerDoesNotRead) {
  TcpTransportOptions o = TestOptions();
  o.max_queued_bytes = 64 << 10;
  o.socket_buffer_bytes = 64 << 10;
  RawFixture f(2, 1, o);
  auto connect = f.ConnectAsync();
  RawConn raw = f.Handshake(0);
  auto mesh = connect.get();
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  // The raw peer reads nothing, but keeps itself alive with heartbeats.
  std::atomic<bool> done{false};
  std::thread beats([&] {
    while (!done) {
      raw.Write(FrameOf(FrameType::kHeartbeat, ""));
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs / 2));
    }
  });
  const std::string chunk(1 << 20, 'z');
  absl::Status s;
  int64_t start = 0;
  for (int i = 0; i < 64 && s.ok(); ++i) {
    start = Now();
    FrameHeader h;
    s = (*mesh)->link(0)->Send(h, chunk, start + 300);
  }
  const int64_t took = Now() - start;
  done = true;
  beats.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(FailedPeerOf(s), f.group.members[0].address) << s;
  EXPECT_GE(took, 300);
  EXPECT_LT(took, 300 + 100);
  // Cut off inside a frame: the link cannot carry more, so the mesh fails with it.
  EXPECT_EQ((*mesh)->failure(), s);
}

TEST(TcpTransportTest, AbortReachesEveryMemberNamingTheBlamedOne) {
  std::vector<std::unique_ptr<TcpTransport>> owned;
  GroupSpec g;
  for (int i = 0; i < 3; ++i) {
    owned.push_back(StartOrDie(common::PrivateKey::Generate()));
    g.members.push_back({owned.back()->address(), owned.back()->endpoint()});
  }
  auto meshes = ConnectAll({owned[0].get(), owned[1].get(), owned[2].get()}, g, Now() + 5000);
  for (auto& m : meshes) ASSERT_TRUE(m.ok()) << m.status();
  auto blocked = std::async(
      std::launch::async, [&] { return meshes[1].value()->link(0)->Recv(Now() + 10000).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t at = Now();
  meshes[0].value()->Abort(
      PeerFailure(absl::StatusCode::kDataLoss, g.members[2].address, "commitment mismatch"));
  const absl::Status s = blocked.get();
  EXPECT_LT(Now() - at, 200);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(FailedPeerOf(s), g.members[2].address) << s;
  EXPECT_TRUE(Contains(s, absl::StrCat("aborted by ", g.members[0].address))) << s;
  EXPECT_TRUE(Contains(s, "commitment mismatch")) << s;
  EXPECT_EQ(meshes[0].value()->failure().code(), absl::StatusCode::kDataLoss);
  const int64_t until = Now() + 1000;
  while (meshes[2].value()->failure().ok() && Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(FailedPeerOf(meshes[2].value()->failure()), g.members[2].address);
  // First failure wins.
  meshes[0].value()->Abort(absl::InternalError("later"));
  EXPECT_EQ(meshes[0].value()->failure().code(), absl::StatusCode::kDataLoss);
}

// ---------------------------------------------------------------------------------------------
// Malformed frames after a valid handshake

struct MalformedCase {
  const char* name;
  std::function<std::string()> bytes;
  bool close_after;
  absl::StatusCode code;
  const char* text;
};

std::string RawHeader(uint8_t type, uint32_t payload_size, uint16_t flags = 0) {
  FrameHeader h;
  h.payload_size = payload_size;
  std::string b = EncodeFrameHeader(h);
  b[5] = static_cast<char>(type);
  b[6] = static_cast<char>(flags & 0xff);
  return b;
}

TEST(TcpTransportTest, MalformedFramesFailTheMeshNamingTheSender) {
  const std::vector<MalformedCase> cases = {
      {"bad magic",
       [] {
         std::string b = RawHeader(4, 0);
         b[0] = 'X';
         return b;
       },
       false, absl::StatusCode::kInvalidArgument, "magic"},
      {"unknown type", [] { return RawHeader(9, 0); }, false, absl::StatusCode::kInvalidArgument,
       "unknown type 9"},
      {"non-zero flags", [] { return RawHeader(4, 0, 1); }, false,
       absl::StatusCode::kInvalidArgument, "flags"},
      {"oversize payload", [] { return RawHeader(4, 0xFFFFFFF0u); }, false,
       absl::StatusCode::kResourceExhausted, "4294967280"},
      {"one byte over the data cap", [] { return RawHeader(4, (4u << 20) + 4097); }, false,
       absl::StatusCode::kResourceExhausted, "over its cap"},
      {"oversize abort", [] { return RawHeader(5, 4096); }, false,
       absl::StatusCode::kResourceExhausted, "abort"},
      {"heartbeat with payload", [] { return RawHeader(3, 4) + "abcd"; }, false,
       absl::StatusCode::kInvalidArgument, "heartbeat"},
      {"hello after the handshake", [] { return RawHeader(1, 2) + "hi"; }, false,
       absl::StatusCode::kInvalidArgument, "after the handshake"},
      {"abort with a control character", [] { return FrameOf(FrameType::kAbort, "\x00\x01x"); },
       false, absl::StatusCode::kInvalidArgument, "abort"},
      {"truncated header then EOF", [] { return RawHeader(4, 0).substr(0, 10); }, true,
       absl::StatusCode::kUnavailable, "10 of 32"},
      {"truncated payload then EOF", [] { return RawHeader(4, 1000) + "only this"; }, true,
       absl::StatusCode::kUnavailable, "9 of 1000"},
  };
  for (const MalformedCase& c : cases) {
    SCOPED_TRACE(c.name);
    RawFixture f(2, 1);
    auto connect = f.ConnectAsync();
    RawConn raw = f.Handshake(0);
    auto mesh = connect.get();
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    // A good frame first: the link works until the bad one.
    ASSERT_TRUE(raw.Write(FrameOf(FrameType::kData, "fine", 5)));
    auto good = (*mesh)->link(0)->Recv(Now() + 2000);
    ASSERT_TRUE(good.ok()) << good.status();
    EXPECT_EQ(good->payload, "fine");
    ASSERT_TRUE(raw.Write(c.bytes()));
    if (c.close_after) raw.Close();
    const int64_t start = Now();
    const absl::Status s = (*mesh)->link(0)->Recv(Now() + 5000).status();
    EXPECT_LT(Now() - start, 500) << s;  // at once, not at the liveness deadline
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(FailedPeerOf(s), f.group.members[0].address) << s;
    EXPECT_TRUE(Contains(s, c.text)) << s;
    if (!c.close_after) {
      // The sender is told why.
      std::string reason;
      for (int i = 0; i < 10; ++i) {
        auto frame = raw.ReadFrame(1000);
        if (!frame.ok()) break;
        if (frame->header.type != FrameType::kAbort) continue;
        auto abort = DecodeAbort(frame->payload);
        ASSERT_TRUE(abort.ok());
        EXPECT_EQ(abort->blamed_address, f.group.members[0].address);
        reason = abort->reason;
        break;
      }
      EXPECT_NE(reason.find(c.text), std::string::npos) << reason;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Refused handshakes

TEST(TcpTransportTest, RefusesAHostThatIsNotAMember) {
  RawFixture f(2, 1);
  auto connect = f.ConnectAsync(3000);
  const common::PrivateKey outsider = common::PrivateKey::Generate();
  RawConn c = RawConn::Dial(f.transport->endpoint());
  HelloOptions o;
  o.audience = f.transport->address();
  ASSERT_TRUE(c.Write(HelloFrame(outsider, f.group, o)));
  const std::string reason = ReadRefusal(&c);
  EXPECT_NE(reason.find("is not a member of mesh"), std::string::npos) << reason;
  const absl::Status r = LatestRefusal(f.transport.get(), 1);
  EXPECT_EQ(r.code(), absl::StatusCode::kPermissionDenied) << r;
  EXPECT_EQ(FailedPeerOf(r), AddressOf(outsider)) << r;
  EXPECT_TRUE(Contains(r, "is not a member of mesh")) << r;
  // The member itself still gets in.
  RawConn member = f.Handshake(0);
  EXPECT_TRUE(connect.get().ok());
}

TEST(TcpTransportTest, RefusesBadHellos) {
  struct Case {
    const char* name;
    std::function<std::string(RawFixture&)> hello;
    absl::StatusCode code;
    const char* text;
  };
  const std::vector<Case> cases = {
      {"wrong audience",
       [](RawFixture& f) {
         HelloOptions o;
         o.audience = AddressOf(common::PrivateKey::Generate());
         return f.Hello(0, o);
       },
       absl::StatusCode::kPermissionDenied, "audience"},
      {"expired",
       [](RawFixture& f) {
         HelloOptions o;
         o.lifetime_ms = -1000;
         return f.Hello(0, o);
       },
       absl::StatusCode::kUnauthenticated, "in the past"},
      {"signed for another method",
       [](RawFixture& f) {
         HelloOptions o;
         o.method = kCollectiveHelloAckMethod;
         return f.Hello(0, o);
       },
       absl::StatusCode::kUnauthenticated, "signature"},
      {"wrong shard",
       [](RawFixture& f) {
         HelloOptions o;
         o.shard_id = f.group.shard_id + 1;
         return f.Hello(0, o);
       },
       absl::StatusCode::kPermissionDenied, "shard_id"},
      {"member_index lies about the signer",
       [](RawFixture& f) {
         HelloOptions o;
         o.member_index = 0;
         return f.Hello(1, o);  // member 1's key claiming to be member 0
       },
       absl::StatusCode::kPermissionDenied, "is not the signer"},
      {"later member dials",
       [](RawFixture& f) {
         HelloOptions o;
         o.member_index = 3;
         return f.Hello(3, o);
       },
       absl::StatusCode::kPermissionDenied, "the earlier member dials"},
      {"garbage header", [](RawFixture&) { return std::string(32, 'G'); },
       absl::StatusCode::kInvalidArgument, "magic"},
      {"a data frame instead of a hello",
       [](RawFixture&) { return FrameOf(FrameType::kData, "data"); },
       absl::StatusCode::kInvalidArgument, "where a hello"},
      {"hello payload that is not a CollectiveHello",
       [](RawFixture&) { return FrameOf(FrameType::kHello, std::string(20, '\xff')); },
       absl::StatusCode::kInvalidArgument, "not a CollectiveHello"},
      {"oversize hello", [](RawFixture&) { return RawHeader(1, 4097); },
       absl::StatusCode::kResourceExhausted, "4097"},
  };
  // Member 2 of 4 listens; raw members 0, 1 and 3 dial it. The raw members send no
  // heartbeats: a long interval keeps the first one in from being declared dead meanwhile.
  TcpTransportOptions options = TestOptions();
  options.heartbeat_interval_ms = 5000;
  options.dead_after_ms = 0;
  RawFixture f(4, 2, options);
  // Member 3 is dialed by the transport: a raw listener answers it.
  std::string endpoint3;
  const int listen3 = RawListen(&endpoint3);
  f.group.members[3].endpoint = endpoint3;
  auto connect = f.ConnectAsync(4000);
  RawConn m3 = AnswerDial(listen3, f.keys[3], f.group, 3);
  ::close(listen3);
  size_t refusals = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RawConn conn = RawConn::Dial(f.transport->endpoint());
    ASSERT_TRUE(conn.Write(c.hello(f)));
    const std::string reason = ReadRefusal(&conn);
    EXPECT_NE(reason.find(c.text), std::string::npos) << reason;
    EXPECT_NE(reason.find(std::string(absl::StatusCodeToString(c.code))), std::string::npos)
        << reason;
    const absl::Status r = LatestRefusal(f.transport.get(), ++refusals);
    EXPECT_EQ(r.code(), c.code) << r;
    EXPECT_TRUE(Contains(r, c.text)) << r;
  }
  // Replay: the same signed bytes twice. The first gets in, the second is refused.
  const std::string hello = f.Hello(0, HelloOptions{});
  RawConn first = RawConn::Dial(f.transport->endpoint());
  ASSERT_TRUE(first.Write(hello));
  auto ack = first.ReadFrame();
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_EQ(ack->header.type, FrameType::kHelloAck);
  RawConn replay = RawConn::Dial(f.transport->endpoint());
  ASSERT_TRUE(replay.Write(hello));
  EXPECT_NE(ReadRefusal(&replay).find("replayed"), std::string::npos);
  const absl::Status r = LatestRefusal(f.transport.get(), ++refusals);
  EXPECT_EQ(r.code(), absl::StatusCode::kUnauthenticated) << r;
  EXPECT_EQ(FailedPeerOf(r), "");  // not authenticated: named by its socket address
  EXPECT_TRUE(Contains(r, "connection from 127.0.0.1:")) << r;
  // A second connection of a member already connected.
  HelloOptions again;
  RawConn dup = RawConn::Dial(f.transport->endpoint());
  ASSERT_TRUE(dup.Write(f.Hello(0, again)));
  EXPECT_NE(ReadRefusal(&dup).find("already connected"), std::string::npos);
  ++refusals;
  // Member 1 completes the mesh.
  RawConn m1 = f.Handshake(1);
  auto mesh = connect.get();
  EXPECT_TRUE(mesh.ok()) << mesh.status();
}

TEST(TcpTransportTest, RefusesAHelloForAMeshNotBeingConnected) {
  TcpTransportOptions o = TestOptions();
  o.handshake_timeout_ms = 300;
  RawFixture f(2, 1, o);
  auto connect = f.ConnectAsync(3000);
  GroupSpec other = f.group;
  other.session = 99;
  HelloOptions h;
  h.audience = f.transport->address();
  h.mesh_id = MeshIdOf(other);
  RawConn c = RawConn::Dial(f.transport->endpoint());
  const int64_t start = Now();
  ASSERT_TRUE(c.Write(HelloFrame(f.keys[0], f.group, h)));
  const std::string reason = ReadRefusal(&c);
  EXPECT_NE(reason.find("is not being connected here"), std::string::npos) << reason;
  EXPECT_GE(Now() - start, 300 - 10);
  const absl::Status r = LatestRefusal(f.transport.get(), 1);
  EXPECT_EQ(r.code(), absl::StatusCode::kPermissionDenied) << r;
  EXPECT_EQ(FailedPeerOf(r), f.group.members[0].address) << r;
  // Silence instead of a hello.
  RawConn silent = RawConn::Dial(f.transport->endpoint());
  EXPECT_NE(ReadRefusal(&silent).find("no whole hello within 300 ms"), std::string::npos);
  RawConn member = f.Handshake(0);
  EXPECT_TRUE(connect.get().ok());
}

TEST(TcpTransportTest, DialerGetsPermissionDeniedNamingTheRefusal) {
  // Two real transports whose groups differ (the dialer's has another shard): the listener
  // parks the hello, then refuses it; the dialer reports whom and why.
  TcpTransportOptions o = TestOptions();
  o.handshake_timeout_ms = 300;
  common::PrivateKey k0 = common::PrivateKey::Generate();
  common::PrivateKey k1 = common::PrivateKey::Generate();
  auto t0 = StartOrDie(k0, o);
  auto t1 = StartOrDie(k1, o);
  GroupSpec g;
  g.shard_id = 5;
  g.members = {{t0->address(), t0->endpoint()}, {t1->address(), t1->endpoint()}};
  GroupSpec wrong = g;
  wrong.shard_id = 6;
  auto listener = std::async(std::launch::async, [&] { return t1->Connect(g, 1, Now() + 600); });
  const absl::Status s = t0->Connect(wrong, 0, Now() + 3000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(FailedPeerOf(s), t1->address()) << s;
  EXPECT_TRUE(Contains(s, "refused the hello")) << s;
  EXPECT_TRUE(Contains(s, "is not being connected here")) << s;
  const absl::Status l = listener.get().status();
  EXPECT_EQ(l.code(), absl::StatusCode::kDeadlineExceeded) << l;
  EXPECT_EQ(FailedPeerOf(l), t0->address()) << l;
}

TEST(TcpTransportTest, DialerRefusesABadAck) {
  // The "listener" is a raw socket that answers the hello with an ack signed by the wrong key,
  // then (second connection) with an abort.
  common::PrivateKey k0 = common::PrivateKey::Generate();
  common::PrivateKey k1 = common::PrivateKey::Generate();
  auto t0 = StartOrDie(k0);
  int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listen_fd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  GroupSpec g;
  g.members = {{t0->address(), t0->endpoint()},
               {AddressOf(k1), absl::StrCat("127.0.0.1:", ntohs(a.sin_port))}};
  for (bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "abort" : "ack from the wrong key");
    auto dial = std::async(std::launch::async, [&] { return t0->Connect(g, 0, Now() + 3000); });
    RawConn conn(::accept(listen_fd, nullptr, nullptr));
    auto hello_frame = conn.ReadFrame();
    ASSERT_TRUE(hello_frame.ok()) << hello_frame.status();
    ASSERT_EQ(hello_frame->header.type, FrameType::kHello);
    auto hello = ParseCollectiveHello(hello_frame->payload);
    ASSERT_TRUE(hello.ok());
    EXPECT_EQ(hello->auth().audience(), AddressOf(k1));
    if (abort) {
      ASSERT_TRUE(conn.Write(FrameOf(FrameType::kAbort, EncodeAbort("", "go away"))));
    } else {
      CollectiveHello ack;
      ack.set_shard_id(g.shard_id);
      ack.set_mesh_id(MeshIdOf(g));
      ack.set_member_index(1);
      ack.set_answers_nonce(hello->auth().nonce());
      const common::PrivateKey impostor = common::PrivateKey::Generate();
      auto auth = SignPeerRequest(impostor, kChain, g.shard_id, kCollectiveHelloAckMethod,
                                  t0->address(), ack, Clock()->NowUnixMs(), 30000);
      ASSERT_TRUE(auth.ok());
      *ack.mutable_auth() = *auth;
      ASSERT_TRUE(conn.Write(FrameOf(FrameType::kHelloAck, ack.SerializeAsString())));
    }
    const absl::Status s = dial.get().status();
    EXPECT_EQ(FailedPeerOf(s), AddressOf(k1)) << s;
    if (abort) {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
      EXPECT_TRUE(Contains(s, "refused the hello: go away")) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
      EXPECT_TRUE(Contains(s, "not the member dialed")) << s;
    }
  }
  ::close(listen_fd);
}

TEST(HandshakeCheckTest, CheckHelloMember) {
  GroupSpec g;
  g.shard_id = 4;
  g.members = {{"gonka1a", "h:1"}, {"gonka1b", "h:2"}, {"gonka1c", "h:3"}};
  const std::string id = MeshIdOf(g);
  CollectiveHello h;
  h.set_shard_id(4);
  h.set_mesh_id(id);
  h.set_member_index(0);
  EXPECT_TRUE(CheckHelloMember(h, "gonka1a", g, id, 2).ok());
  EXPECT_TRUE(CheckHelloMember(h, "gonka1a", g, id, 1).ok());
  EXPECT_TRUE(Contains(CheckHelloMember(h, "gonka1z", g, id, 2), "not a member"));
  EXPECT_TRUE(Contains(CheckHelloMember(h, "gonka1b", g, id, 2), "is not the signer"));
  EXPECT_TRUE(Contains(CheckHelloMember(h, "gonka1a", g, id, 0), "the earlier member dials"));
  h.set_member_index(1000);
  EXPECT_TRUE(Contains(CheckHelloMember(h, "gonka1a", g, id, 2), "is not the signer"));
  h.set_member_index(0);
  h.set_shard_id(5);
  EXPECT_TRUE(Contains(CheckHelloMember(h, "gonka1a", g, id, 2), "shard_id"));
  h.set_shard_id(4);
  h.set_mesh_id("short");
  EXPECT_EQ(CheckHelloMember(h, "gonka1a", g, id, 2).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ParseCollectiveHello(std::string(4097, '\0')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseCollectiveHello("\xff\xff").ok());
  EXPECT_TRUE(ParseCollectiveHello("").ok());
}

}  // namespace
}  // namespace ts::sidecar
