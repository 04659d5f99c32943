#include "sidecar/artifacts/chunk_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
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
// The kernel's queue of connections not yet accepted; the event thread takes at most
// kMaxAcceptsPerWake of them per wake-up, so reading the pending ones is never starved.
constexpr int kListenBacklog = 1024;
constexpr int kMaxAcceptsPerWake = 64;
// How long accepting pauses when the process is out of descriptors or memory.
constexpr int64_t kAcceptPauseMs = 50;
// A pending request is read in pieces of at most this size (its buffer grows with the bytes
// that arrived, not with the length its header claims).
constexpr size_t kRequestReadBytes = 16 << 10;
// Reads of 4 KiB that DrainNow makes at most before a close.
constexpr int kMaxDrainReads = 16;
// Under TLS a chunk file is read and sealed in blocks of this many bytes.
constexpr uint64_t kSealedBlockBytes = 1 << 20;

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

// SendAll of `a` then `b`, sealed into TLS records first when `tls` is set.
absl::Status SendOut(int fd, TlsWire* tls, std::string_view a, std::string_view b = {},
                     int flags = 0) {
  if (tls == nullptr) {
    TS_RETURN_IF_ERROR(SendAll(fd, a.data(), a.size(), b.empty() ? flags : MSG_MORE));
    return b.empty() ? absl::OkStatus() : SendAll(fd, b.data(), b.size(), flags);
  }
  std::string sealed;
  TS_RETURN_IF_ERROR(tls->Seal({a, b}, &sealed));
  return SendAll(fd, sealed.data(), sealed.size(), flags);
}

// Under TLS: the frame header and the chunk file, read in blocks and sealed (no sendfile: the
// kernel cannot encrypt here).
absl::Status SendFileSealed(int fd, TlsWire* tls, std::string_view header, int file_fd,
                            uint64_t size, const std::string& hash) {
  std::string block(std::min<uint64_t>(size, kSealedBlockBytes), '\0');
  uint64_t offset = 0;
  std::string_view first = header;
  while (offset < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(size - offset, block.size()));
    const ssize_t n = ::pread(file_fd, block.data(), want, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(
          absl::StrCat("chunk ", common::HexEncode(hash), ": read: ", Errno(errno)));
    }
    if (n == 0) {
      return absl::OutOfRangeError(
          absl::StrCat("chunk ", common::HexEncode(hash), ": the file shrank while it was sent"));
    }
    TS_RETURN_IF_ERROR(SendOut(fd, tls, first, std::string_view(block.data(), n)));
    first = {};
    offset += static_cast<uint64_t>(n);
  }
  return size == 0 ? SendOut(fd, tls, header) : absl::OkStatus();
}

// Reads and drops what the peer has sent so far, without waiting: bytes left unread at close()
// would turn the FIN into a reset that can overtake the last frame.
void DrainNow(int fd) {
  char sink[4096];
  for (int i = 0; i < kMaxDrainReads; ++i) {
    if (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0) break;
  }
}

// Answers a refused connection of the event thread with an error frame, without blocking (the
// frame fits an empty socket buffer; if it does not, the peer is not reading anyway), and lets
// the FIN follow it.
void Refuse(int fd, TlsWire* tls, const absl::Status& status) {
  std::string frame = EncodeErrorFrame(status);
  if (tls != nullptr) {
    std::string sealed;
    if (!tls->Seal({frame}, &sealed).ok()) sealed.clear();
    frame = std::move(sealed);
  }
  (void)::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  DrainNow(fd);
}

void Wake(int event_fd) {
  const uint64_t one = 1;
  (void)!::write(event_fd, &one, sizeof(one));
}

void DrainWake(int event_fd) {
  uint64_t count = 0;
  (void)!::read(event_fd, &count, sizeof(count));
}

// The source a pending connection counts against: its IPv4 address, or the /64 of its IPv6
// address (a host is usually given a whole /64, so single IPv6 addresses would bound nothing).
std::string SourceOf(const struct sockaddr_storage& from) {
  char text[INET6_ADDRSTRLEN] = {};
  if (from.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const struct sockaddr_in*>(&from);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    return text;
  }
  if (from.ss_family == AF_INET6) {
    struct in6_addr address = reinterpret_cast<const struct sockaddr_in6*>(&from)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&address)) {
      ::inet_ntop(AF_INET, &address.s6_addr[12], text, sizeof(text));
      return text;
    }
    std::memset(&address.s6_addr[8], 0, 8);
    ::inet_ntop(AF_INET6, &address, text, sizeof(text));
    return absl::StrCat(text, "/64");
  }
  return "other";
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

