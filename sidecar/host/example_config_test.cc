// The example configs under deploy/ (docs/deploy.md): each loads and validates as trainshardd
// reads it, and so does each commented `# key = value` line once uncommented, since a reader
// copies those too. The files are found at run time, so a new example is checked without a new
// test.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "sidecar/host/config.h"

namespace ts::sidecar {
namespace {

std::vector<std::string> ExampleConfigs() {
  std::vector<std::string> out;
  const std::filesystem::path deploy = std::filesystem::path(TS_SOURCE_DIR) / "deploy";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(deploy)) {
    if (entry.is_regular_file() && entry.path().extension() == ".toml") {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "# key = value" -> "key = value"; empty for any other line (prose, a heading, a table).
std::string UncommentedAssignment(const std::string& line) {
  if (line.rfind("# ", 0) != 0) return "";
  const std::string rest = line.substr(2);
  size_t key_end = 0;
  while (key_end < rest.size() &&
         ((rest[key_end] >= 'a' && rest[key_end] <= 'z') || rest[key_end] == '_' ||
          (key_end > 0 && rest[key_end] >= '0' && rest[key_end] <= '9'))) {
    ++key_end;
  }
  if (key_end == 0 || rest.compare(key_end, 3, " = ") != 0) return "";
  return rest;
}

absl::Status LoadAndValidate(const std::string& path) {
  absl::StatusOr<HostConfig> config = LoadHostConfigFile(path);
  if (!config.ok()) return config.status();
  return ValidateHostConfig(*config);
}

TEST(ExampleConfigTest, FindsTheExamples) {
  const std::vector<std::string> files = ExampleConfigs();
  const std::string main_example = std::string(TS_SOURCE_DIR) + "/deploy/trainshardd.example.toml";
  EXPECT_NE(std::find(files.begin(), files.end(), main_example), files.end())
      << main_example << " is missing";
  // The example and the compose file's three hosts at least.
  EXPECT_GE(files.size(), 4u);
}

TEST(ExampleConfigTest, EveryExampleLoads) {
  for (const std::string& path : ExampleConfigs()) {
    absl::Status status = LoadAndValidate(path);
    EXPECT_TRUE(status.ok()) << path << ": " << status;
  }
}

TEST(ExampleConfigTest, EveryCommentedKeyLoadsUncommented) {
  int tried = 0;
  for (const std::string& path : ExampleConfigs()) {
    const std::vector<std::string> lines = ReadLines(path);
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string assignment = UncommentedAssignment(lines[i]);
      if (assignment.empty()) continue;
      std::ostringstream text;
      for (size_t j = 0; j < lines.size(); ++j) text << (j == i ? assignment : lines[j]) << "\n";
      const std::string source = absl::StrCat(path, ":", i + 1);
      absl::StatusOr<HostConfig> config = ParseHostConfig(text.str(), source);
      absl::Status status = config.ok() ? ValidateHostConfig(*config) : config.status();
      EXPECT_TRUE(status.ok()) << source << " uncommented (" << assignment << "): " << status;
      ++tried;
    }
  }
  // deploy/trainshardd.example.toml shows most keys commented at their defaults.
  EXPECT_GE(tried, 10);
}

}  // namespace
}  // namespace ts::sidecar
