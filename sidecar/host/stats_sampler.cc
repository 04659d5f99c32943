#include "sidecar/host/stats_sampler.h"

#include <algorithm>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gonka/trainshard/v1/host.grpc.pb.h"
#include "gonka/trainshard/v1/shard.grpc.pb.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using nlohmann::json;

// A run status carries up to 256 round summaries and transitions: well under this.
constexpr int kMaxReceiveBytes = 16 << 20;

// The proto3 JSON mapping with the .proto's own field names and every field present, so the
// page reads the names docs/stats.md and the .proto files use (64-bit integers as strings).
json ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(message, &text, options).ok()) return nullptr;
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

std::string Describe(const grpc::Status& status) {
  return absl::StrCat("operator API: ", status.error_message(), " (code ",
                      static_cast<int>(status.error_code()), ")");
}

}  // namespace

struct StatsSampler::Channels {
  explicit Channels(const std::string& target) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
    channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    host = pb::HostOperator::NewStub(channel);
    runs = pb::ShardRunOperator::NewStub(channel);
    artifacts = pb::ArtifactOperator::NewStub(channel);
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::HostOperator::Stub> host;
  std::unique_ptr<pb::ShardRunOperator::Stub> runs;
  std::unique_ptr<pb::ArtifactOperator::Stub> artifacts;
};

StatsSampler::StatsSampler(bridge::ChainClient* chain, HostMetrics* metrics, common::Clock* clock,
                           StatsSamplerOptions options)
    : chain_(chain),
      metrics_(metrics),
      clock_(clock),
      options_(std::move(options)),
      channels_(std::make_unique<Channels>(options_.operator_target)) {}

StatsSampler::~StatsSampler() { Stop(); }

void StatsSampler::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void StatsSampler::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StatsSampler::Loop() {
  while (true) {
    SampleOnce();
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval);
    if (stopping_) return;
  }
}

std::string StatsSampler::OverviewJson() const {
  absl::MutexLock lock(&mu_);
  return overview_;
}

void StatsSampler::SampleOnce() {
  json overview = json::object();
  overview["generated_unix_ms"] = clock_->NowUnixMs();
  SampleHost(overview);
  // The network: every network_interval, and the shards' settlements once each is settled.
  if (clock_->MonotonicMs() >= next_network_ms_) RefreshNetwork();
  if (!network_json_.empty()) {
    json network = json::parse(network_json_, nullptr, /*allow_exceptions=*/false);
    if (network.contains("network_error")) {
      overview["network_error"] = network["network_error"];
    } else {
      overview["network"] = std::move(network);
    }
  }

  // This host's shards: the newest ones it reserved in, each with its run and settlement.
  pb::ListShardsResponse records;
  {
    grpc::ClientContext context;
    SetDeadline(&context, options_.call_timeout);
    grpc::Status s = channels_->host->ListShards(&context, {}, &records);
    if (!s.ok()) {
      overview["shards_error"] = Describe(s);
      metrics_->CountError(kErrorOperatorApi);
    }
  }
  std::vector<const pb::HostShardRecord*> mine;
  for (const pb::HostShardRecord& r : records.shards()) {
    if (r.reservation_sent() || r.reserved()) mine.push_back(&r);
  }
  std::sort(mine.begin(), mine.end(),
            [](const auto* a, const auto* b) { return a->shard_id() > b->shard_id(); });
  if (mine.size() > kMaxSampledRuns) mine.resize(kMaxSampledRuns);
  json shards = json::array();
  for (const pb::HostShardRecord* record : mine) {
    shards.push_back(ShardEntry(*record));
  }
  overview["shards"] = std::move(shards);
  // Settlements are kept for the shards shown only.
  std::erase_if(settlement_json_, [&mine](const auto& entry) {
    return std::none_of(mine.begin(), mine.end(),
                        [&entry](const auto* r) { return r->shard_id() == entry.first; });
  });

  // Strings from the host are UTF-8 (protobuf checks); a stray byte is replaced, never thrown.
  std::string text = overview.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  absl::MutexLock lock(&mu_);
  overview_ = std::move(text);
}

