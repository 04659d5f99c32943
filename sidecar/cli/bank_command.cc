// `trainshard bank balance|send`: ngonka balances and transfers.
#include <memory>

#include "chain-bridge/module/tx.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"

namespace ts::sidecar {
namespace {

int RunBalance(Context& ctx, const std::string& address_text) {
  auto address = ParseAccountAddress("--address", address_text);
  if (!address.ok()) return ctx.BadInput(address.status());
  auto balance = ctx.chain().Balance(*address);
  if (!balance.ok()) return ctx.ChainFailed(balance.status());
  std::string amount = common::FormatAmount(*balance);
  if (ctx.json()) {
    ctx.PrintJson({{"address", *address}, {"amount", amount}});
  } else {
    PrintKeyValues(ctx.out(), {{"address", *address}, {"amount", amount + " ngonka"}});
  }
  return kExitOk;
}

struct SendArgs {
  std::string to;
  std::string amount;
  bool wait = false;
};

int RunSend(Context& ctx, const SendArgs& args) {
  auto to = ParseAccountAddress("--to", args.to);
  if (!to.ok()) return ctx.BadInput(to.status());
  auto amount = ParseAmountFlag("--amount", args.amount);
  if (!amount.ok()) return ctx.BadInput(amount.status());
  auto key = ctx.LoadKey("bank send");
  if (!key.ok()) return ctx.BadInput(key.status());

  cosmos::bank::v1beta1::MsgSend msg;
  msg.set_from_address(common::AddressFromPublicKey(key->public_key()));
  msg.set_to_address(*to);
  auto* coin = msg.add_amount();
  coin->set_denom(std::string(common::kDenom));
  coin->set_amount(common::FormatAmount(*amount));
  auto response = ctx.chain().SignAndBroadcast(*key, {bridge::PackMsg(msg)}, args.wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  return ctx.ReportTx(*response);
}

}  // namespace

void AddBankCommands(CLI::App& root, CommandTable& table) {
  CLI::App* bank = root.add_subcommand("bank", "balances and transfers");
  bank->require_subcommand(1);

  auto address = std::make_shared<std::string>();
  CLI::App* balance = bank->add_subcommand("balance", "an account's ngonka balance");
  balance->add_option("--address", *address, "gonka1... account address")->required();
  table.Add(balance, [address](Context& ctx) { return RunBalance(ctx, *address); });

  auto send_args = std::make_shared<SendArgs>();
  CLI::App* send = bank->add_subcommand("send", "send ngonka from the --key account");
  send->add_option("--to", send_args->to, "recipient address")->required();
  send->add_option("--amount", send_args->amount, "ngonka to send")->required();
  send->add_flag("--wait", send_args->wait, "wait until the tx is in a block");
  table.Add(send, [send_args](Context& ctx) { return RunSend(ctx, *send_args); });
}

}  // namespace ts::sidecar
