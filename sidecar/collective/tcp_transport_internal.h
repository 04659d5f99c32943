// The TCP transport's internals, shared by its three files and by nothing else: the socket
// helpers (tcp_socket.cc), a mesh and its links with their reader threads (tcp_link.cc), and the
// listener, the dialer and the public TcpTransport (tcp_transport.cc). The public surface is
// tcp_transport.h; docs/collective.md explains the protocol.
//
// Thread-safety: as each class says; the functions are thread-safe.
#ifndef TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_INTERNAL_H_
#define TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_INTERNAL_H_

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
namespace tcp_internal {

using Hello = ::gonka::trainshard::v1::CollectiveHello;
using common::AsAbsl;
using common::UniqueFd;

// Longest a blocked Send, Recv or poll waits before looking at the clock and the mesh again
// (a mesh failure also wakes them at once through the mesh's eventfd or condition variables).
inline constexpr int64_t kSliceMs = 50;
// Best-effort aborts sent when a mesh fails, and the rest of a heartbeat cut short.
inline constexpr int64_t kAbortDeadlineMs = 100;
// A mesh being destroyed waits for what it sent to be acknowledged before closing its sockets:
// closed with bytes still queued, a socket answers the peer's next heartbeat with a reset that
// discards them (the peer's last data frame, or the abort that names the member at fault). It
// stops waiting on a link that makes no progress for dead_after_ms, and after this in all.
inline constexpr int64_t kMaxLingerMs = 10000;
inline constexpr int64_t kLingerPollMs = 5;
// The ack and refusals written by the listener: a few hundred bytes on a fresh connection.
inline constexpr int64_t kReplyDeadlineMs = 1000;
inline constexpr int64_t kHelloLifetimeMs = 30000;
inline constexpr int64_t kDialBackoffFirstMs = 20;
inline constexpr int64_t kDialBackoffMaxMs = 500;
// A link's reader reads the socket in pieces this large; data payloads past the bytes already
// in this buffer are read straight into the payload.
inline constexpr size_t kReadBufferBytes = 256u << 10;
inline constexpr size_t kMaxPooledBuffers = 16;
inline constexpr size_t kMaxPooledBytes = 32u << 20;
inline constexpr size_t kMaxRefusals = 32;
inline constexpr std::string_view kLogComponent = "collective";

// A status's message as a std::string_view (Debian's Abseil has its own string_view).
std::string_view Msg(const absl::Status& status);
// The first 4 bytes of an id, in hex, for messages.
std::string Hex8(std::string_view id);
std::string ErrnoText(int err);

// A connected socket and, under TLS, its record states.
struct Conn {
  UniqueFd fd;
  std::unique_ptr<TlsWire> tls;  // null: in the clear
};

// recv(2) through the connection's records when it has them; *wire_bytes grows by what was
// read off the socket.
ssize_t RecvOn(int fd, TlsWire* tls, char* buf, size_t size, uint64_t* wire_bytes);
// errno's text, or the TLS failure behind EPROTO.
std::string RecvErrorText(int err, const TlsWire* tls);
// What goes on the wire for `frame`: the frame in the clear, its records under TLS (empty if
// the key may seal no more).
std::string WireBytes(TlsWire* tls, std::string_view frame);

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
Wait WaitFd(int fd, short events, int cancel_fd, int64_t timeout_ms);
// Splits "host:port" or "[v6]:port".
absl::Status SplitHostPort(std::string_view field, std::string_view endpoint, std::string* host,
                           std::string* port);

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t size = 0;
};

absl::StatusOr<SocketAddress> Resolve(std::string_view field, std::string_view endpoint);
// "ip:port" or "[ip6]:port" of the socket's peer; "unknown" when it has none.
std::string PeerNameOf(int fd);
// TCP_NODELAY, and the buffer sizes when buffer_bytes > 0.
void SetSocketOptions(int fd, int buffer_bytes);
// Writes all of `data` to a non-blocking socket by deadline_ms. Used for handshake frames and
// refusals only (data frames go through LinkImpl::Send).
absl::Status WriteAll(int fd, std::string_view data, int64_t deadline_ms, int cancel_fd,
                      common::Clock* clock);
// Reads exactly `size` bytes into `out` by deadline_ms. UNAVAILABLE for EOF or a socket error.
absl::Status ReadExact(int fd, TlsWire* tls, char* out, size_t size, int64_t deadline_ms,
                       int cancel_fd, common::Clock* clock);
// A frame with its encoded header.
std::string FrameBytes(FrameType type, std::string_view payload);

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

}  // namespace tcp_internal

// ---------------------------------------------------------------------------------------------

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
    common::UniqueFd fd;
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
    tcp_internal::Hello hello;
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

  absl::Status Dial(tcp_internal::MeshImpl* mesh, size_t member_index, int64_t deadline_ms);
  // One attempt: connect, hello, ack. *final set when retrying cannot help.
  absl::StatusOr<tcp_internal::Conn> DialOnce(tcp_internal::MeshImpl* mesh, size_t member_index,
                                              const tcp_internal::SocketAddress& to,
                                              int64_t deadline_ms, bool* final);
  // The dialer's TLS handshake on a connected socket, pinned to the member's certificate.
  absl::StatusOr<std::unique_ptr<TlsWire>> DialTls(tcp_internal::MeshImpl* mesh,
                                                   size_t member_index, int fd, int64_t deadline_ms,
                                                   bool* final);

  void Register(tcp_internal::MeshImpl* mesh) {
    absl::MutexLock lock(&meshes_mu);
    meshes.insert(mesh);
  }
  void Unregister(tcp_internal::MeshImpl* mesh) {
    absl::MutexLock lock(&meshes_mu);
    meshes.erase(mesh);
  }

  const common::PrivateKey key;
  const TcpTransportOptions options;
  common::Clock* const clock;
  const std::string address;
  std::string endpoint;
  int64_t dead_after_ms = 0;
  common::UniqueFd listen_fd;
  PeerRequestVerifier verifier;
  tcp_internal::EventFd accept_wake;
  tcp_internal::EventFd stop;
  std::atomic<bool> stopping{false};
  std::thread accept_thread;
  std::thread heartbeat_thread;

  // Meshes whose Connect is in progress, by mesh id: where accepted hellos go.
  absl::Mutex connect_mu;
  absl::flat_hash_map<std::string, tcp_internal::MeshImpl*> connecting ABSL_GUARDED_BY(connect_mu);
  absl::Status connect_refusal ABSL_GUARDED_BY(connect_mu);  // set by StopConnecting

  // Every live mesh, for the heartbeat thread (held through a whole tick).
  absl::Mutex meshes_mu;
  absl::flat_hash_set<tcp_internal::MeshImpl*> meshes ABSL_GUARDED_BY(meshes_mu);

  mutable absl::Mutex refusals_mu;
  std::deque<absl::Status> refusals ABSL_GUARDED_BY(refusals_mu);
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_INTERNAL_H_
