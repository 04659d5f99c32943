// The chunk stream: chunk bodies over framed TCP (TLS under peer_tls, below) beside the
// ArtifactTransfer gRPC service, framed as chunk_stream_wire.h says (docs/artifacts.md, "Chunk
// stream"). The request is the same signed GetChunksRequest, checked by the same
// ArtifactTransferService::BeginChunks (auth under its own method name kMethodChunkStream,
// membership, caps, every hash named by a complete manifest, a stream slot shared with GetChunks);
// only the bytes travel differently: the server sendfile()s each chunk file after a 48-byte header,
// the fetcher receives it into its page-aligned buffer, hashes it and stores it (O_DIRECT) — no
// HTTP/2 framing, no copies in user space on the sending side.
//
// ChunkStreamServer: one listening socket and one event thread that accepts connections and
// reads their requests without blocking; a connection whose whole request has arrived goes to a
// thread of its own, which checks it (ArtifactTransferService::BeginChunks) and serves it. The
// two kinds of connection are bounded apart, so connections that never authenticate cannot
// crowd out the ones being served, nor a member's new connection:
// - pending (request not yet complete): at most max_pending_connections in all and
//   max_pending_per_source per source (an IPv4 address, or an IPv6 /64). A new connection over
//   either bound takes the place of the oldest pending connection of its own source, or, when
//   the pool is full, of the source holding the most pending connections. Each must deliver its
//   whole request within request_deadline_ms of its accept (the authentication deadline) or is
//   closed; a malformed request is answered with an error frame and closed.
// - serving (request complete: being checked, then served): at most max_connections at once;
//   a complete request beyond that is answered RESOURCE_EXHAUSTED. A refused request holds its
//   thread only while it is checked; each send must progress within send_timeout_ms.
// Until Open() is called every request is answered with an UNAVAILABLE frame.
//
// ChunkStreamCall: the client side of one connection, used by the fetcher. Every read and the
// connect honour one deadline; Cancel() from another thread makes a blocked call return.
//
// TLS (options.tls on the server; ChunkStreamTls on the call): the connection runs a TLS 1.3
// handshake before the request (common/crypto/tls_session.h; the fetcher pins the server to the
// certificate its reservation names, the server takes any client certificate — the request is
// signed), and every byte after it travels in TLS records (sidecar/peer/tls_wire.h). The server
// then reads each chunk file and seals it in user space instead of sendfile() (this kernel has
// no kernel TLS). A pending connection's handshake counts against the same request deadline.
//
// Thread-safety: ChunkStreamServer is thread-safe. A ChunkStreamCall is used by one thread,
// except Cancel(), which any thread may call while the call is alive.
#ifndef TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_H_
#define TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/tls_session.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/chunk_stream_wire.h"
#include "sidecar/artifacts/safe_fs.h"
#include "sidecar/peer/tls_wire.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

class ArtifactTransferService;

// The host of a "host:port" endpoint as the socket calls take it: "[::1]:7000" → "::1".
// Empty if there is no ':' or nothing before it.
std::string EndpointHost(std::string_view endpoint);

struct ChunkStreamServerOptions {
  // Connections whose request has not arrived in full, all together and from one source. A
  // fetcher opens a few at a time (at most 16 per peer) and sends its request at once.
  size_t max_pending_connections = 128;
  size_t max_pending_per_source = 16;
  // The whole request (at most 64 KiB; a fetcher's is under 1 KiB) within this long of the
  // accept.
  int64_t request_deadline_ms = 2000;
  // Connections with a complete request, being checked or served, one thread each.
  size_t max_connections = 64;
  int64_t send_timeout_ms = 30000;
  // This host's TLS identity: every connection TLS; null: in the clear (the trusted network).
  std::shared_ptr<const common::TlsContext> tls;
};

// A call's TLS: this host's identity and the certificate the peer's reservation names.
struct ChunkStreamTls {
  std::shared_ptr<const common::TlsContext> context;  // null: in the clear
  std::string peer_cert_sha256;                       // 32 bytes when context is set
};

class ChunkStreamServer {
 public:
  // Binds `host` (an IP address; port chosen by the kernel) and starts accepting. UNAVAILABLE
  // naming the address if it cannot be bound.
  // `clock` (not owned) times the request deadline and must outlive the server.
  static absl::StatusOr<std::unique_ptr<ChunkStreamServer>> Start(
      const std::string& host, common::Clock* clock, ChunkStreamServerOptions options = {});
  ~ChunkStreamServer();  // Shutdown()
  ChunkStreamServer(const ChunkStreamServer&) = delete;
  ChunkStreamServer& operator=(const ChunkStreamServer&) = delete;

