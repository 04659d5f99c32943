// `trainshard chain status|events|params`: read-only chain queries.
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "gonka/trainshard/v1/chain.grpc.pb.h"
#include "google/protobuf/util/time_util.h"
#include "proto/cosmos_tx_service.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/rpc.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

// One invocation of `chain events` reads at most this many heights (one call each).
constexpr int64_t kEventHeightsMax = 100000;

int RunStatus(Context& ctx) {
  auto stub = pb::Query::NewStub(NewChannel(ctx.options().chain));
  auto status = CallWithDeadline<pb::QueryStatusResponse>(
      ctx.options().timeout_ms, [&](auto* context, auto* response) {
        return stub->Status(context, pb::QueryStatusRequest(), response);
      });
  if (!status.ok()) return ctx.ChainFailed(status.status());
  std::string app_hash = common::HexEncode(status->app_hash());
  if (ctx.json()) {
    // The protobuf JSON shape, except app_hash in hex (as Cosmos nodes report it).
    nlohmann::ordered_json document = ProtoToJsonValue(*status);
    document["app_hash"] = app_hash;
    ctx.PrintJson(document);
  } else {
    PrintKeyValues(ctx.out(), {{"chain_id", status->chain_id()},
                               {"latest_height", std::to_string(status->latest_height())},
                               {"app_hash", app_hash},
                               {"epoch", std::to_string(status->epoch())},
                               {"total_supply", status->total_supply()}});
  }
  return kExitOk;
}

struct EventsArgs {
  int64_t from = 0;
  int64_t to = 0;
  CLI::Option* to_option = nullptr;
};

int RunEvents(Context& ctx, const EventsArgs& args) {
  if (args.from < 1) {
    return ctx.BadInput(
        absl::InvalidArgumentError(absl::StrCat("--from ", args.from, ": heights start at 1")));
  }
  int64_t to = args.to;
  if (args.to_option->count() == 0) {
    auto status = ctx.chain().Status();
    if (!status.ok()) return ctx.ChainFailed(status.status());
    to = status->latest_height;
  } else if (to < args.from) {
    return ctx.BadInput(
        absl::InvalidArgumentError(absl::StrCat("--to ", to, ": below --from ", args.from)));
  }
  if (to >= args.from && to - args.from >= kEventHeightsMax) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--from ", args.from, " --to ", to, ": more than ", kEventHeightsMax,
                     " heights in one call; split the range")));
  }
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (int64_t height = args.from; height <= to; ++height) {
    auto at = ctx.chain().EventsAt(height);
    if (!at.ok()) return ctx.ChainFailed(at.status());
    for (size_t i = 0; i < at->size(); ++i) {
      const auto& event = (*at)[i];
      if (ctx.json()) {
        events.push_back(EventToJson(height, static_cast<uint32_t>(i), event));
      } else {
        ctx.out() << EventLine(height, static_cast<uint32_t>(i), event) << "\n";
      }
    }
  }
  if (ctx.json()) ctx.PrintJson({{"events", std::move(events)}});
  return kExitOk;
}

