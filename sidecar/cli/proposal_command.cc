// `trainshard proposal submit|vote|show`: governance proposals that open shards.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/validation.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "cosmos/gov/v1/tx.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "google/protobuf/util/json_util.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"
#include "sidecar/shard/run_spec.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

struct SubmitArgs {
  std::string spec_file;
  std::string run_spec_file;
  std::vector<std::string> readers;
  std::string deposit;
  std::string title;
  std::string summary;
  bool wait = false;
};

absl::StatusOr<pb::ShardSpec> ReadSpec(const std::string& path) {
  auto text = ReadInputFile("--spec", path);
  if (!text.ok()) return text.status();
  pb::ShardSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(*text, &spec, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec \"", path, "\": not a protobuf-JSON ShardSpec: ", std::string(parsed.message())));
  }
  return spec;
}

// The first value of attribute `key` in the tx's events, or "".
std::string FindAttribute(const cosmos::base::abci::v1beta1::TxResponse& response,
                          const std::string& key) {
  for (const auto& event : response.events()) {
    std::string value = EventAttribute(event, key);
    if (!value.empty()) return value;
  }
  return "";
}

int RunSubmit(Context& ctx, const SubmitArgs& args) {
  auto spec = ReadSpec(args.spec_file);
  if (!spec.ok()) return ctx.BadInput(spec.status());
  if (!args.run_spec_file.empty()) {
    // The shard pins the run spec by the SHA-256 of its exact bytes and carries the bytes, so
    // every host reads and checks the same document before it reserves (docs/training.md). A
    // document the hosts would refuse is refused here, before any deposit is locked.
    auto doc = ReadInputFile("--run-spec", args.run_spec_file);
    if (!doc.ok()) return ctx.BadInput(doc.status());
    if (doc->size() > bridge::kRunSpecBytesMax) {
      return ctx.BadInput(absl::InvalidArgumentError(
          absl::StrCat("--run-spec \"", args.run_spec_file, "\": ", doc->size(),
                       " bytes, the chain carries at most ", bridge::kRunSpecBytesMax)));
    }
    auto parsed = ParseRunSpec(*doc);
    if (!parsed.ok()) {
      return ctx.BadInput(absl::InvalidArgumentError(
          absl::StrCat("--run-spec \"", args.run_spec_file, "\": ", parsed.status().message())));
    }
    spec->set_run_spec_hash(parsed->hash);
    spec->set_run_spec(*doc);
  }
  for (const std::string& reader : args.readers) spec->add_readers(reader);
  auto deposit = ParseAmountFlag("--deposit", args.deposit);
  if (!deposit.ok()) return ctx.BadInput(deposit.status());
  auto key = ctx.LoadKey("proposal submit");
  if (!key.ok()) return ctx.BadInput(key.status());
  auto params = ctx.chain().Params();
  if (!params.ok()) return ctx.ChainFailed(params.status());

  std::string address = common::AddressFromPublicKey(key->public_key());
  pb::MsgCreateTrainshardProposal create;
  create.set_authority(params->gov_address());
  create.set_creator(address);
  *create.mutable_spec() = *spec;

  const google::protobuf::Any msg = bridge::GovProposalMsg(
      address,
      args.title.empty() ? absl::StrCat("Open a trainshard shard (", spec->hardware_profile(), ", ",
                                        spec->min_nodes(), "-", spec->max_nodes(), " nodes)")
                         : args.title,
      args.summary, common::FormatAmount(*deposit), {bridge::PackMsg(create)});

  auto response = ctx.chain().SignAndBroadcast(*key, {msg}, args.wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  if (!args.wait || response->code() != 0) return ctx.ReportTx(*response);

  std::string proposal_id = FindAttribute(*response, "proposal_id");
  std::string shard_id = FindAttribute(*response, "shard_id");
  if (shard_id.empty() && !proposal_id.empty()) {
    // The events may name only the proposal; the proposal record names its shard.
    auto id = common::ParseAmount("proposal_id", proposal_id);
    if (id.ok()) {
      auto proposal = ctx.chain().Proposal(*id);
      if (proposal.ok() && proposal->shard_id() != 0) {
        shard_id = std::to_string(proposal->shard_id());
      }
    }
  }
  if (ctx.json()) {
    ctx.PrintJson({{"txhash", response->txhash()},
                   {"code", response->code()},
                   {"height", std::to_string(response->height())},
                   {"proposal_id", proposal_id},
                   {"shard_id", shard_id}});
  } else {
    PrintKeyValues(ctx.out(), {{"txhash", response->txhash()},
                               {"code", std::to_string(response->code())},
                               {"height", std::to_string(response->height())},
                               {"proposal_id", proposal_id},
                               {"shard_id", shard_id}});
  }
  if (proposal_id.empty()) {
    ctx.err() << "warning: the tx's events carry no proposal_id\n";
  }
  return kExitOk;
}

struct VoteArgs {
  uint64_t id = 0;
  std::string option;
  bool wait = false;
};

int RunVote(Context& ctx, const VoteArgs& args) {
  auto option = ParseVoteOption("--option", args.option);
  if (!option.ok()) return ctx.BadInput(option.status());
  auto key = ctx.LoadKey("proposal vote");
  if (!key.ok()) return ctx.BadInput(key.status());
  cosmos::gov::v1::MsgVote msg;
  msg.set_proposal_id(args.id);
  msg.set_voter(common::AddressFromPublicKey(key->public_key()));
  msg.set_option(*option);
  auto response = ctx.chain().SignAndBroadcast(*key, {bridge::PackMsg(msg)}, args.wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  return ctx.ReportTx(*response);
}

int RunShow(Context& ctx, uint64_t id) {
  auto proposal = ctx.chain().Proposal(id);
  if (!proposal.ok()) return ctx.ChainFailed(proposal.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*proposal);
    return kExitOk;
  }
  const pb::TallyResult& tally = proposal->final_tally();
  KeyValues lines = {
      {"id", std::to_string(proposal->id())},
      {"status", ShortEnumName(pb::ProposalStatus_Name(proposal->status()), "PROPOSAL_STATUS_")},
      {"title", proposal->title()},
      {"proposer", proposal->proposer()},
      {"deposit", proposal->deposit()},
      {"submit_height", std::to_string(proposal->submit_height())},
      {"voting_end_height", std::to_string(proposal->voting_end_height())},
      {"weight_epoch", std::to_string(proposal->weight_epoch())},
      {"total_weight", std::to_string(proposal->total_weight())},
      {"tally", absl::StrCat("yes=", tally.yes(), " no=", tally.no(), " abstain=", tally.abstain(),
                             " veto=", tally.no_with_veto())},
      {"shard_id", std::to_string(proposal->shard_id())},
  };
  if (!proposal->summary().empty()) lines.emplace_back("summary", proposal->summary());
  if (!proposal->failed_reason().empty()) {
    lines.emplace_back("failed_reason", proposal->failed_reason());
  }
  PrintKeyValues(ctx.out(), lines);
  return kExitOk;
}

}  // namespace

