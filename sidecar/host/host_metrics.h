// HostMetrics: what a host sidecar exposes at /metrics, in the Prometheus text format
// (docs/stats.md lists every series). The values come from what the host's operator API
// reports — the host's status, its shard records and each shard process's run status — fed in
// by the StatsSampler once a second, plus the chain's view of the network; a scrape only
// serializes them, so scraping often costs the host nothing but the serialization.
//
// Counters derived from the run status (rounds certified, bytes exchanged, replays) advance by
// the difference to the last value seen, so they never go down while the sidecar runs; a round
// summary is observed into the duration histograms once, the first time a sample shows it.
// After a restart of the sidecar the series start again from zero, as Prometheus expects of a
// restarted target.
//
// The Prometheus client library stays inside this file's .cc (the header passes protobuf
// messages only).
//
// Thread-safety: thread-safe. Observe* are called by one sampler thread, Render by the HTTP
// server's threads.
#ifndef TS_SIDECAR_HOST_HOST_METRICS_H_
#define TS_SIDECAR_HOST_HOST_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/host.pb.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/artifacts/transfer_observer.h"

namespace ts::sidecar {

// The error kinds counted in trainshard_errors_total{kind}.
inline constexpr std::string_view kErrorFollower = "follower";     // a new run of failed steps
inline constexpr std::string_view kErrorRecords = "records";       // the records refuse writes
inline constexpr std::string_view kErrorRunFailed = "run_failed";  // a shard's run failed
inline constexpr std::string_view kErrorOperatorApi = "operator";  // a sample's read failed
inline constexpr std::string_view kErrorChain = "chain";           // the network's read failed
inline constexpr std::string_view kErrorWorkerRestart = "worker_restart";
inline constexpr std::string_view kErrorShardProcessRestart = "shard_process_restart";

// Distinct peers named in the artifact byte counters; the rest are counted as peer="other", so
// a stream of new members cannot grow the metrics without bound.
inline constexpr size_t kMaxPeerLabels = 256;

class HostMetrics final : public TransferObserver {
 public:
  HostMetrics();
  ~HostMetrics() override;
  HostMetrics(const HostMetrics&) = delete;
  HostMetrics& operator=(const HostMetrics&) = delete;

  // The host's own status: chain height, cursor and lag, pending transactions, weight, events
  // processed, and new follower or records failures.
  void ObserveHost(const ::gonka::trainshard::v1::HostStatusResponse& status);
  // One shard this host knows: its chain status and members, and its run on this host (nullptr
  // when it runs nothing there).
  void ObserveShard(const ::gonka::trainshard::v1::HostShardRecord& record,
                    const ::gonka::trainshard::v1::ShardRunStatus* run);
  // One shard's artifact store on this host: bytes held and the chain's quota (0: none).
  void ObserveStore(uint64_t shard_id, uint64_t bytes, uint64_t quota_bytes);
  // The chain's shards, counted by status.
  void ObserveNetwork(const std::vector<::gonka::trainshard::v1::Shard>& shards);
  void CountError(std::string_view kind);
  // The stats server's requests, by path class ("metrics", "api", "page", "other").
  void CountRequest(std::string_view path_class);

  // TransferObserver: artifact bytes by peer and direction, publishes and fetches in flight and
  // their durations.
  void ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) override;
  void TransferStarted(std::string_view kind) override;
  void TransferEnded(std::string_view kind, double seconds,
                     const ::gonka::trainshard::v1::ArtifactProgress* result) override;

  // Every series in the Prometheus text exposition format (version 0.0.4).
  std::string Render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_HOST_HOST_METRICS_H_
