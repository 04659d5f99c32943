#include "sidecar/collective/tcp_transport.h"

#include <arpa/inet.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/absl_view.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/tls_session.h"
#include "common/log.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "sidecar/peer/peer_auth.h"
#include "sidecar/peer/tls_wire.h"

namespace ts::sidecar {
namespace {

using Hello = ::gonka::trainshard::v1::CollectiveHello;
using common::AsAbsl;

// Longest a blocked Send, Recv or poll waits before looking at the clock and the mesh again
// (a mesh failure also wakes them at once through the mesh's eventfd or condition variables).
constexpr int64_t kSliceMs = 50;
// Best-effort aborts sent when a mesh fails, and the rest of a heartbeat cut short.
constexpr int64_t kAbortDeadlineMs = 100;
// A mesh being destroyed waits for what it sent to be acknowledged before closing its sockets:
// closed with bytes still queued, a socket answers the peer's next heartbeat with a reset that
// discards them (the peer's last data frame, or the abort that names the member at fault). It
// stops waiting on a link that makes no progress for dead_after_ms, and after this in all.
constexpr int64_t kMaxLingerMs = 10000;
constexpr int64_t kLingerPollMs = 5;
// The ack and refusals written by the listener: a few hundred bytes on a fresh connection.
constexpr int64_t kReplyDeadlineMs = 1000;
constexpr int64_t kHelloLifetimeMs = 30000;
constexpr int64_t kDialBackoffFirstMs = 20;
constexpr int64_t kDialBackoffMaxMs = 500;
// A link's reader reads the socket in pieces this large; data payloads past the bytes already
// in this buffer are read straight into the payload.
constexpr size_t kReadBufferBytes = 256u << 10;
constexpr size_t kMaxPooledBuffers = 16;
constexpr size_t kMaxPooledBytes = 32u << 20;
constexpr size_t kMaxRefusals = 32;
constexpr std::string_view kLogComponent = "collective";

// A status's message as a std::string_view (Debian's Abseil has its own string_view).
std::string_view Msg(const absl::Status& status) {
  return {status.message().data(), status.message().size()};
}

std::string Hex8(std::string_view id) { return absl::BytesToHexString(AsAbsl(id.substr(0, 4))); }

std::string ErrnoText(int err) {
  char buf[128];
  // GNU strerror_r: returns a pointer to the message (in buf or static).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return absl::StrCat(text, " (errno ", err, ")");
}

using common::UniqueFd;

// A connected socket and, under TLS, its record states.
struct Conn {
  UniqueFd fd;
  std::unique_ptr<TlsWire> tls;  // null: in the clear
};

// recv(2) through the connection's records when it has them; *wire_bytes grows by what was
// read off the socket.
ssize_t RecvOn(int fd, TlsWire* tls, char* buf, size_t size, uint64_t* wire_bytes) {
  if (tls != nullptr) return tls->Recv(fd, buf, size, wire_bytes);
  const ssize_t n = ::recv(fd, buf, size, 0);
  if (n > 0) *wire_bytes += static_cast<uint64_t>(n);
  return n;
}

// errno's text, or the TLS failure behind EPROTO.
std::string RecvErrorText(int err, const TlsWire* tls) {
  if (err == EPROTO && tls != nullptr && !tls->error().ok()) {
    return std::string(tls->error().message());
  }
  return ErrnoText(err);
}

// What goes on the wire for `frame`: the frame in the clear, its records under TLS (empty if
// the key may seal no more).
std::string WireBytes(TlsWire* tls, std::string_view frame) {
  if (tls == nullptr) return std::string(frame);
  std::string out;
  if (!tls->Seal({frame}, &out).ok()) out.clear();
  return out;
}

// An eventfd used as a level-triggered flag (Set never undone) or as a wake-up (Drain resets).
class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) { TS_CHECK(fd_.get() >= 0); }
  int fd() const { return fd_.get(); }
  void Set() const {
    const uint64_t one = 1;
    ssize_t n;
    do {
      n = ::write(fd_.get(), &one, sizeof(one));
    } while (n < 0 && errno == EINTR);
  }
  void Drain() const {
    uint64_t value;
    ssize_t n;
    do {
      n = ::read(fd_.get(), &value, sizeof(value));
    } while (n < 0 && errno == EINTR);
  }
  bool IsSet() const {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

 private:
  UniqueFd fd_;
};

enum class Wait { kReady, kTimeout, kCancelled };

// Waits until `fd` has `events` or `cancel_fd` (if >= 0) is readable, at most timeout_ms.
Wait WaitFd(int fd, short events, int cancel_fd, int64_t timeout_ms) {
  pollfd fds[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
  const nfds_t n = cancel_fd >= 0 ? 2 : 1;
  const int timeout = static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, kSliceMs));
  int r;
  do {
    r = ::poll(fds, n, timeout);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return Wait::kTimeout;
  if (n == 2 && (fds[1].revents & POLLIN) != 0) return Wait::kCancelled;
  return Wait::kReady;
}

// Splits "host:port" or "[v6]:port".
absl::Status SplitHostPort(std::string_view field, std::string_view endpoint, std::string* host,
                           std::string* port) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(field), ": '", absl::CHexEscape(AsAbsl(endpoint)), "' ", AsAbsl(why)));
  };
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return bad("is not host:port");
  std::string_view h = endpoint.substr(0, colon);
  const std::string_view p = endpoint.substr(colon + 1);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  uint32_t port_number = 0;
  if (h.empty()) return bad("has no host");
  if (!absl::SimpleAtoi(AsAbsl(p), &port_number) || port_number > 65535) {
    return bad("has no valid port");
  }
  *host = std::string(h);
  *port = std::string(p);
  return absl::OkStatus();
}

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t size = 0;
};

absl::StatusOr<SocketAddress> Resolve(std::string_view field, std::string_view endpoint) {
  std::string host;
  std::string port;
  TS_RETURN_IF_ERROR(SplitHostPort(field, endpoint, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::UnavailableError(absl::StrCat(AsAbsl(field), ": cannot resolve '",
                                               AsAbsl(endpoint), "': ", ::gai_strerror(rc)));
  }
  SocketAddress out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.size = result->ai_addrlen;
  ::freeaddrinfo(result);
  return out;
}

std::string PeerNameOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown";
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return absl::StrCat("[", host, "]:", port);
  }
  return "unknown";
}

void SetSocketOptions(int fd, int buffer_bytes) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

// Writes all of `data` to a non-blocking socket by deadline_ms. Used for handshake frames and
// refusals only (data frames go through LinkImpl::Send).
absl::Status WriteAll(int fd, std::string_view data, int64_t deadline_ms, int cancel_fd,
                      common::Clock* clock) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("send: ", done, " of ", data.size(), " bytes by the deadline"));
    }
    if (WaitFd(fd, POLLOUT, cancel_fd, left) == Wait::kCancelled) {
      return absl::CancelledError("send: cancelled");
    }
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes into `out` by deadline_ms. UNAVAILABLE for EOF or a socket error.
absl::Status ReadExact(int fd, TlsWire* tls, char* out, size_t size, int64_t deadline_ms,
                       int cancel_fd, common::Clock* clock) {
  size_t done = 0;
  uint64_t wire_bytes = 0;
  while (done < size) {
    const ssize_t n = RecvOn(fd, tls, out + done, size - done, &wire_bytes);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("connection closed after ", done, " of ", size, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("recv: ", RecvErrorText(errno, tls)));
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("recv: ", done, " of ", size, " bytes by the deadline"));
    }
    if (WaitFd(fd, POLLIN, cancel_fd, left) == Wait::kCancelled) {
      return absl::CancelledError("recv: cancelled");
    }
  }
  return absl::OkStatus();
}

std::string FrameBytes(FrameType type, std::string_view payload) {
  FrameHeader header;
  header.type = type;
  header.payload_size = static_cast<uint32_t>(payload.size());
  std::string out = EncodeFrameHeader(header);
  out.append(payload);
  return out;
}

class MeshImpl;

// ---------------------------------------------------------------------------------------------
// One authenticated connection of a mesh.

class LinkImpl final : public Link {
 public:
  LinkImpl(MeshImpl* mesh, std::string peer, Conn conn, int64_t now_ms);
  ~LinkImpl() override;

