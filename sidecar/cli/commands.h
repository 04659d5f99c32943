// The `trainshard` command groups. Each group adds its subcommands to the root CLI::App and
// records, for each leaf subcommand, the action to run once parsing has succeeded; an action
// returns the process exit code (see context.h).
//
// Thread-safety: used by one thread during one invocation.
#ifndef TS_SIDECAR_CLI_COMMANDS_H_
#define TS_SIDECAR_CLI_COMMANDS_H_

#include <functional>
#include <map>

#include "CLI/CLI.hpp"
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

void AddKeysCommands(CLI::App& root, CommandTable& table);
void AddDevnetCommands(CLI::App& root, CommandTable& table);
void AddChainCommands(CLI::App& root, CommandTable& table);
void AddBankCommands(CLI::App& root, CommandTable& table);
void AddWeightsCommands(CLI::App& root, CommandTable& table);
void AddProposalCommands(CLI::App& root, CommandTable& table);
void AddShardCommands(CLI::App& root, CommandTable& table);
void AddHostCommands(CLI::App& root, CommandTable& table);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_COMMANDS_H_
