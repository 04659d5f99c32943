#include "chain-bridge/client/gonka_v0_client.h"

#include <chrono>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "chain-bridge/module/gas.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "common/status.h"
#include "inference/inference/trainshard.grpc.pb.h"
#include "proto/cosmos_node_service.h"
#include "proto/cosmos_tendermint_service.h"
#include "proto/grpc_status.h"
#include "proto/hand_service.h"

namespace ts::bridge {
namespace {

namespace gv0 = ::inference::inference;

constexpr std::string_view kPinPath = "/tls-sha256/";
constexpr std::string_view kDigestPrefix = "@sha256:";
constexpr size_t kSha256Bytes = 32;

absl::Status BadUrl(std::string_view url, std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("endpoint URL \"", absl::string_view(url.data(), url.size()),
                   "\": ", absl::string_view(why.data(), why.size())));
}

pb::ShardStatus StatusOf(gv0::TrainshardStatus status) {
  switch (status) {
    case gv0::TRAINSHARD_STATUS_ACTIVE:
      return pb::SHARD_STATUS_RUNNING;
    case gv0::TRAINSHARD_STATUS_SETTLED:
      return pb::SHARD_STATUS_SETTLED;
    case gv0::TRAINSHARD_STATUS_EXPIRED:
      return pb::SHARD_STATUS_EXPIRED;
    default:
      return pb::SHARD_STATUS_UNSPECIFIED;
  }
}

pb::CloseReason CloseReasonOf(gv0::TrainshardCloseReason reason) {
  switch (reason) {
    case gv0::TRAINSHARD_CLOSE_REASON_SETTLED:
      return pb::CLOSE_REASON_SETTLED;
    case gv0::TRAINSHARD_CLOSE_REASON_TIMEOUT:
      return pb::CLOSE_REASON_TIMEOUT;
    case gv0::TRAINSHARD_CLOSE_REASON_NO_ACTIVE_NODES:
      return pb::CLOSE_REASON_NOT_ENOUGH_NODES;
    default:
      return pb::CLOSE_REASON_UNSPECIFIED;
  }
}

// The module's queries v0 has no counterpart for.
absl::Status NotInV0(std::string_view what) {
  return absl::UnimplementedError(absl::StrCat("gonka-v0: the chain records no ",
                                               absl::string_view(what.data(), what.size()),
                                               " (docs/gonka-v0.md, \"What v0 lacks\")"));
}

// The Cosmos services as GrpcChainClient speaks them, the shard queries from Gonka's.
class GonkaV0ChainClient final : public ChainClient {
 public:
  GonkaV0ChainClient(const std::string& target, ChainClientOptions options)
      : channel_(NewChainChannel(target)),
        cosmos_(NewGrpcChainClient(channel_, options)),
        options_(options),
        query_(gv0::Query::NewStub(channel_)) {}

