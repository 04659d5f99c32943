// Members' public keys as the chain stores them, and the check of a 65-byte statement signature
// against such a key. A member's key is learned once, from the reservation signature the chain
// accepted (it recovered to the member's address), and stored in the SEC1 uncompressed form so
// that checking the member's later signatures needs no square root to decompress it. Checking
// R||S against a known key is cheaper than recovering a key and hashing it into an address,
// and accepts exactly the signatures recovery would, except that V is only range-checked.
// Internal to the module.
//
// Pure functions over common/crypto; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_MEMBER_KEY_H_
#define TS_CHAIN_BRIDGE_MODULE_MEMBER_KEY_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/crypto/secp256k1.h"

namespace ts::bridge {

// 0x04 || X || Y.
inline constexpr size_t kMemberKeySize = common::kUncompressedPublicKeySize;

// The uncompressed form of a 33-byte compressed public key. INVALID_ARGUMENT for a wrong size
// or bytes that are not a point on secp256k1.
absl::StatusOr<std::string> UncompressMemberKey(std::string_view compressed);

// True if `signature` (65 bytes R||S||V) is a valid signature of the 32-byte `digest` by
// `member_key` (kMemberKeySize bytes), with the rules of common::VerifyCompact for R||S
// (R and S below the group order, S at most n/2) and V in 0..3. False for anything else,
// malformed inputs included.
bool VerifyWithMemberKey(std::string_view member_key, std::string_view digest,
                         std::string_view signature);

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_MEMBER_KEY_H_
