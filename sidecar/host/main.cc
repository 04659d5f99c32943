// trainshardd: the host sidecar daemon. Reads its TOML config (flags override it), loads the
// host key, opens its records, follows the chain and serves the operator and settlement query
// APIs until SIGTERM or SIGINT. Exit codes: 0 after a clean shutdown, 2 for a bad config, flag
// or key file (nothing is written then), 1 for any other failure to start.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "chain-bridge/client/chain_client.h"
#include "common/clock.h"
#include "common/key_file.h"
#include "common/log.h"
#include "sidecar/host/config.h"
#include "sidecar/host/host_core.h"
#include "sidecar/host/host_daemon.h"
#include "sidecar/host/operator_service.h"

namespace ts::sidecar {
namespace {

constexpr std::string_view kComponent = "trainshardd";
constexpr char kVersion[] = "trainshardd 0.1.0";
constexpr int kExitBadConfig = 2;
constexpr int kExitFailure = 1;

void LogError(std::string_view message, const absl::Status& status) {
  common::Log(common::LogLevel::kError, kComponent, message,
              {{"code", absl::StatusCodeToString(status.code())},
               {"error", std::string(status.message())}});
}

absl::Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("data_dir: cannot create ", partial, ": ", strerror(errno)));
    }
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("data_dir: ", path, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status WriteFully(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(strerror(errno));
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Temp file, fsync, rename, fsync the directory: readers see the old file or the whole new one.
absl::Status WriteFileAtomically(const std::string& dir, const std::string& name,
                                 const std::string& content) {
  std::string path = dir + "/" + name;
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(tmp, ": ", strerror(errno)));
  absl::Status status = WriteFully(fd, content);
  if (status.ok() && ::fsync(fd) != 0) status = absl::InternalError(strerror(errno));
  ::close(fd);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(strerror(errno));
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": ", status.message()));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  CLI::App app{"trainshardd: the trainshard host sidecar", "trainshardd"};
  std::string config_path;
  HostConfigOverrides overrides;
  std::string data_dir, key_file, chain, listen, log_level;
  app.add_option("--config", config_path, "TOML config file")->required();
  auto* o_data = app.add_option("--data-dir", data_dir, "overrides data_dir");
  auto* o_key = app.add_option("--key-file", key_file, "overrides key_file");
  auto* o_chain = app.add_option("--chain", chain, "overrides chain_endpoint (host:port)");
  auto* o_listen = app.add_option("--listen", listen, "overrides listen (host:port)");
  auto* o_level = app.add_option("--log-level", log_level, "debug | info | warn | error");
  app.set_version_flag("--version", kVersion);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports by exception; this is its one catch site. --help and --version exit 0.
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadConfig;
  }
  if (*o_data) overrides.data_dir = data_dir;
  if (*o_key) overrides.key_file = key_file;
  if (*o_chain) overrides.chain_endpoint = chain;
  if (*o_listen) overrides.listen = listen;
  if (*o_level) overrides.log_level = log_level;

  auto loaded = LoadHostConfigFile(config_path);
  if (!loaded.ok()) {
    LogError("bad config", loaded.status());
    return kExitBadConfig;
  }
  HostConfig config = *std::move(loaded);
  ApplyOverrides(overrides, &config);
  if (absl::Status valid = ValidateHostConfig(config); !valid.ok()) {
    LogError("bad config", valid);
    return kExitBadConfig;
  }
  common::LogLevel level = common::LogLevel::kInfo;
  common::ParseLogLevel(config.log_level, &level);
  common::SetLogLevel(level);
  auto key = common::ReadKeyFile(config.key_file);
  if (!key.ok()) {
    LogError("bad key file", key.status());
    return kExitBadConfig;
  }

  // Signals are taken by sigwait on this thread; every thread started later inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  if (absl::Status made = MakeDirs(config.data_dir); !made.ok()) {
    LogError("cannot create the data dir", made);
    return kExitFailure;
  }
  std::unique_ptr<bridge::ChainClient> chain_client =
      bridge::NewGrpcChainClient(config.chain_endpoint);
  HostCoreOptions options;
  options.shard_endpoint = config.shard_endpoint;
  options.tls_cert_sha256 = config.tls_cert_sha256;
  options.policy = config.policy;
  auto core = HostCore::Open(config.data_dir + "/state", *key, options, chain_client.get(),
                             &common::SystemClock());
  if (!core.ok()) {
    LogError("cannot open the host records", core.status());
    return kExitFailure;
  }
  HostDaemon daemon(core->get(), config.poll_interval_ms);
  auto server = StartOperatorServer(config.listen, core->get(), &daemon, kVersion);
  if (!server.ok()) {
    LogError("cannot serve the operator API", server.status());
    return kExitFailure;
  }
  daemon.Start();
  if (absl::Status written =
          WriteFileAtomically(config.data_dir, "operator.addr", server->address + "\n");
      !written.ok()) {
    LogError("cannot write operator.addr", written);
    server->server->Shutdown();
    daemon.Stop();
    return kExitFailure;
  }
  common::Log(common::LogLevel::kInfo, kComponent, "started",
              {{"version", kVersion},
               {"address", (*core)->address()},
               {"operator", server->address},
               {"chain", config.chain_endpoint},
               {"data_dir", config.data_dir}});

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  common::Log(common::LogLevel::kInfo, kComponent, "shutting down",
              {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  // In-flight RPCs get a moment to finish (gRPC also waits this long for idle client
  // connections to go); the owner thread then stops after its current command or step, each of
  // which leaves the records consistent, as a SIGKILL would.
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  daemon.Stop();
  common::Log(common::LogLevel::kInfo, kComponent, "stopped");
  return 0;
}

}  // namespace
}  // namespace ts::sidecar

int main(int argc, char** argv) { return ts::sidecar::Main(argc, argv); }
