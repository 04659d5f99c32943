#include "sidecar/peer/peer_auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/signing.h"
#include "common/status.h"
#include "google/protobuf/descriptor.h"
#include "proto/deterministic.h"

namespace ts::sidecar {
namespace {

constexpr size_t kNonceSize = 16;
constexpr int64_t kMinPrunePeriodMs = 1000;
// A table is shrunk to fit when its capacity exceeds kShrinkFactor × its size plus
// kShrinkSlack slots (small tables are left alone: shrinking them saves nothing).
constexpr size_t kShrinkFactor = 4;
constexpr size_t kShrinkSlack = 64;

std::string StatementBytes(const pb::PeerRequestAuth& auth, std::string_view method,
                           std::string_view body_sha256) {
  pb::PeerRequestStatement statement;
  statement.set_method(std::string(method));
  statement.set_signer(auth.signer());
  statement.set_audience(auth.audience());
  statement.set_expires_unix_ms(auth.expires_unix_ms());
  statement.set_nonce(auth.nonce());
  statement.set_body_sha256(std::string(body_sha256));
  statement.set_issued_unix_ms(auth.issued_unix_ms());
  return DeterministicBytes(statement);
}

std::string RandomNonce() {
  std::string nonce(kNonceSize, '\0');
  size_t filled = 0;
  while (filled < nonce.size()) {
    ssize_t n = getrandom(nonce.data() + filled, nonce.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    // getrandom only fails for bad arguments or a kernel without it: not recoverable here.
    TS_CHECK(n > 0);
    filled += static_cast<size_t>(n);
  }
  return nonce;
}

// The 16 nonce bytes as two words (any fixed mapping will do: it only has to be injective).
std::pair<uint64_t, uint64_t> NonceWords(std::string_view nonce) {
  uint64_t hi = 0;
  uint64_t lo = 0;
  std::memcpy(&hi, nonce.data(), sizeof(hi));
  std::memcpy(&lo, nonce.data() + sizeof(hi), sizeof(lo));
  return {hi, lo};
}

}  // namespace

std::string RequestBodyBytes(const google::protobuf::Message& request) {
  const google::protobuf::FieldDescriptor* auth = request.GetDescriptor()->FindFieldByName("auth");
  if (auth == nullptr) return DeterministicBytes(request);
  TS_CHECK(auth->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
           !auth->is_repeated());
  std::unique_ptr<google::protobuf::Message> body(request.New());
  body->CopyFrom(request);
  body->GetReflection()->ClearField(body.get(), auth);
  return DeterministicBytes(*body);
}

absl::StatusOr<pb::PeerRequestAuth> SignPeerRequest(const common::PrivateKey& key,
                                                    std::string_view chain_id, uint64_t shard_id,
                                                    std::string_view method,
                                                    std::string_view audience,
                                                    const google::protobuf::Message& request,
                                                    int64_t now_unix_ms, int64_t lifetime_ms) {
  pb::PeerRequestAuth auth;
  auth.set_signer(common::AddressFromPublicKey(key.public_key()));
  auth.set_audience(std::string(audience));
  auth.set_issued_unix_ms(now_unix_ms);
  auth.set_expires_unix_ms(now_unix_ms + lifetime_ms);
  auth.set_nonce(RandomNonce());
  std::string statement = StatementBytes(auth, method, common::Sha256(RequestBodyBytes(request)));
  TS_ASSIGN_OR_RETURN(std::string signature, common::SignStatement(key, kPeerRequestSignKind,
                                                                   chain_id, shard_id, statement));
  auth.set_signature(std::move(signature));
  return auth;
}

PeerRequestVerifier::PeerRequestVerifier(std::string self_address, std::string chain_id,
                                         common::Clock* clock, PeerAuthOptions options)
    : self_address_(std::move(self_address)),
      chain_id_(std::move(chain_id)),
      clock_(clock),
      options_(options),
      start_unix_ms_(clock->NowUnixMs()) {}

absl::StatusOr<std::string> PeerRequestVerifier::Authenticate(const pb::PeerRequestAuth& auth,
                                                              std::string_view method,
                                                              uint64_t shard_id,
                                                              std::string_view body_bytes) const {
  // Cheap checks first, the signature next: neither keeps any state.
  if (auth.signer().empty()) return absl::UnauthenticatedError("auth.signer: empty");
  if (auth.signature().size() != common::kRecoverableSignatureSize) {
    return absl::UnauthenticatedError(absl::StrCat("auth.signature: ", auth.signature().size(),
                                                   " bytes, want ",
                                                   common::kRecoverableSignatureSize));
  }
  if (auth.nonce().size() != kNonceSize) {
    return absl::UnauthenticatedError(
        absl::StrCat("auth.nonce: ", auth.nonce().size(), " bytes, want ", kNonceSize));
  }
  if (auth.audience() != self_address_) {
    return absl::PermissionDeniedError(
        absl::StrCat("auth.audience: ", absl::CHexEscape(auth.audience()), " is not this host (",
                     self_address_, ")"));
  }
  const int64_t now = clock_->NowUnixMs();
  if (now > auth.expires_unix_ms()) {
    return absl::UnauthenticatedError(absl::StrCat("auth.expires_unix_ms: ", auth.expires_unix_ms(),
                                                   " is in the past (now ", now, ")"));
  }
  if (auth.issued_unix_ms() > now + options_.max_clock_skew_ms) {
    return absl::UnauthenticatedError(
        absl::StrCat("auth.issued_unix_ms: ", auth.issued_unix_ms(), " is in the future (now ", now,
                     ", allowed skew ", options_.max_clock_skew_ms, " ms)"));
  }
  if (auth.issued_unix_ms() < start_unix_ms_) {
    return absl::UnauthenticatedError(absl::StrCat("auth.issued_unix_ms: ", auth.issued_unix_ms(),
                                                   " is before this host started (", start_unix_ms_,
                                                   ")"));
  }
  // Both times are at most `now + skew` and at least the start time here, so the difference
  // cannot overflow.
  const int64_t lifetime_ms = auth.expires_unix_ms() - auth.issued_unix_ms();
  if (lifetime_ms < 0 || lifetime_ms > options_.max_lifetime_ms) {
    return absl::UnauthenticatedError(absl::StrCat("auth.expires_unix_ms: lifetime ", lifetime_ms,
                                                   " ms is outside 0..", options_.max_lifetime_ms,
                                                   " ms"));
  }

  std::string statement = StatementBytes(auth, method, common::Sha256(body_bytes));
  absl::StatusOr<std::string> recovered = common::RecoverStatementSigner(
      kPeerRequestSignKind, chain_id_, shard_id, statement, auth.signature());
  if (!recovered.ok()) {
    return absl::UnauthenticatedError(
        absl::StrCat("auth.signature: ", recovered.status().message()));
  }
  if (*recovered != auth.signer()) {
    return absl::UnauthenticatedError(absl::StrCat("auth.signature: signed by ", *recovered,
                                                   ", not auth.signer ",
                                                   absl::CHexEscape(auth.signer())));
  }
  return recovered;
}

absl::StatusOr<std::string> PeerRequestVerifier::Verify(const pb::PeerRequestAuth& auth,
                                                        std::string_view method, uint64_t shard_id,
                                                        std::string_view body_bytes,
                                                        PeerMembership membership) {
  TS_ASSIGN_OR_RETURN(std::string signer, Authenticate(auth, method, shard_id, body_bytes));
  // Membership before the nonce: only a member's request may take a place in the tables, so
  // hosts outside the shard (or keys of no account) cannot fill them, and a refused request
  // leaves nothing behind (sent again, it is refused for the same reason, not as a replay).
  TS_RETURN_IF_ERROR(membership(shard_id, signer));

  const Nonce nonce = NonceWords(auth.nonce());
  const int64_t now = clock_->NowUnixMs();
  absl::MutexLock lock(&mu_);
  if (now >= next_prune_unix_ms_) {
    Prune(now);
    next_prune_unix_ms_ = now + std::max<int64_t>(kMinPrunePeriodMs, options_.max_lifetime_ms / 4);
  }
  auto found = signers_.find(signer);
  if (found != signers_.end() && found->second.expires_unix_ms.contains(nonce)) {
    return absl::UnauthenticatedError("auth.nonce: replayed");
  }
  const size_t held = found == signers_.end() ? 0 : found->second.expires_unix_ms.size();
  if (held >= options_.max_nonces_per_signer) {
    return absl::ResourceExhaustedError(
        absl::StrCat("auth.nonce: ", held, " unexpired requests of ", signer, " held, at most ",
                     options_.max_nonces_per_signer, " per signer"));
  }
  if (nonces_ >= options_.max_nonces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "auth.nonce: ", nonces_, " unexpired requests held, at most ", options_.max_nonces));
  }
  if (found == signers_.end()) found = signers_.try_emplace(signer).first;
  found->second.expires_unix_ms.emplace(nonce, auth.expires_unix_ms());
  ++nonces_;
  return signer;
}

