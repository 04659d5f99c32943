// `trainshard shard list|status|reserve|assemble|settle|settlement`: shards on the chain, and
// the calls to host sidecars that reserve places and sign settlements (`shard report` is in
// shard_report.cc; `shard run|train-status|draft` in train_command.cc).
#include <algorithm>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "common/protocol.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "proto/deterministic.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/host_client.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

std::string StatusName(pb::ShardStatus status) {
  return ShortEnumName(pb::ShardStatus_Name(status), "SHARD_STATUS_");
}

std::string HostPeer(const std::string& endpoint) { return "host " + endpoint; }

int RunList(Context& ctx, const std::string& status_text) {
  pb::ShardStatus status = pb::SHARD_STATUS_UNSPECIFIED;
  if (!status_text.empty()) {
    auto parsed = ParseShardStatus("--status", status_text);
    if (!parsed.ok()) return ctx.BadInput(parsed.status());
    status = *parsed;
  }
  auto shards = ctx.chain().Shards(status);
  if (!shards.ok()) return ctx.ChainFailed(shards.status());
  if (ctx.json()) {
    pb::QueryShardsResponse response;
    for (auto& shard : *shards) *response.add_shards() = std::move(shard);
    ctx.PrintProtoJson(response);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& shard : *shards) {
    rows.push_back({std::to_string(shard.id()), StatusName(shard.status()),
                    shard.spec().hardware_profile(),
                    absl::StrCat(shard.reservations_size(), "/", shard.spec().min_nodes(), "-",
                                 shard.spec().max_nodes()),
                    shard.escrow_held(), std::to_string(shard.deadline_height()), shard.creator()});
  }
  PrintTable(ctx.out(), {"ID", "STATUS", "PROFILE", "NODES", "ESCROW", "DEADLINE", "CREATOR"},
             rows);
  return kExitOk;
}

int RunStatus(Context& ctx, uint64_t id) {
  auto shard = ctx.chain().Shard(id);
  if (!shard.ok()) return ctx.ChainFailed(shard.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*shard);
    return kExitOk;
  }
  auto escrow = ctx.chain().Escrow(id);
  if (!escrow.ok()) return ctx.ChainFailed(escrow.status());
  const pb::ShardSpec& spec = shard->spec();
  KeyValues lines = {
      {"id", std::to_string(shard->id())},
      {"status", StatusName(shard->status())},
      {"creator", shard->creator()},
      {"proposal_id", std::to_string(shard->proposal_id())},
      {"hardware_profile", spec.hardware_profile()},
      {"nodes", absl::StrCat(spec.min_nodes(), "-", spec.max_nodes())},
      {"min_host_weight", std::to_string(spec.min_host_weight())},
      {"run_spec_hash", common::HexEncode(spec.run_spec_hash())},
      {"run_spec", spec.run_spec().empty()
                       ? std::string("not on chain (the hosts' operators run it)")
                       : absl::StrCat(spec.run_spec().size(), " bytes on chain")},
      {"readers", spec.readers().empty()
                      ? std::string("creator only")
                      : absl::StrCat("creator, ", absl::StrJoin(spec.readers(), ", "))},
      {"escrow", absl::StrCat(spec.escrow().amount(), " ", spec.escrow().denom())},
      {"escrow_held", escrow->shard_escrow()},
      {"escrow_address", escrow->escrow_address()},
      {"proposed_height", std::to_string(shard->proposed_height())},
      {"open_height", std::to_string(shard->open_height())},
      {"reservation_deadline", std::to_string(shard->reservation_deadline_height())},
      {"deadline_height", std::to_string(shard->deadline_height())},
      {"total_weight", std::to_string(shard->total_weight())},
  };
  if (shard->closed_height() != 0) {
    lines.emplace_back("closed_height", std::to_string(shard->closed_height()));
    lines.emplace_back("close_reason",
                       ShortEnumName(pb::CloseReason_Name(shard->close_reason()), "CLOSE_REASON_"));
  }
  PrintKeyValues(ctx.out(), lines);
  if (shard->reservations_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& r : shard->reservations()) {
      rows.push_back({r.host(), std::to_string(r.frozen_weight()), r.endpoint(),
                      std::to_string(r.reserved_height())});
    }
    ctx.out() << "\n";
    PrintTable(ctx.out(), {"HOST", "WEIGHT", "ENDPOINT", "RESERVED_AT"}, rows);
  }
  return kExitOk;
}

