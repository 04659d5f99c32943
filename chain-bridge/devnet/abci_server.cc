#include "chain-bridge/devnet/abci_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <list>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/devnet/abci_wire.h"
#include "common/absl_view.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ts::bridge::devnet {
namespace {

namespace abci = ::tendermint::abci;

constexpr std::string_view kComponent = "abci";
constexpr std::string_view kUnixScheme = "unix://";
constexpr std::string_view kTcpScheme = "tcp://";
// Bytes asked of the kernel per read.
constexpr size_t kReadChunkBytes = 64 << 10;
// Responses are written once this many are waiting, even with more requests to serve.
constexpr size_t kWriteBatchBytes = 1 << 20;
// A connection's buffers shrink back to this after a longer message.
constexpr size_t kKeptBufferBytes = 4 << 20;
// After a ResponseException, the peer's remaining bytes are read and dropped for this long (and
// this many at most) before closing, so that closing with unread bytes does not reset the
// connection and destroy the exception before the peer reads it.
constexpr int64_t kLingerMs = 200;
constexpr size_t kLingerBytesMax = 1 << 20;
// Protobuf parses at most 2 GiB; well below it.
constexpr size_t kMaxMessageBytesLimit = 1 << 30;

std::string Errno(int err) { return absl::StrCat(strerror(err), " (errno ", err, ")"); }

using common::UniqueFd;

// Waits for `events` on `fd` or for the wake pipe, at most `timeout_ms` (-1: no limit).
// Returns 1 when fd is ready, 0 on timeout, -1 when the server is shutting down.
int WaitFor(int fd, short events, int wake_fd, int64_t timeout_ms) {
  pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
  int timeout = timeout_ms < 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout_ms, 1 << 30));
  int r;
  do {
    r = ::poll(fds, 2, timeout);
  } while (r < 0 && errno == EINTR);
  if (r < 0 || (fds[1].revents & POLLIN) != 0) return -1;
  // An error or hang-up on fd is "ready": the read or write that follows reports it.
  return r == 0 ? 0 : 1;
}

struct ListenAddress {
  bool unix_socket = false;
  std::string host;  // tcp: without brackets
  std::string port;  // tcp
  std::string path;  // unix
};

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view address) {
  ListenAddress out;
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen_address: \"", common::AsAbsl(address), "\" ", common::AsAbsl(why)));
  };
  if (address.starts_with(kUnixScheme)) {
    out.unix_socket = true;
    out.path = std::string(address.substr(kUnixScheme.size()));
    if (out.path.empty() || out.path[0] != '/') return bad("names no absolute socket path");
    if (out.path.size() >= sizeof(sockaddr_un{}.sun_path)) return bad("is too long a socket path");
    return out;
  }
  if (address.starts_with(kTcpScheme)) address.remove_prefix(kTcpScheme.size());
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == address.size()) {
    return bad("is not host:port, tcp://host:port or unix:///path");
  }
  out.host = std::string(address.substr(0, colon));
  out.port = std::string(address.substr(colon + 1));
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);
  }
  return out;
}

