// `trainshard shard run|train-status|draft` and `trainshard eval`: a host sidecar's training runs
// (docs/training.md) through its ShardRunOperator service on the operator socket.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hex.h"
#include "gonka/trainshard/v1/training.grpc.pb.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"
#include "sidecar/cli/rpc.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

struct RunArgs {
  uint64_t id = 0;
  std::string run_spec;
  std::string host;
};

struct StatusArgs {
  uint64_t id = 0;
  std::string host;
};

struct EvalArgs {
  uint64_t shard = 0;
  std::string artifact;
  std::string host;
  uint64_t windows_max = 0;
};

std::unique_ptr<pb::ShardRunOperator::Stub> Stub(const std::string& endpoint) {
  return pb::ShardRunOperator::NewStub(NewChannel(endpoint));
}

int RunRun(Context& ctx, const RunArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto doc = ReadInputFile("--run-spec", args.run_spec);
  if (!doc.ok()) return ctx.BadInput(doc.status());
  pb::StartShardRunRequest request;
  request.set_shard_id(args.id);
  request.set_run_spec(*doc);
  auto stub = Stub(*endpoint);
  auto response = CallWithDeadline<pb::StartShardRunResponse>(
      ctx.options().timeout_ms,
      [&](auto* context, auto* r) { return stub->Start(context, request, r); });
  if (!response.ok()) return ctx.PeerFailed("host " + *endpoint, response.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*response);
  } else {
    PrintKeyValues(ctx.out(), {{"run_spec_hash", common::HexEncode(response->run_spec_hash())},
                               {"already_running", response->already_running() ? "yes" : "no"}});
  }
  return kExitOk;
}

int RunTrainStatus(Context& ctx, const StatusArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto status = RunStatusFromHost(*endpoint, args.id, ctx.options().timeout_ms);
  if (!status.ok()) return ctx.PeerFailed("host " + *endpoint, status.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*status);
    return kExitOk;
  }
  KeyValues lines = {
      {"shard", std::to_string(status->shard_id())},
      {"state", status->state()},
      {"certified_round", absl::StrCat(status->certified_round(), "/", status->rounds_total())},
      {"root", common::HexEncode(status->root())},
      {"planner", absl::StrCat(status->planner(), " (round ", status->planner_round(), ")")},
      {"shard_process", absl::StrCat("pid ", status->shard_process_pid(), ", restarts ",
                                     status->shard_process_restarts(), ", worker restarts ",
                                     status->worker_restarts())},
      {"worker_device", status->worker_device()},
      {"parameters", std::to_string(status->parameters())},
      {"bytes_exchanged", std::to_string(status->bytes_exchanged())},
      {"inner_seconds", absl::StrFormat("%.1f", status->inner_seconds())},
      {"wall_seconds", absl::StrFormat("%.1f", status->wall_seconds())},
  };
  if (!status->error().empty()) lines.emplace_back("error", status->error());
  if (!status->settlement_txhash().empty()) {
    lines.emplace_back("settlement_tx", status->settlement_txhash());
  }
  PrintKeyValues(ctx.out(), lines);
  if (status->rounds_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& r : status->rounds()) {
      rows.push_back(
          {std::to_string(r.round()), std::to_string(r.members_size()),
           absl::StrFormat("%.4f", r.train_loss()),
           r.eval_loss_micro() == 0 ? "-" : absl::StrFormat("%.4f", r.eval_loss_micro() / 1e6),
           std::to_string(r.bytes_exchanged()), common::HexEncode(r.new_root()).substr(0, 16)});
    }
    ctx.out() << "\n";
    PrintTable(ctx.out(), {"ROUND", "MEMBERS", "TRAIN_LOSS", "EVAL_LOSS", "BYTES", "ROOT"}, rows);
  }
  if (status->transitions_size() > 0) {
    ctx.out() << "\n";
    for (const auto& t : status->transitions()) ctx.out() << t << "\n";
  }
  return kExitOk;
}

int RunDraft(Context& ctx, const StatusArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto draft = DraftFromHost(*endpoint, args.id, ctx.options().timeout_ms);
  if (!draft.ok()) return ctx.PeerFailed("host " + *endpoint, draft.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*draft);
  } else {
    PrintSettlement(ctx.out(), *draft);
  }
  return kExitOk;
}

