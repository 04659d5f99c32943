// `trainshard weights show|submit`: PoC weights per epoch.
#include <memory>

#include "absl/strings/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

struct ShowArgs {
  uint64_t epoch = 0;
  CLI::Option* epoch_option = nullptr;
};

int RunShow(Context& ctx, const ShowArgs& args) {
  bool current = args.epoch_option->count() == 0;
  auto weights = ctx.chain().Weights(args.epoch, current);
  if (!weights.ok()) return ctx.ChainFailed(weights.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*weights);
    return kExitOk;
  }
  PrintKeyValues(ctx.out(), {{"epoch", std::to_string(weights->epoch())},
                             {"total_weight", std::to_string(weights->total_weight())}});
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : weights->weights()) rows.push_back({w.host(), std::to_string(w.weight())});
  if (!rows.empty()) {
    ctx.out() << "\n";
    PrintTable(ctx.out(), {"HOST", "WEIGHT"}, rows);
  }
  return kExitOk;
}

struct SubmitArgs {
  uint64_t epoch = 0;
  std::vector<std::string> weights;
  bool wait = false;
};

int RunSubmit(Context& ctx, const SubmitArgs& args) {
  auto weights = ParseAddressWeights("--weight", args.weights);
  if (!weights.ok()) return ctx.BadInput(weights.status());
  auto key = ctx.LoadKey("weights submit");
  if (!key.ok()) return ctx.BadInput(key.status());

  pb::MsgSubmitPocWeights msg;
  msg.set_authority(common::AddressFromPublicKey(key->public_key()));
  msg.set_epoch(args.epoch);
  for (const auto& w : *weights) {
    auto* entry = msg.add_weights();
    entry->set_host(w.address);
    entry->set_weight(w.value);
  }
  auto response = ctx.chain().SignAndBroadcast(*key, {bridge::PackMsg(msg)}, args.wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  return ctx.ReportTx(*response);
}

}  // namespace

void AddWeightsCommands(CLI::App& root, CommandTable& table) {
  CLI::App* weights = root.add_subcommand("weights", "PoC weights per epoch");
  weights->require_subcommand(1);

  auto show_args = std::make_shared<ShowArgs>();
  CLI::App* show = weights->add_subcommand("show", "the weights of an epoch");
  show_args->epoch_option =
      show->add_option("--epoch", show_args->epoch, "epoch (default: the epoch in force)")
          ->transform(UnsignedInteger());
  table.Add(show, [show_args](Context& ctx) { return RunShow(ctx, *show_args); });

  auto submit_args = std::make_shared<SubmitArgs>();
  CLI::App* submit =
      weights->add_subcommand("submit", "record an epoch's weights (--key: the PoC authority)");
  submit->add_option("--epoch", submit_args->epoch, "epoch the weights are for")
      ->transform(UnsignedInteger())
      ->required();
  submit->add_option("--weight", submit_args->weights, "ADDR=WEIGHT, repeated")
      ->required()
      ->take_all();
  submit->add_flag("--wait", submit_args->wait, "wait until the tx is in a block");
  table.Add(submit, [submit_args](Context& ctx) { return RunSubmit(ctx, *submit_args); });
}

}  // namespace ts::sidecar