absl::StatusOr<UniqueFd> ListenTcp(const ListenAddress& address, std::string* bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(),
                               address.port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("listen_address: cannot resolve \"",
                                                   address.host, ":", address.port,
                                                   "\": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  UniqueFd fd;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd candidate(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (candidate.get() < 0) {
      last_error = Errno(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(candidate.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(candidate.get(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(candidate.get(), SOMAXCONN) != 0) {
      last_error = Errno(errno);
      continue;
    }
    fd = std::move(candidate);
    break;
  }
  ::freeaddrinfo(found);
  if (fd.get() < 0) {
    return absl::UnavailableError(absl::StrCat("listen_address: cannot listen on ", address.host,
                                               ":", address.port, ": ", last_error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  const bool v6 = address.host.find(':') != std::string::npos;
  *bound = absl::StrCat(v6 ? "[" : "", address.host, v6 ? "]" : "", ":", port);
  return fd;
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.data(), path.size());
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
    // A socket file is left behind by a server that died; one that answers is alive.
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.get() >= 0 &&
        ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      return absl::UnavailableError(
          absl::StrCat("listen_address: ", path, " is served by a live process"));
    }
    ::unlink(path.c_str());
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0) {
    return absl::UnavailableError(
        absl::StrCat("listen_address: cannot listen on unix://", path, ": ", Errno(errno)));
  }
  return fd;
}

// Reads and drops what the peer still sends, briefly (see kLingerMs), then closes.
void LingerClose(UniqueFd fd, int wake_fd, common::Clock* clock) {
  ::shutdown(fd.get(), SHUT_WR);
  const int64_t deadline = clock->MonotonicMs() + kLingerMs;
  char buf[4096];
  size_t dropped = 0;
  while (dropped < kLingerBytesMax) {
    const int64_t left = deadline - clock->MonotonicMs();
    if (left <= 0 || WaitFor(fd.get(), POLLIN, wake_fd, left) != 1) break;
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

std::string ExceptionFrame(std::string_view error) {
  abci::Response response;
  response.mutable_exception()->set_error(std::string(error));
  std::string out;
  AppendDelimited(response, &out);
  return out;
}

}  // namespace

struct AbciServer::Impl {
  AbciServerOptions options;
  common::Clock* clock = nullptr;
  std::unique_ptr<AbciApp> app;
  ListenAddress address;
  std::string bound;
  UniqueFd listen_fd;
  // Written once by Shutdown and never read: its read end then stays readable, waking every
  // poll of the accept loop and the connections.
  UniqueFd wake_read;
  UniqueFd wake_write;
  std::thread accept_thread;

  // One per connection thread; `done` is set by the thread as it ends, under mu.
  struct Conn {
    std::thread thread;
    bool done = false;
  };

  mutable absl::Mutex mu;
  std::list<Conn> conns ABSL_GUARDED_BY(mu);
  int open ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;

  void AcceptLoop();
  void Refuse(UniqueFd fd, const std::string& why);
  void ServeConnection(UniqueFd fd, Conn* conn);
  void JoinFinished();
};

namespace {

// One client's connection: reads requests, has the App answer them, writes the responses.
// Lives on the connection's thread.
class Connection {
 public:
  Connection(int fd, int wake_fd, const AbciServerOptions& options, common::Clock* clock,
             AbciApp* app)
      : fd_(fd), wake_fd_(wake_fd), options_(options), clock_(clock), app_(app) {}

  // Serves until the peer closes, the server shuts down, or the connection must be dropped.
  // Returns why it ended; OK for a peer that closed between requests or a shutdown.
  // `*exception` says whether a ResponseException was sent (the caller then lingers).
  absl::Status Run(bool* exception);

 private:
  // Reads what is there (waiting until `deadline_ms`, -1 for no limit) and appends it.
  // CANCELLED on shutdown, UNAVAILABLE when the peer closed or failed, DEADLINE_EXCEEDED.
  absl::Status ReadMore(int64_t deadline_ms);
  // Writes everything pending. UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED as ReadMore.
  absl::Status WriteOut();
  size_t Buffered() const { return in_.size() - in_pos_; }

  const int fd_;
  const int wake_fd_;
  const AbciServerOptions& options_;
  common::Clock* const clock_;
  AbciApp* const app_;
  std::string in_;  // bytes read; those before in_pos_ are served
  size_t in_pos_ = 0;
  std::string out_;  // responses not yet written
  // What one read takes in, before it is appended to in_: so in_ grows by what came, never
  // past the capacity reserved for a request.
  std::string chunk_ = std::string(kReadChunkBytes, '\0');
  int64_t message_started_ms_ = -1;  // when the first byte of the pending request came
};

absl::Status Connection::Run(bool* exception) {
  *exception = false;
  // Ends the connection with a ResponseException after the responses before it.
  const auto fail = [this, exception](const absl::Status& why) {
    out_ += ExceptionFrame(why.ToString());
    *exception = true;
    WriteOut().IgnoreError();  // the peer may be gone already; it is being closed either way
    return why;
  };
  for (;;) {
    const std::string_view pending(in_.data() + in_pos_, Buffered());
    absl::StatusOr<LengthPrefix> prefix = ParseLengthPrefix(pending);
    if (!prefix.ok()) return fail(prefix.status());
    if (prefix->complete && prefix->length > options_.max_message_bytes) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "request: ", prefix->length, " bytes exceed the cap of ", options_.max_message_bytes)));
    }
    const size_t total = prefix->complete ? prefix->prefix_bytes + prefix->length : 0;
    if (!prefix->complete || pending.size() < total) {
      // Nothing complete to serve: write what is answered, then wait for more.
      if (!out_.empty()) TS_RETURN_IF_ERROR(WriteOut());
      // The whole request, and one read past it: one allocation, however long it is.
      if (total > 0) in_.reserve(in_pos_ + total + kReadChunkBytes);
      const int64_t deadline =
          Buffered() == 0 ? -1 : message_started_ms_ + options_.message_timeout_ms;
      absl::Status read = ReadMore(deadline);
      if (absl::IsDeadlineExceeded(read)) return fail(read);
      if (absl::IsCancelled(read)) return absl::OkStatus();
      if (!read.ok()) return Buffered() == 0 ? absl::OkStatus() : read;
      continue;
    }
    abci::Request request;
    if (!request.ParseFromArray(pending.data() + prefix->prefix_bytes,
                                static_cast<int>(prefix->length))) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "request: ", prefix->length, " bytes do not parse as a tendermint.abci.Request")));
    }
    in_pos_ += total;
    // The next request, if already begun, is timed from now.
    message_started_ms_ = Buffered() > 0 ? clock_->MonotonicMs() : -1;
    absl::StatusOr<abci::Response> response = app_->Handle(request);
    if (!response.ok()) return fail(response.status());
    AppendDelimited(*response, &out_);
    if (out_.size() >= kWriteBatchBytes) TS_RETURN_IF_ERROR(WriteOut());
  }
}