void PeerRequestVerifier::Prune(int64_t now_unix_ms) {
  for (auto it = signers_.begin(); it != signers_.end();) {
    auto& table = it->second.expires_unix_ms;
    const size_t before = table.size();
    absl::erase_if(table, [now_unix_ms](const auto& entry) { return entry.second < now_unix_ms; });
    nonces_ -= before - table.size();
    if (table.empty()) {
      signers_.erase(it++);
      continue;
    }
    // flat_hash_map keeps its capacity on erase: a table that held a burst would keep the
    // burst's memory for as long as the signer sends anything.
    if (table.bucket_count() > kShrinkFactor * table.size() + kShrinkSlack) table.rehash(0);
    ++it;
  }
  if (signers_.bucket_count() > kShrinkFactor * signers_.size() + kShrinkSlack) {
    signers_.rehash(0);
  }
}

size_t PeerRequestVerifier::nonces_held() const {
  absl::MutexLock lock(&mu_);
  return nonces_;
}

size_t PeerRequestVerifier::signers_held() const {
  absl::MutexLock lock(&mu_);
  return signers_.size();
}

size_t PeerRequestVerifier::nonce_slots() const {
  absl::MutexLock lock(&mu_);
  size_t slots = signers_.bucket_count();
  for (const auto& [signer, nonces] : signers_) slots += nonces.expires_unix_ms.bucket_count();
  return slots;
}

}  // namespace ts::sidecar