  const std::string& peer() const override { return peer_; }
  absl::Status Send(const FrameHeader& header, std::string_view payload,
                    int64_t deadline_ms) override;
  absl::StatusOr<Frame> Recv(int64_t deadline_ms) override;
  void Recycle(std::string buffer) override;
  uint64_t bytes_sent() const override { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const override {
    return bytes_received_.load(std::memory_order_relaxed);
  }

  void StartReader();
  void JoinReader();
  // Heartbeat thread: sends a heartbeat if the link is idle and no Send holds it. An error
  // only when the heartbeat was cut off inside its 32 bytes (the link can carry no more).
  absl::Status MaybeHeartbeat(int64_t now_ms, int64_t idle_ms);
  // Heartbeat thread: the silence to blame the peer for, or OK.
  absl::Status CheckLiveness(int64_t now_ms, int64_t dead_after_ms);
  // Best-effort control frame (abort, close) with its own deadline; ignores the mesh's state.
  void SendControl(FrameType type, std::string_view payload, int64_t deadline_ms);
  // Wakes a Recv or a paused reader (mesh failed or closing).
  void WakeAll();
  void ShutdownWrite() { ::shutdown(fd_.get(), SHUT_WR); }
  // Bytes sent and not yet acknowledged by the peer (the FIN included); 0 once the connection
  // is closed or reset.
  int64_t UnackedBytes() const;
  bool closed_by_peer() const { return closed_by_peer_.load(std::memory_order_acquire); }
  // Destruction: what goes on the wire for `frame` on this link (sealed once under TLS).
  std::string WireBytesOf(std::string_view frame);
  // Destruction, readers stopped: writes what the socket takes of bytes[*done..] without
  // waiting. False when the link can take nothing more (an error, or an earlier frame cut off).
  bool WriteNow(std::string_view bytes, size_t* done);
  // Destruction, readers stopped: reads and discards what has arrived.
  void DrainInput();

 private:
  enum class ReadResult { kOk, kEof, kError, kCancelled };

  void ReaderMain();
  // Reads at least one byte into buf[0..size) (waiting for it). *got = bytes read.
  ReadResult ReadSome(char* buf, size_t size, size_t* got);
  // Makes read_buf_ hold at least `need` bytes from read_begin_ (need <= kReadBufferBytes).
  ReadResult Fill(size_t need);
  absl::Status FailureOf(ReadResult result, std::string_view where);
  std::string TakeBuffer(size_t size);
  // Waits while the queue is over its cap; false when the mesh stops meanwhile.
  bool WaitForQueueSpace();
  absl::Status WriteFrameLocked(const char* header, std::string_view payload, int64_t deadline_ms,
                                bool cancellable, size_t* written)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);

  MeshImpl* const mesh_;
  const std::string peer_;
  const UniqueFd fd_;
  // Under TLS: sealed by senders (send_mu_), opened by the reader thread.
  const std::unique_ptr<TlsWire> tls_;

  absl::Mutex send_mu_;
  // A frame was cut off on the wire (a failed or interrupted send), or records were sealed and
  // not all sent: nothing more may follow.
  bool broken_ ABSL_GUARDED_BY(send_mu_) = false;
  std::string sealed_ ABSL_GUARDED_BY(send_mu_);  // TLS: the frame being sent, as records

  std::atomic<int64_t> last_sent_ms_;
  std::atomic<int64_t> last_heard_ms_;
  std::atomic<bool> reader_paused_{false};
  std::atomic<bool> closed_by_peer_{false};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};

  absl::Mutex mu_;
  absl::CondVar data_cv_;   // Recv waits for a frame
  absl::CondVar space_cv_;  // the reader waits for queue space
  std::deque<Frame> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> pool_ ABSL_GUARDED_BY(mu_);
  size_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  // Reader thread only.
  std::string read_buf_;
  size_t read_begin_ = 0;
  size_t read_end_ = 0;
  int read_errno_ = 0;
  std::thread reader_;
};

// ---------------------------------------------------------------------------------------------
// A group's links, its single failure, and the state of its Connect.

class MeshImpl final : public Mesh {
 public:
  MeshImpl(TcpTransport::Impl* transport, GroupSpec group, size_t self_index, std::string mesh_id);
  ~MeshImpl() override;

  const GroupSpec& group() const override { return group_; }
  size_t self_index() const override { return self_index_; }
  Link* link(size_t member_index) override;
  absl::Status failure() const override;
  void Abort(const absl::Status& status) override;

  // Records the failure (first wins) and wakes every waiter; true if this one was recorded.
  bool Fail(const absl::Status& status);
  // Sends kAbort carrying `status` (its blamed peer and message) on every link but `except`,
  // best effort.
  void SendAbort(const absl::Status& status, const LinkImpl* except);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // Failed or being destroyed: threads stop.
  bool stopping() const { return failed() || closing_.load(std::memory_order_acquire); }
  int wake_fd() const { return wake_.fd(); }
  const std::string& mesh_id() const { return mesh_id_; }
  const TcpTransportOptions& options() const;
  common::Clock* clock() const;
  int64_t dead_after_ms() const;

  // Connect: a link to `member_index` is up (handshake done); starts its reader.
  bool HasLink(size_t member_index) const;
  void AddLink(size_t member_index, Conn conn);
  // Connect: a dial to `member_index` failed for good (or its last retryable error).
  void SetDialError(size_t member_index, absl::Status status, bool final);
  // Blocks until every link is up, the mesh fails, a dial fails for good or the deadline.
  absl::Status WaitConnected(int64_t deadline_ms);

  // Heartbeat thread, every quarter interval.
  void Tick(int64_t now_ms);

 private:
  std::vector<LinkImpl*> Links() const;
  // Destruction: writes `frame` (kClose or kAbort) on every link, then waits until what each
  // sent has been acknowledged — while the link makes progress (dead_after_ms) and at most
  // kMaxLingerMs — so closing does not reset what is still on its way. `blamed`'s link gets
  // one try only.
  void Linger(std::vector<LinkImpl*> links, std::string_view frame, std::string_view blamed);

  TcpTransport::Impl* const transport_;
  const GroupSpec group_;
  const size_t self_index_;
  const std::string mesh_id_;
  EventFd wake_;

  std::atomic<bool> failed_{false};
  std::atomic<bool> closing_{false};
  mutable absl::Mutex fail_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(fail_mu_);

