// Amounts of ngonka: parsing of the base-10 strings Cosmos coins carry, and overflow-checked
// arithmetic. Pure functions; thread-safe.
#ifndef TS_COMMON_AMOUNT_H_
#define TS_COMMON_AMOUNT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ts::common {

inline constexpr std::string_view kDenom = "ngonka";

// Parses a non-negative base-10 integer that fits in uint64: digits only, no sign, no leading
// zeros (except "0"), at most 20 digits. INVALID_ARGUMENT names `field` and the value otherwise.
absl::StatusOr<uint64_t> ParseAmount(std::string_view field, std::string_view value);

std::string FormatAmount(uint64_t amount);

// a + b, or INVALID_ARGUMENT naming `field` if the sum overflows uint64.
absl::StatusOr<uint64_t> CheckedAdd(std::string_view field, uint64_t a, uint64_t b);

}  // namespace ts::common

#endif  // TS_COMMON_AMOUNT_H_
