// The TCP transport between real listeners on loopback, in one process: the group helpers,
// Start and Connect arguments, handshakes accepted, data both ways and connect deadlines.
#include "sidecar/collective/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "gtest/gtest.h"
#include "sidecar/collective/transport_test_util.h"

namespace ts::sidecar {
namespace {

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

}  // namespace
}  // namespace ts::sidecar