  mutable absl::Mutex links_mu_;
  absl::CondVar links_cv_;
  std::vector<std::unique_ptr<LinkImpl>> links_ ABSL_GUARDED_BY(links_mu_);
  size_t connected_ ABSL_GUARDED_BY(links_mu_) = 0;
  std::vector<absl::Status> dial_errors_ ABSL_GUARDED_BY(links_mu_);
  absl::Status final_dial_error_ ABSL_GUARDED_BY(links_mu_);
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TcpTransport::Impl {
  Impl(common::PrivateKey key_in, TcpTransportOptions options_in, common::Clock* clock_in)
      : key(std::move(key_in)),
        options(std::move(options_in)),
        clock(clock_in),
        address(common::AddressFromPublicKey(key.public_key())),
        verifier(address, options.chain_id, clock) {}

  // A connection accepted by the listener, until its hello is handled.
  struct Pending {
    UniqueFd fd;
    std::string remote;  // ip:port
    int64_t deadline_ms = 0;
    char header[kFrameHeaderSize] = {};
    size_t header_have = 0;
    FrameHeader frame;
    std::string payload;
    size_t payload_have = 0;
    // TLS: the handshake until it is done, then the records and the dialer's certificate.
    std::unique_ptr<common::TlsHandshake> handshake;
    common::TlsHandshake::Want want = common::TlsHandshake::Want::kRead;
    std::unique_ptr<TlsWire> tls;
    std::string peer_cert_sha256;
    // Verified, waiting for a Connect of its mesh.
    bool parked = false;
    Hello hello;
    std::string signer;
  };

  void AcceptMain();
  void HeartbeatMain();
  void AcceptNew(std::vector<std::unique_ptr<Pending>>* pending);
  // TLS: takes the handshake's next steps, then reads the hello once it is done.
  void AdvanceHandshake(Pending* p);
  // Reads what is there; true when the connection is finished with (handed over or refused).
  bool ReadHello(Pending* p);
  // A verified hello: hands the connection to its Connect, refuses it, or leaves it parked.
  // True when finished with.
  bool TryClaim(Pending* p);
  void Refuse(Pending* p, const absl::Status& why);
  void RecordRefusal(const absl::Status& status);

  absl::Status Dial(MeshImpl* mesh, size_t member_index, int64_t deadline_ms);
  // One attempt: connect, hello, ack. *final set when retrying cannot help.
  absl::StatusOr<Conn> DialOnce(MeshImpl* mesh, size_t member_index, const SocketAddress& to,
                                int64_t deadline_ms, bool* final);
  // The dialer's TLS handshake on a connected socket, pinned to the member's certificate.
  absl::StatusOr<std::unique_ptr<TlsWire>> DialTls(MeshImpl* mesh, size_t member_index, int fd,
                                                   int64_t deadline_ms, bool* final);

  void Register(MeshImpl* mesh) {
    absl::MutexLock lock(&meshes_mu);
    meshes.insert(mesh);
  }
  void Unregister(MeshImpl* mesh) {
    absl::MutexLock lock(&meshes_mu);
    meshes.erase(mesh);
  }

  const common::PrivateKey key;
  const TcpTransportOptions options;
  common::Clock* const clock;
  const std::string address;
  std::string endpoint;
  int64_t dead_after_ms = 0;
  UniqueFd listen_fd;
  PeerRequestVerifier verifier;
  EventFd accept_wake;
  EventFd stop;
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  std::thread heartbeat_thread;

  // Meshes whose Connect is in progress, by mesh id: where accepted hellos go.
  absl::Mutex connect_mu;
  absl::flat_hash_map<std::string, MeshImpl*> connecting ABSL_GUARDED_BY(connect_mu);
  absl::Status connect_refusal ABSL_GUARDED_BY(connect_mu);  // set by StopConnecting

  // Every live mesh, for the heartbeat thread (held through a whole tick).
  absl::Mutex meshes_mu;
  absl::flat_hash_set<MeshImpl*> meshes ABSL_GUARDED_BY(meshes_mu);

  mutable absl::Mutex refusals_mu;
  std::deque<absl::Status> refusals ABSL_GUARDED_BY(refusals_mu);
};

namespace {

// ---------------------------------------------------------------------------------------------
// MeshImpl

MeshImpl::MeshImpl(TcpTransport::Impl* transport, GroupSpec group, size_t self_index,
                   std::string mesh_id)
    : transport_(transport),
      group_(std::move(group)),
      self_index_(self_index),
      mesh_id_(std::move(mesh_id)) {
  absl::MutexLock lock(&links_mu_);
  links_.resize(group_.members.size());
  dial_errors_.resize(group_.members.size());
}

MeshImpl::~MeshImpl() {
  transport_->Unregister(this);
  std::vector<LinkImpl*> links = Links();
  closing_.store(true, std::memory_order_release);
  wake_.Set();
  for (LinkImpl* link : links) link->WakeAll();
  for (LinkImpl* link : links) link->JoinReader();
  // A mesh that failed says so again rather than closing with a bare EOF, which a member still
  // waiting would blame on this host (it may see the close before the original abort).
  std::string frame;
  std::string blamed;
  if (failed()) {
    const absl::Status status = failure();
    blamed = FailedPeerOf(status);
    frame = FrameBytes(FrameType::kAbort, EncodeAbort(blamed, std::string(status.message())));
  } else {
    frame = FrameBytes(FrameType::kClose, {});
  }
  Linger(std::move(links), frame, blamed);
  absl::MutexLock lock(&links_mu_);
  links_.clear();
}

void MeshImpl::Linger(std::vector<LinkImpl*> links, std::string_view frame,
                      std::string_view blamed) {
  struct Closing {
    LinkImpl* link;
    std::string wire;  // `frame` as this link sends it
    size_t written = 0;
    bool shut = false;
    int64_t unacked = 0;
    int64_t progress_ms = 0;
  };
  const int64_t start = clock()->MonotonicMs();
  std::vector<Closing> closing;
  for (LinkImpl* link : links) {
    if (link->closed_by_peer()) {
      link->ShutdownWrite();
    } else if (!blamed.empty() && link->peer() == blamed) {
      // Nothing is owed to the member at fault: one try, no waiting.
      size_t written = 0;
      link->WriteNow(link->WireBytesOf(frame), &written);
      link->ShutdownWrite();
    } else {
      closing.push_back({link, link->WireBytesOf(frame), 0, false, link->UnackedBytes(), start});
    }
  }
  while (true) {
    const int64_t now = clock()->MonotonicMs();
    std::erase_if(closing, [&](Closing& c) {
      // Unread input at close() would turn the FIN into a reset.
      c.link->DrainInput();
      bool ok = true;
      if (!c.shut) {
        const size_t before = c.written;
        ok = !c.wire.empty() && c.link->WriteNow(c.wire, &c.written);
        if (c.written > before) c.progress_ms = now;
        if (!ok || c.written == c.wire.size()) {
          c.link->ShutdownWrite();
          c.shut = true;
        }
      }
      if (!ok) return true;
      const int64_t unacked = c.link->UnackedBytes();
      if (c.shut && unacked <= 0) return true;
      if (unacked < c.unacked) c.progress_ms = now;
      c.unacked = unacked;
      return now - c.progress_ms >= dead_after_ms();
    });
    if (closing.empty() || now - start >= kMaxLingerMs) break;
    ::poll(nullptr, 0, static_cast<int>(kLingerPollMs));
  }
  for (Closing& c : closing) {
    if (!c.shut) c.link->ShutdownWrite();
  }
}

const TcpTransportOptions& MeshImpl::options() const { return transport_->options; }
common::Clock* MeshImpl::clock() const { return transport_->clock; }
int64_t MeshImpl::dead_after_ms() const { return transport_->dead_after_ms; }

Link* MeshImpl::link(size_t member_index) {
  TS_CHECK(member_index < group_.members.size() && member_index != self_index_);
  absl::MutexLock lock(&links_mu_);
  return links_[member_index].get();
}

absl::Status MeshImpl::failure() const {
  absl::MutexLock lock(&fail_mu_);
  return failure_;
}

std::vector<LinkImpl*> MeshImpl::Links() const {
  std::vector<LinkImpl*> out;
  absl::MutexLock lock(&links_mu_);
  for (const auto& link : links_) {
    if (link != nullptr) out.push_back(link.get());
  }
  return out;
}

bool MeshImpl::Fail(const absl::Status& status) {
  TS_CHECK(!status.ok());
  {
    absl::MutexLock lock(&fail_mu_);
    if (!failure_.ok()) return false;
    failure_ = status;
    failed_.store(true, std::memory_order_release);
  }
  wake_.Set();
  for (LinkImpl* link : Links()) link->WakeAll();
  {
    absl::MutexLock lock(&links_mu_);
    links_cv_.SignalAll();
  }
  common::Log(common::LogLevel::kWarn, kLogComponent, "mesh failed",
              {{"mesh", Hex8(mesh_id_)},
               {"self", group_.members[self_index_].address},
               {"error", std::string(status.ToString())}});
  return true;
}

void MeshImpl::Abort(const absl::Status& status) {
  if (status.ok() || !Fail(status)) return;
  SendAbort(status, nullptr);
}

void MeshImpl::SendAbort(const absl::Status& status, const LinkImpl* except) {
  const std::string blamed = FailedPeerOf(status);
  const std::string payload = EncodeAbort(blamed, std::string(status.message()));
  // The blamed peer last: its link is the one likely to be stuck, and the others should not
  // wait behind it.
  std::vector<LinkImpl*> links = Links();
  std::erase(links, except);
  std::stable_partition(links.begin(), links.end(),
                        [&](const LinkImpl* link) { return link->peer() != blamed; });
  const int64_t deadline = clock()->MonotonicMs() + kAbortDeadlineMs;
  for (LinkImpl* link : links) link->SendControl(FrameType::kAbort, payload, deadline);
}

bool MeshImpl::HasLink(size_t member_index) const {
  absl::MutexLock lock(&links_mu_);
  return links_[member_index] != nullptr;
}

void MeshImpl::AddLink(size_t member_index, Conn conn) {
  auto link = std::make_unique<LinkImpl>(this, group_.members[member_index].address,
                                         std::move(conn), clock()->MonotonicMs());
  LinkImpl* raw = link.get();
  {
    absl::MutexLock lock(&links_mu_);
    TS_CHECK(links_[member_index] == nullptr);
    links_[member_index] = std::move(link);
    ++connected_;
    links_cv_.SignalAll();
  }
  raw->StartReader();
  // A failure recorded before the link existed did not wake it.
  if (stopping()) raw->WakeAll();
}

void MeshImpl::SetDialError(size_t member_index, absl::Status status, bool final) {
  absl::MutexLock lock(&links_mu_);
  dial_errors_[member_index] = status;
  if (final && final_dial_error_.ok()) final_dial_error_ = std::move(status);
  links_cv_.SignalAll();
}

absl::Status MeshImpl::WaitConnected(int64_t deadline_ms) {
  const size_t n = group_.members.size();
  absl::MutexLock lock(&links_mu_);
  while (true) {
    if (failed()) {
      absl::MutexLock fail_lock(&fail_mu_);
      return failure_;
    }
    if (!final_dial_error_.ok()) return final_dial_error_;
    if (connected_ == n - 1) return absl::OkStatus();
    const int64_t left = deadline_ms - clock()->MonotonicMs();
    if (left <= 0) break;
    links_cv_.WaitWithTimeout(&links_mu_, absl::Milliseconds(std::min(left, kSliceMs)));
  }
  std::vector<std::string> missing;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    if (i == self_index_ || links_[i] != nullptr) continue;
    const GroupMember& m = group_.members[i];
    std::string why = i < self_index_ ? "has not dialed here" : "not reached";
    if (!dial_errors_[i].ok()) why = std::string(dial_errors_[i].message());
    if (first.empty()) first = m.address;
    missing.push_back(absl::StrCat(m.address, " at ", m.endpoint, " (", why, ")"));
  }
  return PeerFailure(absl::StatusCode::kDeadlineExceeded, first,
                     absl::StrCat("not connected by the deadline (mesh ", Hex8(mesh_id_),
                                  "); members not connected: ", absl::StrJoin(missing, ", ")));
}

void MeshImpl::Tick(int64_t now_ms) {
  if (stopping()) return;
  const int64_t idle_ms = std::max<int64_t>(1, options().heartbeat_interval_ms / 2);
  for (LinkImpl* link : Links()) {
    absl::Status status = link->MaybeHeartbeat(now_ms, idle_ms);
    if (status.ok()) status = link->CheckLiveness(now_ms, dead_after_ms());
    if (!status.ok()) {
      Abort(status);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// LinkImpl

LinkImpl::LinkImpl(MeshImpl* mesh, std::string peer, Conn conn, int64_t now_ms)
    : mesh_(mesh),
      peer_(std::move(peer)),
      fd_(std::move(conn.fd)),
      tls_(std::move(conn.tls)),
      last_sent_ms_(now_ms),
      last_heard_ms_(now_ms) {}

LinkImpl::~LinkImpl() { JoinReader(); }

void LinkImpl::StartReader() {
  read_buf_.resize(kReadBufferBytes);
  reader_ = std::thread([this] { ReaderMain(); });
}

void LinkImpl::JoinReader() {
  if (reader_.joinable()) reader_.join();
}

void LinkImpl::WakeAll() {
  absl::MutexLock lock(&mu_);
  data_cv_.SignalAll();
  space_cv_.SignalAll();
}

absl::Status LinkImpl::WriteFrameLocked(const char* header, std::string_view payload,
                                        int64_t deadline_ms, bool cancellable, size_t* written) {
  common::Clock* clock = mesh_->clock();
  const int cancel_fd = cancellable ? mesh_->wake_fd() : -1;
  *written = 0;
  std::string_view first(header, kFrameHeaderSize);
  std::string_view second = payload;
  if (tls_ != nullptr) {
    // Records once sealed must all be sent: nothing is sealed before the socket takes bytes,
    // so a deadline passing first leaves the link usable, as in the clear.
    while (true) {
      const int64_t left = deadline_ms - clock->MonotonicMs();
      if (left <= 0) return absl::DeadlineExceededError("send not begun by the deadline");
      const Wait w = WaitFd(fd_.get(), POLLOUT, cancel_fd, left);
      if (w == Wait::kCancelled)
        return absl::CancelledError("mesh failed or closed during the send");
      if (w == Wait::kReady) break;
    }
    sealed_.clear();
    const absl::Status sealed = tls_->Seal({first, second}, &sealed_);
    if (!sealed.ok()) {
      broken_ = true;
      return absl::UnavailableError(sealed.message());
    }
    first = sealed_;
    second = {};
  }
  const size_t total = first.size() + second.size();
  size_t done = 0;
  absl::Status status;
  while (done < total) {
    iovec iov[2];
    int iov_count = 0;
    if (done < first.size()) {
      iov[iov_count++] = {const_cast<char*>(first.data()) + done, first.size() - done};
      if (!second.empty()) iov[iov_count++] = {const_cast<char*>(second.data()), second.size()};
    } else {
      const size_t at = done - first.size();
      iov[iov_count++] = {const_cast<char*>(second.data()) + at, second.size() - at};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iov_count);
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      status = absl::UnavailableError(absl::StrCat("send: ", ErrnoText(errno)));
      break;
    }
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      status = absl::DeadlineExceededError(absl::StrCat("send not done by the deadline (", done,
                                                        " of ", total, " bytes of the frame)"));
      break;
    }
    if (WaitFd(fd_.get(), POLLOUT, cancel_fd, left) == Wait::kCancelled) {
      status = absl::CancelledError("mesh failed or closed during the send");
      break;
    }
  }
  *written = done;
  if (done > 0) last_sent_ms_.store(clock->MonotonicMs(), std::memory_order_relaxed);
  if ((done > 0 || tls_ != nullptr) && done < total) broken_ = true;
  return status;
}

absl::Status LinkImpl::Send(const FrameHeader& header, std::string_view payload,
                            int64_t deadline_ms) {
  if (mesh_->failed()) return mesh_->failure();
  if (header.type != FrameType::kData) {
    return absl::InvalidArgumentError(absl::StrCat("Send: frame type ",
                                                   static_cast<int>(header.type),
                                                   "; only data frames are sent by callers"));
  }
  if (payload.size() > mesh_->options().max_data_payload) {
    return absl::InvalidArgumentError(absl::StrCat("Send: payload of ", payload.size(),
                                                   " bytes is over max_data_payload ",
                                                   mesh_->options().max_data_payload));
  }
  if (closed_by_peer_.load(std::memory_order_acquire)) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_, "closed the link (kClose)");
  }
  FrameHeader h = header;
  h.payload_size = static_cast<uint32_t>(payload.size());
  char encoded[kFrameHeaderSize];
  EncodeFrameHeader(h, encoded);
  absl::Status status;
  size_t written = 0;
  bool broken = false;
  {
    absl::MutexLock lock(&send_mu_);
    if (broken_) {
      status = absl::UnavailableError("an earlier send was cut off inside a frame");
    } else {
      status = WriteFrameLocked(encoded, payload, deadline_ms, /*cancellable=*/true, &written);
    }
    broken = broken_;
  }
  if (status.ok()) return status;
  if (mesh_->failed()) return mesh_->failure();
  if (absl::IsDeadlineExceeded(status) && !broken) {
    // Nothing of this frame is on the wire: the link is still usable.
    return PeerFailure(absl::StatusCode::kDeadlineExceeded, peer_, Msg(status));
  }
  if (closed_by_peer_.load(std::memory_order_acquire)) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                       absl::StrCat("closed the link (kClose); ", status.message()));
  }
  const absl::StatusCode code =
      absl::IsDeadlineExceeded(status) ? status.code() : absl::StatusCode::kUnavailable;
  mesh_->Abort(PeerFailure(code, peer_, Msg(status)));
  return mesh_->failure();
}

