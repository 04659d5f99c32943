#include "common/crypto/secp256k1.h"

#include <openssl/rand.h>
#include <secp256k1.h>
#include <secp256k1_recovery.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "common/status.h"

namespace ts::common {
namespace {

constexpr size_t kSecretSize = 32;
constexpr size_t kDigestSize = 32;

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// One context for the process. It is randomized once, before any other thread can see it (the
// static initializer is thread-safe), and only read afterwards, which libsecp256k1 allows from
// many threads at once. Randomization blinds the signing computations against side channels.
const secp256k1_context* Context() {
  static const secp256k1_context* ctx = [] {
    secp256k1_context* c = secp256k1_context_create(SECP256K1_CONTEXT_NONE);
    TS_CHECK(c != nullptr);
    std::array<unsigned char, 32> seed;
    TS_CHECK(RAND_bytes(seed.data(), static_cast<int>(seed.size())) == 1);
    TS_CHECK(secp256k1_context_randomize(c, seed.data()) == 1);
    return c;
  }();
  return ctx;
}

std::string SerializeCompressed(const secp256k1_pubkey& key) {
  std::string out(kPublicKeySize, '\0');
  size_t len = out.size();
  TS_CHECK(secp256k1_ec_pubkey_serialize(Context(), reinterpret_cast<unsigned char*>(out.data()),
                                         &len, &key, SECP256K1_EC_COMPRESSED) == 1);
  TS_CHECK(len == kPublicKeySize);
  return out;
}

// True if S is above n/2. secp256k1_ecdsa_signature_normalize reports whether it had to change
// the signature, which is exactly the high-S test; the normalized copy is discarded.
bool IsHighS(const secp256k1_ecdsa_signature& sig) {
  secp256k1_ecdsa_signature normalized;
  return secp256k1_ecdsa_signature_normalize(Context(), &normalized, &sig) == 1;
}

}  // namespace

absl::StatusOr<PrivateKey> PrivateKey::FromBytes(std::string_view secret) {
  if (secret.size() != kSecretSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("private key: ", secret.size(), " bytes, want ", kSecretSize));
  }
  if (secp256k1_ec_seckey_verify(Context(), Bytes(secret)) != 1) {
    return absl::InvalidArgumentError("private key: not a scalar in [1, n-1]");
  }
  secp256k1_pubkey pub;
  TS_CHECK(secp256k1_ec_pubkey_create(Context(), &pub, Bytes(secret)) == 1);
  return PrivateKey(std::string(secret), SerializeCompressed(pub));
}

PrivateKey PrivateKey::Generate() {
  std::string secret(kSecretSize, '\0');
  // A uniform 32-byte string is out of range with probability about 2^-128; loop anyway.
  for (;;) {
    TS_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()),
                        static_cast<int>(secret.size())) == 1);
    auto key = FromBytes(secret);
    if (key.ok()) return *std::move(key);
  }
}

std::string PrivateKey::SignCompact(std::string_view digest) const {
  TS_CHECK(digest.size() == kDigestSize);
  secp256k1_ecdsa_signature sig;
  // A null nonce function selects RFC 6979; libsecp256k1 always emits low S.
  TS_CHECK(secp256k1_ecdsa_sign(Context(), &sig, Bytes(digest), Bytes(secret_), nullptr, nullptr) ==
           1);
  std::string out(kCompactSignatureSize, '\0');
  TS_CHECK(secp256k1_ecdsa_signature_serialize_compact(
               Context(), reinterpret_cast<unsigned char*>(out.data()), &sig) == 1);
  return out;
}

std::string PrivateKey::SignRecoverable(std::string_view digest) const {
  TS_CHECK(digest.size() == kDigestSize);
  secp256k1_ecdsa_recoverable_signature sig;
  TS_CHECK(secp256k1_ecdsa_sign_recoverable(Context(), &sig, Bytes(digest), Bytes(secret_), nullptr,
                                            nullptr) == 1);
  std::string out(kRecoverableSignatureSize, '\0');
  int recid = -1;
  TS_CHECK(secp256k1_ecdsa_recoverable_signature_serialize_compact(
               Context(), reinterpret_cast<unsigned char*>(out.data()), &recid, &sig) == 1);
  TS_CHECK(recid >= 0 && recid <= 3);
  out[64] = static_cast<char>(recid);
  return out;
}