  // What any Cosmos node answers: the chain id from its node info, the height and app hash from
  // its latest block (none yet at height 0).
  absl::StatusOr<ChainStatus> Status() override {
    namespace tm = cosmos::base::tendermint::v1beta1;
    ChainStatus out;
    tm::GetNodeInfoResponse info;
    TS_RETURN_IF_ERROR(Call(tm::kGetNodeInfoPath, tm::GetNodeInfoRequest(), &info));
    out.chain_id = info.default_node_info().network();
    tm::GetLatestBlockResponse latest;
    absl::Status block = Call(tm::kGetLatestBlockPath, tm::GetLatestBlockRequest(), &latest);
    if (block.ok()) {
      out.latest_height = latest.block().header().height();
      out.app_hash = latest.block().header().app_hash();
    } else if (!absl::IsNotFound(block)) {
      return block;
    }
    return out;
  }
  absl::StatusOr<std::vector<tendermint::abci::Event>> EventsAt(int64_t height) override {
    return cosmos_->EventsAt(height);
  }
  absl::StatusOr<AccountInfo> Account(const std::string& address) override {
    return cosmos_->Account(address);
  }
  absl::StatusOr<uint64_t> Balance(const std::string& address) override {
    return cosmos_->Balance(address);
  }
  // What a tx needs from the chain's parameters: the node's minimum gas price (its Config, as
  // any Cosmos node serves it) and the gov module's address (the SDK derives it from the name).
  absl::StatusOr<pb::QueryParamsResponse> Params() override {
    namespace node = cosmos::base::node::v1beta1;
    node::ConfigResponse config;
    TS_RETURN_IF_ERROR(Call("node.Service/Config", [&](grpc::ClientContext* ctx) {
      return node::CallConfig(channel_, ctx, node::ConfigRequest(), &config);
    }));
    pb::QueryParamsResponse out;
    TS_ASSIGN_OR_RETURN(std::string price, GasPriceFromNodeConfig(config.minimum_gas_price()));
    out.mutable_params()->set_min_gas_price(price);
    out.set_gov_address(common::ModuleAddress("gov"));
    return out;
  }
  absl::StatusOr<pb::EpochWeights> Weights(uint64_t epoch, bool current) override {
    return cosmos_->Weights(epoch, current);
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> BroadcastRaw(
      const std::string& tx_bytes) override {
    return cosmos_->BroadcastRaw(tx_bytes);
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> Simulate(
      const std::string& tx_bytes) override {
    return cosmos_->Simulate(tx_bytes);
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> GetTx(
      const std::string& txhash) override {
    return cosmos_->GetTx(txhash);
  }
  absl::StatusOr<cosmos::base::abci::v1beta1::TxResponse> SignAndBroadcast(
      const common::PrivateKey& key, const std::vector<google::protobuf::Any>& msgs,
      bool wait) override {
    return cosmos_->SignAndBroadcast(key, msgs, wait);
  }

  absl::StatusOr<pb::Shard> Shard(uint64_t shard_id) override {
    gv0::QueryGetTrainshardRequest req;
    req.set_trainshard_id(shard_id);
    gv0::QueryGetTrainshardResponse resp;
    TS_RETURN_IF_ERROR(Call("inference.Query/Trainshard", [&](grpc::ClientContext* ctx) {
      return query_->Trainshard(ctx, req, &resp);
    }));
    // Unknown and pruned shards are found = false, not an error, in Gonka's query.
    if (!resp.found()) return absl::NotFoundError(absl::StrCat("shard ", shard_id, " not found"));
    return ShardFromGonkaV0(resp.trainshard());
  }

  absl::StatusOr<std::vector<pb::Shard>> Shards(pb::ShardStatus status) override {
    std::vector<pb::Shard> out;
    // Only active shards can be listed in v0; they are the module's RUNNING ones.
    if (status != pb::SHARD_STATUS_UNSPECIFIED && status != pb::SHARD_STATUS_RUNNING) return out;
    // Gonka caps active shards by governance (max_active_shards), so one unpaginated answer
    // fits the channel's 16 MiB cap (NewChainChannel).
    gv0::QueryActiveTrainshardsResponse resp;
    TS_RETURN_IF_ERROR(Call("inference.Query/ActiveTrainshards", [&](grpc::ClientContext* ctx) {
      return query_->ActiveTrainshards(ctx, gv0::QueryActiveTrainshardsRequest(), &resp);
    }));
    for (const gv0::Trainshard& shard : resp.trainshards()) {
      TS_ASSIGN_OR_RETURN(pb::Shard translated, ShardFromGonkaV0(shard));
      out.push_back(std::move(translated));
    }
    return out;
  }

  absl::StatusOr<pb::Proposal> Proposal(uint64_t) override {
    return NotInV0("module proposal (v0 proposals are TrainshardProposal records)");
  }

  absl::StatusOr<pb::QueryEscrowResponse> Escrow(uint64_t shard_id) override {
    // No escrow in v0: the shard exists, and holds nothing.
    TS_ASSIGN_OR_RETURN(pb::Shard shard, Shard(shard_id));
    pb::QueryEscrowResponse resp;
    resp.set_shard_escrow(shard.escrow_held());
    resp.set_module_balance("0");
    return resp;
  }

  absl::StatusOr<pb::SettlementRecord> Settlement(uint64_t) override {
    return NotInV0("settlement (the creator's settle closes a v0 shard without a result)");
  }

 private:
  // One call: `rpc` given a context with the client's deadline; its status named `what`.
  template <typename Rpc>
  absl::Status Call(const char* what, Rpc rpc) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.call_timeout_ms));
    return FromGrpcStatus(rpc(&ctx), what);
  }

  // A unary call of a hand-written Cosmos service at `path`.
  template <typename Request, typename Response>
  absl::Status Call(const char* path, const Request& request, Response* response) {
    return Call(path, [&](grpc::ClientContext* ctx) {
      const grpc::internal::RpcMethod method(path, grpc::internal::RpcMethod::NORMAL_RPC, channel_);
      return ts::proto::UnaryCall(channel_.get(), method, ctx, request, response);
    });
  }