absl::StatusOr<Frame> LinkImpl::Recv(int64_t deadline_ms) {
  common::Clock* clock = mesh_->clock();
  absl::MutexLock lock(&mu_);
  while (true) {
    if (mesh_->failed()) return mesh_->failure();
    if (!queue_.empty()) {
      Frame frame = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= frame.payload.size();
      space_cv_.Signal();
      return frame;
    }
    if (closed_by_peer_.load(std::memory_order_acquire)) {
      return PeerFailure(absl::StatusCode::kUnavailable, peer_, "closed the link (kClose)");
    }
    if (mesh_->stopping()) return absl::CancelledError("mesh closed");
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) {
      return PeerFailure(absl::StatusCode::kDeadlineExceeded, peer_,
                         "no data frame by the deadline");
    }
    data_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(std::min(left, kSliceMs)));
  }
}

void LinkImpl::Recycle(std::string buffer) {
  if (buffer.capacity() == 0) return;
  absl::MutexLock lock(&mu_);
  if (pool_.size() >= kMaxPooledBuffers || pooled_bytes_ + buffer.capacity() > kMaxPooledBytes) {
    return;
  }
  pooled_bytes_ += buffer.capacity();
  pool_.push_back(std::move(buffer));
}

std::string LinkImpl::TakeBuffer(size_t size) {
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    // The smallest pooled buffer that fits, else the largest (it grows once).
    size_t best = pool_.size();
    for (size_t i = 0; i < pool_.size(); ++i) {
      if (best == pool_.size()) {
        best = i;
        continue;
      }
      const size_t cap = pool_[i].capacity();
      const size_t best_cap = pool_[best].capacity();
      const bool better = best_cap >= size ? (cap >= size && cap < best_cap) : cap > best_cap;
      if (better) best = i;
    }
    if (best < pool_.size()) {
      pooled_bytes_ -= pool_[best].capacity();
      out = std::move(pool_[best]);
      pool_[best] = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  out.resize(size);
  return out;
}

bool LinkImpl::WaitForQueueSpace() {
  const size_t cap = mesh_->options().max_queued_bytes;
  absl::MutexLock lock(&mu_);
  if (queued_bytes_ < cap) return true;
  reader_paused_.store(true, std::memory_order_release);
  while (queued_bytes_ >= cap && !mesh_->stopping()) space_cv_.Wait(&mu_);
  // The pause is not the peer's silence: its clock starts again now.
  last_heard_ms_.store(mesh_->clock()->MonotonicMs(), std::memory_order_relaxed);
  reader_paused_.store(false, std::memory_order_release);
  return !mesh_->stopping();
}

LinkImpl::ReadResult LinkImpl::ReadSome(char* buf, size_t size, size_t* got) {
  while (true) {
    uint64_t wire_bytes = 0;
    const ssize_t n = RecvOn(fd_.get(), tls_.get(), buf, size, &wire_bytes);
    if (wire_bytes > 0) {
      // Under TLS bytes may arrive before their record is whole: they are heard all the same.
      bytes_received_.fetch_add(wire_bytes, std::memory_order_relaxed);
      last_heard_ms_.store(mesh_->clock()->MonotonicMs(), std::memory_order_relaxed);
    }
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return ReadResult::kOk;
    }
    if (n == 0) return ReadResult::kEof;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      read_errno_ = errno;
      return ReadResult::kError;
    }
    if (mesh_->stopping()) return ReadResult::kCancelled;
    pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {mesh_->wake_fd(), POLLIN, 0}};
    int r;
    do {
      r = ::poll(fds, 2, -1);
    } while (r < 0 && errno == EINTR);
    if ((fds[1].revents & POLLIN) != 0) return ReadResult::kCancelled;
  }
}

LinkImpl::ReadResult LinkImpl::Fill(size_t need) {
  if (read_end_ - read_begin_ >= need) return ReadResult::kOk;
  if (read_begin_ + need > read_buf_.size()) {
    std::memmove(read_buf_.data(), read_buf_.data() + read_begin_, read_end_ - read_begin_);
    read_end_ -= read_begin_;
    read_begin_ = 0;
  }
  while (read_end_ - read_begin_ < need) {
    size_t got = 0;
    const ReadResult r = ReadSome(read_buf_.data() + read_end_, read_buf_.size() - read_end_, &got);
    if (r != ReadResult::kOk) return r;
    read_end_ += got;
  }
  return ReadResult::kOk;
}

absl::Status LinkImpl::FailureOf(ReadResult result, std::string_view where) {
  if (result == ReadResult::kEof) {
    return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                       absl::StrCat("connection closed", AsAbsl(where)));
  }
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("connection lost", AsAbsl(where),
                                  ": recv: ", RecvErrorText(read_errno_, tls_.get())));
}

