// StatsServer: the host sidecar's read-only HTTP face on `stats_listen` (docs/stats.md): the
// live stats page (its three files built into the binary), the page's JSON
// (/api/v1/overview) and the Prometheus metrics (/metrics). It serves what the StatsSampler's
// last sample left and nothing else: no request reaches the host's records, its shard
// processes, its key or the chain, so a reader can neither change the host nor make it work.
//
// Who can reach it (docs/threat-model.md): whoever reaches stats_listen (loopback by default).
// What it shows is what the chain and the host's peers see anyway (shards, members, rounds,
// losses, pay), never a key, a path of the operator's files or a run spec's data. Bounds: GET
// and HEAD only (405 otherwise), requests of at most kMaxStatsRequestBytes, kStatsThreads
// threads, kStatsRequestTimeoutMs for a request to arrive and be answered, no keep-alive, no
// file system under it.
//
// The HTTP library (civetweb) stays inside this file's .cc.
//
// Thread-safety: Start, address and the destructor from one thread; the handlers run on the
// server's threads and call the sources from there.
#ifndef TS_SIDECAR_HOST_STATS_SERVER_H_
#define TS_SIDECAR_HOST_STATS_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "sidecar/host/host_metrics.h"

namespace ts::sidecar {

inline constexpr int kStatsThreads = 4;
inline constexpr int kMaxStatsRequestBytes = 8 << 10;
inline constexpr int kStatsRequestTimeoutMs = 10'000;

struct StatsSources {
  std::function<std::string()> overview_json;  // the body of /api/v1/overview
  HostMetrics* metrics = nullptr;              // /metrics; also counts the requests
};

class StatsServer {
 public:
  // Binds `listen` (host:port; port 0 picks one). INVALID_ARGUMENT for a listen address the
  // server cannot use, UNAVAILABLE when it cannot bind (the port taken), with the server's
  // reason. `sources.metrics` must outlive the server.
  static absl::StatusOr<std::unique_ptr<StatsServer>> Start(const std::string& listen,
                                                            StatsSources sources);
  ~StatsServer();  // stops serving; waits for the requests in progress
  StatsServer(const StatsServer&) = delete;
  StatsServer& operator=(const StatsServer&) = delete;

  // "host:port" as bound.
  const std::string& address() const { return address_; }

 private:
  struct Context;
  StatsServer() = default;

  std::unique_ptr<Context> context_;
  std::string address_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_STATS_SERVER_H_
