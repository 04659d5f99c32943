// Authentication of requests between hosts (artifact transfer, shard rounds, collectives): every
// request carries a PeerRequestAuth signed by the sender's host key, bound to the method, the
// request body, the receiving host (audience), an issue time, an expiry and a nonce. The layout is
// in docs/protocol.md ("Peer requests").
//
// Verify checks, in this order, and keeps state only for a request that passed every check:
// 1. the cheap checks (UNAUTHENTICATED unless said otherwise): missing auth, empty signer,
//    signature not 65 bytes, nonce not 16 bytes; audience other than its own address
//    (PERMISSION_DENIED); expired (now > expires), issued in the future beyond the allowed skew,
//    a lifetime (expires − issued) above max_lifetime_ms, or issued before this verifier started
//    — the nonces seen by a previous run of the process are gone, so older requests cannot be
//    checked for replay and are refused instead;
// 2. the signature: it must recover to `signer`;
// 3. membership: the caller's check (PeerMembership: the shard directory, or a collective's
//    group), whose refusal is returned as it is (PERMISSION_DENIED, NOT_FOUND, UNAVAILABLE...);
// 4. the nonce: a (signer, nonce) pair already seen is refused as replayed (kept until its
//    expiry); RESOURCE_EXHAUSTED when the signer already holds max_nonces_per_signer unexpired
//    pairs, or all signers together max_nonces.
// So a host that is not a member, or whose key has no account at all, cannot make the verifier
// keep anything, however many validly signed requests it sends; a member can hold at most its
// own share. Expired pairs are dropped every quarter of max_lifetime_ms (at most once a second)
// and the tables shrink with them, so memory taken by a burst is given back.
//
// Thread-safety: the functions are pure; PeerRequestVerifier is thread-safe. The membership check
// is called without the verifier's lock held.
#ifndef TS_SIDECAR_PEER_PEER_AUTH_H_
#define TS_SIDECAR_PEER_PEER_AUTH_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/crypto/secp256k1.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "google/protobuf/message.h"

namespace ts::sidecar {

namespace pb = ::gonka::trainshard::v1;

inline constexpr std::string_view kPeerRequestSignKind = protocol::kSignPeerRequest;
inline constexpr int64_t kDefaultPeerRequestLifetimeMs = 30000;

struct PeerAuthOptions {
  int64_t max_lifetime_ms = 120000;
  int64_t max_clock_skew_ms = 5000;
  // Unexpired (signer, nonce) pairs held for all signers together, and for one signer. A member
  // signing a request a lifetime (30 s by default) ahead holds one pair per request for that
  // long: 65,536 allow it ~2,000 requests a second, far above a fetch's needs (a request moves
  // up to 256 chunks). A pair takes a 25-byte table slot, tables at most half empty after they
  // grow: ~3.3 MiB for a signer at its cap, ~55 MiB for the whole table at max_nonces.
  size_t max_nonces = 1u << 20;
  size_t max_nonces_per_signer = 1u << 16;
};

// Whether `signer` may make requests in `shard_id`: OK, or the refusal the request gets. Called
// once the signature has verified, before anything is recorded.
using PeerMembership = absl::FunctionRef<absl::Status(uint64_t shard_id, std::string_view signer)>;

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
  // `body_bytes`, asks `membership` about the signer, and records the nonce. Returns the
  // signer's address. Errors as in the file comment.
  absl::StatusOr<std::string> Verify(const pb::PeerRequestAuth& auth, std::string_view method,
                                     uint64_t shard_id, std::string_view body_bytes,
                                     PeerMembership membership);
  // Convenience: Verify(request.auth(), method, shard_id, RequestBodyBytes(request), ...).
  template <typename Request>
  absl::StatusOr<std::string> VerifyRequest(const Request& request, std::string_view method,
                                            uint64_t shard_id, PeerMembership membership) {
    if (!request.has_auth()) return absl::UnauthenticatedError("auth: missing");
    return Verify(request.auth(), method, shard_id, RequestBodyBytes(request), membership);
  }

  // Steps 1 and 2 only (no membership, no nonce, no state): who signed the request, if it is
  // addressed to this host and in time. For a caller that learns later whom to admit (the
  // collective's listener, before its mesh is connected); it must still Verify before acting.
  absl::StatusOr<std::string> Authenticate(const pb::PeerRequestAuth& auth, std::string_view method,
                                           uint64_t shard_id, std::string_view body_bytes) const;
  template <typename Request>
  absl::StatusOr<std::string> AuthenticateRequest(const Request& request, std::string_view method,
                                                  uint64_t shard_id) const {
    if (!request.has_auth()) return absl::UnauthenticatedError("auth: missing");
    return Authenticate(request.auth(), method, shard_id, RequestBodyBytes(request));
  }

  // Unexpired (signer, nonce) pairs held, signers holding any, and the slots their tables take
  // (what the memory follows), for tests and metrics.
  size_t nonces_held() const;
  size_t signers_held() const;
  size_t nonce_slots() const;

  const std::string& self_address() const { return self_address_; }

 private:
  // A nonce as two words: fixed size, held inline in the table (a 16-byte std::string would
  // allocate each).
  using Nonce = std::pair<uint64_t, uint64_t>;
  struct SignerNonces {
    absl::flat_hash_map<Nonce, int64_t> expires_unix_ms;  // nonce -> expiry
  };

  // Drops expired pairs and shrinks what became much larger than its content.
  void Prune(int64_t now_unix_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string self_address_;
  const std::string chain_id_;
  common::Clock* const clock_;
  const PeerAuthOptions options_;
  const int64_t start_unix_ms_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, SignerNonces> signers_ ABSL_GUARDED_BY(mu_);
  size_t nonces_ ABSL_GUARDED_BY(mu_) = 0;  // pairs held, all signers
  // When the tables are next pruned of expired pairs: a pass every quarter of the maximum
  // lifetime keeps the cost per request constant, also while they are full.
  int64_t next_prune_unix_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_PEER_PEER_AUTH_H_