void LinkImpl::ReaderMain() {
  const uint32_t max_data = mesh_->options().max_data_payload;
  while (true) {
    ReadResult r = Fill(kFrameHeaderSize);
    if (r == ReadResult::kCancelled) return;
    if (r != ReadResult::kOk) {
      const size_t have = read_end_ - read_begin_;
      mesh_->Abort(FailureOf(r, have == 0 ? std::string()
                                          : absl::StrCat(" inside a frame header (", have, " of ",
                                                         kFrameHeaderSize, " bytes)")));
      return;
    }
    absl::StatusOr<FrameHeader> header = DecodeFrameHeader(
        std::string_view(read_buf_.data() + read_begin_, kFrameHeaderSize), max_data);
    if (!header.ok()) {
      mesh_->Abort(PeerFailure(header.status().code(), peer_, Msg(header.status())));
      return;
    }
    read_begin_ += kFrameHeaderSize;
    const size_t size = header->payload_size;
    if (header->type == FrameType::kData) {
      std::string payload = TakeBuffer(size);
      const size_t from_buf = std::min(size, read_end_ - read_begin_);
      if (from_buf > 0) std::memcpy(payload.data(), read_buf_.data() + read_begin_, from_buf);
      read_begin_ += from_buf;
      size_t have = from_buf;
      while (have < size) {
        size_t got = 0;
        r = ReadSome(payload.data() + have, size - have, &got);
        if (r == ReadResult::kCancelled) return;
        if (r != ReadResult::kOk) {
          mesh_->Abort(FailureOf(
              r, absl::StrCat(" inside a data frame (", have, " of ", size, " payload bytes)")));
          return;
        }
        have += got;
      }
      if (read_begin_ == read_end_) read_begin_ = read_end_ = 0;
      {
        absl::MutexLock lock(&mu_);
        queued_bytes_ += size;
        queue_.push_back(Frame{*header, std::move(payload)});
        data_cv_.Signal();
      }
      if (!WaitForQueueSpace()) return;
      continue;
    }
    // Control frames: small payloads (caps checked above), read through the buffer.
    r = Fill(size);
    if (r == ReadResult::kCancelled) return;
    if (r != ReadResult::kOk) {
      mesh_->Abort(FailureOf(r, absl::StrCat(" inside a frame (", read_end_ - read_begin_, " of ",
                                             size, " payload bytes)")));
      return;
    }
    const std::string_view payload(read_buf_.data() + read_begin_, size);
    read_begin_ += size;
    if (read_begin_ == read_end_) read_begin_ = read_end_ = 0;
    switch (header->type) {
      case FrameType::kHeartbeat:
        break;
      case FrameType::kClose:
        closed_by_peer_.store(true, std::memory_order_release);
        WakeAll();
        return;
      case FrameType::kAbort: {
        absl::StatusOr<AbortPayload> abort = DecodeAbort(payload);
        if (!abort.ok()) {
          mesh_->Abort(PeerFailure(abort.status().code(), peer_, Msg(abort.status())));
          return;
        }
        bool member = false;
        for (const GroupMember& m : mesh_->group().members) {
          member = member || (!abort->blamed_address.empty() && m.address == abort->blamed_address);
        }
        // DecodeAbort admits printable UTF-8 only: the reason can go into a status as is.
        const absl::Status status =
            PeerFailure(absl::StatusCode::kUnavailable, member ? abort->blamed_address : peer_,
                        absl::StrCat("aborted by ", peer_, ": ", abort->reason));
        // Passed on at once: a member that hears of the failure only later could meanwhile see
        // this host close and blame it instead.
        if (mesh_->Fail(status)) mesh_->SendAbort(status, this);
        return;
      }
      case FrameType::kHello:
      case FrameType::kHelloAck:
      case FrameType::kData:  // handled above
        mesh_->Abort(
            PeerFailure(absl::StatusCode::kInvalidArgument, peer_,
                        absl::StrCat("frame: unexpected type ", static_cast<int>(header->type),
                                     " (hello or ack) after the handshake")));
        return;
    }
  }
}

absl::Status LinkImpl::MaybeHeartbeat(int64_t now_ms, int64_t idle_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return absl::OkStatus();
  if (now_ms - last_sent_ms_.load(std::memory_order_relaxed) < idle_ms) return absl::OkStatus();
  // A Send in progress is traffic enough.
  if (!send_mu_.TryLock()) return absl::OkStatus();
  absl::Status cut_off;
  if (!broken_) {
    FrameHeader header;
    header.type = FrameType::kHeartbeat;
    char encoded[kFrameHeaderSize];
    EncodeFrameHeader(header, encoded);
    std::string_view bytes(encoded, kFrameHeaderSize);
    // Try once without waiting: a full send buffer means bytes are still on their way. Under
    // TLS the record is sealed only once the socket takes bytes (and then must all be sent).
    pollfd writable{fd_.get(), POLLOUT, 0};
    const bool skip =
        tls_ != nullptr && (::poll(&writable, 1, 0) <= 0 || (writable.revents & POLLOUT) == 0);
    std::string sealed;
    if (!skip && tls_ != nullptr && !tls_->Seal({bytes}, &sealed).ok()) broken_ = true;
    if (!skip && !broken_) {
      if (tls_ != nullptr) bytes = sealed;
      const ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      const size_t sent = n > 0 ? static_cast<size_t>(n) : 0;
      if (sent == bytes.size()) {
        bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
        last_sent_ms_.store(now_ms, std::memory_order_relaxed);
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        // Not the failure to report: the link's reader sees why (the peer's kClose, EOF or
        // reset, read in order after the data before it), and a stopped peer by its silence.
        broken_ = true;
      } else if (sent > 0 || tls_ != nullptr) {
        // Rare: the rest must follow, or the stream is cut inside a frame (or a record).
        cut_off =
            WriteAll(fd_.get(), bytes.substr(sent), now_ms + kAbortDeadlineMs, -1, mesh_->clock());
        bytes_sent_.fetch_add(cut_off.ok() ? bytes.size() : sent, std::memory_order_relaxed);
        last_sent_ms_.store(now_ms, std::memory_order_relaxed);
        broken_ = !cut_off.ok();
      }
    }
  }
  send_mu_.Unlock();
  if (cut_off.ok() || mesh_->stopping()) return absl::OkStatus();
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("heartbeat cut off: ", cut_off.message()));
}

std::string LinkImpl::WireBytesOf(std::string_view frame) {
  absl::MutexLock lock(&send_mu_);
  if (broken_) return std::string();
  std::string wire = WireBytes(tls_.get(), frame);
  if (wire.empty()) broken_ = true;
  return wire;
}

bool LinkImpl::WriteNow(std::string_view bytes, size_t* done) {
  absl::MutexLock lock(&send_mu_);
  if (broken_) return false;
  while (*done < bytes.size()) {
    const ssize_t n =
        ::send(fd_.get(), bytes.data() + *done, bytes.size() - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      bytes_sent_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (*done > 0) broken_ = true;
    return false;
  }
  return true;
}

void LinkImpl::DrainInput() {
  char sink[16384];
  for (int i = 0; i < 64; ++i) {
    if (::recv(fd_.get(), sink, sizeof(sink), MSG_DONTWAIT) <= 0) return;
  }
}

int64_t LinkImpl::UnackedBytes() const {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      info.tcpi_state == TCP_CLOSE) {
    return 0;
  }
  int unacked = 0;
  if (::ioctl(fd_.get(), SIOCOUTQ, &unacked) != 0) return 0;
  return unacked;
}