  // One connection to the node for the Cosmos services and Gonka's queries.
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ChainClient> cosmos_;
  ChainClientOptions options_;
  std::unique_ptr<gv0::Query::Stub> query_;
};

}  // namespace

absl::StatusOr<ChainProfile> ParseChainProfile(std::string_view field, std::string_view text) {
  if (text == kProfileTrainshard) return ChainProfile::kTrainshard;
  if (text == kProfileGonkaV0) return ChainProfile::kGonkaV0;
  return absl::InvalidArgumentError(
      absl::StrCat(absl::string_view(field.data(), field.size()), ": \"",
                   absl::string_view(text.substr(0, 64).data(), text.substr(0, 64).size()),
                   "\" is not a chain profile (\"trainshard\" or \"gonka-v0\")"));
}

std::string_view ChainProfileName(ChainProfile profile) {
  return profile == ChainProfile::kGonkaV0 ? kProfileGonkaV0 : kProfileTrainshard;
}

std::unique_ptr<ChainClient> NewChainClient(ChainProfile profile, const std::string& target,
                                            ChainClientOptions options) {
  if (profile == ChainProfile::kGonkaV0) {
    return std::make_unique<GonkaV0ChainClient>(target, std::move(options));
  }
  return NewGrpcChainClient(target, std::move(options));
}

absl::StatusOr<pb::Shard> ShardFromGonkaV0(const gv0::Trainshard& shard) {
  if (shard.trainshard_id() == 0) {
    return absl::InvalidArgumentError("trainshard.trainshard_id: 0 is not a shard id");
  }
  pb::Shard out;
  out.set_id(shard.trainshard_id());
  out.set_creator(shard.creator());
  out.set_status(StatusOf(shard.status()));
  out.set_proposal_id(shard.proposal_id());
  out.set_open_height(shard.created_at_height());
  out.set_reservation_deadline_height(shard.created_at_height());
  out.set_deadline_height(shard.expires_at_height());
  out.set_closed_height(shard.closed_at_height());
  out.set_close_reason(CloseReasonOf(shard.close_reason()));
  out.set_escrow_held("0");

  pb::ShardSpec* spec = out.mutable_spec();
  // A base image that is not a digest pins nothing the hosts could run: left empty, every run
  // spec handed over is refused for not matching it.
  if (auto hash = RunSpecHashFromBaseImage(shard.base_image()); hash.ok()) {
    spec->set_run_spec_hash(*hash);
  }
  spec->set_hardware_profile(shard.gpu_profile_id());
  spec->set_max_duration_blocks(static_cast<uint64_t>(
      std::max<int64_t>(0, shard.expires_at_height() - shard.created_at_height())));
  spec->mutable_escrow()->set_denom(std::string(common::kDenom));
  spec->mutable_escrow()->set_amount("0");
  spec->mutable_artifact_quota()->set_bytes_max(kGonkaV0QuotaBytes);
  spec->mutable_artifact_quota()->set_files_max(kGonkaV0QuotaFiles);
  spec->mutable_reward_policy()->set_kind(pb::RewardPolicy::KIND_EQUAL_SHARE);
  spec->mutable_reward_policy()->set_max_host_share_bps(10000);

  // Members in the order their first node was reserved; a node serving several models is
  // listed once per model with the same weight, so it is counted once.
  std::map<std::string, int> index;  // participant -> reservation
  std::set<std::string> counted;     // participant/node_id
  uint32_t nodes = 0;
  for (const gv0::TrainshardReservedNode& node : shard.nodes()) {
    const std::string node_key = absl::StrCat(node.participant(), "/", node.node_id());
    if (!counted.insert(node_key).second) continue;
    ++nodes;
    if (node.status() != gv0::TRAINSHARD_NODE_STATUS_ACTIVE &&
        !(shard.status() != gv0::TRAINSHARD_STATUS_ACTIVE &&
          node.status() == gv0::TRAINSHARD_NODE_STATUS_RELEASED_ON_CLOSE)) {
      continue;  // kicked: no longer a member
    }
    auto [it, added] = index.emplace(node.participant(), out.reservations_size());
    pb::Reservation* r = added ? out.add_reservations() : out.mutable_reservations(it->second);
    if (added) {
      r->set_shard_id(shard.trainshard_id());
      r->set_host(node.participant());
      r->set_reserved_height(shard.created_at_height());
    }
    if (r->endpoint().empty() && !node.endpoint().empty()) {
      if (auto parsed = ParseGonkaV0EndpointUrl(node.endpoint()); parsed.ok()) {
        r->set_endpoint(parsed->endpoint);
        r->set_tls_cert_sha256(parsed->tls_cert_sha256);
      }
    }
    const uint64_t weight = static_cast<uint64_t>(std::max<int64_t>(0, node.poc_weight()));
    r->set_frozen_weight(r->frozen_weight() + weight);
    out.set_total_weight(out.total_weight() + weight);
  }
  spec->set_min_nodes(1);
  spec->set_max_nodes(nodes);
  return out;
}

