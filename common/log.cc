#include "common/log.h"

#include <unistd.h>

#include <atomic>

#include "common/clock.h"

namespace ts::common {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// Quotes a value when it holds spaces, quotes or '='; escapes quotes and newlines.
std::string Quote(std::string_view v) {
  bool plain = !v.empty();
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\n' || c == '\\') plain = false;
  }
  if (plain) return std::string(v);
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c == '\n' ? ' ' : c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool ParseLogLevel(std::string_view name, LogLevel* level) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == LevelName(l)) {
      *level = l;
      return true;
    }
  }
  return false;
}

void Log(LogLevel level, std::string_view component, std::string_view message,
         const LogFields& fields) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string line =
      absl::StrCat("ts=", SystemClock().NowUnixMs(), " level=", LevelName(level), " component=",
                   // Debian's Abseil has its own absl::string_view, which a
                   // std::string_view does not convert to.
                   absl::string_view(component.data(), component.size()), " msg=", Quote(message));
  for (const auto& [k, v] : fields) absl::StrAppend(&line, " ", k, "=", Quote(v));
  line.push_back('\n');
  // One write() per record so concurrent records do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace ts::common