absl::Status LinkImpl::CheckLiveness(int64_t now_ms, int64_t dead_after_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return absl::OkStatus();
  if (reader_paused_.load(std::memory_order_acquire)) return absl::OkStatus();
  const int64_t silent_ms = now_ms - last_heard_ms_.load(std::memory_order_relaxed);
  if (silent_ms < dead_after_ms) return absl::OkStatus();
  // Bytes waiting in the socket mean the peer spoke and this host's reader is behind.
  int pending = 0;
  if (::ioctl(fd_.get(), FIONREAD, &pending) == 0 && pending > 0) {
    last_heard_ms_.store(now_ms, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return PeerFailure(absl::StatusCode::kUnavailable, peer_,
                     absl::StrCat("no frame or heartbeat for ", silent_ms, " ms"));
}

void LinkImpl::SendControl(FrameType type, std::string_view payload, int64_t deadline_ms) {
  if (closed_by_peer_.load(std::memory_order_acquire)) return;
  FrameHeader header;
  header.type = type;
  header.payload_size = static_cast<uint32_t>(payload.size());
  char encoded[kFrameHeaderSize];
  EncodeFrameHeader(header, encoded);
  absl::MutexLock lock(&send_mu_);
  if (broken_) {
    // A frame was cut off: the peer cannot parse what follows; EOF tells it instead.
    ::shutdown(fd_.get(), SHUT_WR);
    return;
  }
  size_t written = 0;
  const absl::Status status =
      WriteFrameLocked(encoded, payload, deadline_ms, /*cancellable=*/false, &written);
  if (!status.ok()) ::shutdown(fd_.get(), SHUT_WR);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Handshake checks

absl::StatusOr<Hello> ParseCollectiveHello(std::string_view payload) {
  if (payload.size() > kMaxHelloPayload) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello: ", payload.size(), " bytes, at most ", kMaxHelloPayload));
  }
  Hello hello;
  if (!hello.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello: ", payload.size(), " bytes are not a CollectiveHello"));
  }
  return hello;
}

absl::Status CheckHelloMember(const Hello& hello, std::string_view signer, const GroupSpec& group,
                              std::string_view mesh_id, size_t self_index) {
  const std::string mesh = Hex8(mesh_id);
  if (hello.mesh_id() != mesh_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello.mesh_id: ", Hex8(hello.mesh_id()), "… is not mesh ", mesh, "…"));
  }
  if (hello.shard_id() != group.shard_id) {
    return absl::PermissionDeniedError(absl::StrCat("hello.shard_id: ", hello.shard_id(), ", mesh ",
                                                    mesh, " is shard ", group.shard_id));
  }
  const size_t n = group.members.size();
  size_t signer_index = n;
  for (size_t i = 0; i < n; ++i) {
    if (group.members[i].address == signer) signer_index = i;
  }
  if (signer_index == n) {
    return absl::PermissionDeniedError(
        absl::StrCat("host ", AsAbsl(signer), " is not a member of mesh ", mesh));
  }
  if (hello.member_index() != signer_index) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello.member_index: ", hello.member_index(), " is not the signer ",
                     AsAbsl(signer), " (member ", signer_index, " of mesh ", mesh, ")"));
  }
  if (signer_index >= self_index) {
    return absl::PermissionDeniedError(absl::StrCat("hello.member_index: member ", signer_index,
                                                    " dialed member ", self_index, " of mesh ",
                                                    mesh, "; the earlier member dials"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Listener

void TcpTransport::Impl::RecordRefusal(const absl::Status& status) {
  common::Log(common::LogLevel::kWarn, kLogComponent, "handshake refused",
              {{"self", address}, {"error", std::string(status.ToString())}});
  absl::MutexLock lock(&refusals_mu);
  refusals.push_back(status);
  while (refusals.size() > kMaxRefusals) refusals.pop_front();
}

void TcpTransport::Impl::Refuse(Pending* p, const absl::Status& why) {
  const std::string reason =
      absl::StrCat("hello refused by ", address, ": ", absl::StatusCodeToString(why.code()), ": ",
                   why.message());
  absl::Status status =
      p->signer.empty()
          ? absl::Status(why.code(), absl::StrCat("connection from ", p->remote, ": ", reason))
          : PeerFailure(why.code(), p->signer, reason);
  RecordRefusal(status);
  // Under TLS the reason goes only to a dialer whose handshake is done (a record it can open).
  if (p->handshake == nullptr) {
    const std::string frame =
        WireBytes(p->tls.get(), FrameBytes(FrameType::kAbort, EncodeAbort(p->signer, reason)));
    (void)WriteAll(p->fd.get(), frame, clock->MonotonicMs() + kReplyDeadlineMs, -1, clock);
  }
  ::shutdown(p->fd.get(), SHUT_WR);
  // Unread bytes at close() would turn the FIN into a reset that can overtake the abort.
  char sink[4096];
  for (int i = 0; i < 16; ++i) {
    if (::recv(p->fd.get(), sink, sizeof(sink), MSG_DONTWAIT) <= 0) break;
  }
  p->fd.Reset();
}

void TcpTransport::Impl::AcceptNew(std::vector<std::unique_ptr<Pending>>* pending) {
  while (pending->size() < options.max_pending_connections) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        common::Log(common::LogLevel::kWarn, kLogComponent, "accept failed",
                    {{"self", address}, {"error", ErrnoText(errno)}});
      }
      return;
    }
    SetSocketOptions(fd, options.socket_buffer_bytes);
    auto p = std::make_unique<Pending>();
    p->fd = UniqueFd(fd);
    p->remote = PeerNameOf(fd);
    p->deadline_ms = clock->MonotonicMs() + options.handshake_timeout_ms;
    if (options.tls != nullptr) {
      absl::StatusOr<std::unique_ptr<common::TlsHandshake>> handshake = common::TlsHandshake::Start(
          options.tls, fd, common::TlsHandshake::Role::kServer, std::string());
      if (!handshake.ok()) {
        RecordRefusal(absl::Status(
            handshake.status().code(),
            absl::StrCat("connection from ", p->remote, ": ", handshake.status().message())));
        continue;  // p, and the socket with it, go
      }
      p->handshake = *std::move(handshake);
    }
    pending->push_back(std::move(p));
  }
}

void TcpTransport::Impl::AdvanceHandshake(Pending* p) {
  absl::StatusOr<common::TlsHandshake::Want> want = p->handshake->Step();
  if (!want.ok()) {
    Refuse(p, want.status());
    return;
  }
  p->want = *want;
  if (*want != common::TlsHandshake::Want::kDone) return;
  absl::StatusOr<common::TlsRecordLayer> layer = p->handshake->Finish();
  if (!layer.ok()) {
    Refuse(p, layer.status());
    return;
  }
  p->peer_cert_sha256 = p->handshake->peer_cert_sha256();
  p->handshake.reset();
  p->tls = std::make_unique<TlsWire>(*std::move(layer));
  ReadHello(p);  // the hello may have come with the handshake's last flight
}

bool TcpTransport::Impl::ReadHello(Pending* p) {
  while (true) {
    char* dst = nullptr;
    size_t want = 0;
    if (p->header_have < kFrameHeaderSize) {
      dst = p->header + p->header_have;
      want = kFrameHeaderSize - p->header_have;
    } else {
      dst = p->payload.data() + p->payload_have;
      want = p->payload.size() - p->payload_have;
    }
    if (want > 0) {
      uint64_t wire_bytes = 0;
      const ssize_t n = RecvOn(p->fd.get(), p->tls.get(), dst, want, &wire_bytes);
      if (n == 0) {
        Refuse(p,
               absl::UnavailableError(absl::StrCat("connection closed before a whole hello (",
                                                   p->header_have + p->payload_have, " bytes)")));
        return true;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        Refuse(p,
               absl::UnavailableError(absl::StrCat("recv: ", RecvErrorText(errno, p->tls.get()))));
        return true;
      }
      if (p->header_have < kFrameHeaderSize) {
        p->header_have += static_cast<size_t>(n);
        if (p->header_have < kFrameHeaderSize) continue;
        absl::StatusOr<FrameHeader> header = DecodeFrameHeader(
            std::string_view(p->header, kFrameHeaderSize), options.max_data_payload);
        if (!header.ok()) {
          Refuse(p, header.status());
          return true;
        }
        if (header->type != FrameType::kHello) {
          Refuse(p, absl::InvalidArgumentError(absl::StrCat(
                        "frame: type ", static_cast<int>(header->type), " where a hello (",
                        static_cast<int>(FrameType::kHello), ") was expected")));
          return true;
        }
        p->frame = *header;
        // Capped at kMaxHelloPayload by DecodeFrameHeader.
        p->payload.resize(header->payload_size);
      } else {
        p->payload_have += static_cast<size_t>(n);
      }
      if (p->header_have < kFrameHeaderSize || p->payload_have < p->payload.size()) continue;
    }
    // A whole hello.
    absl::StatusOr<Hello> hello = ParseCollectiveHello(p->payload);
    if (!hello.ok()) {
      Refuse(p, hello.status());
      return true;
    }
    // Signature, audience and times now; membership and the nonce once a Connect of the
    // hello's mesh claims it (TryClaim), so a parked hello keeps nothing in the verifier.
    absl::StatusOr<std::string> signer =
        verifier.AuthenticateRequest(*hello, kCollectiveHelloMethod, hello->shard_id());
    if (!signer.ok()) {
      Refuse(p, signer.status());
      return true;
    }
    p->hello = *std::move(hello);
    p->signer = *std::move(signer);
    p->parked = true;
    return TryClaim(p);
  }
}

bool TcpTransport::Impl::TryClaim(Pending* p) {
  absl::MutexLock lock(&connect_mu);
  auto it = connecting.find(p->hello.mesh_id());
  if (it == connecting.end()) return false;
  MeshImpl* mesh = it->second;
  const GroupSpec& group = mesh->group();
  // The group's membership is asked before the hello's nonce is recorded: a hello from a host
  // outside the mesh leaves nothing behind.
  absl::Status ok =
      verifier
          .VerifyRequest(p->hello, kCollectiveHelloMethod, p->hello.shard_id(),
                         [&](uint64_t, std::string_view signer) {
                           return CheckHelloMember(p->hello, signer, group, mesh->mesh_id(),
                                                   mesh->self_index());
                         })
          .status();
  if (!ok.ok() && !absl::IsPermissionDenied(ok)) {
    // Refused by its nonce or its times (a replay, say): the signature shows who once signed
    // the hello, not who sent it now, so the refusal names the connection, not the signer.
    p->signer.clear();
  }
  if (ok.ok() && options.tls != nullptr &&
      p->peer_cert_sha256 != group.members[p->hello.member_index()].tls_cert_sha256) {
    // The hello is the member's, the connection someone else's: name the connection.
    ok = absl::PermissionDeniedError(absl::StrCat(
        "the connection's TLS certificate has SHA-256 ",
        absl::BytesToHexString(p->peer_cert_sha256), ", the reservation of member ",
        p->hello.member_index(), " (", p->signer, ") names ",
        absl::BytesToHexString(group.members[p->hello.member_index()].tls_cert_sha256)));
    p->signer.clear();
  }
  if (ok.ok() && mesh->HasLink(p->hello.member_index())) {
    ok = absl::AlreadyExistsError(absl::StrCat("member ", p->hello.member_index(), " (", p->signer,
                                               ") is already connected in mesh ",
                                               Hex8(mesh->mesh_id())));
  }
  if (!ok.ok()) {
    Refuse(p, ok);
    return true;
  }
  Hello ack;
  ack.set_shard_id(group.shard_id);
  ack.set_mesh_id(mesh->mesh_id());
  ack.set_member_index(static_cast<uint32_t>(mesh->self_index()));
  ack.set_answers_nonce(p->hello.auth().nonce());
  absl::StatusOr<pb::PeerRequestAuth> auth =
      SignPeerRequest(key, options.chain_id, group.shard_id, kCollectiveHelloAckMethod, p->signer,
                      ack, clock->NowUnixMs(), kHelloLifetimeMs);
  if (!auth.ok()) {
    Refuse(p, auth.status());
    return true;
  }
  *ack.mutable_auth() = *std::move(auth);
  const absl::Status sent =
      WriteAll(p->fd.get(),
               WireBytes(p->tls.get(), FrameBytes(FrameType::kHelloAck, ack.SerializeAsString())),
               clock->MonotonicMs() + kReplyDeadlineMs, -1, clock);
  if (!sent.ok()) {
    RecordRefusal(PeerFailure(absl::StatusCode::kUnavailable, p->signer,
                              absl::StrCat("ack not sent: ", sent.message())));
    p->fd.Reset();
    return true;
  }
  mesh->AddLink(p->hello.member_index(), Conn{std::move(p->fd), std::move(p->tls)});
  return true;
}