  uint16_t port() const { return port_; }

  // Requests are checked and served by `service` from now on (not owned; must outlive the
  // server or the Shutdown() call).
  void Open(ArtifactTransferService* service);

  // Stops accepting, ends every connection and joins the threads. Idempotent.
  void Shutdown();

  // Connections open now, pending and serving (for tests of the bounds).
  size_t connections() const { return pending_connections() + serving_connections(); }
  size_t pending_connections() const { return pending_count_.load(); }
  size_t serving_connections() const;
  // Pending connections closed to make room for newer ones, since the start.
  uint64_t evictions() const { return evictions_.load(); }
  // Chunks sent since the start.
  uint64_t chunks_sent() const { return chunks_sent_.load(); }

 private:
  struct Pending;
  struct Connection;
  ChunkStreamServer(common::Clock* clock, ChunkStreamServerOptions options);
  void EventLoop();
  // Accepts what the listening socket holds (a bounded number per call), making room by
  // eviction as the class comment says. False when accepting must pause (out of descriptors).
  bool AcceptNew(std::vector<std::unique_ptr<Pending>>* pending, uint64_t* next_seq);
  // The next step of `p`: its TLS handshake while that lasts, then its request. True when it
  // is done with (see ReadRequest).
  bool Step(Pending* p);
  bool AdvanceHandshake(Pending* p);
  // Reads what `p` has sent. True when it is done with (handed to a serving thread, refused or
  // failed): its descriptor is then closed or moved out.
  bool ReadRequest(Pending* p);
  // Hands a complete request to a thread of its own, or refuses it when max_connections serve.
  void Dispatch(Pending* p);
  void Serve(Connection* connection);
  absl::Status ServeRequest(int fd, TlsWire* tls, const std::string& body, uint32_t* chunks_sent);
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const ChunkStreamServerOptions options_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: wakes the event thread for Shutdown
  uint16_t port_ = 0;
  std::atomic<ArtifactTransferService*> service_{nullptr};
  std::atomic<uint64_t> chunks_sent_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<size_t> pending_count_{0};
  std::thread event_thread_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

// One chunk stream request on its own connection.
class ChunkStreamCall {
 public:
  // `deadline_ms` is on `clock`'s monotonic time and bounds every step; `clock` is not owned.
  ChunkStreamCall(common::Clock* clock, int64_t deadline_ms)
      : clock_(clock), deadline_ms_(deadline_ms) {}
  ~ChunkStreamCall();
  ChunkStreamCall(const ChunkStreamCall&) = delete;
  ChunkStreamCall& operator=(const ChunkStreamCall&) = delete;

  // Connects to host:port (numeric or a name) and sends `request` (already signed for
  // kMethodChunkStream). UNAVAILABLE if the host cannot be reached, DEADLINE_EXCEEDED,
  // CANCELLED.
  // With `tls.context` set, the connection first runs a TLS handshake pinned to
  // tls.peer_cert_sha256 (UNAUTHENTICATED naming both fingerprints for another certificate).
  absl::Status Start(const std::string& host, uint16_t port, const pb::GetChunksRequest& request,
                     const ChunkStreamTls& tls = {});

  // Reads the next frame. For a chunk frame its `size` bytes are read into buffer[0, size);
  // INVALID_ARGUMENT (a protocol violation: the peer is at fault) if size exceeds `capacity`
  // or the header is malformed. An error frame comes back as that status (its code, the peer's
  // message); an end frame as the frame itself. UNAVAILABLE if the connection closes early,
  // DEADLINE_EXCEEDED, CANCELLED.
  absl::StatusOr<ChunkStreamFrame> Next(char* buffer, size_t capacity);

  // Makes a blocked Start or Next return CANCELLED. Thread-safe.
  void Cancel();

 private:
  absl::Status ReadFull(char* out, size_t size);
  absl::Status WaitReady(short events);

  common::Clock* const clock_;
  const int64_t deadline_ms_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // The descriptor as seen by the owning thread (only it closes it).
  int own_fd_ = -1;
  std::unique_ptr<TlsWire> tls_;  // after a TLS handshake
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_H_
