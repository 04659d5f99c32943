// `trainshard keys new|show`: account key files.
#include <memory>

#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "common/key_file.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"

namespace ts::sidecar {
namespace {

int PrintKey(Context& ctx, const common::PrivateKey& key) {
  std::string address = common::AddressFromPublicKey(key.public_key());
  std::string public_key = common::HexEncode(key.public_key());
  if (ctx.json()) {
    ctx.PrintJson({{"address", address}, {"public_key", public_key}});
  } else {
    PrintKeyValues(ctx.out(), {{"address", address}, {"public_key", public_key}});
  }
  return kExitOk;
}

int RunNew(Context& ctx, const std::string& out_path) {
  common::PrivateKey key = common::PrivateKey::Generate();
  absl::Status written = common::WriteNewKeyFile(out_path, key);
  if (!written.ok()) {
    return ctx.BadInput(absl::Status(written.code(), "--out: " + std::string(written.message())));
  }
  return PrintKey(ctx, key);
}

int RunShow(Context& ctx) {
  auto key = ctx.LoadKey("keys show");
  if (!key.ok()) return ctx.BadInput(key.status());
  return PrintKey(ctx, *key);
}

}  // namespace

void AddKeysCommands(CLI::App& root, CommandTable& table) {
  CLI::App* keys = root.add_subcommand("keys", "account key files");
  keys->require_subcommand(1);

  auto out_path = std::make_shared<std::string>();
  CLI::App* create = keys->add_subcommand("new", "generate a key into a new file (mode 0600)");
  create->add_option("--out", *out_path, "file to create; an existing file is never overwritten")
      ->required();
  table.Add(create, [out_path](Context& ctx) { return RunNew(ctx, *out_path); });

  CLI::App* show = keys->add_subcommand("show", "print the address of the key in --key");
  table.Add(show, [](Context& ctx) { return RunShow(ctx); });
}

}  // namespace ts::sidecar
