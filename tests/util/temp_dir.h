// Test helper: a fresh directory under the test's temporary directory, removed with everything
// in it when the object goes. For unit tests only (it reports a failed mkdtemp as a test
// failure). Not thread-safe: one owner.
#ifndef TS_TESTS_UTIL_TEMP_DIR_H_
#define TS_TESTS_UTIL_TEMP_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "gtest/gtest.h"

namespace ts::test_util {

class TempDir {
 public:
  // `prefix` names the directory (prefix + random suffix), so leftovers say whose they are.
  explicit TempDir(std::string_view prefix) {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / (std::string(prefix) + "XXXXXX")).string();
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << std::strerror(errno);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace ts::test_util

#endif  // TS_TESTS_UTIL_TEMP_DIR_H_
