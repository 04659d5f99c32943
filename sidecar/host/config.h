// trainshardd configuration: the TOML file, the command-line overrides and their validation.
// Every error names the key and the offending value, so an operator can fix the file without
// reading code. Nothing here touches the disk except LoadHostConfigFile reading the file.
//
// Thread-safety: pure functions over plain values; thread-safe.
#ifndef TS_SIDECAR_HOST_CONFIG_H_
#define TS_SIDECAR_HOST_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::sidecar {

inline constexpr std::string_view kDefaultListen = "127.0.0.1:0";
inline constexpr std::string_view kDefaultStatsListen = "127.0.0.1:0";
inline constexpr int64_t kDefaultPollIntervalMs = 200;
inline constexpr int64_t kMinPollIntervalMs = 10;
inline constexpr int64_t kMaxPollIntervalMs = 60000;
inline constexpr uint32_t kDefaultMaxShards = 4;
inline constexpr uint32_t kMaxShardsLimit = 1024;
inline constexpr size_t kMaxHardwareProfiles = 64;
// The config file is read whole; anything larger is not a config file.
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;

// When and what the host reserves on its own (see docs/host-sidecar.md, "Reservation policy").
struct ReservationPolicy {
  bool auto_reserve = true;
  // Empty: any profile.
  std::vector<std::string> hardware_profiles;
  uint32_t max_shards = kDefaultMaxShards;
  // ngonka per node (escrow / max_nodes) below which the host does not reserve.
  uint64_t min_escrow_per_node = 0;
};

// The gonka-v0 chain profile (docs/gonka-v0.md): the chain picks the nodes, so the host offers
// its ML nodes by opting them in and re-arming the opt-in before Gonka's TTL lapses.
inline constexpr size_t kMaxGonkaNodeIds = 256;  // Gonka's cap on one refresh
inline constexpr size_t kMaxGonkaNodeIdBytes = 128;
struct GonkaV0HostConfig {
  // The host's ML node ids as the chain knows them; 1..kMaxGonkaNodeIds under gonka-v0.
  std::vector<std::string> node_ids;
  // The opt-in is refreshed every this many blocks: half Gonka's default TTL of 200.
  int64_t refresh_every_blocks = 100;
};