void AddProposalCommands(CLI::App& root, CommandTable& table) {
  CLI::App* proposal = root.add_subcommand("proposal", "governance proposals");
  proposal->require_subcommand(1);

  auto submit_args = std::make_shared<SubmitArgs>();
  CLI::App* submit =
      proposal->add_subcommand("submit", "propose a shard (the --key account funds the escrow)");
  submit->add_option("--spec", submit_args->spec_file, "protobuf-JSON ShardSpec file")->required();
  submit->add_option("--run-spec", submit_args->run_spec_file,
                     "run spec document: carried on chain with its SHA-256 as run_spec_hash; the "
                     "hosts start the run from it");
  submit->add_option("--reader", submit_args->readers,
                     "an address that may fetch the shard's checkpoints besides the creator "
                     "(repeatable)");
  submit->add_option("--deposit", submit_args->deposit, "initial deposit, ngonka")->required();
  submit->add_option("--title", submit_args->title, "proposal title");
  submit->add_option("--summary", submit_args->summary, "proposal summary");
  submit->add_flag("--wait", submit_args->wait,
                   "wait until the tx is in a block and print the proposal and shard ids");
  table.Add(submit, [submit_args](Context& ctx) { return RunSubmit(ctx, *submit_args); });

  auto vote_args = std::make_shared<VoteArgs>();
  CLI::App* vote = proposal->add_subcommand("vote", "vote with the --key account's PoC weight");
  vote->add_option("--id", vote_args->id, "proposal id")->transform(UnsignedInteger())->required();
  vote->add_option("--option", vote_args->option, "yes|no|abstain|veto")->required();
  vote->add_flag("--wait", vote_args->wait, "wait until the tx is in a block");
  table.Add(vote, [vote_args](Context& ctx) { return RunVote(ctx, *vote_args); });

  auto show_id = std::make_shared<uint64_t>(0);
  CLI::App* show = proposal->add_subcommand("show", "a proposal and its tally");
  show->add_option("--id", *show_id, "proposal id")->transform(UnsignedInteger())->required();
  table.Add(show, [show_id](Context& ctx) { return RunShow(ctx, *show_id); });
}

}  // namespace ts::sidecar