struct ReserveArgs {
  uint64_t id = 0;
  std::string host;
};

int RunReserve(Context& ctx, const ReserveArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  HostClient host(*endpoint, ctx.options().timeout_ms);
  auto response = host.Reserve(args.id);
  if (!response.ok()) return ctx.PeerFailed(HostPeer(*endpoint), response.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*response);
  } else {
    PrintKeyValues(ctx.out(), {{"txhash", response->txhash()}});
  }
  return kExitOk;
}

struct AssembleArgs {
  uint64_t id = 0;
  bool wait = false;
};

int RunAssemble(Context& ctx, const AssembleArgs& args) {
  auto key = ctx.LoadKey("shard assemble");
  if (!key.ok()) return ctx.BadInput(key.status());
  pb::MsgAssembleTrainshard msg;
  msg.set_creator(common::AddressFromPublicKey(key->public_key()));
  msg.set_shard_id(args.id);
  auto response = ctx.chain().SignAndBroadcast(*key, {bridge::PackMsg(msg)}, args.wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  return ctx.ReportTx(*response);
}

struct SettleArgs {
  uint64_t id = 0;
  std::string hosts;
  std::string final_root;
  std::vector<std::string> work;
  std::string refund;
  std::string eval_metric;
  int64_t eval_value_micro = 0;
  uint64_t rounds = 0;
  uint64_t rounds_planned = 0;
  std::string submit_via;
  std::string draft_from;
  CLI::Option* eval_value_option = nullptr;
};

struct Refusal {
  std::string host;
  std::string error;
};

// Everything `shard settle` checks before it contacts anyone.
struct SettlePlan {
  std::vector<std::string> hosts;
  std::string final_root;
  std::vector<AddressValue> work;  // rounds contributed, per host
  bool refund_given = false;
  uint64_t refund = 0;
  std::string submit_via;
  // The host whose records' draft is used (then no draft flag is given).
  std::string draft_from;
};

absl::StatusOr<SettlePlan> PlanSettle(const SettleArgs& args) {
  SettlePlan plan;
  auto hosts = ParseHostTargetList("--hosts", args.hosts);
  if (!hosts.ok()) return hosts.status();
  plan.hosts = *std::move(hosts);
  if (!args.submit_via.empty()) {
    auto via = ParseHostTarget("--submit-via", args.submit_via);
    if (!via.ok()) return via.status();
    plan.submit_via = *std::move(via);
  }
  if (!args.draft_from.empty()) {
    // The whole draft is the host's; CLI11 refuses the draft flags beside it (excludes).
    auto from = ParseHostTarget("--draft-from", args.draft_from);
    if (!from.ok()) return from.status();
    plan.draft_from = *std::move(from);
    return plan;
  }
  if (args.final_root.empty()) {
    return absl::InvalidArgumentError(
        "--final-root: required (or --draft-from HOST, to settle what a host's records imply)");
  }
  auto root = ParseHex32("--final-root", args.final_root);
  if (!root.ok()) return root.status();
  plan.final_root = *std::move(root);
  auto work = ParseAddressAmounts("--work", args.work);
  if (!work.ok()) return work.status();
  plan.work = *std::move(work);
  if (!args.refund.empty()) {
    auto refund = ParseAmountFlag("--refund", args.refund);
    if (!refund.ok()) return refund.status();
    plan.refund_given = true;
    plan.refund = *refund;
  }
  bool has_value = args.eval_value_option->count() > 0;
  if (args.eval_metric.empty() && has_value) {
    return absl::InvalidArgumentError("--eval-value-micro: given without --eval-metric");
  }
  if (!args.eval_metric.empty() && !has_value) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-metric \"", args.eval_metric, "\": needs --eval-value-micro"));
  }
  return plan;
}

void PrintSettleResult(Context& ctx, const std::string& txhash, uint32_t code,
                       const std::string& raw_log, size_t signatures,
                       const std::vector<Refusal>& refused) {
  if (ctx.json()) {
    nlohmann::ordered_json refused_json = nlohmann::ordered_json::array();
    for (const auto& r : refused) refused_json.push_back({{"host", r.host}, {"error", r.error}});
    ctx.PrintJson({{"txhash", txhash},
                   {"code", code},
                   {"raw_log", raw_log},
                   {"signatures", signatures},
                   {"refused", std::move(refused_json)}});
    return;
  }
  PrintKeyValues(ctx.out(), {{"txhash", txhash},
                             {"code", std::to_string(code)},
                             {"signatures", std::to_string(signatures)},
                             {"refused", std::to_string(refused.size())}});
}

