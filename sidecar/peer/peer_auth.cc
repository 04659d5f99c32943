#include "sidecar/peer/peer_auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
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

absl::StatusOr<std::string> PeerRequestVerifier::Verify(const pb::PeerRequestAuth& auth,
                                                        std::string_view method, uint64_t shard_id,
                                                        std::string_view body_bytes) {
  // Cheap checks first, the signature next, the nonce last: only a request that verifies may
  // take a place in the nonce map.
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

  std::string key = absl::StrCat(auth.signer(), auth.nonce());
  absl::MutexLock lock(&mu_);
  if (now >= next_prune_unix_ms_) {
    absl::erase_if(nonces_, [now](const auto& entry) { return entry.second < now; });
    next_prune_unix_ms_ = now + std::max<int64_t>(kMinPrunePeriodMs, options_.max_lifetime_ms / 4);
  }
  if (nonces_.contains(key)) return absl::UnauthenticatedError("auth.nonce: replayed");
  if (nonces_.size() >= options_.max_nonces) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "auth.nonce: ", nonces_.size(), " unexpired requests held, at most ", options_.max_nonces));
  }
  nonces_.emplace(std::move(key), auth.expires_unix_ms());
  return std::move(*recovered);
}

}  // namespace ts::sidecar
