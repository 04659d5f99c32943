#include "tests/util/link_emulator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ts::test_util {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A listener on 127.0.0.1 whose one accepted connection runs `serve(fd)` on a thread.
class Server {
 public:
  template <typename F>
  explicit Server(F serve) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 4), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, serve] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      serve(c);
      ::close(c);
    });
  }
  ~Server() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

int Dial(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  ::inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
  return fd;
}

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

TEST(LinkEmulatorTest, RoundTripTakesTwiceTheLatency) {
  Server echo([](int fd) {
    char c;
    while (::read(fd, &c, 1) == 1) {
      if (::write(fd, &c, 1) != 1) return;
    }
  });
  auto link = LinkEmulator::Start(echo.endpoint(), {.rate_bytes_per_s = 1e9, .latency_ms = 40});
  ASSERT_TRUE(link.ok()) << link.status();
  const int fd = Dial((*link)->endpoint());
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    char c = static_cast<char>('a' + i);
    ASSERT_EQ(::write(fd, &c, 1), 1);
    char back = 0;
    ASSERT_TRUE(ReadFull(fd, &back, 1));
    const double rtt = SecondsSince(t0);
    EXPECT_EQ(back, c);
    EXPECT_GE(rtt, 0.080);
    EXPECT_LT(rtt, 0.080 + 0.060);
  }
  ::close(fd);
}

TEST(LinkEmulatorTest, ThroughputIsTheRateAndEndOfStreamPassesOn) {
  constexpr size_t kBytes = 3u << 20;
  constexpr double kRate = 6e6;
  size_t got = 0;
  bool content_ok = true;
  Server sink([&](int fd) {
    std::vector<char> buf(1 << 16);
    for (;;) {
      const ssize_t r = ::read(fd, buf.data(), buf.size());
      if (r <= 0) break;  // end of stream once the dialer closed, through the relay
      for (ssize_t i = 0; i < r; ++i) {
        content_ok = content_ok && buf[i] == static_cast<char>((got + i) % 251);
      }
      got += static_cast<size_t>(r);
    }
  });
  auto link = LinkEmulator::Start(sink.endpoint(), {.rate_bytes_per_s = kRate, .latency_ms = 10});
  ASSERT_TRUE(link.ok()) << link.status();
  std::vector<char> data(kBytes);
  for (size_t i = 0; i < kBytes; ++i) data[i] = static_cast<char>(i % 251);
  const auto t0 = Clock::now();
  const int fd = Dial((*link)->endpoint());
  size_t off = 0;
  while (off < kBytes) {
    const ssize_t w = ::write(fd, data.data() + off, kBytes - off);
    ASSERT_GT(w, 0);
    off += static_cast<size_t>(w);
  }
  ::shutdown(fd, SHUT_WR);
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0);  // the server closed after the end of stream reached it
  const double s = SecondsSince(t0);
  ::close(fd);
  EXPECT_EQ(got, kBytes);
  EXPECT_TRUE(content_ok);
  const double ideal = static_cast<double>(kBytes) / kRate;
  EXPECT_GE(s, ideal);
  EXPECT_LT(s, ideal * 1.25 + 0.1);
  EXPECT_GE((*link)->bytes_relayed(), kBytes);
}

TEST(LinkEmulatorTest, BadTargetAndOptionsAreRefused) {
  EXPECT_EQ(LinkEmulator::Start("localhost", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkEmulator::Start("127.0.0.1:0", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkEmulator::Start("127.0.0.1:80", {.rate_bytes_per_s = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LinkEmulator::Start("127.0.0.1:80", {.latency_ms = -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinkEmulatorTest, DestructionEndsBlockedConnections) {
  // The server never reads: the relay's buffer fills and the writer blocks, yet destruction
  // returns.
  Server stuck([](int fd) {
    char c;
    ::recv(fd, &c, 1, MSG_PEEK);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  });
  auto link = LinkEmulator::Start(stuck.endpoint(), {.rate_bytes_per_s = 1e9, .latency_ms = 0});
  ASSERT_TRUE(link.ok()) << link.status();
  const int fd = Dial((*link)->endpoint());
  std::vector<char> data(1 << 20, 'x');
  ASSERT_GT(::send(fd, data.data(), data.size(), MSG_DONTWAIT), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = Clock::now();
  link->reset();
  EXPECT_LT(SecondsSince(t0), 1.0);
  ::close(fd);
}

}  // namespace
}  // namespace ts::test_util