void StatsSampler::SampleHost(json& overview) {
  pb::HostStatusResponse status;
  grpc::ClientContext context;
  SetDeadline(&context, options_.call_timeout);
  grpc::Status s = channels_->host->Status(&context, {}, &status);
  if (s.ok()) {
    overview["host"] = ToJson(status);
    metrics_->ObserveHost(status);
  } else {
    overview["host_error"] = Describe(s);
    metrics_->CountError(kErrorOperatorApi);
  }
}

void StatsSampler::RefreshNetwork() {
  next_network_ms_ = clock_->MonotonicMs() + absl::ToInt64Milliseconds(options_.network_interval);
  auto shards = chain_->Shards(pb::SHARD_STATUS_UNSPECIFIED);
  auto weights = chain_->Weights(0, /*current=*/true);
  if (shards.ok() && weights.ok()) {
    metrics_->ObserveNetwork(*shards);
    std::sort(shards->begin(), shards->end(),
              [](const pb::Shard& a, const pb::Shard& b) { return a.id() > b.id(); });
    json network = json::object();
    network["shards_total"] = shards->size();
    json list = json::array();
    quota_bytes_.clear();
    for (size_t i = 0; i < shards->size(); ++i) {
      const pb::Shard& shard = (*shards)[i];
      quota_bytes_[shard.id()] = shard.spec().artifact_quota().bytes_max();
      if (i < kMaxNetworkShards) {
        // The run spec document travels in the spec; the page does not need its bytes.
        pb::Shard light = shard;
        light.mutable_spec()->clear_run_spec();
        list.push_back(ToJson(light));
      }
    }
    network["shards"] = std::move(list);
    network["weights"] = ToJson(*weights);
    network_json_ = network.dump(-1, ' ', false, json::error_handler_t::replace);
  } else {
    const absl::Status& failed = shards.ok() ? weights.status() : shards.status();
    network_json_ = json({{"network_error", absl::StrCat("chain: ", failed.message())}}).dump();
    metrics_->CountError(kErrorChain);
  }
}

json StatsSampler::ShardEntry(const pb::HostShardRecord& record) {
  const uint64_t id = record.shard_id();
  json entry = json::object();
  entry["record"] = ToJson(record);
  pb::ShardRunStatus run;
  bool has_run = false;
  {
    pb::ShardRunStatusRequest request;
    request.set_shard_id(id);
    grpc::ClientContext context;
    SetDeadline(&context, options_.call_timeout);
    grpc::Status s = channels_->runs->Status(&context, request, &run);
    has_run = s.ok();
    entry["run"] = has_run ? ToJson(run) : json(nullptr);
    // NOT_FOUND: no run of this shard on this host (yet).
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
      entry["run_error"] = Describe(s);
      metrics_->CountError(kErrorOperatorApi);
    }
  }
  metrics_->ObserveShard(record, has_run ? &run : nullptr);
  if (record.reserved()) {
    pb::ListLocalArtifactsRequest request;
    request.set_shard_id(id);
    request.set_include_incomplete(true);
    pb::ListArtifactsResponse artifacts;
    grpc::ClientContext context;
    SetDeadline(&context, options_.call_timeout);
    if (channels_->artifacts->List(&context, request, &artifacts).ok()) {
      uint64_t bytes = 0;
      for (const pb::ArtifactSummary& a : artifacts.artifacts()) bytes += a.total_bytes();
      auto quota = quota_bytes_.find(id);
      metrics_->ObserveStore(id, bytes, quota == quota_bytes_.end() ? 0 : quota->second);
      entry["store_bytes"] = bytes;
    }
  }
  if (record.status() == pb::SHARD_STATUS_SETTLED && !settlement_json_.contains(id)) {
    if (auto settled = chain_->Settlement(id); settled.ok()) {
      settlement_json_[id] = ToJson(*settled).dump();
    }
  }
  auto settled = settlement_json_.find(id);
  entry["settlement"] = settled == settlement_json_.end()
                            ? json(nullptr)
                            : json::parse(settled->second, nullptr, /*allow_exceptions=*/false);
  return entry;
}

}  // namespace ts::sidecar
