#include "sidecar/artifacts/chunk_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/status.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/artifacts/transfer.h"

namespace ts::sidecar {
namespace {

// Room for the request: a GetChunksRequest of kMaxChunksPerRequest hashes is ~9 KiB.
constexpr uint32_t kMaxStreamRequestBytes = static_cast<uint32_t>(kMaxTransferRequestBytes);
// Socket buffers sized for a few chunks in flight on a long, fast path.
constexpr int kSocketBufferBytes = 4 << 20;

std::string Errno(int err) { return std::strerror(err); }

void SetTimeout(int fd, int option, int64_t ms) {
  struct timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof(tv));
}

void SetSocketOptions(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int size = kSocketBufferBytes;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

// Writes all of `data` (SO_SNDTIMEO bounds each blocked send). CANCELLED if the peer is gone.
absl::Status SendAll(int fd, const char* data, size_t size, int flags = 0) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::send(fd, data + done, size - done, MSG_NOSIGNAL | flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("chunk stream: the peer stopped reading");
      }
      return absl::CancelledError(absl::StrCat("chunk stream: send: ", Errno(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Sends `size` bytes of the file `file_fd` from its start, in the kernel.
absl::Status SendFile(int fd, int file_fd, uint64_t size, const std::string& hash) {
  off_t offset = 0;
  while (static_cast<uint64_t>(offset) < size) {
    const ssize_t n = ::sendfile(fd, file_fd, &offset, static_cast<size_t>(size) - offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError("chunk stream: the peer stopped reading");
      }
      if (errno == EPIPE || errno == ECONNRESET) {
        return absl::CancelledError(absl::StrCat("chunk stream: send: ", Errno(errno)));
      }
      return absl::InternalError(
          absl::StrCat("chunk ", common::HexEncode(hash), ": sendfile: ", Errno(errno)));
    }
    if (n == 0) {
      // The file shrank after it was opened: what was announced cannot be sent.
      return absl::OutOfRangeError(
          absl::StrCat("chunk ", common::HexEncode(hash), ": the file shrank while it was sent"));
    }
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes before `deadline_ms` (monotonic, of `clock`).
absl::Status RecvAll(int fd, char* out, size_t size, common::Clock* clock, int64_t deadline_ms) {
  size_t done = 0;
  while (done < size) {
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) return absl::DeadlineExceededError("chunk stream: request not received in time");
    struct pollfd p = {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR)
      return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    if (ready <= 0) continue;
    const ssize_t n = ::recv(fd, out + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(absl::StrCat("chunk stream: recv: ", Errno(errno)));
    }
    if (n == 0) return absl::UnavailableError("chunk stream: connection closed");
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

std::string EndpointHost(std::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return "";
  std::string_view host = endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

// ---------------------------------------------------------------------------------------------
// ChunkStreamServer

struct ChunkStreamServer::Connection {
  UniqueFd fd;
  std::thread thread;
  std::atomic<bool> done{false};
};

ChunkStreamServer::ChunkStreamServer(common::Clock* clock, ChunkStreamServerOptions options)
    : clock_(clock), options_(options) {}

absl::StatusOr<std::unique_ptr<ChunkStreamServer>> ChunkStreamServer::Start(
    const std::string& host, common::Clock* clock, ChunkStreamServerOptions options) {
  TS_CHECK(clock != nullptr);
  std::unique_ptr<ChunkStreamServer> server(new ChunkStreamServer(clock, options));
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "0", &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("chunk stream: cannot resolve ", host, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  UniqueFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid())
    return absl::UnavailableError(absl::StrCat("chunk stream: socket: ", Errno(errno)));
  if (::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("chunk stream: cannot bind ", host, ": ", Errno(errno)));
  }
  struct sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&bound), &len) != 0) {
    return absl::UnavailableError(absl::StrCat("chunk stream: getsockname: ", Errno(errno)));
  }
  server->port_ = bound.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port)
                      : ntohs(reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
  server->listen_fd_ = std::move(fd);
  server->accept_thread_ = std::thread(&ChunkStreamServer::AcceptLoop, server.get());
  return server;
}

ChunkStreamServer::~ChunkStreamServer() { Shutdown(); }

void ChunkStreamServer::Open(ArtifactTransferService* service) { service_.store(service); }

size_t ChunkStreamServer::connections() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& c : connections_) open += c->done.load() ? 0 : 1;
  return open;
}

void ChunkStreamServer::Shutdown() {
  std::vector<std::unique_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    // Wakes the accept thread (accept returns EINVAL) and every connection blocked on its
    // socket; the descriptors stay open until their threads are joined.
    if (listen_fd_.valid()) ::shutdown(listen_fd_.get(), SHUT_RDWR);
    for (auto& c : connections_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void ChunkStreamServer::Reap() {
  auto done = [](const std::unique_ptr<Connection>& c) { return c->done.load(); };
  for (auto& c : connections_) {
    if (done(c) && c->thread.joinable()) c->thread.join();
  }
  connections_.erase(std::remove_if(connections_.begin(), connections_.end(), done),
                     connections_.end());
}

void ChunkStreamServer::AcceptLoop() {
  while (true) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: back off instead of spinning.
        mu_.AwaitWithTimeout(absl::Condition(&shut_down_), absl::Milliseconds(50));
        continue;
      }
      return;
    }
    Reap();
    if (connections_.size() >= options_.max_connections) continue;  // closed by ~UniqueFd
    SetSocketOptions(fd.get());
    SetTimeout(fd.get(), SO_SNDTIMEO, options_.send_timeout_ms);
    auto connection = std::make_unique<Connection>();
    connection->fd = std::move(fd);
    Connection* c = connection.get();
    connections_.push_back(std::move(connection));
    c->thread = std::thread(&ChunkStreamServer::Serve, this, c);
  }
}

void ChunkStreamServer::Serve(Connection* connection) {
  // sendfile has no MSG_NOSIGNAL: a peer that closes mid-chunk would raise SIGPIPE, which kills
  // any process that has not ignored it. Linux sends it to the writing thread, so blocking it
  // here turns it into EPIPE for this connection alone (the pending signal ends with the thread).
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  const int fd = connection->fd.get();
  try {
    uint32_t sent = 0;
    absl::Status status = ServeRequest(fd, &sent);
    if (status.ok()) {
      char end[kChunkStreamFrameHeaderBytes];
      EncodeEndFrameHeader(sent, end);
      status = SendAll(fd, end, sizeof(end));
    } else if (!absl::IsCancelled(status) && !absl::IsDeadlineExceeded(status)) {
      // The peer is still there to be told why (a broken connection has nobody to tell).
      const std::string frame = EncodeErrorFrame(status);
      (void)SendAll(fd, frame.data(), frame.size());
    }
    // Let the last bytes reach the peer before the close; it closes first or the timeout ends it.
    ::shutdown(fd, SHUT_WR);
    char drain[256];
    SetTimeout(fd, SO_RCVTIMEO, 1000);
    while (::recv(fd, drain, sizeof(drain), 0) > 0) {
    }
  } catch (const std::exception&) {
    // Nothing to tell the peer that would be true; the connection just ends.
  }
  absl::MutexLock lock(&mu_);
  ::shutdown(fd, SHUT_RDWR);
  connection->done.store(true);
}

absl::Status ChunkStreamServer::ServeRequest(int fd, uint32_t* chunks_sent) {
  common::Clock* clock = clock_;
  const int64_t deadline_ms = clock->MonotonicMs() + options_.request_deadline_ms;
  char header[kChunkStreamRequestHeaderBytes];
  TS_RETURN_IF_ERROR(RecvAll(fd, header, sizeof(header), clock, deadline_ms));
  TS_ASSIGN_OR_RETURN(uint32_t length,
                      DecodeChunkStreamRequestHeader(std::string_view(header, sizeof(header)),
                                                     kMaxStreamRequestBytes));
  std::string body(length, '\0');
  TS_RETURN_IF_ERROR(RecvAll(fd, body.data(), body.size(), clock, deadline_ms));
  pb::GetChunksRequest request;
  if (!request.ParseFromString(body)) {
    return absl::InvalidArgumentError("chunk stream request: not a GetChunksRequest");
  }
  ArtifactTransferService* service = service_.load();
  if (service == nullptr) {
    return absl::UnavailableError(
        "this host has not reached its chain yet and cannot check peer requests");
  }
  TS_ASSIGN_OR_RETURN(ChunkServing serving, service->BeginChunks(request, kMethodChunkStream));
  // Each chunk file is opened one chunk ahead and the kernel asked to read it in, so the disk
  // works on the next chunk while this one goes out (chunk files are written with O_DIRECT
  // and are usually not in the page cache).
  struct Opened {
    UniqueFd fd;
    uint64_t size = 0;
  };
  auto open = [&](int i) -> absl::StatusOr<Opened> {
    Opened opened;
    TS_ASSIGN_OR_RETURN(opened.fd, serving.store()->OpenChunk(request.chunks(i), &opened.size));
    ::posix_fadvise(opened.fd.get(), 0, static_cast<off_t>(opened.size), POSIX_FADV_WILLNEED);
    return opened;
  };
  absl::StatusOr<Opened> next = open(0);
  for (int i = 0; i < request.chunks_size(); ++i) {
    const std::string& hash = request.chunks(i);
    TS_RETURN_IF_ERROR(next.status());
    Opened current = *std::move(next);
    if (i + 1 < request.chunks_size()) next = open(i + 1);
    UniqueFd file = std::move(current.fd);
    const uint64_t size = current.size;
    char frame[kChunkStreamFrameHeaderBytes];
    EncodeChunkFrameHeader(static_cast<uint32_t>(i), static_cast<uint32_t>(size), hash, frame);
    // The header goes out with the file's first bytes (MSG_MORE), not in a packet of its own.
    TS_RETURN_IF_ERROR(SendAll(fd, frame, sizeof(frame), MSG_MORE));
    // The receiver hashes every chunk before storing it; as on GetChunks, serving skips a
    // second hash.
    TS_RETURN_IF_ERROR(SendFile(fd, file.get(), size, hash));
    *chunks_sent = static_cast<uint32_t>(i + 1);
    chunks_sent_.fetch_add(1);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ChunkStreamCall

ChunkStreamCall::~ChunkStreamCall() {
  {
    absl::MutexLock lock(&mu_);
    fd_ = -1;
  }
  if (own_fd_ >= 0) ::close(own_fd_);
}

void ChunkStreamCall::Cancel() {
  cancelled_.store(true);
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

absl::Status ChunkStreamCall::WaitReady(short events) {
  while (true) {
    if (cancelled_.load()) return absl::CancelledError("chunk stream: cancelled");
    const int64_t left = deadline_ms_ - clock_->MonotonicMs();
    if (left <= 0) return absl::DeadlineExceededError("chunk stream: deadline exceeded");
    struct pollfd p = {own_fd_, events, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno != EINTR)
      return absl::InternalError(absl::StrCat("poll: ", Errno(errno)));
    if (ready > 0) return absl::OkStatus();
  }
}

absl::Status ChunkStreamCall::Start(const std::string& host, uint16_t port,
                                    const pb::GetChunksRequest& request) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  struct addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("chunk stream: cannot resolve ", host, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<struct addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  own_fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (own_fd_ < 0)
    return absl::UnavailableError(absl::StrCat("chunk stream: socket: ", Errno(errno)));
  {
    absl::MutexLock lock(&mu_);
    fd_ = own_fd_;
  }
  SetSocketOptions(own_fd_);
  if (::connect(own_fd_, found->ai_addr, found->ai_addrlen) != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(
        absl::StrCat("chunk stream: connect to ", host, ":", port, ": ", Errno(errno)));
  }
  TS_RETURN_IF_ERROR(WaitReady(POLLOUT));
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(own_fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrCat("chunk stream: connect to ", host, ":", port, ": ", Errno(err)));
  }
  std::string bytes;
  if (!request.SerializeToString(&bytes) || bytes.size() > kMaxStreamRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream request: ", bytes.size(),
                                                   " bytes, at most ", kMaxStreamRequestBytes));
  }
  const std::string out =
      EncodeChunkStreamRequestHeader(static_cast<uint32_t>(bytes.size())) + bytes;
  size_t done = 0;
  while (done < out.size()) {
    TS_RETURN_IF_ERROR(WaitReady(POLLOUT));
    const ssize_t n = ::send(own_fd_, out.data() + done, out.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (cancelled_.load()) return absl::CancelledError("chunk stream: cancelled");
      return absl::UnavailableError(absl::StrCat("chunk stream: send: ", Errno(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ChunkStreamCall::ReadFull(char* out, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::recv(own_fd_, out + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (cancelled_.load()) return absl::CancelledError("chunk stream: cancelled");
      return absl::UnavailableError(absl::StrCat("chunk stream: connection closed by the peer (",
                                                 done, " of ", size, " bytes of a frame read)"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      TS_RETURN_IF_ERROR(WaitReady(POLLIN));
      continue;
    }
    if (cancelled_.load()) return absl::CancelledError("chunk stream: cancelled");
    return absl::UnavailableError(absl::StrCat("chunk stream: recv: ", Errno(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkStreamFrame> ChunkStreamCall::Next(char* buffer, size_t capacity) {
  char header[kChunkStreamFrameHeaderBytes];
  TS_RETURN_IF_ERROR(ReadFull(header, sizeof(header)));
  TS_ASSIGN_OR_RETURN(
      ChunkStreamFrame frame,
      DecodeChunkStreamFrameHeader(std::string_view(header, sizeof(header)), kMaxChunkSize));
  switch (frame.type) {
    case ChunkStreamFrameType::kChunk:
      if (frame.size > capacity) {
        return absl::InvalidArgumentError(absl::StrCat("chunk stream frame: chunk of ", frame.size,
                                                       " bytes, more than the ", capacity,
                                                       " this artifact's chunk size allows"));
      }
      TS_RETURN_IF_ERROR(ReadFull(buffer, frame.size));
      return frame;
    case ChunkStreamFrameType::kError: {
      std::string message(frame.size, '\0');
      TS_RETURN_IF_ERROR(ReadFull(message.data(), message.size()));
      return ChunkStreamErrorStatus(frame, message);
    }
    case ChunkStreamFrameType::kEnd:
      return frame;
  }
  return absl::InternalError("chunk stream frame: unreachable");
}

}  // namespace ts::sidecar
