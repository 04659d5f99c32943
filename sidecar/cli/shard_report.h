// `trainshard shard report`: one shard as its hosts and the chain see it. For each host named on
// the command line: whether it could be reached, its account, what its run did
// (ShardRunOperator.Status: state, rounds certified and contributed to, worker device, replays
// and marks, timings, the error and the latest transitions), and what the settlement on chain
// paid it (its HostPayout). docs/cli.md "shard report" shows the output.
//
// The report is gathered first (GatherShardReport, the only part that calls anyone) and then
// printed from plain values, so its formatting is tested with hand-built messages.
//
// Thread-safety: pure functions of their arguments, except GatherShardReport, which uses the
// Context of one invocation (one thread).
#ifndef TS_SIDECAR_CLI_SHARD_REPORT_H_
#define TS_SIDECAR_CLI_SHARD_REPORT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "nlohmann/json.hpp"
#include "sidecar/cli/context.h"

namespace ts::sidecar {

// The latest transitions of each host the human form shows (--json has all the host keeps).
inline constexpr int kReportTransitionsShown = 5;

struct HostReport {
  std::string target;  // the operator address as given in --hosts
  // Why the host's status could not be had (HostOperator.Status); OK when it answered.
  absl::Status reached;
  std::string address;  // its account (from its status); empty when not reached
  // Its run of the shard, or why none: NOT_FOUND (no run of this shard there), or the call's
  // error. Not asked when the host was not reached.
  std::optional<gonka::trainshard::v1::ShardRunStatus> run;
  absl::Status run_error;
};

struct ShardReport {
  uint64_t shard_id = 0;
  // The shard on chain, or the query's error.
  std::optional<gonka::trainshard::v1::Shard> shard;
  absl::Status shard_error;
  // The settlement on chain; NOT_FOUND while the shard is not settled.
  std::optional<gonka::trainshard::v1::SettlementRecord> settlement;
  absl::Status settlement_error;
  std::vector<HostReport> hosts;
};

// What a host's rounds add up to: the rounds of its run's list (the latest 256 certified) whose
// members include its address (all of them when the address is not known), and their timings.
struct HostTimings {
  uint32_t rounds = 0;
  double inner_s = 0;
  double exchange_s = 0;
  double certify_s = 0;
  double publish_s = 0;
};
HostTimings SumTimings(const gonka::trainshard::v1::ShardRunStatus& run,
                       const std::string& address);

// Asks the chain for the shard and its settlement, then each host in turn (each call within
// --timeout-ms). Never fails: every error is kept in the report.
ShardReport GatherShardReport(Context& ctx, uint64_t shard_id,
                              const std::vector<std::string>& targets);

// The human form: the shard's lines, a table of runs, one of timings, one of payouts, then per
// host its error and latest transitions (or why it could not be reached).
void PrintShardReport(std::ostream& out, const ShardReport& report);
// The --json document (docs/cli.md).
nlohmann::ordered_json ShardReportJson(const ShardReport& report);

// kExitUnreachable when the chain or a host could not be reached (UNAVAILABLE or
// DEADLINE_EXCEEDED), else kExitRefused when one refused (a host with no run of the shard is not
// a refusal, nor a shard not settled yet), else kExitOk.
int ShardReportExitCode(const ShardReport& report);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_SHARD_REPORT_H_
