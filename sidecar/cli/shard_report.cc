#include "sidecar/cli/shard_report.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hex.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/host_client.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

bool Unreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
}

std::string ErrorText(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
}

// "unreachable", "refused", "no run", or the run's own state.
std::string HostState(const HostReport& host) {
  if (!host.reached.ok()) return Unreachable(host.reached) ? "unreachable" : "refused";
  if (host.run.has_value()) return host.run->state();
  if (absl::IsNotFound(host.run_error)) return "no run";
  return Unreachable(host.run_error) ? "unreachable" : "refused";
}

// The payout the settlement on chain gives `address`, if any.
const pb::HostPayout* PayoutOf(const ShardReport& report, const std::string& address) {
  if (!report.settlement.has_value() || address.empty()) return nullptr;
  for (const pb::HostPayout& p : report.settlement->settlement().payouts()) {
    if (p.host() == address) return &p;
  }
  return nullptr;
}

std::string Seconds(double total, uint32_t rounds) {
  if (rounds == 0) return absl::StrFormat("%.1f", total);
  return absl::StrFormat("%.1f (%.2f)", total, total / rounds);
}

double Mean(double total, uint32_t rounds) { return rounds == 0 ? 0 : total / rounds; }

std::string Dash(const std::string& text) { return text.empty() ? "-" : text; }

void PrintShardLines(std::ostream& out, const ShardReport& report) {
  KeyValues lines = {{"shard", std::to_string(report.shard_id)}};
  if (report.shard.has_value()) {
    lines.emplace_back(
        "status", ShortEnumName(pb::ShardStatus_Name(report.shard->status()), "SHARD_STATUS_"));
    lines.emplace_back("members", std::to_string(report.shard->reservations_size()));
  } else {
    lines.emplace_back("status",
                       absl::StrCat(Unreachable(report.shard_error) ? "cannot reach the chain: "
                                                                    : "the chain refused: ",
                                    ErrorText(report.shard_error)));
  }
  if (report.settlement.has_value()) {
    const pb::SettlementRecord& r = *report.settlement;
    lines.emplace_back(
        "settlement",
        absl::StrCat("height ", r.height(), ", rounds ", r.settlement().rounds_completed(), "/",
                     r.settlement().rounds_planned(), ", refund ", r.settlement().refund(),
                     " ngonka, ", r.signatures_size(), " signatures (weight ", r.signed_weight(),
                     ")"));
    lines.emplace_back("final_root", common::HexEncode(r.settlement().final_checkpoint_root()));
  } else if (absl::IsNotFound(report.settlement_error)) {
    lines.emplace_back("settlement", "none yet");
  } else if (report.shard.has_value()) {
    lines.emplace_back("settlement", ErrorText(report.settlement_error));
  }
  size_t unreachable = 0;
  for (const HostReport& host : report.hosts) {
    if (HostState(host) == "unreachable") ++unreachable;
  }
  lines.emplace_back(
      "hosts", absl::StrCat(report.hosts.size(), " asked, ", unreachable, " could not be reached"));
  PrintKeyValues(out, lines);
}

void PrintRuns(std::ostream& out, const ShardReport& report) {
  std::vector<std::vector<std::string>> rows;
  for (const HostReport& host : report.hosts) {
    std::vector<std::string> row = {host.target, Dash(host.address), HostState(host)};
    if (host.run.has_value()) {
      const pb::ShardRunStatus& run = *host.run;
      row.insert(
          row.end(),
          {absl::StrCat(run.certified_round(), "/", run.rounds_total()),
           std::to_string(SumTimings(run, host.address).rounds), Dash(run.worker_device()),
           absl::StrCat(run.replays_passed(), "/", run.replays()), std::to_string(run.marks())});
    } else {
      row.insert(row.end(), {"-", "-", "-", "-", "-"});
    }
    rows.push_back(std::move(row));
  }
  PrintTable(
      out,
      {"HOST", "ADDRESS", "STATE", "CERTIFIED", "CONTRIBUTED", "DEVICE", "REPLAYS_PASSED", "MARKS"},
      rows);
}

void PrintTimings(std::ostream& out, const ShardReport& report) {
  std::vector<std::vector<std::string>> rows;
  for (const HostReport& host : report.hosts) {
    if (!host.run.has_value()) continue;
    const pb::ShardRunStatus& run = *host.run;
    const HostTimings t = SumTimings(run, host.address);
    rows.push_back({host.target, std::to_string(t.rounds), Seconds(t.inner_s, t.rounds),
                    Seconds(t.exchange_s, t.rounds), Seconds(t.certify_s, t.rounds),
                    Seconds(t.publish_s, t.rounds), absl::StrFormat("%.1f", run.replay_seconds()),
                    absl::StrFormat("%.1f", run.wall_seconds())});
  }
  if (rows.empty()) return;
  out << "\ntimings in seconds: total over the rounds contributed (mean per round)\n";
  PrintTable(
      out,
      {"HOST", "ROUNDS", "INNER_S", "EXCHANGE_S", "CERTIFY_S", "PUBLISH_S", "REPLAY_S", "WALL_S"},
      rows);
}

