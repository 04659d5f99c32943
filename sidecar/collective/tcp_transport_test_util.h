// The TCP transport tests' shared helpers (tcp_transport_failures_test.cc,
// tcp_transport_refusals_test.cc): a hand-rolled peer on raw sockets, a transport with raw
// members around it, and a raw first member among real ones; for tests only.
#ifndef TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_TEST_UTIL_H_
#define TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"
#include "gtest/gtest.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/collective/transport_test_util.h"
#include "sidecar/peer/peer_auth.h"

namespace ts::sidecar {
namespace {

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

inline std::string FrameOf(FrameType type, std::string_view payload, uint64_t op_id = 0) {
  FrameHeader h;
  h.type = type;
  h.op_id = op_id;
  h.payload_size = static_cast<uint32_t>(payload.size());
  return EncodeFrameHeader(h) + std::string(payload);
}

// A signed kHello frame from `key` for `group`.
inline std::string HelloFrame(const common::PrivateKey& key, const GroupSpec& group,
                              const HelloOptions& o) {
  ::gonka::trainshard::v1::CollectiveHello hello;
  hello.set_shard_id(o.shard_id.value_or(group.shard_id));
  hello.set_mesh_id(o.mesh_id.value_or(MeshIdOf(group)));
  hello.set_member_index(o.member_index);
  auto auth = SignPeerRequest(key, kChain, hello.shard_id(), o.method, o.audience, hello,
                              Clock()->NowUnixMs(), o.lifetime_ms);
  EXPECT_TRUE(auth.ok()) << auth.status();
  *hello.mutable_auth() = *auth;
  return FrameOf(FrameType::kHello, hello.SerializeAsString());
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

// Three members: real transports for members 1 and 2, and a raw member 0 that dials both and
// completes each handshake (the first member of the order dials every other). raw[0] is its
// connection to member 1, raw[1] to member 2.
struct RawFirstOfThree {
  std::vector<common::PrivateKey> keys;
  std::unique_ptr<TcpTransport> t1;
  std::unique_ptr<TcpTransport> t2;
  GroupSpec group;
  absl::StatusOr<std::unique_ptr<Mesh>> mesh1 = absl::UnknownError("not connected");
  absl::StatusOr<std::unique_ptr<Mesh>> mesh2 = absl::UnknownError("not connected");
  std::vector<RawConn> raw;

  explicit RawFirstOfThree(const TcpTransportOptions& options = TestOptions()) {
    for (int i = 0; i < 3; ++i) keys.push_back(common::PrivateKey::Generate());
    t1 = StartOrDie(keys[1], options);
    t2 = StartOrDie(keys[2], options);
    group.members = {{AddressOf(keys[0]), "127.0.0.1:1"},
                     {AddressOf(keys[1]), t1->endpoint()},
                     {AddressOf(keys[2]), t2->endpoint()}};
    auto m1 = std::async(std::launch::async, [&] { return t1->Connect(group, 1, Now() + 5000); });
    auto m2 = std::async(std::launch::async, [&] { return t2->Connect(group, 2, Now() + 5000); });
    for (size_t j : {1, 2}) {
      raw.push_back(RawConn::Dial(group.members[j].endpoint));
      HelloOptions o;
      o.audience = group.members[j].address;
      EXPECT_TRUE(raw.back().Write(HelloFrame(keys[0], group, o)));
      absl::StatusOr<RawConn::RawFrame> ack = raw.back().ReadFrame();
      EXPECT_TRUE(ack.ok()) << ack.status();
      if (ack.ok()) {
        EXPECT_EQ(ack->header.type, FrameType::kHelloAck);
      }
    }
    mesh1 = m1.get();
    mesh2 = m2.get();
  }
};

}  // namespace
}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_TEST_UTIL_H_
