// Structured logging: one line per record, `ts=<unix ms> level=<l> component=<c> msg="..." k=v`.
// Records go to stderr; thread-safe (one write call per record).
#ifndef TS_COMMON_LOG_H_
#define TS_COMMON_LOG_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ts::common {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Records below this level are dropped. Default kInfo.
void SetLogLevel(LogLevel level);
// Parses "debug" | "info" | "warn" | "error"; false if unknown.
bool ParseLogLevel(std::string_view name, LogLevel* level);

using LogFields = std::vector<std::pair<std::string, std::string>>;

void Log(LogLevel level, std::string_view component, std::string_view message,
         const LogFields& fields = {});

}  // namespace ts::common

#endif  // TS_COMMON_LOG_H_
