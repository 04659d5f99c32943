// Hex encoding of byte strings. Pure functions; thread-safe.
#ifndef TS_COMMON_HEX_H_
#define TS_COMMON_HEX_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ts::common {

std::string HexEncode(std::string_view bytes);       // lower case
std::string HexEncodeUpper(std::string_view bytes);  // upper case (Cosmos tx hashes)
// Accepts upper or lower case; INVALID_ARGUMENT on odd length or a non-hex character.
absl::StatusOr<std::string> HexDecode(std::string_view hex);

}  // namespace ts::common

#endif  // TS_COMMON_HEX_H_
