// ts_shard: the shard process (docs/architecture.md, "Shard process"). One per host and shard,
// started and supervised by the host sidecar (trainshardd). It runs the host's part in training
// the shard (ShardRun: its worker process, the collective's traffic, the rounds) with a
// database of its own under <shards-dir>/<id>/state (round certificates, the run spec), serves
// ShardRunOperator and ShardRound on a Unix socket (the sidecar forwards operator and peer calls
// to it), and reaches back to the sidecar through its Unix socket (HostLink) for the shard's
// artifact store and the settlement. SIGTERM or SIGINT stops it; its sidecar's death kills it
// (PR_SET_PDEATHSIG SIGKILL, set by the sidecar). A crash leaves the sidecar and the other shards
// running; the sidecar starts it again and the run resumes from its records.
//
// Exit codes: 0 after a clean shutdown, 2 for a bad flag or key file, 1 for any other failure to
// start.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>
#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "chain-bridge/client/chain_client.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/tls_identity.h"
#include "common/crypto/tls_session.h"
#include "common/key_file.h"
#include "common/log.h"
#include "common/process.h"
#include "common/status.h"
#include "sidecar/peer/shard_directory.h"
#include "sidecar/shard/host_link.h"
#include "sidecar/shard/round_peers.h"
#include "sidecar/shard/shard_run_manager.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

constexpr std::string_view kComponent = "ts_shard";
constexpr char kVersion[] = "ts_shard 0.1.0";
constexpr int kExitBadFlags = 2;
constexpr int kExitFailure = 1;
// Peer and operator calls forwarded by the sidecar: certificates (64 per call) and plans.
constexpr int kMaxShardMessageBytes = 16 << 20;

void LogError(std::string_view message, const absl::Status& status) {
  common::Log(common::LogLevel::kError, kComponent, message,
              {{"code", absl::StatusCodeToString(status.code())},
               {"error", std::string(status.message())}});
}

absl::Status CheckSocketPath(const char* field, const std::string& path) {
  if (path.empty() || path.size() > common::kUnixSocketPathMax || path.front() != '/') {
    return absl::InvalidArgumentError(absl::StrCat(field, ": \"", path, "\" must be an absolute ",
                                                   "path of 1..", common::kUnixSocketPathMax,
                                                   " bytes"));
  }
  return absl::OkStatus();
}

struct Flags {
  uint64_t shard_id = 0;
  std::string shards_dir, socket, host_socket, key_file, chain, chain_id, worker_binary;
  std::string chain_profile = "trainshard";
  std::string collective_host = "127.0.0.1", log_level = "info";
  int worker_threads = 2;
  std::string worker_device = "cpu";
  uint64_t worker_memory_bytes_max = 0;
  int64_t heartbeat_ms = 500;
  bool peer_tls = false;
  std::string tls_dir;
};

