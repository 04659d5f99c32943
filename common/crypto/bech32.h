// Bech32 (BIP-173) and Gonka account addresses: bech32("gonka", RIPEMD160(SHA256(pubkey))).
// Pure functions; thread-safe.
#ifndef TS_COMMON_CRYPTO_BECH32_H_
#define TS_COMMON_CRYPTO_BECH32_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::common {

inline constexpr std::string_view kAddressPrefix = "gonka";

struct Bech32Data {
  std::string hrp;
  std::vector<uint8_t> values;  // 5-bit values, checksum removed
};

// Raw BIP-173 encoding of 5-bit values (each < 32). Lower case.
std::string Bech32EncodeRaw(std::string_view hrp, const std::vector<uint8_t>& values);
// Raw BIP-173 decoding: checks length (<= 90), character set, mixed case, hrp characters,
// separator position and checksum. INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<Bech32Data> Bech32DecodeRaw(std::string_view text);

// Encodes 8-bit bytes (regrouped into 5-bit values with padding).
std::string Bech32Encode(std::string_view hrp, std::string_view bytes);
// Decodes to 8-bit bytes; checks that `hrp` matches and the padding is canonical.
absl::StatusOr<std::string> Bech32Decode(std::string_view expected_hrp, std::string_view text);

// Address of a 33-byte compressed public key.
std::string AddressFromPublicKey(std::string_view public_key,
                                 std::string_view hrp = kAddressPrefix);
// Address of a 20-byte account id (e.g. a module account).
std::string AddressFromBytes(std::string_view id20, std::string_view hrp = kAddressPrefix);
// Returns the 20-byte account id; INVALID_ARGUMENT naming `field` and the value if `address`
// is not a valid bech32 address with prefix `hrp` and a 20-byte payload.
absl::StatusOr<std::string> ParseAddress(std::string_view field, std::string_view address,
                                         std::string_view hrp = kAddressPrefix);

// Module account address: bech32 of the first 20 bytes of SHA256(module name), as Cosmos SDK's
// authtypes.NewModuleAddress.
std::string ModuleAddress(std::string_view module_name, std::string_view hrp = kAddressPrefix);

}  // namespace ts::common

#endif  // TS_COMMON_CRYPTO_BECH32_H_
