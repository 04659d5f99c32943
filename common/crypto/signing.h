// Domain-separated sign bytes for consensus statements (settlements, reservations, round
// certificates, peer requests). The layout, specified in docs/protocol.md, is
//
//   "gonka-trainshard/v1/" || kind || 0x00 || u8(len(chain_id)) || chain_id ||
//   be64(shard_id) || canonical message bytes
//
// and the signature is the 65-byte recoverable secp256k1 signature of SHA-256 of it.
// Pure functions; thread-safe.
#ifndef TS_COMMON_CRYPTO_SIGNING_H_
#define TS_COMMON_CRYPTO_SIGNING_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"

namespace ts::common {

inline constexpr std::string_view kSignDomain = "gonka-trainshard/v1/";

// INVALID_ARGUMENT if kind is not [a-z_]{1,32} or chain_id is empty or longer than 64 bytes.
absl::StatusOr<std::string> SignBytes(std::string_view kind, std::string_view chain_id,
                                      uint64_t shard_id, std::string_view message);

// SHA-256 of SignBytes(...), signed recoverably. Errors as SignBytes.
absl::StatusOr<std::string> SignStatement(const PrivateKey& key, std::string_view kind,
                                          std::string_view chain_id, uint64_t shard_id,
                                          std::string_view message);

// Recovers the signer's bech32 address ("gonka" prefix) of a statement signature. Errors as
// SignBytes and RecoverPublicKey.
absl::StatusOr<std::string> RecoverStatementSigner(std::string_view kind, std::string_view chain_id,
                                                   uint64_t shard_id, std::string_view message,
                                                   std::string_view signature);

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_SIGNING_H_
