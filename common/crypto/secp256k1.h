// secp256k1 keys and signatures (libsecp256k1 behind this header), as Cosmos and Gonka use them:
// 33-byte compressed public keys, 64-byte compact R||S signatures with low S (SIGN_MODE_DIRECT),
// and 65-byte recoverable R||S||V signatures (V in 0..3, low S) for consensus statements.
// Every function takes a 32-byte digest, never a message. Thread-safe: the shared context is
// created once and only read afterwards.
#ifndef TS_COMMON_CRYPTO_SECP256K1_H_
#define TS_COMMON_CRYPTO_SECP256K1_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ts::common {

inline constexpr size_t kPublicKeySize = 33;
inline constexpr size_t kUncompressedPublicKeySize = 65;
inline constexpr size_t kCompactSignatureSize = 64;
inline constexpr size_t kRecoverableSignatureSize = 65;

class PrivateKey {
 public:
  // INVALID_ARGUMENT unless `secret` is 32 bytes and a valid scalar (0 < k < n).
  static absl::StatusOr<PrivateKey> FromBytes(std::string_view secret);
  // A fresh key from the operating system's random source.
  static PrivateKey Generate();

  const std::string& secret() const { return secret_; }
  const std::string& public_key() const { return public_key_; }  // 33 bytes, compressed

  // RFC 6979 deterministic signatures over a 32-byte digest (TS_CHECKed size).
  std::string SignCompact(std::string_view digest) const;      // 64 bytes, low S
  std::string SignRecoverable(std::string_view digest) const;  // 65 bytes, low S

 private:
  PrivateKey(std::string secret, std::string public_key)
      : secret_(std::move(secret)), public_key_(std::move(public_key)) {}
  std::string secret_;
  std::string public_key_;
};

// OK if `signature` (64 bytes, low S) is valid for `public_key` (33 bytes compressed, or 65
// bytes uncompressed as UncompressPublicKey returns) over the 32-byte `digest`. INVALID_ARGUMENT
// for malformed inputs (wrong sizes, unparsable key, high S), UNAUTHENTICATED for a well-formed
// signature that does not verify.
absl::Status VerifyCompact(std::string_view public_key, std::string_view digest,
                           std::string_view signature);

// The SEC1 uncompressed form (0x04 || X || Y, 65 bytes) of a 33-byte compressed key. A verifier
// that checks many signatures of one key keeps this form: parsing it needs no square root.
// INVALID_ARGUMENT for a wrong size or bytes that are not a point on secp256k1.
absl::StatusOr<std::string> UncompressPublicKey(std::string_view compressed);

// Recovers the 33-byte compressed public key from a 65-byte recoverable signature over the
// 32-byte digest. INVALID_ARGUMENT for wrong sizes, V > 3 or high S; UNAUTHENTICATED if no key
// can be recovered.
absl::StatusOr<std::string> RecoverPublicKey(std::string_view digest, std::string_view signature);

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_SECP256K1_H_