// Adds to `draft` a payout per host of `work` (its rounds contributed), each the amount the
// shard's reward policy gives it of the escrow's part the draft's rounds make payable
// (PayableOf, PayoutsFromStats: the rules the chain checks); the sum paid.
absl::StatusOr<uint64_t> AddPayouts(const pb::Shard& shard, const std::vector<AddressValue>& work,
                                    pb::Settlement* draft) {
  auto escrow = common::ParseAmount("spec.escrow.amount", shard.spec().escrow().amount());
  if (!escrow.ok()) return absl::InternalError(escrow.status().message());
  for (const auto& w : work) {
    pb::HostPayout* entry = draft->add_payouts();
    entry->set_host(w.address);
    entry->set_rounds_contributed(w.value);
  }
  const uint64_t payable =
      protocol::PayableOf(*escrow, draft->rounds_completed(), draft->rounds_planned());
  const std::vector<uint64_t> amounts =
      bridge::PayoutsFromStats(payable, shard.spec().reward_policy(), draft->payouts());
  uint64_t paid = 0;
  for (size_t i = 0; i < amounts.size(); ++i) {
    draft->mutable_payouts(static_cast<int>(i))->set_amount(common::FormatAmount(amounts[i]));
    paid += amounts[i];
  }
  return paid;
}

