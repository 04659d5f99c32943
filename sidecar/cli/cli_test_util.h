// The CLI unit tests' shared helpers (cli_test.cc, cli_host_test.cc): running the CLI in-process,
// describing a result, a temporary directory, and fresh addresses; for tests only.
#ifndef TS_SIDECAR_CLI_CLI_TEST_UTIL_H_
#define TS_SIDECAR_CLI_CLI_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "sidecar/cli/cli.h"

namespace ts::sidecar::cli_testing {

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline CliResult Cli(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  CliResult result;
  result.code = RunCli(args, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

inline std::string Describe(const CliResult& r) {
  return "exit " + std::to_string(r.code) + "\nstdout: " + r.out + "\nstderr: " + r.err;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ts-cli-XXXXXX").string();
    TS_CHECK(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string AddressOf(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

inline std::string FreshAddress() { return AddressOf(common::PrivateKey::Generate()); }

}  // namespace ts::sidecar::cli_testing

#endif  // TS_SIDECAR_CLI_CLI_TEST_UTIL_H_