void TcpTransport::Impl::AcceptMain() {
  std::vector<std::unique_ptr<Pending>> pending;
  std::vector<pollfd> fds;
  while (!stopping.load(std::memory_order_acquire)) {
    fds.clear();
    fds.push_back({accept_wake.fd(), POLLIN, 0});
    const bool listening = pending.size() < options.max_pending_connections;
    fds.push_back({listening ? listen_fd.get() : -1, POLLIN, 0});
    int64_t timeout_ms = 1000;
    const int64_t now = clock->MonotonicMs();
    for (const auto& p : pending) {
      const bool out = p->handshake != nullptr && p->want == common::TlsHandshake::Want::kWrite;
      fds.push_back({p->fd.get(), static_cast<short>(out ? POLLOUT : POLLIN), 0});
      timeout_ms = std::min(timeout_ms, p->deadline_ms - now);
    }
    int r;
    do {
      r = ::poll(fds.data(), fds.size(),
                 static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, 1000)));
    } while (r < 0 && errno == EINTR);
    if (stopping.load(std::memory_order_acquire)) break;
    if ((fds[0].revents & POLLIN) != 0) accept_wake.Drain();
    // Existing connections first (their pollfds line up with `pending` before accepting).
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending* p = pending[i].get();
      if (p->fd.get() < 0 || fds[i + 2].revents == 0) continue;
      if (p->handshake != nullptr) {
        AdvanceHandshake(p);
        continue;
      }
      if (p->parked) {
        // A parked dialer has nothing more to say: it left, or it breaks the protocol.
        Refuse(p, absl::InvalidArgumentError(
                      "connection sent more than a hello or closed while waiting"));
        continue;
      }
      ReadHello(p);
    }
    for (auto& p : pending) {
      if (p->fd.get() >= 0 && p->parked) TryClaim(p.get());
    }
    const int64_t after = clock->MonotonicMs();
    for (auto& p : pending) {
      if (p->fd.get() < 0 || after < p->deadline_ms) continue;
      if (p->parked) {
        Refuse(p.get(), absl::PermissionDeniedError(absl::StrCat(
                            "mesh ", Hex8(p->hello.mesh_id()), " is not being connected here (",
                            "waited ", options.handshake_timeout_ms, " ms)")));
      } else {
        Refuse(p.get(), absl::DeadlineExceededError(absl::StrCat(
                            p->handshake != nullptr ? "no TLS handshake" : "no whole hello",
                            " within ", options.handshake_timeout_ms, " ms")));
      }
    }
    // Handed over or refused: their fd was moved out or closed.
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const auto& p) { return p->fd.get() < 0; }),
                  pending.end());
    if (listening && (fds[1].revents & POLLIN) != 0) AcceptNew(&pending);
  }
}

void TcpTransport::Impl::HeartbeatMain() {
  const int64_t tick_ms = std::max<int64_t>(1, options.heartbeat_interval_ms / 4);
  int64_t next = clock->MonotonicMs() + tick_ms;
  while (!stopping.load(std::memory_order_acquire)) {
    const int64_t now = clock->MonotonicMs();
    if (now < next) {
      pollfd p{stop.fd(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min(next - now, tick_ms)));
      continue;
    }
    next = now + tick_ms;
    absl::MutexLock lock(&meshes_mu);
    for (MeshImpl* mesh : meshes) mesh->Tick(clock->MonotonicMs());
  }
}

// ---------------------------------------------------------------------------------------------
// Dialer

absl::StatusOr<std::unique_ptr<TlsWire>> TcpTransport::Impl::DialTls(MeshImpl* mesh,
                                                                     size_t member_index, int fd,
                                                                     int64_t deadline_ms,
                                                                     bool* final) {
  const GroupMember& peer = mesh->group().members[member_index];
  absl::StatusOr<common::TlsRecordLayer> layer = common::TlsHandshake::Connect(
      options.tls, fd, peer.tls_cert_sha256, [&](short events) -> absl::Status {
        const int64_t left = deadline_ms - clock->MonotonicMs();
        if (left <= 0)
          return absl::DeadlineExceededError("TLS handshake: not done by the deadline");
        if (WaitFd(fd, events, mesh->wake_fd(), left) == Wait::kCancelled) {
          return absl::CancelledError("TLS handshake: cancelled");
        }
        return absl::OkStatus();
      });
  if (!layer.ok()) {
    // A certificate other than the reservation's will not change by dialing again.
    *final = absl::IsUnauthenticated(layer.status());
    return PeerFailure(layer.status().code(), peer.address, Msg(layer.status()));
  }
  return std::make_unique<TlsWire>(*std::move(layer));
}

absl::StatusOr<Conn> TcpTransport::Impl::DialOnce(MeshImpl* mesh, size_t member_index,
                                                  const SocketAddress& to, int64_t deadline_ms,
                                                  bool* final) {
  *final = false;
  const GroupSpec& group = mesh->group();
  const GroupMember& peer = group.members[member_index];
  UniqueFd fd(::socket(to.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  SetSocketOptions(fd.get(), options.socket_buffer_bytes);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.storage), to.size) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(errno)));
    }
    while (true) {
      const int64_t left = deadline_ms - clock->MonotonicMs();
      if (left <= 0) return absl::DeadlineExceededError("connect: not done by the deadline");
      const Wait w = WaitFd(fd.get(), POLLOUT, mesh->wake_fd(), left);
      if (w == Wait::kCancelled) return absl::CancelledError("connect: cancelled");
      if (w == Wait::kReady) break;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(err)));
  }
  std::unique_ptr<TlsWire> tls;
  if (options.tls != nullptr) {
    TS_ASSIGN_OR_RETURN(tls, DialTls(mesh, member_index, fd.get(), deadline_ms, final));
  }

  Hello hello;
  hello.set_shard_id(group.shard_id);
  hello.set_mesh_id(mesh->mesh_id());
  hello.set_member_index(static_cast<uint32_t>(mesh->self_index()));
  absl::StatusOr<pb::PeerRequestAuth> auth =
      SignPeerRequest(key, options.chain_id, group.shard_id, kCollectiveHelloMethod, peer.address,
                      hello, clock->NowUnixMs(), kHelloLifetimeMs);
  if (!auth.ok()) {
    *final = true;
    return auth.status();
  }
  const std::string nonce = auth->nonce();
  *hello.mutable_auth() = *std::move(auth);
  TS_RETURN_IF_ERROR(WriteAll(
      fd.get(), WireBytes(tls.get(), FrameBytes(FrameType::kHello, hello.SerializeAsString())),
      deadline_ms, mesh->wake_fd(), clock));

  // Exactly the reply: frames the listener sends after it belong to the link's reader.
  char header_bytes[kFrameHeaderSize];
  TS_RETURN_IF_ERROR(ReadExact(fd.get(), tls.get(), header_bytes, kFrameHeaderSize, deadline_ms,
                               mesh->wake_fd(), clock));
  *final = true;
  absl::StatusOr<FrameHeader> header =
      DecodeFrameHeader(std::string_view(header_bytes, kFrameHeaderSize), options.max_data_payload);
  if (!header.ok()) {
    return PeerFailure(header.status().code(), peer.address,
                       absl::StrCat("reply to the hello: ", header.status().message()));
  }
  std::string payload(header->payload_size, '\0');
  absl::Status read = ReadExact(fd.get(), tls.get(), payload.data(), payload.size(), deadline_ms,
                                mesh->wake_fd(), clock);
  if (!read.ok()) {
    *final = false;
    return read;
  }
  if (header->type == FrameType::kAbort) {
    absl::StatusOr<AbortPayload> abort = DecodeAbort(payload);
    if (!abort.ok()) {
      return PeerFailure(absl::StatusCode::kPermissionDenied, peer.address,
                         absl::StrCat("refused the hello (", abort.status().message(), ")"));
    }
    return PeerFailure(absl::StatusCode::kPermissionDenied, peer.address,
                       absl::StrCat("refused the hello: ", abort->reason));
  }
  if (header->type != FrameType::kHelloAck) {
    return PeerFailure(absl::StatusCode::kInvalidArgument, peer.address,
                       absl::StrCat("reply to the hello: frame type ",
                                    static_cast<int>(header->type), ", want an ack"));
  }
  absl::StatusOr<Hello> ack = ParseCollectiveHello(payload);
  if (!ack.ok()) {
    return PeerFailure(absl::StatusCode::kInvalidArgument, peer.address,
                       absl::StrCat("ack: ", ack.status().message()));
  }
  // The only member an ack may come from is the one dialed.
  absl::StatusOr<std::string> signer =
      verifier.VerifyRequest(*ack, kCollectiveHelloAckMethod, group.shard_id,
                             [&](uint64_t, std::string_view from) -> absl::Status {
                               if (from == peer.address) return absl::OkStatus();
                               return absl::UnauthenticatedError(absl::StrCat(
                                   "signed by ", AsAbsl(from), ", not the member dialed"));
                             });
  if (!signer.ok()) {
    return PeerFailure(signer.status().code(), peer.address,
                       absl::StrCat("ack: ", signer.status().message()));
  }
  if (ack->mesh_id() != mesh->mesh_id() || ack->shard_id() != group.shard_id ||
      ack->member_index() != member_index || ack->answers_nonce() != nonce) {
    return PeerFailure(
        absl::StatusCode::kUnauthenticated, peer.address,
        absl::StrCat("ack: does not answer this hello (mesh ", Hex8(ack->mesh_id()), ", shard ",
                     ack->shard_id(), ", member_index ", ack->member_index(), ")"));
  }
  return Conn{std::move(fd), std::move(tls)};
}