struct HostConfig {
  // "trainshard" (this project's module) or "gonka-v0" (Gonka's trainshards v0).
  std::string chain_profile = "trainshard";
  GonkaV0HostConfig gonka_v0;
  std::string chain_endpoint;  // host:port of the chain's gRPC
  // host:port of the chain node's CometBFT JSON-RPC: when set, the host reads each height's
  // events through its block_results (as from any CometBFT node); empty: through the module's
  // gRPC query.
  std::string chain_rpc_endpoint;
  // host:port of the public settlement query (SettlementQuery alone); empty: not served. The
  // operator API is on the Unix socket <data_dir>/host.sock only.
  std::string listen = std::string(kDefaultListen);
  std::string key_file;
  std::string data_dir;
  // host:port of the read-only HTTP stats page, its JSON and /metrics (sidecar/host/
  // stats_server.h; docs/stats.md); empty: not served. Port 0 picks a free port; the bound
  // address is written to <data_dir>/stats.addr.
  std::string stats_listen = std::string(kDefaultStatsListen);
  std::string shard_endpoint;  // host:port advertised in reservations
  // host:port the peer-facing shard services (ArtifactTransfer) bind. Empty: the default,
  // "0.0.0.0:<port of shard_endpoint>" (ShardListenAddress).
  std::string shard_listen;
  // Whether the shard listener also serves chunks over the chunk stream (plain TCP on a port of
  // its own on the same host, announced to members by GetChunkStream; docs/artifacts.md).
  bool chunk_stream = true;
  // TLS on every peer-facing channel (the shard services and their clients: the artifact
  // transfer and its chunk stream, the round service; the shard processes' collective links),
  // with the host's own certificate and the fingerprints reservations pin
  // (sidecar/peer/peer_tls.h, chunk_stream.h, sidecar/collective/tcp_transport.h). False:
  // everything in the clear — the trusted-network switch.
  bool peer_tls = true;
  // Absolute directory of the shards' artifact stores. Empty: the default, <data_dir>/artifacts
  // (ArtifactsDir).
  std::string artifacts_dir;
  // Absolute folder under which the operator's `artifact publish` may read and `artifact fetch`
  // / export may write (sidecar/artifacts/file_policy.h). Empty: none (a shard process's own
  // folder is always allowed for its shard).
  std::string files_root;
  // 32 raw bytes when set in the file; empty means "use the placeholder" (SHA-256 of the host
  // address) until the shard sidecar serves TLS.
  std::string tls_cert_sha256;
  int64_t poll_interval_ms = kDefaultPollIntervalMs;
  // The worker executable the shard runs start (docs/training.md). Empty: `ts_worker` beside
  // trainshardd, else ../../worker/ts_worker from it (the build tree).
  std::string worker_binary;
  // The shard process executable (docs/architecture.md). Empty: `ts_shard` beside trainshardd,
  // else ../shard/ts_shard from it (the build tree).
  std::string shard_binary;
  // A run done (its shard settled) this long has its shard process stopped; 0: never.
  int64_t shard_idle_stop_ms = 60'000;
  int64_t worker_threads = 2;  // torch threads of each worker, 1..256
  // Where workers train: "cpu" (the default), "cuda" (the host does not start without a CUDA
  // device its ts_worker can use) or "auto" (CUDA where available). The host reserves only
  // shards whose run spec's requirements.device and memory its workers meet.
  std::string worker_device = "cpu";
  // The memory each worker may use for a run's fp32 training state (16 bytes a parameter): the
  // host reserves no shard whose chain-pinned run spec needs more, and its workers refuse such a
  // model. 0: the machine's physical memory.
  uint64_t worker_memory_bytes_max = 0;
  std::string log_level = "info";
  ReservationPolicy policy;
};

// Command-line values that replace the file's (unset = keep the file's).
struct HostConfigOverrides {
  std::optional<std::string> data_dir;
  std::optional<std::string> key_file;
  std::optional<std::string> chain_endpoint;
  std::optional<std::string> listen;
  std::optional<std::string> log_level;
};

// Parses TOML text. `source` names the file in messages. INVALID_ARGUMENT naming the key and
// value for a TOML syntax error, an unknown key, a value of the wrong type or out of range.
// Required keys are checked by ValidateHostConfig, after overrides are applied.
absl::StatusOr<HostConfig> ParseHostConfig(std::string_view toml_text, std::string_view source);

// Reads and parses `path`. NOT_FOUND if the file does not exist, INVALID_ARGUMENT if it is
// larger than kMaxConfigFileBytes or does not parse (as ParseHostConfig), PERMISSION_DENIED or
// INTERNAL if it cannot be read.
absl::StatusOr<HostConfig> LoadHostConfigFile(const std::string& path);

void ApplyOverrides(const HostConfigOverrides& overrides, HostConfig* config);

// INVALID_ARGUMENT naming the key and value for a missing required key (chain_endpoint,
// key_file, data_dir, shard_endpoint), a malformed host:port (shard_listen may use port 0), a
// relative artifacts_dir or an unknown log level.
absl::Status ValidateHostConfig(const HostConfig& config);

// shard_listen, or its default "0.0.0.0:<port of shard_endpoint>". For a validated config.
std::string ShardListenAddress(const HostConfig& config);
// artifacts_dir, or its default <data_dir>/artifacts (relative if data_dir is).
std::string ArtifactsDir(const HostConfig& config);

// Splits "host:port" ("[v6]:port" too). INVALID_ARGUMENT naming `key` unless the host is
// non-empty and the port is a number in [min_port, 65535].
absl::Status CheckHostPort(std::string_view key, std::string_view value, int min_port);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_CONFIG_H_
