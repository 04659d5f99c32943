// `trainshard devnet init|start|abci|replay`: the embedded devnet chain node, and the same module
// served to a CometBFT node over ABCI.
#include <pthread.h>
#include <signal.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chain-bridge/devnet/abci_server.h"
#include "chain-bridge/devnet/node.h"
#include "chain-bridge/module/gas.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "google/protobuf/util/json_util.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

// Governance fractions in parts per million and the per-message weight cap of a devnet genesis.
constexpr uint32_t kQuorumPpm = 334000;
constexpr uint32_t kThresholdPpm = 500000;
constexpr uint32_t kVetoThresholdPpm = 334000;
constexpr uint32_t kMaxWeightsPerSubmission = 10000;

struct InitArgs {
  std::string home;
  std::string chain_id;
  std::vector<std::string> accounts;
  std::vector<std::string> weights;
  std::string poc_authority;
  uint64_t epoch_length = 1000;
  uint64_t voting_period = 10;
  std::string min_deposit = "1000";
  std::string min_gas_price = "0";
  uint32_t max_nodes_limit = 1000;
  uint64_t max_duration_limit = 1000000;
  std::string genesis_file;
};

absl::StatusOr<pb::Genesis> GenesisFromFlags(const InitArgs& args) {
  if (args.chain_id.empty()) {
    return absl::InvalidArgumentError("--chain-id: required unless --genesis is given");
  }
  pb::Genesis genesis;
  genesis.set_chain_id(args.chain_id);
  genesis.set_genesis_time_unix(absl::ToUnixSeconds(absl::Now()));
  pb::Params* params = genesis.mutable_params();
  params->set_epoch_length_blocks(args.epoch_length);
  params->set_voting_period_blocks(args.voting_period);
  auto min_deposit = ParseAmountFlag("--min-deposit", args.min_deposit);
  if (!min_deposit.ok()) return min_deposit.status();
  params->set_min_deposit(common::FormatAmount(*min_deposit));
  auto min_gas_price = bridge::ParseGasPrice("--min-gas-price", args.min_gas_price);
  if (!min_gas_price.ok()) return min_gas_price.status();
  params->set_min_gas_price(args.min_gas_price);
  params->set_quorum_ppm(kQuorumPpm);
  params->set_threshold_ppm(kThresholdPpm);
  params->set_veto_threshold_ppm(kVetoThresholdPpm);
  if (args.poc_authority.empty()) {
    // As Cosmos modules default their authority: only governance, no single account.
    params->set_poc_authority(common::ModuleAddress("gov"));
  } else {
    auto authority = ParseAccountAddress("--poc-authority", args.poc_authority);
    if (!authority.ok()) return authority.status();
    params->set_poc_authority(*authority);
  }
  params->set_max_nodes_limit(args.max_nodes_limit);
  params->set_max_weights_per_submission(kMaxWeightsPerSubmission);
  params->set_max_duration_blocks_limit(args.max_duration_limit);

  auto accounts = ParseAddressAmounts("--account", args.accounts);
  if (!accounts.ok()) return accounts.status();
  for (const auto& account : *accounts) {
    auto* entry = genesis.add_accounts();
    entry->set_address(account.address);
    entry->set_balance(common::FormatAmount(account.value));
  }
  auto weights = ParseAddressWeights("--weight", args.weights);
  if (!weights.ok()) return weights.status();
  for (const auto& weight : *weights) {
    auto* entry = genesis.add_poc_weights();
    entry->set_host(weight.address);
    entry->set_weight(weight.value);
  }
  return genesis;
}

absl::StatusOr<pb::Genesis> GenesisFromFile(const std::string& path) {
  auto text = ReadInputFile("--genesis", path);
  if (!text.ok()) return text.status();
  pb::Genesis genesis;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(*text, &genesis, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--genesis \"", path, "\": not a protobuf-JSON Genesis: ", std::string(parsed.message())));
  }
  return genesis;
}

int RunInit(Context& ctx, const InitArgs& args) {
  auto genesis =
      args.genesis_file.empty() ? GenesisFromFlags(args) : GenesisFromFile(args.genesis_file);
  if (!genesis.ok()) return ctx.BadInput(genesis.status());
  absl::Status status = bridge::InitHome(args.home, *genesis);
  if (!status.ok()) return ctx.LocalFailed(status);
  std::string genesis_path = args.home + "/genesis.json";
  if (ctx.json()) {
    ctx.PrintJson({{"home", args.home},
                   {"chain_id", genesis->chain_id()},
                   {"genesis", genesis_path},
                   {"poc_authority", genesis->params().poc_authority()}});
  } else {
    PrintKeyValues(ctx.out(), {{"home", args.home},
                               {"chain_id", genesis->chain_id()},
                               {"genesis", genesis_path},
                               {"accounts", std::to_string(genesis->accounts_size())},
                               {"weights", std::to_string(genesis->poc_weights_size())},
                               {"poc_authority", genesis->params().poc_authority()}});
  }
  return kExitOk;
}

