// The `trainshard` command groups. Each group adds its subcommands to the root CLI::App and
// records, for each leaf subcommand, the action to run once parsing has succeeded; an action
// returns the process exit code (see context.h).
//
// Thread-safety: used by one thread during one invocation.
#ifndef TS_SIDECAR_CLI_COMMANDS_H_
#define TS_SIDECAR_CLI_COMMANDS_H_

#include <functional>
#include <limits>
#include <map>

#include "CLI/CLI.hpp"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/training.pb.h"
#include "sidecar/cli/context.h"

namespace ts::sidecar {

using CommandAction = std::function<int(Context&)>;

class CommandTable {
 public:
  void Add(const CLI::App* command, CommandAction action) { actions_[command] = std::move(action); }
  // nullptr if `command` has no action (a group, not a leaf).
  const CommandAction* Find(const CLI::App* command) const {
    auto it = actions_.find(command);
    return it == actions_.end() ? nullptr : &it->second;
  }

 private:
  std::map<const CLI::App*, CommandAction> actions_;
};

// The help of every --host flag (ParseHostTarget).
inline constexpr char kHostFlagHelp[] =
    "the sidecar's operator socket: its data dir, unix:PATH (what <data_dir>/operator.addr "
    "holds) or the socket's path";

// Accepts only a base-10 integer without sign that fits 64 bits: CLI11 alone would read "-3" into
// a uint64_t as 2^64-3, clamp 18446744073709551616 to 2^64-1, and read "010" as octal. The value
// is rewritten in canonical form (no leading zeros) before CLI11 converts it; a value too large
// for a narrower option is CLI11's conversion error. The error names the value; CLI11 prefixes
// the flag.
inline CLI::Validator UnsignedInteger() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
          return "expected a non-negative base-10 integer, got \"" + text.substr(0, 40) + "\"";
        }
        uint64_t value = 0;
        for (char c : text) {
          const uint64_t digit = static_cast<uint64_t>(c - '0');
          if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
            return "\"" + text.substr(0, 40) + "\" is larger than " +
                   std::to_string(std::numeric_limits<uint64_t>::max());
          }
          value = value * 10 + digit;
        }
        text = std::to_string(value);
        return "";
      },
      "UINT");
}

// The settlement the host at `target` (a gRPC target, ParseHostTarget) says its certified
// training records imply for the shard (ShardRunOperator.DraftSettlement): the one draft it
// signs. Errors are the host's.
absl::StatusOr<gonka::trainshard::v1::Settlement> DraftFromHost(const std::string& target,
                                                                uint64_t shard_id,
                                                                int64_t timeout_ms);

// The host at `target`'s run of the shard (ShardRunOperator.Status). NOT_FOUND when it has
// none; otherwise the host's errors.
absl::StatusOr<gonka::trainshard::v1::ShardRunStatus> RunStatusFromHost(const std::string& target,
                                                                        uint64_t shard_id,
                                                                        int64_t timeout_ms);

void AddKeysCommands(CLI::App& root, CommandTable& table);
// `trainshard gonka ...`: Gonka's trainshards v0 messages and queries (docs/gonka-v0.md).
void AddGonkaCommands(CLI::App& root, CommandTable& table);
// Only in builds with the tokenizer (GCC: TS_HAVE_DATA_COMMANDS).
void AddDataCommands(CLI::App& root, CommandTable& table);
void AddDevnetCommands(CLI::App& root, CommandTable& table);
void AddChainCommands(CLI::App& root, CommandTable& table);
void AddBankCommands(CLI::App& root, CommandTable& table);
void AddWeightsCommands(CLI::App& root, CommandTable& table);
void AddProposalCommands(CLI::App& root, CommandTable& table);
void AddShardCommands(CLI::App& root, CommandTable& table);
void AddModelCommands(CLI::App& root, CommandTable& table);
// `shard run`, `shard train-status` (added to the shard group) and `eval`.
void AddTrainCommands(CLI::App& root, CLI::App& shard, CommandTable& table);
// `shard report` (shard_report.h).
void AddShardReportCommand(CLI::App& shard, CommandTable& table);
void AddHostCommands(CLI::App& root, CommandTable& table);
void AddArtifactCommands(CLI::App& root, CommandTable& table);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_COMMANDS_H_