absl::StatusOr<std::string> GasPriceFromNodeConfig(std::string_view minimum_gas_price) {
  // DecCoins: "<decimal><denom>" entries joined by commas; only ngonka pays fees here.
  std::string_view rest = minimum_gas_price;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view coin = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (coin.size() <= common::kDenom.size() ||
        coin.substr(coin.size() - common::kDenom.size()) != common::kDenom) {
      continue;
    }
    const std::string_view amount = coin.substr(0, coin.size() - common::kDenom.size());
    TS_RETURN_IF_ERROR(ParseGasPrice("minimum_gas_price", amount).status());
    return std::string(amount);
  }
  return std::string();  // no ngonka price: the node takes txs without fees
}

std::string GonkaV0EndpointUrl(std::string_view endpoint, std::string_view tls_cert_sha256,
                               bool tls) {
  std::string url = absl::StrCat(tls ? "https://" : "http://",
                                 absl::string_view(endpoint.data(), endpoint.size()));
  if (tls_cert_sha256.size() == kSha256Bytes) {
    absl::StrAppend(&url, absl::string_view(kPinPath.data(), kPinPath.size()),
                    common::HexEncode(tls_cert_sha256));
  }
  return url;
}

absl::StatusOr<GonkaV0Endpoint> ParseGonkaV0EndpointUrl(std::string_view url) {
  std::string_view rest;
  if (url.substr(0, 7) == "http://") {
    rest = url.substr(7);
  } else if (url.substr(0, 8) == "https://") {
    rest = url.substr(8);
  } else {
    return BadUrl(url, "scheme must be http or https");
  }
  const size_t slash = rest.find('/');
  GonkaV0Endpoint out;
  out.endpoint = std::string(rest.substr(0, slash));
  const size_t colon = out.endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == out.endpoint.size() || colon == 0) {
    return BadUrl(url, "host:port expected after the scheme");
  }
  if (slash == std::string_view::npos) return out;
  const std::string_view path = rest.substr(slash);
  if (path.substr(0, kPinPath.size()) != kPinPath) return out;  // a path of its own: no pin
  auto pin = common::HexDecode(path.substr(kPinPath.size()));
  if (!pin.ok() || pin->size() != kSha256Bytes) {
    return BadUrl(url, "the certificate pin is not 64 hex digits");
  }
  out.tls_cert_sha256 = *std::move(pin);
  return out;
}

std::string RunSpecBaseImage(std::string_view run_spec_hash) {
  return absl::StrCat(
      absl::string_view(kRunSpecImageRepository.data(), kRunSpecImageRepository.size()),
      absl::string_view(kDigestPrefix.data(), kDigestPrefix.size()),
      common::HexEncode(run_spec_hash));
}

absl::StatusOr<std::string> RunSpecHashFromBaseImage(std::string_view base_image) {
  const size_t at = base_image.find(kDigestPrefix);
  std::string_view hex;
  if (at != std::string_view::npos && at > 0) hex = base_image.substr(at + kDigestPrefix.size());
  absl::StatusOr<std::string> digest = absl::InvalidArgumentError("no digest");
  if (hex.size() == 2 * kSha256Bytes) digest = common::HexDecode(hex);
  if (!digest.ok()) {
    const std::string_view shown = base_image.substr(0, 200);
    return absl::InvalidArgumentError(
        absl::StrCat("base_image: \"", absl::string_view(shown.data(), shown.size()),
                     "\" is not <repository>@sha256:<64 hex digits>"));
  }
  return *std::move(digest);
}

}  // namespace ts::bridge
