// Cat(): absl::StrCat that also takes std::string_view. Debian's Abseil is built with its own
// absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), which StrCat takes but a
// std::string_view does not convert to. Internal to the module. Pure; thread-safe.
#ifndef TS_CHAIN_BRIDGE_MODULE_STR_CAT_H_
#define TS_CHAIN_BRIDGE_MODULE_STR_CAT_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ts::bridge {
namespace str_cat_internal {

inline absl::string_view Piece(std::string_view s) { return {s.data(), s.size()}; }
inline absl::string_view Piece(const std::string& s) { return {s.data(), s.size()}; }
inline absl::string_view Piece(const char* s) { return s; }
inline absl::string_view Piece(absl::string_view s) { return s; }
template <typename T>
requires std::is_arithmetic_v<T> &&(!std::is_same_v<T, char>)&&(!std::is_same_v<T, bool>)T
    Piece(T value) {
  return value;
}

}  // namespace str_cat_internal

template <typename... Parts>
std::string Cat(const Parts&... parts) {
  return absl::StrCat(str_cat_internal::Piece(parts)...);
}

}  // namespace ts::bridge

#endif  // TS_CHAIN_BRIDGE_MODULE_STR_CAT_H_
