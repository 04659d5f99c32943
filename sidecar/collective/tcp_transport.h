// The collective's transport over TCP: one listener per host, one connection per pair of
// members (the member earlier in the group's order dials), each authenticated by a signed
// hello and a signed ack (host keys, audience, expiry, nonce — docs/collective.md
// "Handshake"), then frames (frame.h) both ways. Per connection a reader thread demultiplexes
// frames: heartbeats refresh liveness, aborts fail the mesh, data frames go to a bounded queue
// (max_queued_bytes; the reader stops reading while it is full, which pauses — but does not
// count against — the peer's liveness). A heartbeat thread wakes every quarter interval, sends
// kHeartbeat on every link idle for half of heartbeat_interval_ms (so a peer hears something at
// least every 0.75 interval, well inside dead_after_ms, even when this host is slow to be
// scheduled) and fails a mesh whose peer has sent nothing for dead_after_ms: a dead peer is
// detected within dead_after_ms + interval / 4 of the last byte it sent (≤ 1.75 intervals with
// the default dead_after_ms). A received kAbort fails the mesh and is passed on to the other
// members at once.
//
// Destroying a mesh writes kClose on every link (kAbort with the failure instead, if the mesh
// failed, so nobody mistakes the close for this host's death) and then waits until what it
// sent has been acknowledged — as long as each link makes progress within dead_after_ms, at
// most 10 s — so a peer's heartbeat cannot make the closed socket reset bytes still on their
// way.
//
// TLS (options.tls set; docs/threat-model.md "TLS between hosts"): every connection runs a TLS
// 1.3 handshake before its hello (common/crypto/tls_session.h), both sides presenting their
// host's certificate. The dialer accepts only the certificate whose SHA-256 the group names for
// the member it dials (GroupMember::tls_cert_sha256, from the member's reservation); the
// listener, once the hello shows which member dialed, refuses a connection whose certificate is
// not that member's. Every frame after the handshake travels in TLS records (tls_wire.h).
// Without options.tls every byte is in the clear: the trusted-network switch.
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
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/tls_session.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/collective/transport.h"

namespace ts::sidecar {

struct TcpTransportOptions {
  // host:port to listen on; port 0 picks a free one (see endpoint()).
  std::string listen_address = "127.0.0.1:0";
  std::string chain_id;
  int64_t heartbeat_interval_ms = 500;
  // A peer silent this long fails the mesh; 0 = 1.5 × heartbeat_interval_ms. At least
  // heartbeat_interval_ms when set.
  int64_t dead_after_ms = 0;
  int64_t handshake_timeout_ms = 5000;
  // Largest kData payload accepted from a peer.
  uint32_t max_data_payload = (4u << 20) + 4096;
  // Data frames queued per link before its reader pauses.
  size_t max_queued_bytes = 64u << 20;
  size_t max_pending_connections = 64;
  // SO_SNDBUF / SO_RCVBUF; 0 leaves the kernel's autotuning alone.
  int socket_buffer_bytes = 0;
  // This host's TLS identity; null runs every link in the clear (see the file comment).
  std::shared_ptr<const common::TlsContext> tls;
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
  void StopConnecting(const absl::Status& status) override;

  // The latest handshakes this host's listener refused (at most 32, oldest first), each naming
  // the peer (its address once authenticated, else its socket address) and what was wrong.
  // They are also logged; kept here for diagnostics and tests.
  std::vector<absl::Status> RecentRefusals() const;

  struct Impl;

 private:
  explicit TcpTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The handshake's checks of untrusted bytes, exposed for tests and the fuzz target.
inline constexpr std::string_view kCollectiveHelloMethod = "/gonka.trainshard.v1.Collective/Hello";
inline constexpr std::string_view kCollectiveHelloAckMethod =
    "/gonka.trainshard.v1.Collective/HelloAck";

// Parses a kHello / kHelloAck payload. INVALID_ARGUMENT when it is longer than kMaxHelloPayload
// or not a CollectiveHello.
absl::StatusOr<::gonka::trainshard::v1::CollectiveHello> ParseCollectiveHello(
    std::string_view payload);

// What a listener, member `self_index` of `group` (mesh id `mesh_id`), requires of a hello whose
// auth verified as `signer`: the same mesh id and shard, a signer that is a member, the
// member_index of the signer, and a member earlier in the group's order (the earlier one
// dials). PERMISSION_DENIED naming what was wrong ("host gonka1… is not a member of mesh
// <hex8>", ...).
absl::Status CheckHelloMember(const ::gonka::trainshard::v1::CollectiveHello& hello,
                              std::string_view signer, const GroupSpec& group,
                              std::string_view mesh_id, size_t self_index);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TCP_TRANSPORT_H_
