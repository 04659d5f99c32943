#include "sidecar/host/host_metrics.h"

#include <optional>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;

// The value of the series written exactly as `series` (name and labels) in the text format;
// nullopt when it is absent.
std::optional<double> Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

pb::ShardRunStatus RunStatus(uint64_t certified, uint64_t bytes) {
  pb::ShardRunStatus run;
  run.set_shard_id(7);
  run.set_state("training");
  run.set_certified_round(certified);
  run.set_current_round(certified + 1);
  run.set_rounds_total(10);
  run.set_bytes_exchanged(bytes);
  for (uint64_t r = 1; r <= certified; ++r) {
    pb::RoundSummary* s = run.add_rounds();
    s->set_round(r);
    s->set_attempt(r == 2 ? 1 : 0);
    s->set_train_loss(6.0f - static_cast<float>(r) * 0.5f);
    s->set_eval_loss_micro(r % 2 == 1 ? 6'000'000 - static_cast<int64_t>(r) * 100'000 : 0);
    s->set_inner_seconds(2.0);
    s->set_exchange_seconds(0.3);
    s->set_certify_seconds(0.2);
    s->set_publish_seconds(0.1);
    s->set_round_seconds(2.6);
  }
  return run;
}

pb::HostShardRecord Record() {
  pb::HostShardRecord record;
  record.set_shard_id(7);
  record.set_status(pb::SHARD_STATUS_RUNNING);
  record.set_reserved(true);
  record.set_frozen_weight(100);
  record.set_total_weight(300);
  for (int i = 0; i < 3; ++i) record.add_members()->set_weight(100);
  return record;
}

TEST(HostMetricsTest, HostStatusAsGaugesAndCounters) {
  HostMetrics metrics;
  pb::HostStatusResponse status;
  status.set_chain_height(120);
  status.set_cursor_height(115);
  status.set_events_processed(40);
  status.set_current_weight(1000);
  metrics.ObserveHost(status);
  status.set_events_processed(55);
  metrics.ObserveHost(status);
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_chain_height"), 120);
  EXPECT_EQ(Value(text, "trainshard_chain_lag_blocks"), 5);
  EXPECT_EQ(Value(text, "trainshard_chain_events_processed_total"), 55);
  EXPECT_EQ(Value(text, "trainshard_host_weight"), 1000);
  EXPECT_EQ(Value(text, "trainshard_follower_up"), 1);
  EXPECT_NE(text.find("# TYPE trainshard_chain_events_processed_total counter"), std::string::npos);
}

TEST(HostMetricsTest, AFailureCountsOncePerRunOfFailedSteps) {
  HostMetrics metrics;
  pb::HostStatusResponse status;
  status.set_follower_error("chain unreachable");
  status.set_follower_error_since_unix_ms(1000);
  for (int i = 0; i < 3; ++i) metrics.ObserveHost(status);  // the same run of failures
  EXPECT_EQ(Value(metrics.Render(), "trainshard_errors_total{kind=\"follower\"}"), 1);
  EXPECT_EQ(Value(metrics.Render(), "trainshard_follower_up"), 0);
  status.set_follower_error_since_unix_ms(5000);  // recovered in between, failing again
  metrics.ObserveHost(status);
  EXPECT_EQ(Value(metrics.Render(), "trainshard_errors_total{kind=\"follower\"}"), 2);
}

TEST(HostMetricsTest, EachRoundIsObservedOnce) {
  HostMetrics metrics;
  const pb::HostShardRecord record = Record();
  pb::ShardRunStatus run = RunStatus(3, 3000);
  metrics.ObserveShard(record, &run);
  metrics.ObserveShard(record, &run);  // the same rounds again: nothing new
  std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_rounds_certified_total{shard=\"7\"}"), 3);
  EXPECT_EQ(Value(text, "trainshard_rounds_contributed_total{shard=\"7\"}"), 3);
  EXPECT_EQ(Value(text, "trainshard_round_retries_total{shard=\"7\"}"), 1);
  EXPECT_EQ(Value(text, "trainshard_round_phase_seconds_count{phase=\"inner\",shard=\"7\"}"), 3);
  EXPECT_EQ(Value(text, "trainshard_round_phase_seconds_sum{phase=\"inner\",shard=\"7\"}"), 6);
  EXPECT_EQ(Value(text, "trainshard_bytes_total{kind=\"collective\",shard=\"7\"}"), 3000);
  EXPECT_FLOAT_EQ(*Value(text, "trainshard_train_loss{shard=\"7\"}"), 4.5);
  EXPECT_FLOAT_EQ(*Value(text, "trainshard_eval_loss{shard=\"7\"}"), 5.7);  // round 3's
  EXPECT_EQ(Value(text, "trainshard_shard_members{shard=\"7\"}"), 3);
  EXPECT_EQ(Value(text, "trainshard_shard_info{shard=\"7\",status=\"SHARD_STATUS_RUNNING\"}"), 1);
  EXPECT_EQ(Value(text, "trainshard_run_state{shard=\"7\",state=\"training\"}"), 1);

  run = RunStatus(4, 4500);
  run.set_state("done");
  metrics.ObserveShard(record, &run);
  text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_rounds_certified_total{shard=\"7\"}"), 4);
  EXPECT_EQ(Value(text, "trainshard_round_phase_seconds_count{phase=\"inner\",shard=\"7\"}"), 4);
  EXPECT_EQ(Value(text, "trainshard_bytes_total{kind=\"collective\",shard=\"7\"}"), 4500);
  // The state's series moved: the old one is gone, not left at 1 beside the new one.
  EXPECT_EQ(Value(text, "trainshard_run_state{shard=\"7\",state=\"training\"}"), std::nullopt);
  EXPECT_EQ(Value(text, "trainshard_run_state{shard=\"7\",state=\"done\"}"), 1);
}