absl::Status TcpTransport::Impl::Dial(MeshImpl* mesh, size_t member_index, int64_t deadline_ms) {
  const GroupMember& peer = mesh->group().members[member_index];
  absl::StatusOr<SocketAddress> to =
      Resolve(absl::StrCat("group.members[", member_index, "].endpoint"), peer.endpoint);
  if (!to.ok()) return PeerFailure(to.status().code(), peer.address, Msg(to.status()));
  int64_t backoff_ms = kDialBackoffFirstMs;
  while (true) {
    bool final = false;
    absl::StatusOr<Conn> fd = DialOnce(mesh, member_index, *to, deadline_ms, &final);
    if (fd.ok()) {
      mesh->AddLink(member_index, *std::move(fd));
      return absl::OkStatus();
    }
    if (mesh->stopping() || absl::IsCancelled(fd.status())) return fd.status();
    const absl::Status named = FailedPeerOf(fd.status()).empty()
                                   ? PeerFailure(fd.status().code(), peer.address, Msg(fd.status()))
                                   : fd.status();
    mesh->SetDialError(member_index, named, final);
    if (final) return named;
    const int64_t left = deadline_ms - clock->MonotonicMs();
    if (left <= 0) return named;
    pollfd p{mesh->wake_fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min(left, backoff_ms)));
    backoff_ms = std::min(backoff_ms * 2, kDialBackoffMaxMs);
  }
}

// ---------------------------------------------------------------------------------------------
// TcpTransport

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Start(common::PrivateKey key,
                                                                  TcpTransportOptions options,
                                                                  common::Clock* clock) {
  if (options.chain_id.empty()) return absl::InvalidArgumentError("options.chain_id: empty");
  if (options.heartbeat_interval_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.heartbeat_interval_ms: ", options.heartbeat_interval_ms, ", want > 0"));
  }
  if (options.dead_after_ms < 0 ||
      (options.dead_after_ms > 0 && options.dead_after_ms < options.heartbeat_interval_ms)) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.dead_after_ms: ", options.dead_after_ms, ", want 0 or at least ",
                     "heartbeat_interval_ms (", options.heartbeat_interval_ms, ")"));
  }
  if (options.handshake_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.handshake_timeout_ms: ", options.handshake_timeout_ms, ", want > 0"));
  }
  if (options.max_data_payload == 0) {
    return absl::InvalidArgumentError("options.max_data_payload: 0, want > 0");
  }
  if (options.max_queued_bytes == 0) {
    return absl::InvalidArgumentError("options.max_queued_bytes: 0, want > 0");
  }
  if (options.max_pending_connections == 0) {
    return absl::InvalidArgumentError("options.max_pending_connections: 0, want > 0");
  }
  if (options.socket_buffer_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.socket_buffer_bytes: ", options.socket_buffer_bytes, ", want >= 0"));
  }
  TS_ASSIGN_OR_RETURN(SocketAddress bind_to,
                      Resolve("options.listen_address", options.listen_address));
  if (bind_to.storage.ss_family != AF_INET && bind_to.storage.ss_family != AF_INET6) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.listen_address: '", options.listen_address, "' is not IP"));
  }

  auto impl = std::make_unique<Impl>(std::move(key), std::move(options), clock);
  Impl& t = *impl;
  t.dead_after_ms = t.options.dead_after_ms > 0 ? t.options.dead_after_ms
                                                : t.options.heartbeat_interval_ms * 3 / 2;
  t.listen_fd =
      UniqueFd(::socket(bind_to.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (t.listen_fd.get() < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  }
  const int one = 1;
  ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (t.options.socket_buffer_bytes > 0) {
    ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_RCVBUF, &t.options.socket_buffer_bytes,
                 sizeof(int));
    ::setsockopt(t.listen_fd.get(), SOL_SOCKET, SO_SNDBUF, &t.options.socket_buffer_bytes,
                 sizeof(int));
  }
  if (::bind(t.listen_fd.get(), reinterpret_cast<const sockaddr*>(&bind_to.storage),
             bind_to.size) != 0 ||
      ::listen(t.listen_fd.get(), 128) != 0) {
    return absl::UnavailableError(absl::StrCat("options.listen_address: cannot listen on ",
                                               t.options.listen_address, ": ", ErrnoText(errno)));
  }
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  ::getsockname(t.listen_fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_size);
  const uint16_t port = bound.ss_family == AF_INET
                            ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                            : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  std::string host;
  std::string unused_port;
  TS_RETURN_IF_ERROR(
      SplitHostPort("options.listen_address", t.options.listen_address, &host, &unused_port));
  t.endpoint = bound.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                           : absl::StrCat(host, ":", port);
  t.accept_thread = std::thread([&t] { t.AcceptMain(); });
  t.heartbeat_thread = std::thread([&t] { t.HeartbeatMain(); });
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(impl)));
}

TcpTransport::TcpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpTransport::~TcpTransport() {
  impl_->stopping.store(true, std::memory_order_release);
  impl_->accept_wake.Set();
  impl_->stop.Set();
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  if (impl_->heartbeat_thread.joinable()) impl_->heartbeat_thread.join();
  absl::MutexLock lock(&impl_->meshes_mu);
  // Meshes refer to the transport (contract: destroyed first).
  TS_CHECK(impl_->meshes.empty());
}

std::string TcpTransport::endpoint() const { return impl_->endpoint; }
const std::string& TcpTransport::address() const { return impl_->address; }

std::vector<absl::Status> TcpTransport::RecentRefusals() const {
  absl::MutexLock lock(&impl_->refusals_mu);
  return std::vector<absl::Status>(impl_->refusals.begin(), impl_->refusals.end());
}

absl::StatusOr<std::unique_ptr<Mesh>> TcpTransport::Connect(const GroupSpec& group,
                                                            size_t self_index,
                                                            int64_t deadline_ms) {
  Impl& t = *impl_;
  TS_RETURN_IF_ERROR(ValidateGroup(group));
  const size_t n = group.members.size();
  if (self_index >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("self_index: ", self_index, " is outside the group of ", n));
  }
  if (group.members[self_index].address != t.address) {
    return absl::InvalidArgumentError(absl::StrCat("group.members[", self_index,
                                                   "].address: ", group.members[self_index].address,
                                                   " is not this host (", t.address, ")"));
  }
  for (size_t j = 0; j < n && t.options.tls != nullptr; ++j) {
    if (j != self_index && group.members[j].tls_cert_sha256.size() != common::kSha256Size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group.members[", j, "].tls_cert_sha256: ", group.members[j].tls_cert_sha256.size(),
          " bytes, want ", common::kSha256Size, " (TLS is on: every peer is pinned)"));
    }
  }
  for (size_t j = self_index + 1; j < n; ++j) {
    std::string host;
    std::string port;
    TS_RETURN_IF_ERROR(SplitHostPort(absl::StrCat("group.members[", j, "].endpoint"),
                                     group.members[j].endpoint, &host, &port));
  }
  const std::string mesh_id = MeshIdOf(group);
  auto mesh = std::make_unique<MeshImpl>(&t, group, self_index, mesh_id);
  {
    absl::MutexLock lock(&t.connect_mu);
    if (!t.connect_refusal.ok()) return t.connect_refusal;
    if (!t.connecting.emplace(mesh_id, mesh.get()).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("mesh ", Hex8(mesh_id), " is already being connected here"));
    }
  }
  t.Register(mesh.get());
  // Hellos that arrived before this Connect are parked in the listener: look at them now.
  t.accept_wake.Set();

  std::vector<std::thread> dialers;
  for (size_t j = self_index + 1; j < n; ++j) {
    dialers.emplace_back([&t, m = mesh.get(), j, deadline_ms] {
      absl::Status s = t.Dial(m, j, deadline_ms);
      (void)s;  // recorded through SetDialError / AddLink
    });
  }
  absl::Status status = mesh->WaitConnected(deadline_ms);
  {
    absl::MutexLock lock(&t.connect_mu);
    t.connecting.erase(mesh_id);
  }
  // Successful dialers have returned (every link is up); failing ones stop at the mesh's
  // failure, which Abort below records.
  if (!status.ok()) mesh->Abort(status);
  for (std::thread& d : dialers) d.join();
  if (!status.ok()) return status;
  return std::unique_ptr<Mesh>(std::move(mesh));
}

void TcpTransport::StopConnecting(const absl::Status& status) {
  TS_CHECK(!status.ok());
  Impl& t = *impl_;
  // Under the lock a connecting mesh cannot go away (Connect takes it out of the map first);
  // its abort frames go out within kAbortDeadlineMs.
  absl::MutexLock lock(&t.connect_mu);
  if (t.connect_refusal.ok()) t.connect_refusal = status;
  for (auto& [id, mesh] : t.connecting) mesh->Abort(status);
}

}  // namespace ts::sidecar