void PrintPayouts(std::ostream& out, const ShardReport& report) {
  if (!report.settlement.has_value()) {
    out << "\npaid: nothing yet (no settlement on chain)\n";
    return;
  }
  std::vector<std::vector<std::string>> rows;
  for (const HostReport& host : report.hosts) {
    if (host.address.empty()) continue;
    const pb::HostPayout* p = PayoutOf(report, host.address);
    if (p == nullptr) {
      rows.push_back({host.target, host.address, "no payout", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    rows.push_back({host.target, host.address, p->amount(), std::to_string(p->rounds_contributed()),
                    std::to_string(p->tokens()), std::to_string(p->verified()),
                    std::to_string(p->rejected()), std::to_string(p->marks()),
                    std::to_string(p->score())});
  }
  if (rows.empty()) return;
  out << "\npaid (ngonka) by the settlement on chain\n";
  PrintTable(
      out,
      {"HOST", "ADDRESS", "PAID", "ROUNDS", "TOKENS", "VERIFIED", "REJECTED", "MARKS", "SCORE"},
      rows);
}

void PrintProblems(std::ostream& out, const ShardReport& report) {
  bool first = true;
  auto heading = [&] {
    if (first) out << "\n";
    first = false;
  };
  for (const HostReport& host : report.hosts) {
    if (!host.reached.ok()) {
      heading();
      out << host.target << ": " << (Unreachable(host.reached) ? "cannot reach: " : "refused: ")
          << ErrorText(host.reached) << "\n";
      continue;
    }
    if (!host.run.has_value()) {
      heading();
      out << host.target << ": no run of shard " << report.shard_id << ": "
          << ErrorText(host.run_error) << "\n";
      continue;
    }
    const pb::ShardRunStatus& run = *host.run;
    if (!run.error().empty()) {
      heading();
      out << host.target << ": error: " << run.error() << "\n";
    }
    if (run.transitions_size() > 0) {
      heading();
      const int shown = std::min(run.transitions_size(), kReportTransitionsShown);
      out << host.target << ": " << run.transitions_size() << " transitions"
          << (shown < run.transitions_size() ? absl::StrCat(", the latest ", shown) : "") << ":\n";
      for (int i = run.transitions_size() - shown; i < run.transitions_size(); ++i) {
        out << "  " << run.transitions(i) << "\n";
      }
    }
  }
}

nlohmann::ordered_json RunJson(const pb::ShardRunStatus& run, const std::string& address) {
  const HostTimings t = SumTimings(run, address);
  nlohmann::ordered_json transitions = nlohmann::ordered_json::array();
  for (const std::string& line : run.transitions()) transitions.push_back(line);
  return {
      {"state", run.state()},
      {"error", run.error()},
      {"certified_round", run.certified_round()},
      {"rounds_total", run.rounds_total()},
      {"rounds_contributed", t.rounds},
      {"worker_device", run.worker_device()},
      {"replays", run.replays()},
      {"replays_passed", run.replays_passed()},
      {"marks", run.marks()},
      {"timings",
       {{"inner_s", t.inner_s},
        {"inner_s_mean", Mean(t.inner_s, t.rounds)},
        {"exchange_s", t.exchange_s},
        {"exchange_s_mean", Mean(t.exchange_s, t.rounds)},
        {"certify_s", t.certify_s},
        {"certify_s_mean", Mean(t.certify_s, t.rounds)},
        {"publish_s", t.publish_s},
        {"publish_s_mean", Mean(t.publish_s, t.rounds)},
        {"replay_s", run.replay_seconds()},
        {"wall_s", run.wall_seconds()}}},
      {"transitions", std::move(transitions)},
  };
}

}  // namespace

HostTimings SumTimings(const pb::ShardRunStatus& run, const std::string& address) {
  HostTimings t;
  for (const pb::RoundSummary& round : run.rounds()) {
    if (!address.empty() && std::find(round.members().begin(), round.members().end(), address) ==
                                round.members().end()) {
      continue;  // certified without this host (it caught up on it)
    }
    ++t.rounds;
    t.inner_s += round.inner_seconds();
    t.exchange_s += round.exchange_seconds();
    t.certify_s += round.certify_seconds();
    t.publish_s += round.publish_seconds();
  }
  return t;
}

ShardReport GatherShardReport(Context& ctx, uint64_t shard_id,
                              const std::vector<std::string>& targets) {
  ShardReport report;
  report.shard_id = shard_id;
  auto shard = ctx.chain().Shard(shard_id);
  if (shard.ok()) {
    report.shard = *std::move(shard);
    auto settlement = ctx.chain().Settlement(shard_id);
    if (settlement.ok()) {
      report.settlement = *std::move(settlement);
    } else {
      report.settlement_error = settlement.status();
    }
  } else {
    report.shard_error = shard.status();
    report.settlement_error = shard.status();
  }
  for (const std::string& target : targets) {
    HostReport host;
    host.target = target;
    HostClient client(target, ctx.options().timeout_ms);
    auto status = client.Status();
    if (!status.ok()) {
      host.reached = status.status();
      report.hosts.push_back(std::move(host));
      continue;
    }
    host.address = status->address();
    auto run = RunStatusFromHost(target, shard_id, ctx.options().timeout_ms);
    if (run.ok()) {
      host.run = *std::move(run);
    } else {
      host.run_error = run.status();
    }
    report.hosts.push_back(std::move(host));
  }
  return report;
}

void PrintShardReport(std::ostream& out, const ShardReport& report) {
  PrintShardLines(out, report);
  if (!report.hosts.empty()) {
    out << "\n";
    PrintRuns(out, report);
  }
  PrintTimings(out, report);
  PrintPayouts(out, report);
  PrintProblems(out, report);
}

nlohmann::ordered_json ShardReportJson(const ShardReport& report) {
  nlohmann::ordered_json doc = {{"shard_id", report.shard_id}};
  if (report.shard.has_value()) {
    doc["status"] = ShortEnumName(pb::ShardStatus_Name(report.shard->status()), "SHARD_STATUS_");
    doc["chain_error"] = "";
  } else {
    doc["status"] = nullptr;
    doc["chain_error"] = ErrorText(report.shard_error);
  }
  if (report.settlement.has_value()) {
    const pb::SettlementRecord& r = *report.settlement;
    doc["settlement"] = {
        {"height", r.height()},
        {"rounds_completed", r.settlement().rounds_completed()},
        {"rounds_planned", r.settlement().rounds_planned()},
        {"refund", r.settlement().refund()},
        {"final_checkpoint_root", common::HexEncode(r.settlement().final_checkpoint_root())},
        {"signatures", r.signatures_size()},
        {"signed_weight", r.signed_weight()},
        {"submitter", r.submitter()},
    };
  } else {
    doc["settlement"] = nullptr;
  }
  nlohmann::ordered_json hosts = nlohmann::ordered_json::array();
  size_t unreachable = 0;
  for (const HostReport& host : report.hosts) {
    const std::string state = HostState(host);
    if (state == "unreachable") ++unreachable;
    nlohmann::ordered_json entry = {
        {"host", host.target}, {"state", state},          {"reachable", host.reached.ok()},
        {"error", ""},         {"address", host.address}, {"run", nullptr},
        {"payout", nullptr}};
    if (!host.reached.ok()) {
      entry["error"] = ErrorText(host.reached);
    } else if (!host.run.has_value()) {
      entry["error"] = ErrorText(host.run_error);
    } else {
      entry["run"] = RunJson(*host.run, host.address);
    }
    if (const pb::HostPayout* p = PayoutOf(report, host.address); p != nullptr) {
      entry["payout"] = ProtoToJsonValue(*p);
    }
    hosts.push_back(std::move(entry));
  }
  doc["hosts"] = std::move(hosts);
  doc["unreachable"] = unreachable;
  return doc;
}

int ShardReportExitCode(const ShardReport& report) {
  bool refused = !report.shard_error.ok() && !Unreachable(report.shard_error);
  bool unreachable = Unreachable(report.shard_error);
  if (!report.settlement_error.ok() && !absl::IsNotFound(report.settlement_error)) {
    if (Unreachable(report.settlement_error)) {
      unreachable = true;
    } else {
      refused = true;
    }
  }
  for (const HostReport& host : report.hosts) {
    const std::string state = HostState(host);
    if (state == "unreachable") unreachable = true;
    if (state == "refused") refused = true;
  }
  if (unreachable) return kExitUnreachable;
  return refused ? kExitRefused : kExitOk;
}

namespace {

struct ReportArgs {
  uint64_t id = 0;
  std::string hosts;
};

int RunReport(Context& ctx, const ReportArgs& args) {
  auto targets = ParseHostTargetList("--hosts", args.hosts);
  if (!targets.ok()) return ctx.BadInput(targets.status());
  const ShardReport report = GatherShardReport(ctx, args.id, *targets);
  if (ctx.json()) {
    ctx.PrintJson(ShardReportJson(report));
  } else {
    PrintShardReport(ctx.out(), report);
  }
  const int code = ShardReportExitCode(report);
  if (code == kExitUnreachable) {
    ctx.err() << "error: some hosts (or the chain) could not be reached; the report shows the "
                 "rest\n";
  } else if (code == kExitRefused) {
    ctx.err() << "error: some hosts (or the chain) refused; the report shows why\n";
  }
  return code;
}

}  // namespace

void AddShardReportCommand(CLI::App& shard, CommandTable& table) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* report = shard.add_subcommand(
      "report",
      "per host of a shard: its run (rounds, errors, timings, replays, marks) and what it was "
      "paid");
  report->add_option("--id", args->id, "shard id")->transform(UnsignedInteger())->required();
  report
      ->add_option("--hosts", args->hosts,
                   "the sidecars' operator sockets (as --host), comma-separated")
      ->required();
  table.Add(report, [args](Context& ctx) { return RunReport(ctx, *args); });
}

}  // namespace ts::sidecar
