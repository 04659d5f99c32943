// StatsSampler: what the stats page and /metrics show, read once a second. It reads the host
// through its own operator API (the owner-only Unix socket, as the CLI does: the host's status,
// its shard records, each run's status from its shard process, each store's artifacts) and the
// network from the chain (the shards and the epoch's weights, every few seconds; a shard's
// settlement once it is settled), feeds HostMetrics, and keeps the overview the page reads as
// one JSON document (docs/stats.md gives its shape).
//
// The HTTP server only hands out what the last sample left, so any number of readers cost the
// host, its shard processes and the chain nothing beyond one sample a second, and a slow or
// hostile reader cannot make the host call anyone.
//
// Bounds: at most kMaxSampledRuns run statuses a sample (the newest shards this host is a
// member of), kMaxNetworkShards of the chain's shards in the overview, every call with a
// deadline of call_timeout.
//
// Thread-safety: Start and Stop from one thread; SampleOnce from one thread at a time (the
// sampler's own once started); OverviewJson from any thread.
#ifndef TS_SIDECAR_HOST_STATS_SAMPLER_H_
#define TS_SIDECAR_HOST_STATS_SAMPLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json_fwd.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chain-bridge/client/chain_client.h"
#include "common/clock.h"
#include "gonka/trainshard/v1/host.pb.h"
#include "sidecar/host/host_metrics.h"

namespace ts::sidecar {

inline constexpr size_t kMaxSampledRuns = 32;
inline constexpr size_t kMaxNetworkShards = 100;

struct StatsSamplerOptions {
  // The operator API's gRPC target ("unix:<data_dir>/host.sock").
  std::string operator_target;
  absl::Duration interval = absl::Seconds(1);
  // How often the chain's shards and weights are read (the settlement of a settled shard is read
  // once).
  absl::Duration network_interval = absl::Seconds(5);
  absl::Duration call_timeout = absl::Seconds(2);
};

class StatsSampler {
 public:
  // `chain`, `metrics` and `clock` are not owned and must outlive the sampler.
  StatsSampler(bridge::ChainClient* chain, HostMetrics* metrics, common::Clock* clock,
               StatsSamplerOptions options);
  ~StatsSampler();  // Stop()s
  StatsSampler(const StatsSampler&) = delete;
  StatsSampler& operator=(const StatsSampler&) = delete;

  // Samples now and then every interval on a thread of its own.
  void Start();
  // Ends the thread after its current sample. Idempotent.
  void Stop();

  // One sample: reads everything, updates the metrics and the overview. A read that fails is
  // counted (trainshard_errors_total) and shown in the overview; what was read stands.
  void SampleOnce();

  // The overview the latest sample made ("{}" before the first).
  std::string OverviewJson() const;

 private:
  struct Channels;
  void Loop();
  // The parts of a sample, on the sampling thread: the host's status into `overview`; the
  // chain's shards and weights into network_json_; one of this host's shards as the overview
  // shows it (its record, run, store and settlement), its metrics observed.
  void SampleHost(nlohmann::json& overview);
  void RefreshNetwork();
  nlohmann::json ShardEntry(const ::gonka::trainshard::v1::HostShardRecord& record);

  bridge::ChainClient* const chain_;
  HostMetrics* const metrics_;
  common::Clock* const clock_;
  const StatsSamplerOptions options_;
  std::unique_ptr<Channels> channels_;

  // The sampling thread's own state.
  int64_t next_network_ms_ = 0;
  std::string network_json_;
  std::map<uint64_t, std::string> settlement_json_;  // by shard, once settled
  std::map<uint64_t, uint64_t> quota_bytes_;         // by shard, from the chain's spec

  mutable absl::Mutex mu_;
  std::string overview_ ABSL_GUARDED_BY(mu_) = "{}";
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_STATS_SAMPLER_H_