TEST(HostMetricsTest, CountersNeverGoDownWhenTheSourceRestarts) {
  HostMetrics metrics;
  const pb::HostShardRecord record = Record();
  pb::ShardRunStatus run = RunStatus(2, 5000);
  run.set_worker_restarts(1);
  metrics.ObserveShard(record, &run);
  // A new shard process counts its bytes from zero again.
  run.set_bytes_exchanged(1200);
  run.set_worker_restarts(1);
  metrics.ObserveShard(record, &run);
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_bytes_total{kind=\"collective\",shard=\"7\"}"), 6200);
  EXPECT_EQ(Value(text, "trainshard_worker_restarts_total{shard=\"7\"}"), 1);
  EXPECT_EQ(Value(text, "trainshard_errors_total{kind=\"worker_restart\"}"), 1);
}

TEST(HostMetricsTest, AFailedRunCountsOnceAndNetworkStatusesStay) {
  HostMetrics metrics;
  pb::ShardRunStatus run = RunStatus(1, 10);
  run.set_state("failed");
  metrics.ObserveShard(Record(), &run);
  metrics.ObserveShard(Record(), &run);
  EXPECT_EQ(Value(metrics.Render(), "trainshard_errors_total{kind=\"run_failed\"}"), 1);

  std::vector<pb::Shard> shards(3);
  shards[0].set_status(pb::SHARD_STATUS_RUNNING);
  shards[1].set_status(pb::SHARD_STATUS_RUNNING);
  shards[2].set_status(pb::SHARD_STATUS_OPEN);
  metrics.ObserveNetwork(shards);
  EXPECT_EQ(Value(metrics.Render(), "trainshard_network_shards{status=\"SHARD_STATUS_RUNNING\"}"),
            2);
  shards.resize(2);
  shards[0].set_status(pb::SHARD_STATUS_SETTLED);
  metrics.ObserveNetwork(shards);
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_network_shards{status=\"SHARD_STATUS_OPEN\"}"), 0);
  EXPECT_EQ(Value(text, "trainshard_network_shards{status=\"SHARD_STATUS_SETTLED\"}"), 1);
}

TEST(HostMetricsTest, ArtifactTrafficByPeerWithABoundOnPeers) {
  HostMetrics metrics;
  metrics.ChunkServed("gonka1a", kServedOverGrpc, 1000);
  metrics.ChunkServed("gonka1a", kServedOverChunkStream, 500);
  metrics.TransferStarted(kTransferFetch);
  metrics.TransferStarted(kTransferFetch);
  std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_artifact_bytes_total{direction=\"served\",peer=\"gonka1a\"}"),
            1500);
  EXPECT_EQ(Value(text, "trainshard_artifact_chunks_served_total{way=\"chunk_stream\"}"), 1);
  EXPECT_EQ(Value(text, "trainshard_transfers_in_flight{kind=\"fetch\"}"), 2);

  pb::ArtifactProgress done;
  (*done.mutable_bytes_by_peer())["gonka1b"] = 700;
  (*done.mutable_bytes_by_peer())["gonka1c"] = 300;
  metrics.TransferEnded(kTransferFetch, 2.5, &done);
  metrics.TransferEnded(kTransferFetch, 0.5, nullptr);
  text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_transfers_in_flight{kind=\"fetch\"}"), 0);
  EXPECT_EQ(Value(text, "trainshard_artifact_bytes_total{direction=\"fetched\",peer=\"gonka1b\"}"),
            700);
  EXPECT_EQ(Value(text, "trainshard_transfer_seconds_count{kind=\"fetch\",result=\"ok\"}"), 1);
  EXPECT_EQ(Value(text, "trainshard_transfer_seconds_sum{kind=\"fetch\",result=\"error\"}"), 0.5);

  // A stream of new peers: the first kMaxPeerLabels have series of their own, the rest share one.
  for (size_t i = 0; i < kMaxPeerLabels + 10; ++i) {
    metrics.ChunkServed("peer" + std::to_string(i), kServedOverGrpc, 1);
  }
  text = metrics.Render();
  EXPECT_EQ(Value(text, "trainshard_artifact_bytes_total{direction=\"served\",peer=\"other\"}"),
            13);  // three named above took places of their own
}

}  // namespace
}  // namespace ts::sidecar