absl::Status Connection::ReadMore(int64_t deadline_ms) {
  if (in_pos_ > 0) {
    in_.erase(0, in_pos_);
    in_pos_ = 0;
  }
  // A long request served leaves no long buffer behind.
  if (in_.capacity() > kKeptBufferBytes && in_.size() < kKeptBufferBytes / 2) in_.shrink_to_fit();
  for (;;) {
    const int64_t left = deadline_ms < 0 ? -1 : deadline_ms - clock_->MonotonicMs();
    if (deadline_ms >= 0 && left <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("request: incomplete after ",
                                                      options_.message_timeout_ms, " ms (",
                                                      in_.size(), " bytes came)"));
    }
    const int ready = WaitFor(fd_, POLLIN, wake_fd_, left);
    if (ready < 0) return absl::CancelledError("the server is shutting down");
    if (ready == 0) continue;  // the deadline check above reports it
    const size_t had = in_.size();
    const ssize_t n = ::recv(fd_, chunk_.data(), chunk_.size(), MSG_DONTWAIT);
    if (n > 0) in_.append(chunk_.data(), static_cast<size_t>(n));
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("read: ", Errno(errno)));
    if (n == 0) return absl::UnavailableError("read: the peer closed the connection");
    if (had == 0) message_started_ms_ = clock_->MonotonicMs();
    return absl::OkStatus();
  }
}

absl::Status Connection::WriteOut() {
  const int64_t deadline = clock_->MonotonicMs() + options_.write_timeout_ms;
  size_t written = 0;
  while (written < out_.size()) {
    const ssize_t n =
        ::send(fd_, out_.data() + written, out_.size() - written, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("write: ", Errno(errno)));
    }
    const int64_t left = deadline - clock_->MonotonicMs();
    if (left <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("write: the peer took no bytes for ",
                                                      options_.write_timeout_ms, " ms (",
                                                      out_.size() - written, " bytes waiting)"));
    }
    if (WaitFor(fd_, POLLOUT, wake_fd_, left) < 0) {
      return absl::CancelledError("the server is shutting down");
    }
  }
  out_.clear();
  if (out_.capacity() > kKeptBufferBytes) out_.shrink_to_fit();
  return absl::OkStatus();
}

}  // namespace

void AbciServer::Impl::ServeConnection(UniqueFd fd, Conn* conn) {
  absl::Status ended;
  bool exception = false;
  // The thread's entry: nothing may escape it and take the process down.
  try {
    Connection connection(fd.get(), wake_read.get(), options, clock, app.get());
    ended = connection.Run(&exception);
  } catch (const std::exception& e) {
    ended = absl::InternalError(absl::StrCat("connection: ", e.what()));
    const std::string frame = ExceptionFrame(ended.ToString());
    ::send(fd.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    exception = true;
  }
  if (!ended.ok()) {
    common::Log(common::LogLevel::kWarn, kComponent, "connection closed",
                {{"error", ended.ToString()}});
  }
  if (exception) {
    LingerClose(std::move(fd), wake_read.get(), clock);
  } else {
    fd.Reset();
  }
  absl::MutexLock lock(&mu);
  --open;
  conn->done = true;
}

void AbciServer::Impl::Refuse(UniqueFd fd, const std::string& why) {
  const std::string frame = ExceptionFrame(why);
  // A fresh socket's buffer takes a frame this small at once; a peer that cannot take it loses
  // nothing it was promised.
  ::send(fd.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  LingerClose(std::move(fd), wake_read.get(), clock);
}

void AbciServer::Impl::JoinFinished() {
  std::list<Conn> finished;
  {
    absl::MutexLock lock(&mu);
    for (auto it = conns.begin(); it != conns.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), conns, it);
      it = next;
    }
  }
  for (Conn& conn : finished) conn.thread.join();
}

