#include "common/amount.h"

#include "absl/strings/str_cat.h"

namespace ts::common {
namespace {

// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which StrCat takes but std::string_view does not convert to.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<uint64_t> ParseAmount(std::string_view field, std::string_view value) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(field), ": '",
                                                   ToAbsl(value.substr(0, 64)),
                                                   "' is not a valid amount: ", ToAbsl(why)));
  };
  if (value.empty()) return bad("empty");
  if (value.size() > 20) return bad("more than 20 digits");
  if (value.size() > 1 && value[0] == '0') return bad("leading zero");
  uint64_t result = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return bad("not a base-10 digit string");
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (result > (UINT64_MAX - digit) / 10) return bad("overflows uint64");
    result = result * 10 + digit;
  }
  return result;
}

std::string FormatAmount(uint64_t amount) { return std::to_string(amount); }

absl::StatusOr<uint64_t> CheckedAdd(std::string_view field, uint64_t a, uint64_t b) {
  if (a > UINT64_MAX - b) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(field), ": sum ", a, " + ", b, " overflows"));
  }
  return a + b;
}

}  // namespace ts::common
