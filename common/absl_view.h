// AsAbsl(): a std::string_view as an absl::string_view. Debian's Abseil is built with its own
// absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0), which absl::StrCat and friends take
// but a std::string_view does not convert to. Pure; thread-safe.
#ifndef TS_COMMON_ABSL_VIEW_H_
#define TS_COMMON_ABSL_VIEW_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace ts::common {

inline absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace ts::common

#endif  // TS_COMMON_ABSL_VIEW_H_