struct StartArgs {
  std::string home;
  std::string listen = "127.0.0.1:9090";
  std::string rpc_listen = "127.0.0.1:26657";
  int64_t block_interval_ms = 500;
};

// Blocks SIGTERM and SIGINT in the calling thread for its lifetime; threads started meanwhile
// inherit the mask, so the signals stay pending until sigwait() takes them here.
class ScopedSignalBlock {
 public:
  ScopedSignalBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~ScopedSignalBlock() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  ScopedSignalBlock(const ScopedSignalBlock&) = delete;
  ScopedSignalBlock& operator=(const ScopedSignalBlock&) = delete;

  int Wait() {
    int signal_number = 0;
    while (sigwait(&set_, &signal_number) != 0) {
    }
    return signal_number;
  }

 private:
  sigset_t set_;
  sigset_t previous_;
};

int RunStart(Context& ctx, const StartArgs& args) {
  auto listen = ParseListenAddress("--listen", args.listen);
  if (!listen.ok()) return ctx.BadInput(listen.status());
  std::string rpc_listen;
  if (!args.rpc_listen.empty()) {
    auto parsed = ParseListenAddress("--rpc-listen", args.rpc_listen);
    if (!parsed.ok()) return ctx.BadInput(parsed.status());
    rpc_listen = *parsed;
  }
  if (args.block_interval_ms < 1) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--block-interval-ms ", args.block_interval_ms, ": must be at least 1")));
  }
  ScopedSignalBlock signals;
  bridge::DevnetOptions options;
  options.listen_address = *listen;
  options.rpc_listen_address = rpc_listen;
  options.block_interval_ms = args.block_interval_ms;
  auto node = bridge::DevnetNode::Open(args.home, options);
  if (!node.ok()) return ctx.LocalFailed(node.status());
  absl::Status started = (*node)->Start();
  if (!started.ok()) return ctx.LocalFailed(started);
  std::string address = (*node)->listen_address();
  if (ctx.json()) {
    ctx.PrintJson({{"listen", address},
                   {"rpc_listen", (*node)->rpc_listen_address()},
                   {"home", args.home},
                   {"chain_id", (*node)->chain_id()},
                   {"height", std::to_string((*node)->height())}});
  } else {
    ctx.out() << "devnet " << (*node)->chain_id() << " listening on " << address << " (height "
              << (*node)->height() << ", home " << args.home << ")\n";
    if (!(*node)->rpc_listen_address().empty()) {
      ctx.out() << "CometBFT JSON-RPC on " << (*node)->rpc_listen_address() << "\n";
    }
    ctx.out().flush();
  }
  int signal_number = signals.Wait();
  (*node)->Shutdown();
  int64_t height = (*node)->height();
  node->reset();
  ctx.err() << "devnet stopped on signal " << signal_number << " at height " << height << "\n";
  return kExitOk;
}

struct AbciArgs {
  std::string home;
  std::string listen = "127.0.0.1:26658";
};

// Serves the home's genesis to a CometBFT node over ABCI until SIGTERM or SIGINT. The App lives
// in memory: CometBFT replays its blocks into it after a restart.
int RunAbci(Context& ctx, const AbciArgs& args) {
  auto genesis = bridge::ReadGenesis(args.home);
  if (!genesis.ok()) return ctx.LocalFailed(genesis.status());
  ScopedSignalBlock signals;
  bridge::devnet::AbciServerOptions options;
  options.listen_address = args.listen;
  auto server = bridge::devnet::AbciServer::Start(*std::move(genesis), options);
  if (!server.ok()) {
    return absl::IsInvalidArgument(server.status()) ? ctx.BadInput(server.status())
                                                    : ctx.LocalFailed(server.status());
  }
  if (ctx.json()) {
    ctx.PrintJson({{"abci_listen", (*server)->listen_address()}, {"home", args.home}});
  } else {
    ctx.out() << "ABCI application listening on " << (*server)->listen_address() << "\n";
    ctx.out().flush();
  }
  int signal_number = signals.Wait();
  const int64_t height = (*server)->committed_height();
  (*server)->Shutdown();
  ctx.err() << "abci stopped on signal " << signal_number << " at height " << height << "\n";
  return kExitOk;
}

