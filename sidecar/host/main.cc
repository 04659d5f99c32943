// trainshardd: the host sidecar daemon. Reads its TOML config (flags override it), loads the
// host key, opens its records, follows the chain and serves the operator APIs (host, artifact and
// shard run operator) on its owner-only Unix socket <data_dir>/host.sock, the public settlement
// query on `listen`, and the peer-facing artifact transfer service on `shard_listen`, until
// SIGTERM or SIGINT. Exit codes: 0 after a clean shutdown, 2 for a bad
// config, flag or key file (nothing is written then), 1 for any other failure to start.
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/tls_identity.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "sidecar/artifacts/operator_service.h"
#include "sidecar/host/config.h"
#include "sidecar/host/host_core.h"
#include "sidecar/host/host_daemon.h"
#include "sidecar/host/operator_service.h"
#include "sidecar/host/run_check.h"
#include "sidecar/host/run_starter.h"
#include "sidecar/host/shard_processes.h"
#include "sidecar/host/shard_server.h"
#include "sidecar/host/stats_sampler.h"
#include "sidecar/host/stats_server.h"
#include "sidecar/peer/shard_directory.h"
#include "worker/data_shard.h"

namespace ts::sidecar {
namespace {

// The chain client's options from the config: events through block_results when the node's
// CometBFT JSON-RPC is configured.
bridge::ChainClientOptions ChainOptions(const HostConfig& config) {
  bridge::ChainClientOptions options;
  options.rpc_target = config.chain_rpc_endpoint;
  return options;
}

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

// `path` as an absolute path: relative ones are taken from the working directory at start, so a
// later chdir (there is none) or a relative data_dir cannot move the stores.
std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  char cwd[4096];
  if (::getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

// Artifact chunks (1 MiB by default, up to 4 MiB) pass through several buffers each: gRPC's
// slices, the protobuf message, the file read for serving. glibc serves blocks of 128 KiB and
// more with a fresh mmap and unmaps them on free, and trims the heap's free top above 128 KiB,
// so every chunk faulted in new zeroed pages — most of the daemon's CPU during a fetch. Kept
// on the heap and untrimmed, the same pages are reused chunk after chunk; the cost is that the
// daemon keeps its peak heap (bounded by the stream caps: at most a few chunk buffers per
// stream) instead of returning it.
constexpr int kMallocMmapThresholdBytes = 32 << 20;  // glibc's maximum on 64-bit
constexpr int kMallocTrimThresholdBytes = 256 << 20;

void TuneMalloc() {
  // Best effort: a libc that refuses keeps its defaults, which are only slower.
  ::mallopt(M_MMAP_THRESHOLD, kMallocMmapThresholdBytes);
  ::mallopt(M_TRIM_THRESHOLD, kMallocTrimThresholdBytes);
}

// A private folder (mode 0700) for Unix sockets whose paths under the data dir would be too long
// for a socket address: made under /tmp, owned by this process's user, so no other user can
// plant or reach a socket there. Empty if none is needed; `error` set if one cannot be made.
std::string PrivateSocketDir(const std::string& data_root, absl::Status* error) {
  // The longest socket path under the data dir: a shard process's, with a 20-digit shard id.
  const std::string longest = absl::StrCat(data_root, "/shards/18446744073709551615/shard.sock");
  if (longest.size() <= common::kUnixSocketPathMax) return "";
  std::string dir = "/tmp/trainshardd-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    *error = absl::InternalError(
        absl::StrCat("cannot make a socket folder under /tmp: ", strerror(errno)));
    return "";
  }
  return dir;
}

int Main(int argc, char** argv) {
  TuneMalloc();
  // Everything this process and its children create (records, sockets, artifact stores, the
  // address files) is its owner's alone; the operator socket in particular is 0600 from the
  // moment it exists.
  ::umask(077);
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
  const sigset_t signals = common::BlockStopSignals();

  if (absl::Status made = MakeDirs(config.data_dir); !made.ok()) {
    LogError("cannot create the data dir", made);
    return kExitFailure;
  }
  // The host's TLS identity for its peer-facing channels, made at the first start; its
  // certificate's fingerprint goes into every reservation (common/crypto/tls_identity.h).
  auto tls = common::LoadOrCreateTlsIdentity(AbsolutePath(config.data_dir),
                                             common::AddressFromPublicKey(key->public_key()));
  if (!tls.ok()) {
    LogError("cannot load the TLS identity", tls.status());
    return kExitFailure;
  }
  if (!config.tls_cert_sha256.empty() && config.tls_cert_sha256 != tls->cert_sha256) {
    LogError("bad config", absl::InvalidArgumentError(absl::StrCat(
                               "tls_cert_sha256: ", common::HexEncode(config.tls_cert_sha256),
                               " is not the fingerprint of this host's certificate (",
                               common::HexEncode(tls->cert_sha256), " in ", config.data_dir, "/",
                               common::kTlsCertFile, "); remove the key from the config")));
    return kExitBadConfig;
  }
  // Checked by ValidateHostConfig.
  const bridge::ChainProfile profile =
      *bridge::ParseChainProfile("chain_profile", config.chain_profile);
  std::unique_ptr<bridge::ChainClient> chain_client =
      bridge::NewChainClient(profile, config.chain_endpoint, ChainOptions(config));
  HostCoreOptions options;
  options.shard_endpoint = config.shard_endpoint;
  options.tls_cert_sha256 = tls->cert_sha256;
  options.policy = config.policy;
  options.chain_profile = profile;
  options.gonka_node_ids = config.gonka_v0.node_ids;
  options.gonka_refresh_every_blocks = config.gonka_v0.refresh_every_blocks;
  // Published with each opt-in refresh: where the members reach this host's shard services,
  // and the certificate they pin (the chain carries no TLS key in v0).
  options.gonka_endpoint_url =
      bridge::GonkaV0EndpointUrl(config.shard_endpoint, tls->cert_sha256, config.peer_tls);
  // Before it reserves, the host checks it can run the shard's chain-pinned run spec.
  RunCheckLimits run_limits;
  run_limits.worker_memory_bytes_max = config.worker_memory_bytes_max;
  const std::string worker_binary =
      common::SiblingExecutable(config.worker_binary, "ts_worker", "../../worker/ts_worker");
  auto device = ProbeWorkerDevice(worker_binary, config.worker_device,
                                  AbsolutePath(config.data_dir) + "/worker-device.out");
  if (!device.ok()) {
    LogError("the workers cannot train where worker_device says", device.status());
    return kExitBadConfig;
  }
  run_limits.device = *device;
  common::Log(common::LogLevel::kInfo, kComponent, "workers train on",
              {{"device", std::string(worker::DeviceName(device->device))},
               {"name", device->name},
               {"memory_bytes", absl::StrCat(device->memory_bytes)}});
  run_limits.fortunes_dir = std::string(worker::kFortunesDir);
  options.run_check = [run_limits](const pb::ShardSpec& spec) {
    return RunSpecSkipReason(spec, run_limits);
  };
  auto core = HostCore::Open(config.data_dir + "/state", *key, options, chain_client.get(),
                             &common::SystemClock());
  if (!core.ok()) {
    LogError("cannot open the host records", core.status());
    return kExitFailure;
  }
  const std::string& address = (*core)->address();

  // Artifacts: each shard's store under artifacts_dir, its index in the host's database, the
  // shard's members and quota from the chain (through a client of its own, so the follower's
  // calls and the peer checks never wait on each other).
  std::string artifacts_dir = AbsolutePath(ArtifactsDir(config));
  std::unique_ptr<bridge::ChainClient> directory_chain =
      bridge::NewChainClient(profile, config.chain_endpoint, ChainOptions(config));
  ChainShardDirectory directory(directory_chain.get(), &common::SystemClock());
  // Peer requests are signed over the chain id: known from the records after the first contact
  // with the chain, else the shard services wait for it (below).
  std::string chain_id;
  if (auto stored = (*core)->store().MetaString(kMetaChainId); stored.ok()) chain_id = *stored;
  ShardStoreRegistryOptions registry_options;
  registry_options.artifacts_dir = artifacts_dir;
  registry_options.self_address = address;
  registry_options.chain_id = chain_id;
  ShardStoreRegistry registry((*core)->shared_db(), &directory, &common::SystemClock(),
                              registry_options);
  // The operator's publishes read, and its fetches and exports write, only under files_root or
  // a shard's own work folder, never the data dir, the stores or the key file
  // (sidecar/artifacts/file_policy.h).
  ArtifactOperatorOptions artifact_operator_options;
  OperatorFilePolicy file_policy;
  file_policy.files_root = config.files_root;
  file_policy.shards_dir = AbsolutePath(config.data_dir) + "/shards";
  file_policy.protected_paths = {{"the data dir", AbsolutePath(config.data_dir)},
                                 {"the artifact stores", artifacts_dir},
                                 {"the host key file", AbsolutePath(config.key_file)}};
  artifact_operator_options.file_policy = std::move(file_policy);
  // The host's metrics (docs/stats.md), told of artifact traffic as it happens and fed the rest
  // by the stats sampler below.
  HostMetrics metrics;
  artifact_operator_options.observer = &metrics;
  artifact_operator_options.peer_tls = config.peer_tls;
  if (config.peer_tls) {
    // Fetches over peers' chunk streams present this host's certificate.
    auto tls_context = common::TlsContext::New(*tls);
    if (!tls_context.ok()) {
      LogError("cannot load the TLS identity", tls_context.status());
      return kExitFailure;
    }
    artifact_operator_options.tls = *std::move(tls_context);
  }
  ArtifactOperatorService artifact_operator(&registry, &directory, *key, &common::SystemClock(),
                                            artifact_operator_options);

  // Training runs (docs/training.md): one shard process (ts_shard) per shard this host trains
  // in, each driving its own worker process and keeping its own records; they reach this daemon
  // through the operator API on a Unix socket in the data dir (settlement, artifact store).
  HostDaemon daemon(core->get(), config.poll_interval_ms);
  const std::string data_root = AbsolutePath(config.data_dir);
  absl::Status socket_dir_error;
  const std::string socket_dir = PrivateSocketDir(data_root, &socket_dir_error);
  if (!socket_dir_error.ok()) {
    LogError("cannot serve the operator API", socket_dir_error);
    return kExitFailure;
  }
  const std::string host_socket =
      common::UnixSocketPathOr(data_root + "/host.sock", socket_dir + "/host.sock");
  ShardProcessOptions process_options;
  if (!socket_dir.empty()) process_options.fallback_socket_dir = socket_dir;
  process_options.binary =
      common::SiblingExecutable(config.shard_binary, "ts_shard", "../shard/ts_shard");
  process_options.shards_dir = data_root + "/shards";
  process_options.host_socket = host_socket;
  process_options.key_file = AbsolutePath(config.key_file);
  process_options.chain_endpoint = config.chain_endpoint;
  process_options.chain_profile = config.chain_profile;
  process_options.worker_binary = worker_binary;
  process_options.worker_device = config.worker_device;
  process_options.worker_threads = static_cast<int>(config.worker_threads);
  process_options.worker_memory_bytes_max = config.worker_memory_bytes_max;
  process_options.collective_host = EndpointHost(ShardListenAddress(config));
  if (process_options.collective_host == "0.0.0.0" || process_options.collective_host.empty()) {
    process_options.collective_host = EndpointHost(config.shard_endpoint);
  }
  process_options.log_level = config.log_level;
  process_options.peer_tls = config.peer_tls;
  process_options.tls_dir = AbsolutePath(config.data_dir);
  process_options.idle_stop_ms = config.shard_idle_stop_ms;
  ShardProcesses runs((*core)->shared_db(), process_options);

  TransferServiceOptions transfer_options;
  transfer_options.observer = &metrics;
  // The settlement this host signed, beside the artifacts: on a chain that records none
  // (gonka-v0), the payer takes the members' signatures from here (docs/gonka-v0.md).
  SettlementQueryService shard_settlements(core->get());
  // Under peer_tls the listener and the chunk stream serve TLS.
  auto shard_server =
      ShardServer::Start(ShardListenAddress(config), &registry, &directory, address,
                         &common::SystemClock(), config.chunk_stream, transfer_options,
                         {static_cast<grpc::Service*>(static_cast<pb::ShardRound::Service*>(&runs)),
                          &shard_settlements},
                         config.peer_tls ? &*tls : nullptr);
  if (!shard_server.ok()) {
    LogError("cannot serve the shard services", shard_server.status());
    return kExitFailure;
  }
  if (!chain_id.empty()) (*shard_server)->Activate(chain_id);

  // The runs of shards this host reserved start by themselves once RUNNING, with the run spec
  // the chain pins (through a chain client of its own, like the directory's).
  std::unique_ptr<bridge::ChainClient> starter_chain =
      bridge::NewChainClient(profile, config.chain_endpoint, ChainOptions(config));
  RunStarter starter(
      &(*core)->store(), starter_chain.get(),
      [&runs](uint64_t shard_id) { return runs.Info(shard_id).has_value(); },
      [&runs](uint64_t shard_id, const std::string& run_spec) {
        return runs.StartRun(shard_id, run_spec).status();
      });
  OperatorServerOptions operator_options;
  operator_options.socket_path = host_socket;
  operator_options.query_listen = config.listen;
  operator_options.version = kVersion;
  operator_options.extra_services = {
      &artifact_operator,
      static_cast<grpc::Service*>(static_cast<pb::ShardRunOperator::Service*>(&runs))};
  operator_options.records = &runs;
  operator_options.run_starts = [&starter] {
    std::vector<pb::RunStartStatus> out;
    for (const auto& [shard_id, state] : starter.Snapshot()) {
      pb::RunStartStatus& r = out.emplace_back();
      r.set_shard_id(shard_id);
      r.set_started(state.started);
      r.set_waiting_for_operator(state.left_alone);
      r.set_attempts(state.attempts);
      r.set_last_error(state.last_error);
    }
    return out;
  };
  auto server = StartOperatorServer(core->get(), &daemon, operator_options);
  if (!server.ok()) {
    LogError("cannot serve the operator API", server.status());
    return kExitFailure;
  }
  daemon.Start();
  if (!chain_id.empty()) runs.Activate(chain_id);
  starter.Start();

  // The stats page and /metrics (docs/stats.md): a sampler reads the operator API and the
  // chain once a second; the HTTP server hands out its last sample.
  std::unique_ptr<bridge::ChainClient> stats_chain =
      bridge::NewChainClient(profile, config.chain_endpoint, ChainOptions(config));
  StatsSamplerOptions sampler_options;
  sampler_options.operator_target = server->address;
  StatsSampler sampler(stats_chain.get(), &metrics, &common::SystemClock(), sampler_options);
  std::unique_ptr<StatsServer> stats_server;
  if (!config.stats_listen.empty()) {
    sampler.Start();
    StatsSources sources;
    sources.overview_json = [&sampler] { return sampler.OverviewJson(); };
    sources.metrics = &metrics;
    auto started = StatsServer::Start(config.stats_listen, std::move(sources));
    if (!started.ok()) {
      LogError("cannot serve the stats page", started.status());
      sampler.Stop();
      runs.StopAll();
      starter.Stop();
      server->Shutdown(std::chrono::system_clock::now());
      daemon.Stop();
      return kExitFailure;
    }
    stats_server = *std::move(started);
  }

  std::vector<std::pair<std::string, std::string>> addr_files = {
      {"operator.addr", server->address}, {"shard.addr", (*shard_server)->address()}};
  if (!server->query_address.empty()) addr_files.emplace_back("query.addr", server->query_address);
  if (stats_server != nullptr) addr_files.emplace_back("stats.addr", stats_server->address());
  for (const auto& [name, bound] : addr_files) {
    if (absl::Status written = WriteFileAtomically(config.data_dir, name, bound + "\n");
        !written.ok()) {
      LogError("cannot write " + name, written);
      server->Shutdown(std::chrono::system_clock::now());
      daemon.Stop();
      return kExitFailure;
    }
  }
  common::Log(common::LogLevel::kInfo, kComponent, "started",
              {{"version", kVersion},
               {"address", address},
               {"operator", server->address},
               {"query", server->query_address},
               {"stats", stats_server != nullptr ? stats_server->address() : ""},
               {"shard_listen", (*shard_server)->address()},
               {"chunk_stream_port", std::to_string((*shard_server)->chunk_stream_port())},
               {"artifacts_dir", artifacts_dir},
               {"chain", config.chain_endpoint},
               {"data_dir", config.data_dir}});

  int sig = 0;
  while (true) {
    // Wakes up now and then to start the shard services once the follower has learnt the chain
    // id; afterwards only a signal ends the wait.
    timespec wait = {0, 200 * 1000 * 1000};
    if (!(*shard_server)->active()) {
      auto stored = (*core)->store().MetaString(kMetaChainId);
      if (stored.ok() && !stored->empty()) {
        registry.SetChainId(*stored);
        (*shard_server)->Activate(*stored);
        runs.Activate(*stored);
        common::Log(common::LogLevel::kInfo, kComponent, "shard services active",
                    {{"chain_id", *stored}});
      }
    }
    sig = (*shard_server)->active() ? sigwaitinfo(&signals, nullptr)
                                    : sigtimedwait(&signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) break;
  }
  common::Log(common::LogLevel::kInfo, kComponent, "shutting down",
              {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"}});
  // In-flight RPCs get a moment to finish (gRPC also waits this long for idle client
  // connections to go); a fetch in flight stops between chunks and stays resumable. The owner
  // thread then stops after its current command or step, each of which leaves the records
  // consistent, as a SIGKILL would.
  auto grace = std::chrono::system_clock::now() + std::chrono::seconds(1);
  stats_server.reset();
  sampler.Stop();
  runs.StopAll();
  starter.Stop();
  (*shard_server)->Shutdown(grace);
  server->Shutdown(grace);
  daemon.Stop();
  if (!socket_dir.empty()) {
    ::unlink(host_socket.c_str());
    ::rmdir(socket_dir.c_str());
  }
  common::Log(common::LogLevel::kInfo, kComponent, "stopped");
  return 0;
}

}  // namespace
}  // namespace ts::sidecar

int main(int argc, char** argv) { return ts::sidecar::Main(argc, argv); }
