// Authentication of requests between hosts (artifact transfer, collectives): every request
// carries a PeerRequestAuth signed by the sender's host key, bound to the method, the request
// body, the receiving host (audience), an issue time, an expiry and a nonce. The layout is in
// docs/protocol.md ("Peer requests").
//
// A receiver refuses (UNAUTHENTICATED unless said otherwise), naming what was wrong:
// - missing auth, signature not 65 bytes, or a signature that does not recover to `signer`;
// - audience other than its own address (PERMISSION_DENIED);
// - expired (now > expires), issued in the future beyond the allowed skew, a lifetime
//   (expires − issued) above max_lifetime_ms, or issued before this verifier started — the
//   nonces seen by a previous run of the process are gone, so older requests cannot be checked
//   for replay and are refused instead;
// - a (signer, nonce) pair already seen (kept until its expiry; RESOURCE_EXHAUSTED when
//   max_nonces unexpired pairs are held).
// Membership of the signer in the shard is the caller's check (ShardDirectory).
//
// Thread-safety: the functions are pure; PeerRequestVerifier is thread-safe.
#ifndef TS_SIDECAR_PEER_PEER_AUTH_H_
#define TS_SIDECAR_PEER_PEER_AUTH_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "google/protobuf/message.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

inline constexpr std::string_view kPeerRequestSignKind = "peer_request";
inline constexpr int64_t kDefaultPeerRequestLifetimeMs = 30000;

struct PeerAuthOptions {
  int64_t max_lifetime_ms = 120000;
  int64_t max_clock_skew_ms = 5000;
  size_t max_nonces = 1u << 20;
};

// Deterministic bytes of `request` with its top-level field named "auth" cleared (the part of
// a request the signature binds through body_sha256). TS_CHECKs that the message has no such
// field of message type only if it is present with another type (programmer error).
std::string RequestBodyBytes(const google::protobuf::Message& request);

// Signs a request to `audience`: fills and returns the auth for `request` (whose own auth field
// is ignored). Random nonce (16 bytes). INVALID_ARGUMENT from SignBytes (chain_id).
absl::StatusOr<pb::PeerRequestAuth> SignPeerRequest(const common::PrivateKey& key,
                                                    std::string_view chain_id, uint64_t shard_id,
                                                    std::string_view method,
                                                    std::string_view audience,
                                                    const google::protobuf::Message& request,
                                                    int64_t now_unix_ms, int64_t lifetime_ms);

class PeerRequestVerifier {
 public:
  // `clock` is not owned. The start time is clock->NowUnixMs() at construction.
  PeerRequestVerifier(std::string self_address, std::string chain_id, common::Clock* clock,
                      PeerAuthOptions options = {});

  // Checks `auth` for a request of `method` in `shard_id` whose RequestBodyBytes are
  // `body_bytes`; records the nonce. Returns the signer's address. Errors as in the file comment.
  absl::StatusOr<std::string> Verify(const pb::PeerRequestAuth& auth, std::string_view method,
                                     uint64_t shard_id, std::string_view body_bytes);
  // Convenience: Verify(request.auth(), method, shard_id, RequestBodyBytes(request)).
  template <typename Request>
  absl::StatusOr<std::string> VerifyRequest(const Request& request, std::string_view method,
                                            uint64_t shard_id) {
    if (!request.has_auth()) return absl::UnauthenticatedError("auth: missing");
    return Verify(request.auth(), method, shard_id, RequestBodyBytes(request));
  }

  const std::string& self_address() const { return self_address_; }

 private:
  const std::string self_address_;
  const std::string chain_id_;
  common::Clock* const clock_;
  const PeerAuthOptions options_;
  const int64_t start_unix_ms_;
  absl::Mutex mu_;
  // signer || nonce -> expires_unix_ms
  absl::flat_hash_map<std::string, int64_t> nonces_ ABSL_GUARDED_BY(mu_);
  // When nonces_ is next pruned of expired entries: a pass over the map every quarter of the
  // maximum lifetime keeps its cost per request constant, also while the map is full.
  int64_t next_prune_unix_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_PEER_PEER_AUTH_H_