int RunReplay(Context& ctx, const std::string& home) {
  auto report = bridge::Replay(home);
  if (!report.ok()) return ctx.LocalFailed(report.status());
  if (ctx.json()) {
    nlohmann::ordered_json document = {{"blocks", report->blocks_replayed},
                                       {"ok", report->ok()},
                                       {"latest_height", report->latest_height},
                                       {"state_matches", report->state_matches},
                                       {"mismatch_height", nullptr},
                                       {"mismatch", report->mismatch}};
    if (report->first_mismatch_height.has_value()) {
      document["mismatch_height"] = *report->first_mismatch_height;
    }
    ctx.PrintJson(document);
  } else if (report->ok()) {
    ctx.out() << "replayed " << report->blocks_replayed << " blocks: OK\n";
  } else if (report->first_mismatch_height.has_value()) {
    ctx.out() << "replayed " << report->blocks_replayed << " blocks: MISMATCH at height "
              << *report->first_mismatch_height << ": " << report->mismatch << "\n";
  } else {
    ctx.out() << "replayed " << report->blocks_replayed
              << " blocks: MISMATCH in the final state: " << report->mismatch << "\n";
  }
  if (!report->ok()) {
    ctx.err() << "error: replay does not reproduce the stored chain\n";
    return kExitRefused;
  }
  return kExitOk;
}

}  // namespace

void AddDevnetCommands(CLI::App& root, CommandTable& table) {
  CLI::App* devnet = root.add_subcommand("devnet", "the embedded devnet chain node");
  devnet->require_subcommand(1);

  auto init_args = std::make_shared<InitArgs>();
  CLI::App* init = devnet->add_subcommand("init", "write a genesis into a new home directory");
  init->add_option("--home", init_args->home, "node home directory")->required();
  CLI::Option* chain_id = init->add_option("--chain-id", init_args->chain_id, "chain id");
  CLI::Option* genesis = init->add_option("--genesis", init_args->genesis_file,
                                          "a protobuf-JSON Genesis instead of the flags below");
  std::vector<CLI::Option*> flags = {
      chain_id,
      init->add_option("--account", init_args->accounts, "ADDR=AMOUNT (ngonka), repeated")
          ->take_all(),
      init->add_option("--weight", init_args->weights, "ADDR=WEIGHT of epoch 0, repeated")
          ->take_all(),
      init->add_option("--poc-authority", init_args->poc_authority,
                       "account allowed to submit PoC weights (default: the gov module)"),
      init->add_option("--epoch-length", init_args->epoch_length, "blocks per epoch")
          ->transform(UnsignedInteger())
          ->capture_default_str(),
      init->add_option("--voting-period", init_args->voting_period, "voting period, blocks")
          ->transform(UnsignedInteger())
          ->capture_default_str(),
      init->add_option("--min-deposit", init_args->min_deposit, "minimum deposit, ngonka")
          ->capture_default_str(),
      init->add_option("--min-gas-price", init_args->min_gas_price,
                       "fee a tx pays per unit of gas, ngonka (a decimal; 0: no fee)")
          ->capture_default_str(),
      init->add_option("--max-nodes-limit", init_args->max_nodes_limit,
                       "largest max_nodes a spec may ask")
          ->transform(UnsignedInteger())
          ->capture_default_str(),
      init->add_option("--max-duration-limit", init_args->max_duration_limit,
                       "largest max_duration_blocks a spec may ask")
          ->transform(UnsignedInteger())
          ->capture_default_str(),
  };
  for (CLI::Option* flag : flags) genesis->excludes(flag);
  table.Add(init, [init_args](Context& ctx) { return RunInit(ctx, *init_args); });

  auto start_args = std::make_shared<StartArgs>();
  CLI::App* start =
      devnet->add_subcommand("start", "run the node in the foreground until SIGTERM or SIGINT");
  start->add_option("--home", start_args->home, "node home directory")->required();
  start->add_option("--listen", start_args->listen, "gRPC listen address (port 0: any free)")
      ->capture_default_str();
  start
      ->add_option("--rpc-listen", start_args->rpc_listen,
                   "CometBFT JSON-RPC and WebSocket listen address (port 0: any free; \"\": none)")
      ->capture_default_str();
  start
      ->add_option("--block-interval-ms", start_args->block_interval_ms,
                   "one block every this many milliseconds")
      ->transform(UnsignedInteger())
      ->capture_default_str();
  table.Add(start, [start_args](Context& ctx) { return RunStart(ctx, *start_args); });

  auto abci_args = std::make_shared<AbciArgs>();
  CLI::App* abci = devnet->add_subcommand(
      "abci", "serve the home's genesis as an ABCI application to a CometBFT node, until SIGTERM");
  abci->add_option("--home", abci_args->home, "node home directory (its genesis.json)")->required();
  abci->add_option("--listen", abci_args->listen,
                   "host:port, tcp://host:port or unix:///path (CometBFT's proxy_app)")
      ->capture_default_str();
  table.Add(abci, [abci_args](Context& ctx) { return RunAbci(ctx, *abci_args); });

  auto replay_home = std::make_shared<std::string>();
  CLI::App* replay = devnet->add_subcommand(
      "replay", "re-execute every stored block from genesis and compare the app hashes");
  replay->add_option("--home", *replay_home, "node home directory (the node must be stopped)")
      ->required();
  table.Add(replay, [replay_home](Context& ctx) { return RunReplay(ctx, *replay_home); });
}

}  // namespace ts::sidecar
