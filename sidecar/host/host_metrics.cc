#include "sidecar/host/host_metrics.h"

#include <map>
#include <set>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// Round phases take from a fraction of a second (a tiny model's exchange on loopback) to the
// spec's compute cap (minutes).
const Histogram::BucketBoundaries& DurationBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                                       10,   25,  60,   120, 300, 600, 1800};
  return kBuckets;
}

Family<Gauge>& GaugeFamily(prometheus::Registry& r, const std::string& name,
                           const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}
Family<Counter>& CounterFamily(prometheus::Registry& r, const std::string& name,
                               const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

struct HostMetrics::Impl {
  Impl()
      : registry(std::make_shared<prometheus::Registry>()),
        chain_height(GaugeFamily(*registry, "trainshard_chain_height",
                                 "Latest height of the chain the host has seen.")),
        cursor_height(GaugeFamily(*registry, "trainshard_chain_cursor_height",
                                  "Last height whose events the host has fully processed.")),
        chain_lag(GaugeFamily(*registry, "trainshard_chain_lag_blocks",
                              "Blocks between the chain's height and the host's cursor.")),
        events_processed(CounterFamily(*registry, "trainshard_chain_events_processed_total",
                                       "Chain events the host has processed.")),
        pending_txs(GaugeFamily(*registry, "trainshard_pending_txs",
                                "Transactions the host has sent and not yet seen included.")),
        host_weight(GaugeFamily(*registry, "trainshard_host_weight",
                                "The host's current Proof-of-Compute weight on chain.")),
        follower_up(GaugeFamily(*registry, "trainshard_follower_up",
                                "1 while the host follows the chain, 0 while its steps fail.")),
        errors(CounterFamily(*registry, "trainshard_errors_total", "Errors, by kind.")),
        requests(CounterFamily(*registry, "trainshard_stats_requests_total",
                               "Requests to the stats server, by path.")),
        network_shards(
            GaugeFamily(*registry, "trainshard_network_shards", "The chain's shards, by status.")),
        shard_info(GaugeFamily(*registry, "trainshard_shard_info",
                               "1 for each shard the host knows, labelled with its status.")),
        shard_members(GaugeFamily(*registry, "trainshard_shard_members",
                                  "Members of the shard (reservations on chain).")),
        shard_weight(GaugeFamily(*registry, "trainshard_shard_weight",
                                 "Sum of the frozen weights of the shard's members.")),
        shard_host_weight(GaugeFamily(*registry, "trainshard_shard_host_frozen_weight",
                                      "This host's frozen weight in the shard.")),
        settlement_signed(GaugeFamily(*registry, "trainshard_shard_settlement_signed",
                                      "1 once this host signed the shard's settlement.")),
        run_state(GaugeFamily(*registry, "trainshard_run_state",
                              "1 for the state the shard's run on this host is in.")),
        round_current(
            GaugeFamily(*registry, "trainshard_round_current", "The round the host's run is in.")),
        rounds_planned(GaugeFamily(*registry, "trainshard_rounds_planned",
                                   "Rounds the shard's run spec asks for.")),
        rounds_certified(CounterFamily(*registry, "trainshard_rounds_certified_total",
                                       "Rounds certified by more than 2/3 of the weight.")),
        rounds_contributed(
            CounterFamily(*registry, "trainshard_rounds_contributed_total",
                          "Certified rounds this host's pseudo-gradient was part of.")),
        round_retries(CounterFamily(*registry, "trainshard_round_retries_total",
                                    "Attempts after the first of the rounds this host was in.")),
        train_loss(GaugeFamily(*registry, "trainshard_train_loss",
                               "Train loss (nats per token) of the latest certified round.")),
        eval_loss(GaugeFamily(*registry, "trainshard_eval_loss",
                              "Held-out eval loss (nats per token) of the latest evaluated "
                              "certified round.")),
        initial_eval_loss(GaugeFamily(*registry, "trainshard_initial_eval_loss",
                                      "Held-out eval loss of the round-0 checkpoint.")),
        round_seconds(prometheus::BuildHistogram()
                          .Name("trainshard_round_phase_seconds")
                          .Help("Duration of each part of a certified round on this host: "
                                "inner steps, exchange (allreduce), certify, publish, and the "
                                "whole round.")
                          .Register(*registry)),
        bytes(
            CounterFamily(*registry, "trainshard_bytes_total", "Bytes this host moved, by kind.")),
        worker_restarts(CounterFamily(*registry, "trainshard_worker_restarts_total",
                                      "Times the shard process started its worker again.")),
        process_restarts(CounterFamily(*registry, "trainshard_shard_process_restarts_total",
                                       "Times the sidecar started the shard process again.")),
        replays(CounterFamily(*registry, "trainshard_replays_total",
                              "Replays of other members' rounds this host ran, by result.")),
        marks(GaugeFamily(*registry, "trainshard_marks",
                          "This host's marks in the shard's certified verdicts.")),
        inner_seconds(CounterFamily(*registry, "trainshard_inner_seconds_total",
                                    "Seconds the worker spent on inner steps.")),
        replay_seconds(CounterFamily(*registry, "trainshard_replay_seconds_total",
                                     "Seconds the worker spent replaying and re-evaluating.")),
        parameters(GaugeFamily(*registry, "trainshard_model_parameters",
                               "Parameters of the shard's model.")),
        checkpoint_bytes(GaugeFamily(*registry, "trainshard_checkpoint_bytes",
                                     "Bytes of the shard's checkpoint artifact.")),
        store_bytes(GaugeFamily(*registry, "trainshard_store_bytes",
                                "Bytes held in the shard's artifact store on this host.")),
        store_quota(GaugeFamily(*registry, "trainshard_store_quota_bytes",
                                "The shard's artifact quota on chain (0: none set).")),
        artifact_bytes(CounterFamily(*registry, "trainshard_artifact_bytes_total",
                                     "Artifact chunk bytes, by direction (served to a member, "
                                     "fetched from one) and peer.")),
        artifact_chunks(CounterFamily(*registry, "trainshard_artifact_chunks_served_total",
                                      "Artifact chunks served, by way (grpc, chunk_stream).")),
        transfer_seconds(prometheus::BuildHistogram()
                             .Name("trainshard_transfer_seconds")
                             .Help("Duration of artifact publishes and fetches, by result.")
                             .Register(*registry)),
        transfers_in_flight(GaugeFamily(*registry, "trainshard_transfers_in_flight",
                                        "Artifact publishes and fetches running now.")) {}

  // The peer label for `peer`: itself among the first kMaxPeerLabels seen, else "other".
  std::string PeerLabel(const std::string& peer) {
    absl::MutexLock lock(&peers_mu);
    if (peers.contains(peer)) return peer;
    if (peers.size() >= kMaxPeerLabels) return "other";
    peers.insert(peer);
    return peer;
  }

  // Advances `family{labels}` to `value`: by the difference to the last value seen, or by the
  // whole value when the source went back (it restarted, as a counter does). Returns the step.
  double AdvanceTo(Family<Counter>& family, const Labels& labels, double value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string key = family.GetName();
    for (const auto& [k, v] : labels) absl::StrAppend(&key, "|", k, "=", v);
    auto [it, inserted] = last_counter_values.try_emplace(key, 0.0);
    double delta = value >= it->second ? value - it->second : value;
    if (delta > 0) family.Add(labels).Increment(delta);
    it->second = value;
    return delta;
  }

  // Sets the one "1" member of an info-style family for a shard, removing the one before.
  void SetInfo(Family<Gauge>& family, std::map<uint64_t, Gauge*>& current, uint64_t shard_id,
               Labels labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Gauge& gauge = family.Add(labels);
    auto it = current.find(shard_id);
    if (it != current.end() && it->second != &gauge) family.Remove(it->second);
    current[shard_id] = &gauge;
    gauge.Set(1);
  }

  std::shared_ptr<prometheus::Registry> registry;
  Family<Gauge>& chain_height;
  Family<Gauge>& cursor_height;
  Family<Gauge>& chain_lag;
  Family<Counter>& events_processed;
  Family<Gauge>& pending_txs;
  Family<Gauge>& host_weight;
  Family<Gauge>& follower_up;
  Family<Counter>& errors;
  Family<Counter>& requests;
  Family<Gauge>& network_shards;
  Family<Gauge>& shard_info;
  Family<Gauge>& shard_members;
  Family<Gauge>& shard_weight;
  Family<Gauge>& shard_host_weight;
  Family<Gauge>& settlement_signed;
  Family<Gauge>& run_state;
  Family<Gauge>& round_current;
  Family<Gauge>& rounds_planned;
  Family<Counter>& rounds_certified;
  Family<Counter>& rounds_contributed;
  Family<Counter>& round_retries;
  Family<Gauge>& train_loss;
  Family<Gauge>& eval_loss;
  Family<Gauge>& initial_eval_loss;
  Family<Histogram>& round_seconds;
  Family<Counter>& bytes;
  Family<Counter>& worker_restarts;
  Family<Counter>& process_restarts;
  Family<Counter>& replays;
  Family<Gauge>& marks;
  Family<Counter>& inner_seconds;
  Family<Counter>& replay_seconds;
  Family<Gauge>& parameters;
  Family<Gauge>& checkpoint_bytes;
  Family<Gauge>& store_bytes;
  Family<Gauge>& store_quota;
  Family<Counter>& artifact_bytes;
  Family<Counter>& artifact_chunks;
  Family<Histogram>& transfer_seconds;
  Family<Gauge>& transfers_in_flight;

  absl::Mutex peers_mu;
  std::set<std::string> peers ABSL_GUARDED_BY(peers_mu);

  absl::Mutex mu;
  std::map<std::string, double> last_counter_values ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Gauge*> shard_status_gauges ABSL_GUARDED_BY(mu);
  std::map<uint64_t, Gauge*> run_state_gauges ABSL_GUARDED_BY(mu);
  // Per shard, the highest round whose summary was observed into the histograms.
  std::map<uint64_t, uint64_t> last_round_observed ABSL_GUARDED_BY(mu);
  int64_t follower_error_since_ms ABSL_GUARDED_BY(mu) = 0;
  int64_t records_error_since_ms ABSL_GUARDED_BY(mu) = 0;
  std::set<uint64_t> failed_runs ABSL_GUARDED_BY(mu);
  std::set<std::string> network_statuses ABSL_GUARDED_BY(mu);
};

HostMetrics::HostMetrics() : impl_(std::make_unique<Impl>()) {}
HostMetrics::~HostMetrics() = default;

void HostMetrics::ObserveHost(const pb::HostStatusResponse& status) {
  Impl& m = *impl_;
  absl::MutexLock lock(&m.mu);
  m.chain_height.Add({}).Set(static_cast<double>(status.chain_height()));
  m.cursor_height.Add({}).Set(static_cast<double>(status.cursor_height()));
  m.chain_lag.Add({}).Set(
      static_cast<double>(std::max<int64_t>(0, status.chain_height() - status.cursor_height())));
  m.AdvanceTo(m.events_processed, {}, static_cast<double>(status.events_processed()));
  m.pending_txs.Add({}).Set(status.pending_txs());
  m.host_weight.Add({}).Set(static_cast<double>(status.current_weight()));
  m.follower_up.Add({}).Set(status.follower_error().empty() ? 1 : 0);
  // A failure counts once per run of failed steps (its start time), not once per sample.
  if (status.follower_error_since_unix_ms() != 0 &&
      status.follower_error_since_unix_ms() != m.follower_error_since_ms) {
    m.errors.Add({{"kind", std::string(kErrorFollower)}}).Increment();
  }
  m.follower_error_since_ms = status.follower_error_since_unix_ms();
  if (status.records_error_since_unix_ms() != 0 &&
      status.records_error_since_unix_ms() != m.records_error_since_ms) {
    m.errors.Add({{"kind", std::string(kErrorRecords)}}).Increment();
  }
  m.records_error_since_ms = status.records_error_since_unix_ms();
}

void HostMetrics::ObserveShard(const pb::HostShardRecord& record, const pb::ShardRunStatus* run) {
  Impl& m = *impl_;
  const uint64_t id = record.shard_id();
  const std::string shard = absl::StrCat(id);
  absl::MutexLock lock(&m.mu);
  m.SetInfo(m.shard_info, m.shard_status_gauges, id,
            {{"shard", shard}, {"status", pb::ShardStatus_Name(record.status())}});
  m.shard_members.Add({{"shard", shard}}).Set(record.members_size());
  m.shard_weight.Add({{"shard", shard}}).Set(static_cast<double>(record.total_weight()));
  m.shard_host_weight.Add({{"shard", shard}}).Set(static_cast<double>(record.frozen_weight()));
  m.settlement_signed.Add({{"shard", shard}}).Set(record.settlement_signed() ? 1 : 0);
  if (run == nullptr) return;

  m.SetInfo(m.run_state, m.run_state_gauges, id, {{"shard", shard}, {"state", run->state()}});
  if (run->state() == "failed" && m.failed_runs.insert(id).second) {
    m.errors.Add({{"kind", std::string(kErrorRunFailed)}}).Increment();
  }
  m.round_current.Add({{"shard", shard}}).Set(static_cast<double>(run->current_round()));
  m.rounds_planned.Add({{"shard", shard}}).Set(static_cast<double>(run->rounds_total()));
  m.AdvanceTo(m.rounds_certified, {{"shard", shard}}, static_cast<double>(run->certified_round()));
  m.AdvanceTo(m.bytes, {{"shard", shard}, {"kind", "collective"}},
              static_cast<double>(run->bytes_exchanged()));
  m.AdvanceTo(m.inner_seconds, {{"shard", shard}}, run->inner_seconds());
  m.AdvanceTo(m.replay_seconds, {{"shard", shard}}, run->replay_seconds());
  if (double restarts = m.AdvanceTo(m.worker_restarts, {{"shard", shard}}, run->worker_restarts());
      restarts > 0) {
    m.errors.Add({{"kind", std::string(kErrorWorkerRestart)}}).Increment(restarts);
  }
  if (double restarts =
          m.AdvanceTo(m.process_restarts, {{"shard", shard}}, run->shard_process_restarts());
      restarts > 0) {
    m.errors.Add({{"kind", std::string(kErrorShardProcessRestart)}}).Increment(restarts);
  }
  m.AdvanceTo(m.replays, {{"shard", shard}, {"result", "passed"}}, run->replays_passed());
  m.AdvanceTo(m.replays, {{"shard", shard}, {"result", "failed"}},
              run->replays() - std::min(run->replays(), run->replays_passed()));
  m.marks.Add({{"shard", shard}}).Set(run->marks());
  m.parameters.Add({{"shard", shard}}).Set(static_cast<double>(run->parameters()));
  m.checkpoint_bytes.Add({{"shard", shard}}).Set(static_cast<double>(run->checkpoint_bytes()));
  if (run->initial_eval_loss_micro() != 0) {
    m.initial_eval_loss.Add({{"shard", shard}}).Set(run->initial_eval_loss_micro() / 1e6);
  }

  // Rounds come oldest first; each is observed once.
  uint64_t& last = m.last_round_observed[id];
  const pb::RoundSummary* latest = nullptr;
  const pb::RoundSummary* latest_evaluated = nullptr;
  for (const pb::RoundSummary& r : run->rounds()) {
    if (latest == nullptr || r.round() >= latest->round()) latest = &r;
    if (r.eval_loss_micro() != 0 &&
        (latest_evaluated == nullptr || r.round() >= latest_evaluated->round())) {
      latest_evaluated = &r;
    }
    if (r.round() <= last) continue;
    m.rounds_contributed.Add({{"shard", shard}}).Increment();
    if (r.attempt() > 0) m.round_retries.Add({{"shard", shard}}).Increment(r.attempt());
    const std::pair<const char*, double> phases[] = {{"inner", r.inner_seconds()},
                                                     {"exchange", r.exchange_seconds()},
                                                     {"certify", r.certify_seconds()},
                                                     {"publish", r.publish_seconds()},
                                                     {"round", r.round_seconds()}};
    // A round caught up on (no inner steps here) has no parts to time.
    if (r.round_seconds() > 0) {
      for (const auto& [phase, seconds] : phases) {
        m.round_seconds.Add({{"shard", shard}, {"phase", phase}}, DurationBuckets())
            .Observe(seconds);
      }
    }
  }
  if (latest != nullptr) {
    last = std::max(last, latest->round());
    m.train_loss.Add({{"shard", shard}}).Set(latest->train_loss());
  }
  if (latest_evaluated != nullptr) {
    m.eval_loss.Add({{"shard", shard}}).Set(latest_evaluated->eval_loss_micro() / 1e6);
  }
}

void HostMetrics::ObserveStore(uint64_t shard_id, uint64_t bytes, uint64_t quota_bytes) {
  const std::string shard = absl::StrCat(shard_id);
  impl_->store_bytes.Add({{"shard", shard}}).Set(static_cast<double>(bytes));
  impl_->store_quota.Add({{"shard", shard}}).Set(static_cast<double>(quota_bytes));
}

void HostMetrics::ObserveNetwork(const std::vector<pb::Shard>& shards) {
  Impl& m = *impl_;
  std::map<std::string, int> counts;
  for (const pb::Shard& s : shards) ++counts[pb::ShardStatus_Name(s.status())];
  absl::MutexLock lock(&m.mu);
  // A status no shard has any more reads 0 rather than vanishing, so a dashboard sees it drop.
  for (const std::string& status : m.network_statuses) counts.try_emplace(status, 0);
  for (const auto& [status, count] : counts) {
    m.network_shards.Add({{"status", status}}).Set(count);
    m.network_statuses.insert(status);
  }
}

void HostMetrics::CountError(std::string_view kind) {
  impl_->errors.Add({{"kind", std::string(kind)}}).Increment();
}

void HostMetrics::CountRequest(std::string_view path_class) {
  impl_->requests.Add({{"path", std::string(path_class)}}).Increment();
}

void HostMetrics::ChunkServed(const std::string& peer, std::string_view way, uint64_t bytes) {
  impl_->artifact_bytes.Add({{"direction", "served"}, {"peer", impl_->PeerLabel(peer)}})
      .Increment(static_cast<double>(bytes));
  impl_->artifact_chunks.Add({{"way", std::string(way)}}).Increment();
}

void HostMetrics::TransferStarted(std::string_view kind) {
  impl_->transfers_in_flight.Add({{"kind", std::string(kind)}}).Increment();
}

void HostMetrics::TransferEnded(std::string_view kind, double seconds,
                                const pb::ArtifactProgress* result) {
  impl_->transfers_in_flight.Add({{"kind", std::string(kind)}}).Decrement();
  impl_->transfer_seconds
      .Add({{"kind", std::string(kind)}, {"result", result != nullptr ? "ok" : "error"}},
           DurationBuckets())
      .Observe(seconds);
  if (result == nullptr) return;
  for (const auto& [peer, bytes] : result->bytes_by_peer()) {
    impl_->artifact_bytes.Add({{"direction", "fetched"}, {"peer", impl_->PeerLabel(peer)}})
        .Increment(static_cast<double>(bytes));
  }
}

std::string HostMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace ts::sidecar
