#include "sidecar/cli/cli.h"

#include <algorithm>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "chain-bridge/client/gonka_v0_client.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/context.h"

namespace ts::sidecar {

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool err_is_terminal) {
  Context context(out, err, err_is_terminal);
  GlobalOptions& options = context.options();
  const char* env_chain = std::getenv(std::string(kChainEnv).c_str());
  options.chain = env_chain != nullptr && env_chain[0] != '\0' ? env_chain : kDefaultChain;

  CLI::App app(
      "trainshard: keys, devnet, chain queries, proposals, shards, host sidecars and artifacts",
      "trainshard");
  // Subcommands inherit fallthrough, so the global options may follow any subcommand.
  app.fallthrough();
  app.require_subcommand(1);
  app.add_option("--chain", options.chain,
                 "HOST:PORT of the chain's gRPC endpoint (default: $TRAINSHARD_CHAIN, else " +
                     std::string(kDefaultChain) + ")");
  app.add_option("--chain-profile", options.chain_profile,
                 "the chain's profile: trainshard (this project's module) or gonka-v0 (Gonka's "
                 "trainshards v0)")
      ->check(CLI::IsMember(
          {std::string(bridge::kProfileTrainshard), std::string(bridge::kProfileGonkaV0)}));
  app.add_option("--key", options.key_file, "key file to sign with (hex secret, mode 0600)");
  app.add_flag("--json", options.json, "machine output: one JSON document on stdout");
  app.add_option("--timeout-ms", options.timeout_ms,
                 "deadline of each call, and of waiting for a tx to be included")
      ->check(CLI::Range(int64_t{1}, int64_t{24} * 3600 * 1000));

  CommandTable table;
  AddKeysCommands(app, table);
  AddDevnetCommands(app, table);
  AddChainCommands(app, table);
  AddBankCommands(app, table);
  AddWeightsCommands(app, table);
  AddProposalCommands(app, table);
  AddGonkaCommands(app, table);
  AddShardCommands(app, table);
  AddModelCommands(app, table);
  AddHostCommands(app, table);
  AddArtifactCommands(app, table);
#ifdef TS_HAVE_DATA_COMMANDS
  AddDataCommands(app, table);
#endif

  // CLI11 reports parse errors by throwing; this is the one place they are caught.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return app.exit(CLI::CallForHelp(), out, err);
  } catch (const CLI::CallForAllHelp&) {
    return app.exit(CLI::CallForAllHelp(), out, err);
  } catch (const CLI::ParseError& e) {
    // A mistyped command word is left over unparsed; CLI11 then reports only the missing
    // subcommand, so name the word too.
    std::vector<std::string> unknown = app.remaining(/*recurse=*/true);
    if (!unknown.empty()) {
      err << "error: unknown command or argument:";
      for (const auto& word : unknown) err << " " << word;
      err << "\n";
    }
    err << "error: " << e.what() << "\n";
    err << "run 'trainshard --help' (or '<command> --help') for usage\n";
    return kExitUsage;
  }

  const CLI::App* command = &app;
  while (!command->get_subcommands().empty()) command = command->get_subcommands().front();
  const CommandAction* action = table.Find(command);
  if (action == nullptr) {
    err << "error: '" << command->get_name() << "' needs a subcommand; see --help\n";
    return kExitUsage;
  }
  return (*action)(context);
}

}  // namespace ts::sidecar
