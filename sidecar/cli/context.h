// What every `trainshard` command shares: the global options, the output streams, exit codes,
// and the clients of the chain and of host sidecars, created on first use with the deadline of
// --timeout-ms.
//
// Exit codes (docs/cli.md): 0 success; 1 the chain or a host refused; 2 bad usage or bad input;
// 3 the chain or a host cannot be reached.
//
// Thread-safety: one Context per invocation, used by one thread.
#ifndef TS_SIDECAR_CLI_CONTEXT_H_
#define TS_SIDECAR_CLI_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "chain-bridge/client/chain_client.h"
#include "common/crypto/secp256k1.h"
#include "cosmos/base/abci/v1beta1/abci.pb.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"
#include "sidecar/cli/progress.h"

namespace ts::sidecar {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRefused = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

inline constexpr std::string_view kDefaultChain = "127.0.0.1:9090";
inline constexpr std::string_view kChainEnv = "TRAINSHARD_CHAIN";
inline constexpr int64_t kDefaultTimeoutMs = 30000;

struct GlobalOptions {
  std::string chain;  // host:port of the chain's gRPC endpoint
  // The chain's profile: "trainshard", or "gonka-v0", whose shards the shard commands see
  // through the gonka-v0 client's translation (chain-bridge/client/gonka_v0_client.h).
  std::string chain_profile = "trainshard";
  std::string key_file;  // signing key, for the commands that sign
  bool json = false;     // one JSON document on stdout
  int64_t timeout_ms = kDefaultTimeoutMs;
};

class Context {
 public:
  Context(std::ostream& out, std::ostream& err, bool err_is_terminal = false)
      : out_(out), err_(err), err_is_terminal_(err_is_terminal) {}

  GlobalOptions& options() { return options_; }
  const GlobalOptions& options() const { return options_; }
  bool json() const { return options_.json; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  // How long-running operations show their progress on err() (progress.h).
  ProgressMode progress_mode() const { return ProgressModeFor(json(), err_is_terminal_); }

  // The chain client for --chain, each call bounded by --timeout-ms (also the wait for a tx to
  // be included in a block).
  bridge::ChainClient& chain();

  // The key of --key. INVALID_ARGUMENT if --key was not given (naming `command`); otherwise the
  // errors of ReadKeyFile.
  absl::StatusOr<common::PrivateKey> LoadKey(std::string_view command);

  // Failure reporting: each prints "error: ..." on stderr and returns the exit code to use.
  // Bad flags or local input (key files, spec files): exit 2.
  int BadInput(const absl::Status& status);
  // A local operation failed (files, the devnet database): codes that mean the input or the
  // home directory is wrong (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
  // PERMISSION_DENIED, OUT_OF_RANGE) exit 2, anything else 1.
  int LocalFailed(const absl::Status& status);
  // A failed call to `peer` ("chain 127.0.0.1:26657" or "host ..."): UNAVAILABLE and
  // DEADLINE_EXCEEDED mean it could not be reached (exit 3); any other code is a refusal (1).
  int PeerFailed(std::string_view peer, const absl::Status& status);
  int ChainFailed(const absl::Status& status);

  // Prints a tx result: with --json the TxResponse as protobuf JSON, otherwise txhash, code and
  // height. A non-zero code also prints "error: code=<c> codespace=<cs>: <raw_log>" on stderr
  // and returns 1.
  int ReportTx(const cosmos::base::abci::v1beta1::TxResponse& response);
  // Prints "error: code=..." for a tx refused by the chain; returns kExitRefused.
  int TxRefused(const cosmos::base::abci::v1beta1::TxResponse& response);

  // Writes one JSON document and a newline on stdout.
  void PrintJson(const nlohmann::ordered_json& document);
  void PrintProtoJson(const google::protobuf::Message& message);

 private:
  std::ostream& out_;
  std::ostream& err_;
  const bool err_is_terminal_;
  GlobalOptions options_;
  std::unique_ptr<bridge::ChainClient> chain_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_CONTEXT_H_
