// The TCP transport under TLS (options.tls): real listeners on loopback, each host with its own
// certificate and each member pinned to the one its group entry (its reservation) names. Data
// both ways across record boundaries, heartbeats, aborts; and the refusals: a listener with
// another certificate, a dialer with another certificate, a peer in the clear either way.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crypto/tls_identity.h"
#include "common/crypto/tls_session.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/collective/transport_test_util.h"

namespace ts::sidecar {
namespace {

std::shared_ptr<const common::TlsContext> NewContext() {
  absl::StatusOr<common::TlsIdentity> identity = common::NewTlsIdentity("gonka1host");
  EXPECT_TRUE(identity.ok()) << identity.status();
  absl::StatusOr<std::shared_ptr<const common::TlsContext>> context =
      common::TlsContext::New(*identity);
  EXPECT_TRUE(context.ok()) << context.status();
  return *context;
}

// n hosts under TLS, each with its own certificate; group.members[i] pins host i's.
struct TlsHosts {
  std::vector<common::PrivateKey> keys;
  std::vector<std::shared_ptr<const common::TlsContext>> contexts;
  std::vector<std::unique_ptr<TcpTransport>> owned;
  std::vector<TcpTransport*> transports;
  GroupSpec group;

  explicit TlsHosts(size_t n, TcpTransportOptions options = TestOptions()) {
    group.shard_id = 9;
    group.session = 1;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(common::PrivateKey::Generate());
      contexts.push_back(NewContext());
      TcpTransportOptions o = options;
      o.tls = contexts.back();
      owned.push_back(StartOrDie(keys.back(), o));
      transports.push_back(owned.back().get());
      group.members.push_back(
          {owned.back()->address(), owned.back()->endpoint(), contexts.back()->cert_sha256()});
    }
  }
};

TEST(TcpTransportTlsTest, ThreeMembersExchangeAcrossRecordBoundaries) {
  TcpTransportOptions options = TestOptions();
  options.heartbeat_interval_ms = 1000;  // liveness is not what this test is about
  options.dead_after_ms = 0;
  TlsHosts hosts(3, options);
  const size_t n = hosts.transports.size();
  auto meshes = ConnectAll(hosts.transports, hosts.group, Now() + 5000, {0, 40, 80});
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(meshes[i].ok()) << i << ": " << meshes[i].status();

  // Around one record (16 KiB of plaintext, a 32-byte frame header in front), and several MiB.
  const std::vector<size_t> sizes = {0, 1, 16384 - 32, 16384 - 31, 16384, (4u << 20) + 5, 3};
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      Mesh* mesh = meshes[a]->get();
      threads.emplace_back([&, mesh, a, b] {
        for (size_t k = 0; k < sizes.size(); ++k) {
          FrameHeader h;
          h.type = FrameType::kData;
          h.chunk = static_cast<uint32_t>(k);
          absl::Status s = mesh->link(b)->Send(h, Pattern(a, b, k, sizes[k]), Now() + 10000);
          if (!s.ok()) {
            ADD_FAILURE() << a << "->" << b << ": " << s;
            ++failures;
            return;
          }
        }
      });
      threads.emplace_back([&, mesh, a, b] {
        for (size_t k = 0; k < sizes.size(); ++k) {
          absl::StatusOr<Frame> f = mesh->link(b)->Recv(Now() + 10000);
          if (!f.ok()) {
            ADD_FAILURE() << a << "<-" << b << ": " << f.status();
            ++failures;
            return;
          }
          EXPECT_EQ(f->header.chunk, k);
          EXPECT_TRUE(f->payload == Pattern(b, a, k, sizes[k])) << a << "<-" << b << " #" << k;
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  // What crossed the wire is the frames as records: each record adds 22 bytes.
  uint64_t frame_bytes = 0;
  for (size_t s : sizes) frame_bytes += kFrameHeaderSize + s;
  for (size_t a = 0; a < n; ++a) {
    EXPECT_TRUE(meshes[a].value()->failure().ok()) << meshes[a].value()->failure();
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      EXPECT_GE(meshes[a].value()->link(b)->bytes_sent(),
                frame_bytes + sizes.size() * (common::kTlsRecordHeader + 1 + common::kTlsTagSize));
      EXPECT_GE(meshes[a].value()->link(b)->bytes_received(), frame_bytes);
    }
  }
  meshes.clear();
  for (auto& t : hosts.owned) EXPECT_TRUE(t->RecentRefusals().empty());
}

TEST(TcpTransportTlsTest, HeartbeatsAndAbortsTravelInRecords) {
  TlsHosts hosts(3);
  auto meshes = ConnectAll(hosts.transports, hosts.group, Now() + 5000);
  for (auto& m : meshes) ASSERT_TRUE(m.ok()) << m.status();
  // Idle for several dead_after_ms: heartbeats alone keep every link alive.
  std::this_thread::sleep_for(std::chrono::milliseconds(8 * kHeartbeatMs));
  for (auto& m : meshes) EXPECT_TRUE(m.value()->failure().ok()) << m.value()->failure();
  EXPECT_GE(meshes[0].value()->link(1)->bytes_received(), 4 * kFrameHeaderSize);
  // An abort from member 2 reaches the others, naming whom it blames.
  meshes[2].value()->Abort(PeerFailure(absl::StatusCode::kDataLoss, hosts.group.members[1].address,
                                       "bad pseudo-gradient"));
  for (size_t i = 0; i < 2; ++i) {
    const absl::Status s = meshes[i].value()->link(2)->Recv(Now() + 3000).status();
    EXPECT_EQ(FailedPeerOf(s), hosts.group.members[1].address) << i << ": " << s;
    EXPECT_TRUE(Contains(s, "bad pseudo-gradient")) << s;
  }
}

TEST(TcpTransportTlsTest, ADialerRefusesAListenerWithAnotherCertificate) {
  TlsHosts hosts(2);
  const std::string real = hosts.group.members[1].tls_cert_sha256;
  hosts.group.members[1].tls_cert_sha256 = NewContext()->cert_sha256();  // the reservation's
  // The listener's certificate is checked before any hello: member 1 need not be connecting.
  const int64_t start = Now();
  const absl::Status s = hosts.transports[0]->Connect(hosts.group, 0, Now() + 3000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ(FailedPeerOf(s), hosts.group.members[1].address) << s;
  EXPECT_TRUE(Contains(s, absl::BytesToHexString(real))) << s;
  EXPECT_TRUE(Contains(s, absl::BytesToHexString(hosts.group.members[1].tls_cert_sha256))) << s;
  // Final: the dialer does not retry until the deadline.
  EXPECT_LT(Now() - start, 1500);
  // The listener heard the dialer's alert.
  EXPECT_TRUE(Contains(LatestRefusal(hosts.owned[1].get(), 1), "alert"))
      << hosts.owned[1]->RecentRefusals().size();
}

TEST(TcpTransportTlsTest, AListenerRefusesADialerWithAnotherCertificate) {
  TlsHosts hosts(2);
  // Member 0 dials with a certificate that is not the one the group names for it.
  hosts.group.members[0].tls_cert_sha256 = NewContext()->cert_sha256();
  auto meshes = ConnectAll(hosts.transports, hosts.group, Now() + 1500);
  ASSERT_FALSE(meshes[0].ok());
  EXPECT_EQ(meshes[0].status().code(), absl::StatusCode::kPermissionDenied) << meshes[0].status();
  EXPECT_TRUE(Contains(meshes[0].status(), "TLS certificate")) << meshes[0].status();
  const absl::Status refusal = hosts.owned[1]->RecentRefusals().at(0);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kPermissionDenied) << refusal;
  EXPECT_TRUE(Contains(refusal, absl::BytesToHexString(hosts.contexts[0]->cert_sha256())))
      << refusal;
  // The connection is named, not the member whose hello it carried.
  EXPECT_TRUE(FailedPeerOf(refusal).empty()) << refusal;
}

TEST(TcpTransportTlsTest, APeerInTheClearIsRefusedEitherWay) {
  // A TLS listener and a dialer in the clear.
  {
    TlsHosts hosts(2);
    TcpTransportOptions clear = TestOptions();
    auto plain = StartOrDie(hosts.keys[0], clear);
    GroupSpec g = hosts.group;
    g.members[0].endpoint = plain->endpoint();
    auto meshes = ConnectAll({plain.get(), hosts.transports[1]}, g, Now() + 1500);
    EXPECT_FALSE(meshes[0].ok());
    EXPECT_FALSE(meshes[1].ok());
    const absl::Status refusal = LatestRefusal(hosts.owned[1].get(), 1);
    EXPECT_TRUE(Contains(refusal, "TLS")) << refusal;
  }
  // A TLS dialer and a listener in the clear.
  {
    TlsHosts hosts(2);
    auto plain = StartOrDie(hosts.keys[1], TestOptions());
    GroupSpec g = hosts.group;
    g.members[1].endpoint = plain->endpoint();
    auto meshes = ConnectAll({hosts.transports[0], plain.get()}, g, Now() + 1500);
    EXPECT_FALSE(meshes[0].ok());
    EXPECT_FALSE(meshes[1].ok());
    // The listener in the clear took the ClientHello for a frame and refused it.
    bool refused_as_a_frame = false;
    for (const absl::Status& r : plain->RecentRefusals()) {
      refused_as_a_frame = refused_as_a_frame || Contains(r, "frame header: magic");
    }
    EXPECT_TRUE(refused_as_a_frame);
  }
}

TEST(TcpTransportTlsTest, ConnectWantsEveryPeersFingerprint) {
  TlsHosts hosts(2);
  GroupSpec g = hosts.group;
  g.members[1].tls_cert_sha256.clear();
  const absl::Status s = hosts.transports[0]->Connect(g, 0, Now() + 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s, "group.members[1].tls_cert_sha256")) << s;
  g.members[1].tls_cert_sha256 = "short";
  EXPECT_TRUE(Contains(ValidateGroup(g), "tls_cert_sha256: 5 bytes")) << ValidateGroup(g);
}

// A raw client that connects and never says anything holds a pending slot only until the
// handshake timeout; the listener keeps serving members meanwhile.
TEST(TcpTransportTlsTest, ASilentConnectionTimesOutInTheHandshake) {
  TcpTransportOptions o = TestOptions();
  o.handshake_timeout_ms = 300;
  TlsHosts hosts(2, o);
  const std::string endpoint = hosts.owned[1]->endpoint();
  const size_t colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  auto meshes = ConnectAll(hosts.transports, hosts.group, Now() + 3000);
  EXPECT_TRUE(meshes[0].ok() && meshes[1].ok());
  const absl::Status refusal = LatestRefusal(hosts.owned[1].get(), 1);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kDeadlineExceeded) << refusal;
  EXPECT_TRUE(Contains(refusal, "no TLS handshake within 300 ms")) << refusal;
  ::close(fd);
}

}  // namespace
}  // namespace ts::sidecar