struct ChunkStreamServer::Pending {
  UniqueFd fd;
  std::string source;
  uint64_t seq = 0;  // accept order: the smallest is the oldest
  int64_t deadline_ms = 0;
  char header[kChunkStreamRequestHeaderBytes] = {};
  size_t header_have = 0;
  uint32_t length = 0;  // of the body, once the header is decoded
  std::string body;     // grows as the bytes arrive, never ahead of them
  // TLS: the handshake until it is done, then the records.
  std::unique_ptr<common::TlsHandshake> handshake;
  common::TlsHandshake::Want want = common::TlsHandshake::Want::kRead;
  std::unique_ptr<TlsWire> tls;
};

struct ChunkStreamServer::Connection {
  UniqueFd fd;
  std::unique_ptr<TlsWire> tls;
  std::string body;
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
  UniqueFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid())
    return absl::UnavailableError(absl::StrCat("chunk stream: socket: ", Errno(errno)));
  if (::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      ::listen(fd.get(), kListenBacklog) != 0) {
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
  server->wake_fd_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!server->wake_fd_.valid()) {
    return absl::UnavailableError(absl::StrCat("chunk stream: eventfd: ", Errno(errno)));
  }
  server->listen_fd_ = std::move(fd);
  server->event_thread_ = std::thread(&ChunkStreamServer::EventLoop, server.get());
  return server;
}

ChunkStreamServer::~ChunkStreamServer() { Shutdown(); }

void ChunkStreamServer::Open(ArtifactTransferService* service) { service_.store(service); }

size_t ChunkStreamServer::serving_connections() const {
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
    // Wakes every serving thread blocked on its socket; the descriptors stay open until their
    // threads are joined.
    for (auto& c : connections_) ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  Wake(wake_fd_.get());
  if (event_thread_.joinable()) event_thread_.join();  // it closes the pending connections
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

void ChunkStreamServer::EventLoop() {
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<struct pollfd> fds;
  uint64_t next_seq = 0;
  int64_t accept_paused_until_ms = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shut_down_) break;
      Reap();
    }
    const int64_t now = clock_->MonotonicMs();
    const bool accepting = now >= accept_paused_until_ms;
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    int64_t timeout_ms = accepting ? 1000 : accept_paused_until_ms - now;
    for (const auto& p : pending) {
      const bool out = p->handshake != nullptr && p->want == common::TlsHandshake::Want::kWrite;
      fds.push_back({p->fd.get(), static_cast<short>(out ? POLLOUT : POLLIN), 0});
      timeout_ms = std::min(timeout_ms, p->deadline_ms - now);
    }
    const int ready =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, 1000)));
    if (ready < 0 && errno != EINTR) {
      // poll fails only for bad arguments or no memory: wait, as for a full descriptor table.
      accept_paused_until_ms = clock_->MonotonicMs() + kAcceptPauseMs;
      continue;
    }
    if ((fds[0].revents & POLLIN) != 0) DrainWake(wake_fd_.get());
    // Connections that sent something (or closed) first, then the deadlines: the pollfds line
    // up with `pending` until it changes.
    const int64_t after = clock_->MonotonicMs();
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending* p = pending[i].get();
      if (ready > 0 && fds[i + 2].revents != 0 && Step(p)) continue;
      // Silent past the deadline: closed with nothing sent (no request, nobody to answer).
      if (after >= p->deadline_ms) p->fd = UniqueFd();
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const auto& p) { return !p->fd.valid(); }),
                  pending.end());
    if (accepting && ready > 0 && (fds[1].revents & POLLIN) != 0) {
      if (!AcceptNew(&pending, &next_seq)) {
        accept_paused_until_ms = clock_->MonotonicMs() + kAcceptPauseMs;
      }
    }
    pending_count_.store(pending.size());
  }
  pending.clear();
  pending_count_.store(0);
}