int RunBlock(Context& ctx, int64_t height) {
  if (height < 1) {
    return ctx.BadInput(
        absl::InvalidArgumentError(absl::StrCat("--height ", height, ": heights start at 1")));
  }
  auto channel = NewChannel(ctx.options().chain);
  cosmos::tx::v1beta1::TxServiceStub tx_service(channel);
  cosmos::tx::v1beta1::GetBlockWithTxsRequest block_request;
  block_request.set_height(height);
  // Only the header and the tx count are shown; one tx decoded is enough.
  block_request.mutable_pagination()->set_limit(1);
  auto block = CallWithDeadline<cosmos::tx::v1beta1::GetBlockWithTxsResponse>(
      ctx.options().timeout_ms, [&](auto* context, auto* response) {
        return tx_service.GetBlockWithTxs(context, block_request, response);
      });
  if (!block.ok()) return ctx.ChainFailed(block.status());
  auto query = pb::Query::NewStub(channel);
  pb::QueryBlockEventsRequest events_request;
  events_request.set_height(height);
  auto events = CallWithDeadline<pb::QueryBlockEventsResponse>(
      ctx.options().timeout_ms, [&](auto* context, auto* response) {
        return query->BlockEvents(context, events_request, response);
      });
  if (!events.ok()) return ctx.ChainFailed(events.status());
  const tendermint::types::Header& header = block->block().header();
  KeyValues lines = {
      {"height", std::to_string(header.height())},
      {"time", google::protobuf::util::TimeUtil::ToString(header.time())},
      {"block_hash", common::HexEncode(block->block_id().hash())},
      {"txs", std::to_string(block->block().data().txs_size())},
      {"events", std::to_string(events->events_size())},
      {"data_hash", common::HexEncode(header.data_hash())},
      {"app_hash_before", common::HexEncode(header.app_hash())},
      {"app_hash_after", common::HexEncode(events->app_hash())},
  };
  if (ctx.json()) {
    nlohmann::ordered_json document = nlohmann::ordered_json::object();
    for (const auto& [key, value] : lines) document[key] = value;
    document["txs"] = block->block().data().txs_size();
    document["events"] = events->events_size();
    ctx.PrintJson(document);
  } else {
    PrintKeyValues(ctx.out(), lines);
  }
  return kExitOk;
}

int RunParams(Context& ctx) {
  auto params = ctx.chain().Params();
  if (!params.ok()) return ctx.ChainFailed(params.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*params);
    return kExitOk;
  }
  const pb::Params& p = params->params();
  PrintKeyValues(ctx.out(),
                 {{"chain_id", params->chain_id()},
                  {"gov_address", params->gov_address()},
                  {"escrow_address", params->escrow_address()},
                  {"fee_collector_address", params->fee_collector_address()},
                  {"epoch_length_blocks", std::to_string(p.epoch_length_blocks())},
                  {"voting_period_blocks", std::to_string(p.voting_period_blocks())},
                  {"min_deposit", p.min_deposit()},
                  {"min_gas_price", p.min_gas_price().empty() ? "0" : p.min_gas_price()},
                  {"quorum_ppm", std::to_string(p.quorum_ppm())},
                  {"threshold_ppm", std::to_string(p.threshold_ppm())},
                  {"veto_threshold_ppm", std::to_string(p.veto_threshold_ppm())},
                  {"poc_authority", p.poc_authority()},
                  {"max_nodes_limit", std::to_string(p.max_nodes_limit())},
                  {"max_weights_per_submission", std::to_string(p.max_weights_per_submission())},
                  {"max_duration_blocks_limit", std::to_string(p.max_duration_blocks_limit())}});
  return kExitOk;
}

}  // namespace

void AddChainCommands(CLI::App& root, CommandTable& table) {
  CLI::App* chain = root.add_subcommand("chain", "chain queries");
  chain->require_subcommand(1);

  CLI::App* status = chain->add_subcommand("status", "chain id, latest height, app hash, epoch");
  table.Add(status, [](Context& ctx) { return RunStatus(ctx); });

  auto events_args = std::make_shared<EventsArgs>();
  CLI::App* events = chain->add_subcommand("events", "the chain's events per height");
  events->add_option("--from", events_args->from, "first height")
      ->transform(UnsignedInteger())
      ->required();
  events_args->to_option =
      events->add_option("--to", events_args->to, "last height (default: the latest)")
          ->transform(UnsignedInteger());
  table.Add(events, [events_args](Context& ctx) { return RunEvents(ctx, *events_args); });

  auto block_height = std::make_shared<int64_t>(0);
  CLI::App* block =
      chain->add_subcommand("block", "a block's header, tx and event counts and app hashes");
  block->add_option("--height", *block_height, "block height")
      ->transform(UnsignedInteger())
      ->required();
  table.Add(block, [block_height](Context& ctx) { return RunBlock(ctx, *block_height); });

  CLI::App* params = chain->add_subcommand("params", "the module parameters");
  table.Add(params, [](Context& ctx) { return RunParams(ctx); });
}

}  // namespace ts::sidecar