absl::StatusOr<std::string> UncompressPublicKey(std::string_view compressed) {
  if (compressed.size() != kPublicKeySize) {
    return absl::InvalidArgumentError(
        absl::StrCat("public key: ", compressed.size(), " bytes, want ", kPublicKeySize));
  }
  secp256k1_pubkey pub;
  if (secp256k1_ec_pubkey_parse(Context(), &pub, Bytes(compressed), compressed.size()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("public key: ", HexEncode(compressed), " is not a point on secp256k1"));
  }
  std::string out(kUncompressedPublicKeySize, '\0');
  size_t size = out.size();
  TS_CHECK(secp256k1_ec_pubkey_serialize(Context(), reinterpret_cast<unsigned char*>(out.data()),
                                         &size, &pub, SECP256K1_EC_UNCOMPRESSED) == 1 &&
           size == kUncompressedPublicKeySize);
  return out;
}

absl::Status VerifyCompact(std::string_view public_key, std::string_view digest,
                           std::string_view signature) {
  bool uncompressed = public_key.size() == kUncompressedPublicKeySize && public_key[0] == 0x04;
  if (public_key.size() != kPublicKeySize && !uncompressed) {
    return absl::InvalidArgumentError(absl::StrCat("public key: ", public_key.size(),
                                                   " bytes, want ", kPublicKeySize,
                                                   " (or 65 starting with 0x04)"));
  }
  if (digest.size() != kDigestSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest: ", digest.size(), " bytes, want ", kDigestSize));
  }
  if (signature.size() != kCompactSignatureSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("signature: ", signature.size(), " bytes, want ", kCompactSignatureSize));
  }
  // Keys on the wire are compressed (Cosmos); the uncompressed form is only what a verifier
  // keeps for keys it checks often. Hybrid encodings (0x06/0x07) are excluded above.
  secp256k1_pubkey pub;
  if (secp256k1_ec_pubkey_parse(Context(), &pub, Bytes(public_key), public_key.size()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("public key: ", HexEncode(public_key), " is not a point on secp256k1"));
  }
  secp256k1_ecdsa_signature sig;
  if (secp256k1_ecdsa_signature_parse_compact(Context(), &sig, Bytes(signature)) != 1) {
    return absl::InvalidArgumentError("signature: R or S is not below the group order");
  }
  // secp256k1_ecdsa_verify would also refuse a high S, but as a mismatch; a high S is a
  // malleated encoding, which callers treat as malformed rather than as a wrong signer.
  if (IsHighS(sig)) {
    return absl::InvalidArgumentError("signature: S is above n/2 (not low-S)");
  }
  if (secp256k1_ecdsa_verify(Context(), &sig, Bytes(digest), &pub) != 1) {
    return absl::UnauthenticatedError("signature does not verify for this key and digest");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecoverPublicKey(std::string_view digest, std::string_view signature) {
  if (digest.size() != kDigestSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("digest: ", digest.size(), " bytes, want ", kDigestSize));
  }
  if (signature.size() != kRecoverableSignatureSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("signature: ", signature.size(), " bytes, want ", kRecoverableSignatureSize));
  }
  const int recid = static_cast<unsigned char>(signature[64]);
  if (recid > 3) {
    return absl::InvalidArgumentError(absl::StrCat("signature: V is ", recid, ", want 0..3"));
  }
  secp256k1_ecdsa_recoverable_signature rsig;
  if (secp256k1_ecdsa_recoverable_signature_parse_compact(Context(), &rsig, Bytes(signature),
                                                          recid) != 1) {
    return absl::InvalidArgumentError("signature: R or S is not below the group order");
  }
  // secp256k1_ecdsa_recover accepts a high S (it would recover the same key as the low-S twin
  // with the other V), so the malleated form is refused here explicitly.
  secp256k1_ecdsa_signature plain;
  TS_CHECK(secp256k1_ecdsa_recoverable_signature_convert(Context(), &plain, &rsig) == 1);
  if (IsHighS(plain)) {
    return absl::InvalidArgumentError("signature: S is above n/2 (not low-S)");
  }
  secp256k1_pubkey pub;
  if (secp256k1_ecdsa_recover(Context(), &pub, &rsig, Bytes(digest)) != 1) {
    return absl::UnauthenticatedError("signature: no public key can be recovered");
  }
  return SerializeCompressed(pub);
}

}  // namespace ts::common
