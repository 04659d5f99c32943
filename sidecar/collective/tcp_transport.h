// The collective's transport over TCP: one listener per host, one connection per pair of
// members (the member earlier in the group's order dials), each authenticated by a signed
// hello and a signed ack (host keys, audience, expiry, nonce — docs/collective.md
// "Handshake"), then frames (frame.h) both ways. Per connection a reader thread demultiplexes
// frames: heartbeats refresh liveness, aborts fail the mesh, data frames go to a bounded queue
// (max_queued_bytes; the reader stops reading while it is full, which pauses — but does not
// count against — the peer's liveness). A heartbeat thread sends kHeartbeat on every link idle
// for heartbeat_interval_ms and fails a mesh whose peer has sent nothing for dead_after_ms.
//
// Accepted connections whose hello names a mesh not (yet) connected here wait, at most
// max_pending_connections of them and for at most handshake_timeout_ms, for Connect to claim
// them; a hello from a host not in the group is answered with kAbort naming the refusal.
//
// Thread-safety: thread-safe. Meshes must be destroyed before the transport.
#ifndef TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_H_
#define TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "sidecar/collective/transport.h"

namespace ts::sidecar {

struct TcpTransportOptions {
  // host:port to listen on; port 0 picks a free one (see endpoint()).
  std::string listen_address = "127.0.0.1:0";
  std::string chain_id;
  int64_t heartbeat_interval_ms = 500;
  // A peer silent this long fails the mesh; 0 = 1.5 × heartbeat_interval_ms.
  int64_t dead_after_ms = 0;
  int64_t handshake_timeout_ms = 5000;
  // Largest kData payload accepted from a peer.
  uint32_t max_data_payload = (4u << 20) + 4096;
  // Data frames queued per link before its reader pauses.
  size_t max_queued_bytes = 64u << 20;
  size_t max_pending_connections = 64;
  // SO_SNDBUF / SO_RCVBUF; 0 leaves the kernel's autotuning alone.
  int socket_buffer_bytes = 0;
};

class TcpTransport final : public Transport {
 public:
  // Binds and starts listening. `clock` is not owned and must outlive the transport.
  // INVALID_ARGUMENT naming the option for a bad listen_address, empty chain_id, or
  // non-positive intervals; UNAVAILABLE when the address cannot be bound (naming it and errno).
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Start(common::PrivateKey key,
                                                             TcpTransportOptions options,
                                                             common::Clock* clock);
  ~TcpTransport() override;

  // The bound host:port (the port resolved when 0 was asked for).
  std::string endpoint() const;
  // This host's bech32 address (from its key).
  const std::string& address() const;

  absl::StatusOr<std::unique_ptr<Mesh>> Connect(const GroupSpec& group, size_t self_index,
                                                 int64_t deadline_ms) override;

  struct Impl;

 private:
  explicit TcpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_H_