bool ChunkStreamServer::AcceptNew(std::vector<std::unique_ptr<Pending>>* pending,
                                  uint64_t* next_seq) {
  for (int accepted = 0; accepted < kMaxAcceptsPerWake; ++accepted) {
    struct sockaddr_storage from = {};
    socklen_t from_size = sizeof(from);
    UniqueFd fd(::accept4(listen_fd_.get(), reinterpret_cast<struct sockaddr*>(&from), &from_size,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: nothing more to accept. Out of descriptors or memory: the caller pauses
      // accepting instead of spinning on a listening socket that stays readable.
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    std::string source = SourceOf(from);
    // Room for it: the oldest pending connection of its own source when that source is at its
    // bound, else, when the pool is full, the oldest of the source holding the most. A source
    // flooding idle connections thus evicts its own, and a newcomer from elsewhere evicts the
    // flooder's, never a connection of a source holding fewer.
    absl::flat_hash_map<std::string_view, size_t> held;
    for (const auto& p : *pending) ++held[p->source];
    std::string_view victim_source;
    if (held[source] >= options_.max_pending_per_source) {
      victim_source = source;
    } else if (pending->size() >= options_.max_pending_connections) {
      size_t most = 0;
      for (const auto& [s, n] : held) {
        if (n > most) {
          most = n;
          victim_source = s;
        }
      }
    }
    if (!victim_source.empty() || pending->size() >= options_.max_pending_connections) {
      auto oldest = pending->end();
      for (auto it = pending->begin(); it != pending->end(); ++it) {
        if (!victim_source.empty() && (*it)->source != victim_source) continue;
        if (oldest == pending->end() || (*it)->seq < (*oldest)->seq) oldest = it;
      }
      if (oldest != pending->end()) {
        pending->erase(oldest);  // closed with nothing sent
        evictions_.fetch_add(1);
      }
    }
    if (pending->size() >= options_.max_pending_connections) continue;  // a bound of 0
    auto p = std::make_unique<Pending>();
    p->fd = std::move(fd);
    p->source = std::move(source);
    p->seq = (*next_seq)++;
    p->deadline_ms = clock_->MonotonicMs() + options_.request_deadline_ms;
    if (options_.tls != nullptr) {
      auto handshake = common::TlsHandshake::Start(options_.tls, p->fd.get(),
                                                   common::TlsHandshake::Role::kServer, "");
      if (!handshake.ok()) continue;  // closed with nothing sent
      p->handshake = *std::move(handshake);
    }
    // A fetcher sends its request (or its TLS hello) right after connecting, so it is usually
    // here already: read it now, before later accepts could evict the connection.
    if (!Step(p.get())) pending->push_back(std::move(p));
  }
  return true;
}

bool ChunkStreamServer::Step(Pending* p) {
  return p->handshake != nullptr ? AdvanceHandshake(p) : ReadRequest(p);
}

bool ChunkStreamServer::AdvanceHandshake(Pending* p) {
  absl::StatusOr<common::TlsHandshake::Want> want = p->handshake->Step();
  absl::StatusOr<common::TlsRecordLayer> layer = absl::UnknownError("not done");
  if (want.ok() && *want == common::TlsHandshake::Want::kDone) layer = p->handshake->Finish();
  if (!want.ok() || (*want == common::TlsHandshake::Want::kDone && !layer.ok())) {
    // No TLS to answer in (a peer in the clear, a failed handshake): closed with nothing sent.
    p->fd = UniqueFd();
    return true;
  }
  p->want = *want;
  if (*want != common::TlsHandshake::Want::kDone) return false;
  p->handshake.reset();
  p->tls = std::make_unique<TlsWire>(*std::move(layer));
  return ReadRequest(p);  // the request may have come with the handshake's last flight
}

bool ChunkStreamServer::ReadRequest(Pending* p) {
  const int fd = p->fd.get();
  while (true) {
    const bool in_body = p->header_have == sizeof(p->header);
    char* into;
    size_t want;
    if (!in_body) {
      into = p->header + p->header_have;
      want = sizeof(p->header) - p->header_have;
    } else {
      const size_t have = p->body.size();
      want = std::min<size_t>(p->length - have, kRequestReadBytes);
      p->body.resize(have + want);
      into = p->body.data() + have;
    }
    uint64_t wire_bytes = 0;
    const ssize_t n = p->tls != nullptr ? p->tls->Recv(fd, into, want, &wire_bytes)
                                        : ::recv(fd, into, want, MSG_DONTWAIT);
    const size_t got = n > 0 ? static_cast<size_t>(n) : 0;
    if (in_body) p->body.resize(p->body.size() - want + got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n <= 0) {
      // Closed or reset before the request was whole: nobody to answer.
      p->fd = UniqueFd();
      return true;
    }
    if (!in_body) {
      p->header_have += got;
      if (p->header_have < sizeof(p->header)) continue;
      absl::StatusOr<uint32_t> length = DecodeChunkStreamRequestHeader(
          std::string_view(p->header, sizeof(p->header)), kMaxStreamRequestBytes);
      if (!length.ok()) {
        Refuse(fd, p->tls.get(), length.status());
        p->fd = UniqueFd();
        return true;
      }
      p->length = *length;
    }
    if (p->body.size() == p->length) {
      Dispatch(p);
      return true;
    }
  }
}

void ChunkStreamServer::Dispatch(Pending* p) {
  absl::MutexLock lock(&mu_);
  Reap();
  if (shut_down_) {
    p->fd = UniqueFd();
    return;
  }
  if (connections_.size() >= options_.max_connections) {
    Refuse(p->fd.get(), p->tls.get(),
           absl::ResourceExhaustedError(
               absl::StrCat("chunk stream: ", options_.max_connections,
                            " requests already being served here; try again or use GetChunks")));
    p->fd = UniqueFd();
    return;
  }
  const int fd = p->fd.get();
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // the serving thread blocks
  SetSocketOptions(fd);
  SetTimeout(fd, SO_SNDTIMEO, options_.send_timeout_ms);
  auto connection = std::make_unique<Connection>();
  connection->fd = std::move(p->fd);
  connection->tls = std::move(p->tls);
  connection->body = std::move(p->body);
  Connection* c = connection.get();
  connections_.push_back(std::move(connection));
  c->thread = std::thread(&ChunkStreamServer::Serve, this, c);
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
  TlsWire* tls = connection->tls.get();
  try {
    uint32_t sent = 0;
    absl::Status status = ServeRequest(fd, tls, connection->body, &sent);
    connection->body = std::string();
    if (status.ok()) {
      char end[kChunkStreamFrameHeaderBytes];
      EncodeEndFrameHeader(sent, end);
      status = SendOut(fd, tls, std::string_view(end, sizeof(end)));
    } else if (!absl::IsCancelled(status) && !absl::IsDeadlineExceeded(status)) {
      // The peer is still there to be told why (a broken connection has nobody to tell; under
      // TLS, a send cut off inside a record leaves nothing the peer could open).
      (void)SendOut(fd, tls, EncodeErrorFrame(status));
    }
    // The last bytes and then the FIN go out in order; the peer sent nothing but its request,
    // which was read whole, so closing does not turn into a reset. (What a peer sends beyond
    // its request is read and dropped here: otherwise the close would reset the connection.)
    ::shutdown(fd, SHUT_WR);
    DrainNow(fd);
  } catch (const std::exception&) {
    // Nothing to tell the peer that would be true; the connection just ends.
  }
  {
    absl::MutexLock lock(&mu_);
    ::shutdown(fd, SHUT_RDWR);
    connection->done.store(true);
  }
  Wake(wake_fd_.get());  // so the event thread joins this one soon
}

absl::Status ChunkStreamServer::ServeRequest(int fd, TlsWire* tls, const std::string& body,
                                             uint32_t* chunks_sent) {
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
    // The receiver hashes every chunk before storing it; as on GetChunks, serving skips a
    // second hash.
    if (tls != nullptr) {
      TS_RETURN_IF_ERROR(
          SendFileSealed(fd, tls, std::string_view(frame, sizeof(frame)), file.get(), size, hash));
    } else {
      // The header goes out with the file's first bytes (MSG_MORE), not in a packet of its own.
      TS_RETURN_IF_ERROR(SendAll(fd, frame, sizeof(frame), MSG_MORE));
      TS_RETURN_IF_ERROR(SendFile(fd, file.get(), size, hash));
    }
    service->ChunkServed(request.auth().signer(), kServedOverChunkStream, size);
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
                                    const pb::GetChunksRequest& request,
                                    const ChunkStreamTls& tls) {
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
  if (tls.context != nullptr) {
    absl::StatusOr<common::TlsRecordLayer> layer =
        common::TlsHandshake::Connect(tls.context, own_fd_, tls.peer_cert_sha256,
                                      [this](short events) { return WaitReady(events); });
    if (!layer.ok()) {
      if (cancelled_.load()) return absl::CancelledError("chunk stream: cancelled");
      if (absl::StartsWith(layer.status().message(), "chunk stream")) return layer.status();
      return absl::Status(layer.status().code(),
                          absl::StrCat("chunk stream: ", layer.status().message()));
    }
    tls_ = std::make_unique<TlsWire>(*std::move(layer));
  }
  std::string bytes;
  if (!request.SerializeToString(&bytes) || bytes.size() > kMaxStreamRequestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream request: ", bytes.size(),
                                                   " bytes, at most ", kMaxStreamRequestBytes));
  }
  std::string out = EncodeChunkStreamRequestHeader(static_cast<uint32_t>(bytes.size())) + bytes;
  if (tls_ != nullptr) {
    std::string sealed;
    TS_RETURN_IF_ERROR(tls_->Seal({out}, &sealed));
    out = std::move(sealed);
  }
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
    uint64_t wire_bytes = 0;
    const ssize_t n = tls_ != nullptr ? tls_->Recv(own_fd_, out + done, size - done, &wire_bytes)
                                      : ::recv(own_fd_, out + done, size - done, 0);
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
    if (errno == EPROTO && tls_ != nullptr && !tls_->error().ok()) {
      return absl::UnavailableError(absl::StrCat("chunk stream: ", tls_->error().message()));
    }
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