int RunSettle(Context& ctx, const SettleArgs& args) {
  auto plan = PlanSettle(args);
  if (!plan.ok()) return ctx.BadInput(plan.status());
  std::optional<common::PrivateKey> key;
  if (plan->submit_via.empty()) {
    auto loaded = ctx.LoadKey("shard settle (without --submit-via)");
    if (!loaded.ok()) return ctx.BadInput(loaded.status());
    key = *std::move(loaded);
  }

  auto status = ctx.chain().Status();
  if (!status.ok()) return ctx.ChainFailed(status.status());
  auto shard = ctx.chain().Shard(args.id);
  if (!shard.ok()) return ctx.ChainFailed(shard.status());
  auto held = common::ParseAmount("escrow_held", shard->escrow_held());
  if (!held.ok()) return ctx.ChainFailed(absl::InternalError(held.status().message()));
  if (shard->status() != pb::SHARD_STATUS_RUNNING) {
    // The chain would refuse any settlement now; say why before asking the hosts.
    if (shard->status() == pb::SHARD_STATUS_SETTLED) {
      ctx.err() << "error: shard " << args.id << " is already settled\n";
    } else {
      ctx.err() << "error: shard " << args.id << " is " << StatusName(shard->status())
                << " (escrow held " << *held << "): only a running shard can be settled\n";
    }
    return kExitRefused;
  }
  pb::Settlement draft;
  if (!plan->draft_from.empty()) {
    auto from = DraftFromHost(plan->draft_from, args.id, ctx.options().timeout_ms);
    if (!from.ok()) return ctx.PeerFailed(HostPeer(plan->draft_from), from.status());
    draft = *std::move(from);
    if (!ctx.json()) ctx.out() << "draft from " << plan->draft_from << "\n";
  } else {
    draft.set_chain_id(status->chain_id);
    draft.set_shard_id(args.id);
    draft.set_final_checkpoint_root(plan->final_root);
    if (!args.eval_metric.empty()) {
      draft.mutable_evaluation()->set_metric(args.eval_metric);
      draft.mutable_evaluation()->set_value_micro(args.eval_value_micro);
    }
    // Rounds completed: by default the most any host contributed; planned: all of them.
    uint64_t rounds = args.rounds;
    if (rounds == 0) {
      for (const AddressValue& w : plan->work) rounds = std::max(rounds, w.value);
    }
    draft.set_rounds_completed(rounds);
    draft.set_rounds_planned(args.rounds_planned > 0 ? args.rounds_planned : rounds);
    auto paid = AddPayouts(*shard, plan->work, &draft);
    if (!paid.ok()) return ctx.ChainFailed(paid.status());
    uint64_t refund = plan->refund;
    if (!plan->refund_given) {
      if (*paid > *held) {
        return ctx.BadInput(absl::InvalidArgumentError(absl::StrCat(
            "--work: the payouts sum to ", *paid, ", more than the shard's escrow ", *held)));
      }
      refund = *held - *paid;
    }
    draft.set_refund(common::FormatAmount(refund));
  }
  std::set<std::string> members;
  for (const auto& r : shard->reservations()) members.insert(r.host());

  const std::string draft_bytes = DeterministicBytes(draft);
  std::vector<pb::SettlementSignature> signatures;
  std::set<std::string> signers;
  std::vector<Refusal> refused;
  for (const auto& endpoint : plan->hosts) {
    HostClient host(endpoint, ctx.options().timeout_ms);
    auto signed_draft = host.SignSettlement(draft);
    if (!signed_draft.ok()) {
      std::string error = absl::StrCat(absl::StatusCodeToString(signed_draft.status().code()), ": ",
                                       std::string(signed_draft.status().message()));
      ctx.err() << "host " << endpoint << " did not sign: " << error << "\n";
      refused.push_back({endpoint, error});
      continue;
    }
    const pb::SettlementSignature& signature = signed_draft->signature();
    // One bad signature would make the chain refuse the whole settlement: check each here
    // and count a host whose signature is not over this draft as refusing.
    auto signer =
        common::RecoverStatementSigner(protocol::kSignSettlement, draft.chain_id(),
                                       draft.shard_id(), draft_bytes, signature.signature());
    if (!signer.ok() || *signer != signature.host()) {
      std::string error = absl::StrCat("signature claimed for ", signature.host(),
                                       " does not verify over this draft");
      ctx.err() << "host " << endpoint << " did not sign: " << error << "\n";
      refused.push_back({endpoint, error});
      continue;
    }
    // The chain refuses a settlement carrying a signature from outside the shard.
    if (members.count(signature.host()) == 0) {
      std::string error = absl::StrCat(signature.host(), " is not a member of shard ", args.id);
      ctx.err() << "host " << endpoint << " did not sign: " << error << "\n";
      refused.push_back({endpoint, error});
      continue;
    }
    // Quorum counts distinct hosts; a second operator address of the same host adds nothing.
    if (!signers.insert(signature.host()).second) continue;
    if (!ctx.json()) ctx.out() << "signed by " << signature.host() << " (" << endpoint << ")\n";
    signatures.push_back(signature);
  }

  std::string txhash;
  uint32_t code = 0;
  std::string raw_log;
  std::string codespace;
  if (!plan->submit_via.empty()) {
    pb::SubmitSettlementRequest request;
    *request.mutable_settlement() = draft;
    for (const auto& s : signatures) *request.add_signatures() = s;
    HostClient via(plan->submit_via, ctx.options().timeout_ms);
    auto response = via.SubmitSettlement(request);
    if (!response.ok()) return ctx.PeerFailed(HostPeer(plan->submit_via), response.status());
    txhash = response->txhash();
    code = response->code();
    raw_log = response->raw_log();
  } else {
    pb::MsgSettleTrainshard msg;
    msg.set_submitter(common::AddressFromPublicKey(key->public_key()));
    *msg.mutable_settlement() = draft;
    for (const auto& s : signatures) *msg.add_signatures() = s;
    auto response = ctx.chain().SignAndBroadcast(*key, {bridge::PackMsg(msg)}, /*wait=*/true);
    if (!response.ok()) return ctx.ChainFailed(response.status());
    txhash = response->txhash();
    code = response->code();
    raw_log = response->raw_log();
    codespace = response->codespace();
  }
  PrintSettleResult(ctx, txhash, code, raw_log, signatures.size(), refused);
  if (code != 0) {
    ctx.err() << "error: code=" << code << " codespace=" << codespace << ": " << raw_log << "\n";
    return kExitRefused;
  }
  return kExitOk;
}

int RunSettlement(Context& ctx, uint64_t id) {
  auto record = ctx.chain().Settlement(id);
  if (!record.ok()) return ctx.ChainFailed(record.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*record);
    return kExitOk;
  }
  PrintSettlement(ctx.out(), record->settlement());
  ctx.out() << "\n";
  PrintKeyValues(ctx.out(), {{"height", std::to_string(record->height())},
                             {"submitter", record->submitter()},
                             {"signed_weight", std::to_string(record->signed_weight())},
                             {"signatures", std::to_string(record->signatures_size())}});
  return kExitOk;
}

}  // namespace

