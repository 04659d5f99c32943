// The collective's transport: authenticated, full-duplex links between the members of one
// group (a "mesh"), with heartbeats, deadlines and caps. The algorithms (collective.h) see only
// these interfaces, so they run over TCP (tcp_transport.h), over an in-memory mesh in unit
// tests, or not at all (Gloo, gloo_collective.h, for trusted meshes).
//
// Failure model. A mesh fails as a whole: the first failure on any of its links — a peer that
// closed its connection or died (EOF / reset), sent nothing (not even a heartbeat) for
// dead_after_ms, sent a malformed or oversized frame, or sent kAbort — is recorded once, and
// from then on every Send and Recv on every link of the mesh returns it at once. The status
// names the peer at fault in its message ("peer gonka1…: …") and in a payload that
// FailedPeerOf reads, so callers can retry with the survivors. A mesh is not reused after a
// failure; the caller connects a new one (with a new session) without the failed peer.
//
// Thread-safety: Link::Send and Link::Recv may be called from different threads at the same
// time (one sender and one receiver per link at a time); Mesh methods are thread-safe.
#ifndef TS_SIDECAR_COLLECTIVE_TRANSPORT_H_
#define TS_SIDECAR_COLLECTIVE_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sidecar/collective/frame.h"

namespace ts::sidecar {

// Largest group a mesh connects (full mesh: n·(n−1)/2 connections).
inline constexpr size_t kMaxGroupMembers = 256;

struct GroupMember {
  std::string address;   // bech32 host address
  std::string endpoint;  // host:port of its collective listener
  // SHA-256 of the TLS certificate its reservation names (32 bytes), pinned when the
  // transport runs TLS; empty in the clear.
  std::string tls_cert_sha256 = {};
};

// Who takes part in a series of operations. Every member must pass the same spec: the member
// order is the ring order and the reduction order.
struct GroupSpec {
  uint64_t shard_id = 0;
  // Chosen by the caller and the same on every member (e.g. round << 8 | attempt); a retry
  // with survivors uses a new session, so its mesh id differs from the failed one's.
  uint64_t session = 0;
  std::vector<GroupMember> members;
};

// INVALID_ARGUMENT naming the field and value: fewer than 2 or more than kMaxGroupMembers
// members, an empty or duplicate address, an empty endpoint, a tls_cert_sha256 neither empty
// nor 32 bytes.
absl::Status ValidateGroup(const GroupSpec& group);

// SHA-256("gonka-trainshard/v1/collective_mesh" || u64 shard_id || u64 session || u32 n ||
// for each member: u32 len || address || u32 len || endpoint), integers big-endian.
std::string MeshIdOf(const GroupSpec& group);

struct Frame {
  FrameHeader header;
  std::string payload;
};

class Link {
 public:
  virtual ~Link() = default;
  // The peer's authenticated address.
  virtual const std::string& peer() const = 0;
  // Sends one frame (header.payload_size is set from payload). Blocks until the bytes are
  // handed to the kernel or until deadline_ms (monotonic clock): DEADLINE_EXCEEDED naming the
  // peer. Errors of the mesh's failure (see file comment).
  virtual absl::Status Send(const FrameHeader& header, std::string_view payload,
                            int64_t deadline_ms) = 0;
  // The next kData frame from the peer, in the order sent. DEADLINE_EXCEEDED naming the peer
  // when none arrives by deadline_ms; the mesh's failure otherwise.
  virtual absl::StatusOr<Frame> Recv(int64_t deadline_ms) = 0;
  // Hands a payload buffer back for reuse by later Recv calls (optional; saves allocating and
  // faulting in a fresh buffer per frame).
  virtual void Recycle(std::string buffer) = 0;
  // Whether Send returns without waiting (an unbounded in-memory link): the collective then
  // sends on the caller's thread instead of a sender thread of its own.
  virtual bool SendNeverBlocks() const { return false; }
  // Bytes sent and received on this link so far, headers and heartbeats included.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
};

class Mesh {
 public:
  virtual ~Mesh() = default;
  virtual const GroupSpec& group() const = 0;
  virtual size_t self_index() const = 0;
  // The link to member `member_index` (!= self_index); owned by the mesh.
  virtual Link* link(size_t member_index) = 0;
  // OK, or the mesh's first failure (it never changes once set).
  virtual absl::Status failure() const = 0;
  // Fails the mesh with `status` (which should name the peer at fault, see
  // PeerFailure) and sends kAbort with the reason to every member still reachable, so they
  // fail fast too. No effect if the mesh has already failed.
  virtual void Abort(const absl::Status& status) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Connects this host, member `self_index` of `group`, to every other member, authenticating
  // each (signed hello and ack, docs/collective.md "Handshake"). Blocks until all links are up
  // or deadline_ms (monotonic): DEADLINE_EXCEEDED naming the members not connected.
  // INVALID_ARGUMENT from ValidateGroup or when self_index is out of range or its address is
  // not this host's. UNAVAILABLE / PERMISSION_DENIED / UNAUTHENTICATED naming the peer when a
  // member cannot be reached or refuses, or answers with the wrong identity.
  virtual absl::StatusOr<std::unique_ptr<Mesh>> Connect(const GroupSpec& group, size_t self_index,
                                                        int64_t deadline_ms) = 0;
  // Fails every Connect in progress with `status` (its mesh aborted, so the members already
  // linked hear of it) and every later one at once: for an owner that is stopping and must not
  // wait out a connect deadline. Meshes already connected are the owner's to abort.
  virtual void StopConnecting(const absl::Status& status) = 0;
};

// A status of `code` with message "peer <address>: <message>" and the address in a payload.
absl::Status PeerFailure(absl::StatusCode code, std::string_view address, std::string_view message);
// The address a status names as at fault (PeerFailure), or "" if none.
std::string FailedPeerOf(const absl::Status& status);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_TRANSPORT_H_