int RunEval(Context& ctx, const EvalArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto id = common::HexDecode(args.artifact);
  if (!id.ok() || id->size() != 32) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--artifact: \"", args.artifact.substr(0, 80), "\" is not 64 hex digits")));
  }
  pb::EvaluateCheckpointRequest request;
  request.set_shard_id(args.shard);
  request.set_artifact_id(*id);
  request.set_windows_max(args.windows_max);
  auto stub = Stub(*endpoint);
  auto response = CallWithDeadline<pb::EvaluateCheckpointResponse>(
      std::max<int64_t>(ctx.options().timeout_ms, 600'000),
      [&](auto* context, auto* r) { return stub->Evaluate(context, request, r); });
  if (!response.ok()) return ctx.PeerFailed("host " + *endpoint, response.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*response);
    return kExitOk;
  }
  const pb::EvaluationResult& e = response->evaluation().result();
  PrintKeyValues(ctx.out(), {{"checkpoint_root", common::HexEncode(e.checkpoint_root())},
                             {"eval_set", common::HexEncode(e.eval_set_id())},
                             {"eval_loss", absl::StrFormat("%.6f", e.loss_micro() / 1e6)},
                             {"tokens", std::to_string(e.tokens())},
                             {"evaluator", e.host()},
                             {"signature", common::HexEncode(response->evaluation().signature())}});
  return kExitOk;
}

}  // namespace

absl::StatusOr<pb::Settlement> DraftFromHost(const std::string& target, uint64_t shard_id,
                                             int64_t timeout_ms) {
  pb::DraftSettlementRequest request;
  request.set_shard_id(shard_id);
  auto stub = Stub(target);
  auto response = CallWithDeadline<pb::DraftSettlementResponse>(
      timeout_ms,
      [&](auto* context, auto* r) { return stub->DraftSettlement(context, request, r); });
  if (!response.ok()) return response.status();
  return std::move(*response->mutable_draft());
}

absl::StatusOr<pb::ShardRunStatus> RunStatusFromHost(const std::string& target, uint64_t shard_id,
                                                     int64_t timeout_ms) {
  pb::ShardRunStatusRequest request;
  request.set_shard_id(shard_id);
  auto stub = Stub(target);
  return CallWithDeadline<pb::ShardRunStatus>(
      timeout_ms, [&](auto* context, auto* r) { return stub->Status(context, request, r); });
}

void AddTrainCommands(CLI::App& root, CLI::App& shard, CommandTable& table) {
  auto run_args = std::make_shared<RunArgs>();
  CLI::App* run = shard.add_subcommand(
      "run", "start (or resume) a host's training run of a RUNNING shard with its run spec");
  run->add_option("--id", run_args->id, "shard id")->transform(UnsignedInteger())->required();
  run->add_option("--run-spec", run_args->run_spec,
                  "the run spec document (JSON) whose SHA-256 the shard pins")
      ->required();
  run->add_option("--host", run_args->host, kHostFlagHelp)->required();
  table.Add(run, [run_args](Context& ctx) { return RunRun(ctx, *run_args); });

  auto status_args = std::make_shared<StatusArgs>();
  CLI::App* status = shard.add_subcommand(
      "train-status", "a host's training run: rounds, losses, membership changes");
  status->add_option("--id", status_args->id, "shard id")->transform(UnsignedInteger())->required();
  status->add_option("--host", status_args->host, kHostFlagHelp)->required();
  table.Add(status, [status_args](Context& ctx) { return RunTrainStatus(ctx, *status_args); });

  auto draft_args = std::make_shared<StatusArgs>();
  CLI::App* draft = shard.add_subcommand(
      "draft", "the settlement a host's certified training records imply: all it will sign");
  draft->add_option("--id", draft_args->id, "shard id")->transform(UnsignedInteger())->required();
  draft->add_option("--host", draft_args->host, kHostFlagHelp)->required();
  table.Add(draft, [draft_args](Context& ctx) { return RunDraft(ctx, *draft_args); });

  auto eval_args = std::make_shared<EvalArgs>();
  CLI::App* eval = root.add_subcommand(
      "eval", "evaluate a checkpoint artifact on a shard's held-out set, signed by the host");
  eval->add_option("--shard", eval_args->shard, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  eval->add_option("--artifact", eval_args->artifact, "checkpoint artifact id, 64 hex digits")
      ->required();
  eval->add_option("--host", eval_args->host, kHostFlagHelp)->required();
  eval->add_option("--windows-max", eval_args->windows_max, "evaluate at most this many windows")
      ->transform(UnsignedInteger());
  table.Add(eval, [eval_args](Context& ctx) { return RunEval(ctx, *eval_args); });
}

}  // namespace ts::sidecar