void AddShardCommands(CLI::App& root, CommandTable& table) {
  CLI::App* shard = root.add_subcommand("shard", "shards on the chain, reservations, settlement");
  shard->require_subcommand(1);

  auto list_status = std::make_shared<std::string>();
  CLI::App* list = shard->add_subcommand("list", "shards, optionally of one status");
  list->add_option("--status", *list_status,
                   "proposed|open|running|settled|expired|rejected (default: all)");
  table.Add(list, [list_status](Context& ctx) { return RunList(ctx, *list_status); });

  auto status_id = std::make_shared<uint64_t>(0);
  CLI::App* status = shard->add_subcommand("status", "one shard, its reservations and escrow");
  status->add_option("--id", *status_id, "shard id")->transform(UnsignedInteger())->required();
  table.Add(status, [status_id](Context& ctx) { return RunStatus(ctx, *status_id); });

  auto reserve_args = std::make_shared<ReserveArgs>();
  CLI::App* reserve =
      shard->add_subcommand("reserve", "ask a host sidecar to reserve a place in a shard now");
  reserve->add_option("--id", reserve_args->id, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  reserve->add_option("--host", reserve_args->host, kHostFlagHelp)->required();
  table.Add(reserve, [reserve_args](Context& ctx) { return RunReserve(ctx, *reserve_args); });

  auto assemble_args = std::make_shared<AssembleArgs>();
  CLI::App* assemble =
      shard->add_subcommand("assemble", "close reservations of an OPEN shard with min_nodes");
  assemble->add_option("--id", assemble_args->id, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  assemble->add_flag("--wait", assemble_args->wait, "wait until the tx is in a block");
  table.Add(assemble, [assemble_args](Context& ctx) { return RunAssemble(ctx, *assemble_args); });

  auto settle_args = std::make_shared<SettleArgs>();
  CLI::App* settle = shard->add_subcommand(
      "settle", "have member sidecars sign a settlement draft, then submit it");
  settle->add_option("--id", settle_args->id, "shard id")->transform(UnsignedInteger())->required();
  settle
      ->add_option("--hosts", settle_args->hosts,
                   "the sidecars' operator sockets (as --host), comma-separated")
      ->required();
  CLI::Option* final_root =
      settle->add_option("--final-root", settle_args->final_root,
                         "final checkpoint root, 64 hex characters (or --draft-from)");
  CLI::Option* payout =
      settle
          ->add_option("--work", settle_args->work,
                       "HOSTADDR=ROUNDS, repeated: the rounds each host contributed; the payouts "
                       "follow by the shard's reward policy")
          ->take_all();
  CLI::Option* refund =
      settle->add_option("--refund", settle_args->refund,
                         "ngonka refunded to the creator (default: escrow minus the payouts)");
  CLI::Option* metric = settle->add_option("--eval-metric", settle_args->eval_metric,
                                           "evaluation metric, e.g. eval_loss");
  settle_args->eval_value_option = settle->add_option(
      "--eval-value-micro", settle_args->eval_value_micro, "metric value times 1e6");
  CLI::Option* rounds =
      settle
          ->add_option("--rounds", settle_args->rounds,
                       "rounds completed (default: the most rounds a host of --work contributed)")
          ->transform(UnsignedInteger());
  CLI::Option* rounds_planned =
      settle
          ->add_option("--rounds-planned", settle_args->rounds_planned,
                       "rounds the run spec asked for (default: --rounds); more settles a run "
                       "that reached its deadline: the payouts share escrow × rounds / "
                       "rounds-planned, the rest is refunded")
          ->transform(UnsignedInteger());
  settle
      ->add_option("--draft-from", settle_args->draft_from,
                   "take the whole draft from this sidecar's certified records (as --host): the "
                   "one settlement the members sign")
      ->excludes(final_root)
      ->excludes(payout)
      ->excludes(refund)
      ->excludes(metric)
      ->excludes(settle_args->eval_value_option)
      ->excludes(rounds)
      ->excludes(rounds_planned);
  settle->add_option("--submit-via", settle_args->submit_via,
                     "submit through this sidecar (default: submit with --key)");
  table.Add(settle, [settle_args](Context& ctx) { return RunSettle(ctx, *settle_args); });

  auto settlement_id = std::make_shared<uint64_t>(0);
  CLI::App* settlement = shard->add_subcommand("settlement", "a settled shard's record");
  settlement->add_option("--id", *settlement_id, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  table.Add(settlement,
            [settlement_id](Context& ctx) { return RunSettlement(ctx, *settlement_id); });
  AddTrainCommands(root, *shard, table);
  AddShardReportCommand(*shard, table);
}

}  // namespace ts::sidecar
