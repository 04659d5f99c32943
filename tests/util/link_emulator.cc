#include "tests/util/link_emulator.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <list>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ts::test_util {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadBytes = 64u << 10;

absl::StatusOr<sockaddr_in> ParseTarget(const std::string& target) {
  const size_t colon = target.rfind(':');
  uint32_t port = 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (colon == std::string::npos || !absl::SimpleAtoi(target.substr(colon + 1), &port) ||
      port == 0 || port > 65535 ||
      ::inet_pton(AF_INET, target.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("link emulator: target \"", target, "\" is not an IPv4 host:port"));
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// One direction of one relayed connection: a reader that stamps what it reads with its delivery
// time and a writer that writes it then.
class Pipe {
 public:
  Pipe(int src, int dst, const LinkOptions& options, size_t cap, std::atomic<uint64_t>* relayed)
      : src_(src), dst_(dst), options_(options), cap_(cap), relayed_(relayed) {
    reader_ = std::thread([this] { Read(); });
    writer_ = std::thread([this] { Write(); });
  }
  ~Pipe() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    reader_.join();
    writer_.join();
  }

 private:
  struct Piece {
    Clock::time_point deliver_at;
    std::vector<char> bytes;  // empty: end of stream
  };

  bool MayRead() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || buffered_ < cap_; }
  bool MayWrite() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  void Read() {
    Clock::time_point link_free = Clock::now();
    std::vector<char> buf(kReadBytes);
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(this, &Pipe::MayRead));
        if (stop_) return;
      }
      const ssize_t n = ::read(src_, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      Piece p;
      if (n > 0) {
        // The link serializes at the rate, then the bytes travel for the latency.
        const auto now = Clock::now();
        link_free = std::max(link_free, now) +
                    std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                        static_cast<double>(n) / options_.rate_bytes_per_s));
        p.deliver_at = link_free + std::chrono::milliseconds(options_.latency_ms);
        p.bytes.assign(buf.data(), buf.data() + n);
      } else {
        p.deliver_at =
            std::max(link_free, Clock::now()) + std::chrono::milliseconds(options_.latency_ms);
      }
      {
        absl::MutexLock l(&mu_);
        buffered_ += p.bytes.size();
        queue_.push_back(std::move(p));
      }
      if (n <= 0) return;
    }
  }

  void Write() {
    for (;;) {
      Piece p;
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(this, &Pipe::MayWrite));
        if (stop_) return;
        const auto wait = queue_.front().deliver_at - Clock::now();
        if (wait > Clock::duration::zero() &&
            mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(wait))) {
          return;
        }
        if (stop_) return;
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      if (p.bytes.empty()) {
        ::shutdown(dst_, SHUT_WR);
        return;
      }
      size_t off = 0;
      while (off < p.bytes.size()) {
        const ssize_t w = ::send(dst_, p.bytes.data() + off, p.bytes.size() - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
          // The far side is gone: stop reading this direction too.
          ::shutdown(src_, SHUT_RDWR);
          return;
        }
        off += static_cast<size_t>(w);
        relayed_->fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      }
      {
        absl::MutexLock l(&mu_);
        buffered_ -= p.bytes.size();
      }
    }
  }

  const int src_;
  const int dst_;
  const LinkOptions options_;
  const size_t cap_;
  std::atomic<uint64_t>* const relayed_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  size_t buffered_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Piece> queue_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
  std::thread writer_;
};

struct Connection {
  int client = -1;
  int server = -1;
  std::unique_ptr<Pipe> up;    // client → server
  std::unique_ptr<Pipe> down;  // server → client
};

}  // namespace

struct LinkEmulator::Impl {
  LinkOptions options;
  size_t cap = 0;
  sockaddr_in target{};
  int listen_fd = -1;
  uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> relayed{0};
  absl::Mutex mu;
  std::list<Connection> connections ABSL_GUARDED_BY(mu);
  std::thread acceptor;

  void Accept() {
    while (!stop.load()) {
      pollfd p{.fd = listen_fd, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (server < 0 ||
          ::connect(server, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) != 0) {
        if (server >= 0) ::close(server);
        ::close(client);  // the dialer sees the refusal as a closed connection
        continue;
      }
      NoDelay(client);
      NoDelay(server);
      absl::MutexLock l(&mu);
      if (stop.load()) {
        ::close(client);
        ::close(server);
        return;
      }
      Connection& c = connections.emplace_back();
      c.client = client;
      c.server = server;
      c.up = std::make_unique<Pipe>(client, server, options, cap, &relayed);
      c.down = std::make_unique<Pipe>(server, client, options, cap, &relayed);
    }
  }
};

absl::StatusOr<std::unique_ptr<LinkEmulator>> LinkEmulator::Start(const std::string& target,
                                                                  const LinkOptions& options) {
  if (!(options.rate_bytes_per_s > 0) || !std::isfinite(options.rate_bytes_per_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link emulator: rate_bytes_per_s ", options.rate_bytes_per_s, " is not a positive rate"));
  }
  if (options.latency_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("link emulator: latency_ms ", options.latency_ms, " is negative"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto parsed = ParseTarget(target);
  if (!parsed.ok()) return parsed.status();
  impl->target = *parsed;
  impl->cap = options.max_buffered_bytes != 0
                  ? options.max_buffered_bytes
                  : static_cast<size_t>(options.rate_bytes_per_s *
                                        static_cast<double>(options.latency_ms) / 1000.0) +
                        (256u << 10);
  impl->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (impl->listen_fd < 0 ||
      ::bind(impl->listen_fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(impl->listen_fd, 64) != 0 ||
      ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    if (impl->listen_fd >= 0) ::close(impl->listen_fd);
    return absl::UnavailableError(
        absl::StrCat("link emulator: cannot listen on 127.0.0.1: ", std::strerror(e)));
  }
  impl->port = ntohs(a.sin_port);
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->Accept(); });
  return std::unique_ptr<LinkEmulator>(new LinkEmulator(std::move(impl)));
}

LinkEmulator::LinkEmulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LinkEmulator::~LinkEmulator() {
  impl_->stop.store(true);
  impl_->acceptor.join();
  ::close(impl_->listen_fd);
  absl::MutexLock l(&impl_->mu);
  for (Connection& c : impl_->connections) {
    // Wakes blocked reads and writes; the pipes then see stop and end.
    ::shutdown(c.client, SHUT_RDWR);
    ::shutdown(c.server, SHUT_RDWR);
    c.up.reset();
    c.down.reset();
    ::close(c.client);
    ::close(c.server);
  }
}

std::string LinkEmulator::endpoint() const { return absl::StrCat("127.0.0.1:", impl_->port); }

uint64_t LinkEmulator::bytes_relayed() const { return impl_->relayed.load(); }

}  // namespace ts::test_util
