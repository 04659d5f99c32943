// The TCP transport between real listeners on loopback, in one process: refused handshakes
// and malformed frames after a valid handshake. Peers that misbehave are hand-rolled on raw
// sockets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/collective/tcp_transport_test_util.h"
#include "sidecar/collective/transport_test_util.h"
#include "sidecar/peer/peer_auth.h"

namespace ts::sidecar {
namespace {

using ::gonka::trainshard::v1::CollectiveHello;

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