void AbciServer::Impl::AcceptLoop() {
  for (;;) {
    JoinFinished();
    const int ready = WaitFor(listen_fd.get(), POLLIN, wake_read.get(), /*timeout_ms=*/1000);
    if (ready < 0) return;
    if (ready == 0) continue;
    UniqueFd fd(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      common::Log(common::LogLevel::kWarn, kComponent, "accept failed", {{"error", Errno(errno)}});
      clock->SleepMs(50);  // out of descriptors or memory: do not spin
      continue;
    }
    if (!address.unix_socket) {
      const int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    UniqueFd refused;
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      if (open >= options.max_connections) {
        refused = std::move(fd);
      } else {
        ++open;
        conns.emplace_back();
        Conn* conn = &conns.back();
        conn->thread = std::thread(&Impl::ServeConnection, this, std::move(fd), conn);
      }
    }
    // Refused on this thread: briefly (kLingerMs at most), and a flood of refusals delays only
    // new connections.
    if (refused.get() >= 0) {
      Refuse(std::move(refused),
             absl::StrCat("abci: ", options.max_connections, " connections are open already"));
    }
  }
}

AbciServer::AbciServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AbciServer::~AbciServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<AbciServer>> AbciServer::Start(pb::Genesis genesis,
                                                              AbciServerOptions options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections: ", options.max_connections, " is not positive"));
  }
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes: ", options.max_message_bytes,
                                                   " cannot hold a block's request"));
  }
  if (options.max_message_bytes > kMaxMessageBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes: ", options.max_message_bytes,
                                                   " is over ", kMaxMessageBytesLimit));
  }
  if (options.message_timeout_ms <= 0 || options.write_timeout_ms <= 0) {
    return absl::InvalidArgumentError("message_timeout_ms, write_timeout_ms: must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->clock = options.clock != nullptr ? options.clock : &common::SystemClock();
  TS_ASSIGN_OR_RETURN(impl->address, ParseListenAddress(options.listen_address));
  TS_ASSIGN_OR_RETURN(impl->app, AbciApp::Create(std::move(genesis), options.app));
  if (impl->address.unix_socket) {
    TS_ASSIGN_OR_RETURN(impl->listen_fd, ListenUnix(impl->address.path));
    impl->bound = absl::StrCat(common::AsAbsl(kUnixScheme), impl->address.path);
  } else {
    TS_ASSIGN_OR_RETURN(impl->listen_fd, ListenTcp(impl->address, &impl->bound));
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", Errno(errno)));
  }
  impl->wake_read = UniqueFd(pipe_fds[0]);
  impl->wake_write = UniqueFd(pipe_fds[1]);
  impl->options = std::move(options);
  Impl* raw = impl.get();
  impl->accept_thread = std::thread(&Impl::AcceptLoop, raw);
  return std::unique_ptr<AbciServer>(new AbciServer(std::move(impl)));
}

void AbciServer::Shutdown() {
  Impl& s = *impl_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.stopping) return;
    s.stopping = true;
  }
  const char byte = 1;
  while (::write(s.wake_write.get(), &byte, 1) < 0 && errno == EINTR) {
  }
  s.accept_thread.join();
  // Every connection's poll now sees the wake pipe; a request in the App completes first.
  std::list<Impl::Conn> conns;
  {
    absl::MutexLock lock(&s.mu);
    conns.splice(conns.end(), s.conns);
  }
  for (Impl::Conn& conn : conns) conn.thread.join();
  s.listen_fd.Reset();
  if (s.address.unix_socket) ::unlink(s.address.path.c_str());
}

std::string AbciServer::listen_address() const { return impl_->bound; }

int AbciServer::connections() const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->open;
}

int64_t AbciServer::committed_height() const { return impl_->app->committed_height(); }

}  // namespace ts::bridge::devnet