// Parses the flags into `f`; an exit code when the process ends here (--help, --version, a
// flag CLI11 refuses).
std::optional<int> ParseFlags(int argc, char** argv, Flags* f) {
  CLI::App app{"ts_shard: a host's shard process (started by trainshardd)", "ts_shard"};
  app.add_option("--shard-id", f->shard_id, "the shard")->required();
  app.add_option("--shards-dir", f->shards_dir, "absolute; this shard's folder is <dir>/<id>")
      ->required();
  app.add_option("--socket", f->socket, "Unix socket to serve on")->required();
  app.add_option("--host-socket", f->host_socket, "the host sidecar's Unix socket")->required();
  app.add_option("--key-file", f->key_file, "the host key")->required();
  app.add_option("--chain", f->chain, "chain endpoint (host:port)")->required();
  app.add_option("--chain-id", f->chain_id, "the chain id")->required();
  app.add_option("--chain-profile", f->chain_profile, "the chain's profile: trainshard | gonka-v0");
  app.add_option("--worker-binary", f->worker_binary, "the ts_worker executable")->required();
  app.add_option("--worker-threads", f->worker_threads, "worker threads")
      ->check(CLI::Range(1, 256));
  app.add_option("--worker-device", f->worker_device, "the worker's --device: cpu | cuda | auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--worker-memory-bytes-max", f->worker_memory_bytes_max,
                 "the worker's --memory-bytes-max (0: the machine's memory)");
  app.add_option("--collective-host", f->collective_host, "host the collective listener binds");
  app.add_flag("--peer-tls", f->peer_tls,
               "talk TLS to the other members, pinning the certificates their reservations name");
  app.add_option("--tls-dir", f->tls_dir,
                 "absolute; the host's TLS identity (tls.key, tls.crt), with --peer-tls");
  app.add_option("--heartbeat-ms", f->heartbeat_ms, "collective heartbeat interval")
      ->check(CLI::Range(int64_t{50}, int64_t{60'000}));
  app.add_option("--log-level", f->log_level, "debug | info | warn | error");
  app.set_version_flag("--version", kVersion);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports by exception; this is its one catch site. --help and --version exit 0.
    int code = app.exit(e);
    return code == 0 ? 0 : kExitBadFlags;
  }
  return std::nullopt;
}

absl::Status CheckFlags(const Flags& f) {
  if (f.shard_id == 0) return absl::InvalidArgumentError("--shard-id: 0 is no shard");
  if (f.shards_dir.empty() || f.shards_dir.front() != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards-dir: \"", f.shards_dir, "\" is not an absolute path"));
  }
  TS_RETURN_IF_ERROR(CheckSocketPath("--socket", f.socket));
  TS_RETURN_IF_ERROR(CheckSocketPath("--host-socket", f.host_socket));
  if (f.chain_id.empty()) return absl::InvalidArgumentError("--chain-id: empty");
  TS_RETURN_IF_ERROR(bridge::ParseChainProfile("--chain-profile", f.chain_profile).status());
  if (f.peer_tls && (f.tls_dir.empty() || f.tls_dir.front() != '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-dir: \"", f.tls_dir, "\" is not an absolute path (--peer-tls needs the identity)"));
  }
  return absl::OkStatus();
}

ShardRunOptions RunOptionsOf(const Flags& f) {
  ShardRunOptions o;
  o.worker_binary = f.worker_binary;
  o.worker_threads = f.worker_threads;
  o.worker_device = f.worker_device;
  o.worker_memory_bytes_max = f.worker_memory_bytes_max;
  o.work_root = f.shards_dir;
  o.collective_host = f.collective_host;
  o.heartbeat_interval_ms = f.heartbeat_ms;
  return o;
}

// The host as the runs see it: the chain through its own client (serialized), the artifact
// store and the settlement through the sidecar's link. Everything referenced outlives the runs.
ShardRunHost RunHostOf(const Flags& f, const common::PrivateKey* key, ShardDirectory* directory,
                       HostLink* link, state::Db* db, bridge::ChainClient* chain,
                       absl::Mutex* chain_mu) {
  ShardRunHost h;
  h.key = key;
  h.address = common::AddressFromPublicKey(key->public_key());
  h.chain_id = f.chain_id;
  h.directory = directory;
  h.artifacts = link;
  if (f.peer_tls) {
    // Each member's endpoint is pinned to the certificate its reservation names; an endpoint no
    // member has gets a fingerprint nothing matches, so no call falls back to plaintext.
    h.make_peers = [directory, shard_id = f.shard_id] {
      return MakeGrpcRoundPeers([directory, shard_id](const std::string& endpoint) {
        if (auto view = directory->Get(shard_id); view.ok()) {
          for (const ShardMember& m : view->members) {
            if (m.endpoint == endpoint && !m.tls_cert_sha256.empty()) return m.tls_cert_sha256;
          }
        }
        return std::string(common::kSha256Size, '\0');
      });
    };
  }
  h.db = db;
  h.clock = &common::SystemClock();
  h.chain_shard = [chain, chain_mu](uint64_t id) {
    absl::MutexLock lock(chain_mu);
    return chain->Shard(id);
  };
  h.chain_height = [chain, chain_mu]() -> absl::StatusOr<int64_t> {
    absl::MutexLock lock(chain_mu);
    TS_ASSIGN_OR_RETURN(bridge::ChainStatus status, chain->Status());
    return status.latest_height;
  };
  h.sign_settlement = [link](const pb::Settlement& draft) { return link->SignSettlement(draft); };
  h.submit_settlement = [link](const pb::Settlement& s,
                               const std::vector<pb::SettlementSignature>& sigs) {
    return link->SubmitSettlement(s, sigs);
  };
  return h;
}

// Serves the runs on the shard's socket until SIGINT or SIGTERM; stops the runs, then the
// server (a call in progress keeps its run alive: the manager holds runs by shared ownership).
int Serve(const Flags& f, const std::string& address, ShardRunManager& runs,
          const sigset_t& signals) {
  // The path belongs to this process: a socket left by a killed one is replaced.
  ::unlink(f.socket.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("unix:", f.socket), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(kMaxShardMessageBytes);
  builder.RegisterService(static_cast<pb::ShardRunOperator::Service*>(&runs));
  builder.RegisterService(static_cast<pb::ShardRound::Service*>(&runs));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    LogError("cannot serve", absl::UnavailableError(absl::StrCat("cannot bind unix:", f.socket)));
    return kExitFailure;
  }
  ::chmod(f.socket.c_str(), 0600);
  runs.Activate(f.chain_id);
  common::Log(common::LogLevel::kInfo, kComponent, "started",
              {{"version", kVersion},
               {"shard", absl::StrCat(f.shard_id)},
               {"pid", absl::StrCat(::getpid())},
               {"address", address},
               {"socket", f.socket}});

  int sig = sigwaitinfo(&signals, nullptr);
  common::Log(
      common::LogLevel::kInfo, kComponent, "shutting down",
      {{"shard", absl::StrCat(f.shard_id)}, {"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
  runs.StopAll();
  // The socket file stays: by now a new process of this shard may have bound the path (its
  // sidecar restarted after a crash), and the next start replaces a stale one anyway.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  return 0;
}

int Main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> code = ParseFlags(argc, argv, &f)) return *code;
  common::LogLevel level = common::LogLevel::kInfo;
  common::ParseLogLevel(f.log_level, &level);
  common::SetLogLevel(level);
  if (absl::Status valid = CheckFlags(f); !valid.ok()) {
    LogError("bad flags", valid);
    return kExitBadFlags;
  }
  auto key = common::ReadKeyFile(f.key_file);
  if (!key.ok()) {
    LogError("bad key file", key.status());
    return kExitBadFlags;
  }
  // Under --peer-tls the collective's links are TLS with the host's own identity.
  std::shared_ptr<const common::TlsContext> tls;
  if (f.peer_tls) {
    absl::StatusOr<common::TlsIdentity> identity = common::LoadTlsIdentity(f.tls_dir);
    absl::StatusOr<std::shared_ptr<const common::TlsContext>> context =
        identity.ok() ? common::TlsContext::New(*identity) : identity.status();
    if (!context.ok()) {
      LogError("cannot load the TLS identity", context.status());
      return kExitBadFlags;
    }
    tls = *std::move(context);
  }

  // Signals are taken by sigwait on this thread; every thread started later inherits the mask.
  const sigset_t signals = common::BlockStopSignals();

  const std::string dir = absl::StrCat(f.shards_dir, "/", f.shard_id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    LogError("cannot create the shard folder", absl::InternalError(dir + ": " + ec.message()));
    return kExitFailure;
  }
  auto db = state::Db::Open(dir + "/state", ShardDbOptions());
  if (!db.ok()) {
    LogError("cannot open the shard's records", db.status());
    return kExitFailure;
  }

  // Checked by CheckFlags.
  const bridge::ChainProfile profile =
      *bridge::ParseChainProfile("--chain-profile", f.chain_profile);
  std::unique_ptr<bridge::ChainClient> directory_chain = bridge::NewChainClient(profile, f.chain);
  ChainShardDirectory directory(directory_chain.get(), &common::SystemClock());
  std::unique_ptr<bridge::ChainClient> run_chain = bridge::NewChainClient(profile, f.chain);
  absl::Mutex run_chain_mu;
  HostLink link(f.host_socket);
  ShardRunHost run_host =
      RunHostOf(f, &*key, &directory, &link, db->get(), run_chain.get(), &run_chain_mu);
  run_host.tls = tls;
  run_host.settles_on_chain = profile != bridge::ChainProfile::kGonkaV0;
  ShardRunManager runs(run_host, RunOptionsOf(f));
  return Serve(f, run_host.address, runs, signals);
}

}  // namespace
}  // namespace ts::sidecar

int main(int argc, char** argv) { return ts::sidecar::Main(argc, argv); }
