// `trainshard gonka ...`: Gonka's trainshards v0 (docs/gonka-v0.md) on a chain of the gonka-v0
// profile: the governance proposal that creates a trainshard proposal, the creator's assemble,
// settle and kicks, a host's opt-in and refresh, and the three `inference.inference.Query` reads.
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "chain-bridge/client/gonka_v0_client.h"
#include "chain-bridge/module/gonka_v0.h"
#include "chain-bridge/module/tx.h"
#include "common/amount.h"
#include "common/crypto/bech32.h"
#include "common/hex.h"
#include "inference/inference/trainshard.grpc.pb.h"
#include "inference/inference/trainshard.pb.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"
#include "sidecar/cli/rpc.h"
#include "sidecar/shard/run_spec.h"

namespace ts::sidecar {
namespace gv0 = ::inference::inference;
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " \"", value.substr(0, 200), "\": ", why));
}

struct Signer {
  common::PrivateKey key;
  std::string address;
};

absl::StatusOr<Signer> LoadSigner(Context& ctx, std::string_view command) {
  auto key = ctx.LoadKey(command);
  if (!key.ok()) return key.status();
  std::string address = common::AddressFromPublicKey(key->public_key());
  return Signer{*std::move(key), std::move(address)};
}

// An attribute of a delivered tx's events: {event type (empty: any), attribute key}.
using EventField = std::pair<std::string, std::string>;

// Signs and broadcasts `msg`. Without --wait, or for a tx the chain refused, it reports the
// TxResponse as every tx command does; a delivered tx prints txhash, code and height followed by
// each of `fields` under its key and the `extra` values (the TxResponse when there are neither).
int Broadcast(Context& ctx, const Signer& signer, const google::protobuf::Any& msg, bool wait,
              const std::vector<EventField>& fields = {}, const KeyValues& extra = {}) {
  auto response = ctx.chain().SignAndBroadcast(signer.key, {msg}, wait);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  if (!wait || response->code() != 0 || (fields.empty() && extra.empty())) {
    return ctx.ReportTx(*response);
  }
  KeyValues lines = {{"txhash", response->txhash()},
                     {"code", std::to_string(response->code())},
                     {"height", std::to_string(response->height())}};
  for (const auto& [type, key] : fields) {
    std::string value;
    for (const auto& event : response->events()) {
      if (value.empty() && (type.empty() || event.type() == type)) {
        value = EventAttribute(event, key);
      }
    }
    // The tx is in a block either way; a missing value means a chain that names it otherwise.
    if (value.empty()) ctx.err() << "warning: the tx's events carry no " << key << "\n";
    lines.emplace_back(key, value);
  }
  lines.insert(lines.end(), extra.begin(), extra.end());
  if (!ctx.json()) {
    PrintKeyValues(ctx.out(), lines);
    return kExitOk;
  }
  nlohmann::ordered_json document;
  for (const auto& [key, value] : lines) document[key] = value;
  document["code"] = response->code();  // a number, as `proposal submit` prints it
  ctx.PrintJson(document);
  return kExitOk;
}

// --- gonka propose

struct ProposeArgs {
  std::string gpu_profile;
  uint32_t max_nodes = 0;
  int64_t duration_blocks = 0;
  std::string run_spec_file;
  std::string base_image;
  std::string run_key;
  std::string creator;
  std::string deposit;
  std::string title;
  std::string summary;
  bool wait = false;
};

// The base_image Gonka's keeper accepts when the proposal executes: a refusal then would come
// only after the vote, with the deposit spent, so it is checked here first.
absl::StatusOr<std::string> ProposalBaseImage(const ProposeArgs& args) {
  if (!args.run_spec_file.empty()) {
    auto doc = ReadInputFile("--run-spec", args.run_spec_file);
    if (!doc.ok()) return doc.status();
    // v0 carries no run spec: the image digest is the one on-chain pin of the document the
    // creator hands to the hosts, so it must be one the hosts would accept.
    auto parsed = ParseRunSpec(*doc);
    if (!parsed.ok()) return Bad("--run-spec", args.run_spec_file, parsed.status().message());
    return bridge::RunSpecBaseImage(parsed->hash);
  }
  if (args.base_image.empty()) {
    return absl::InvalidArgumentError("one of --run-spec FILE or --base-image IMAGE is required");
  }
  auto hash = bridge::RunSpecHashFromBaseImage(args.base_image);
  if (!hash.ok()) return Bad("--base-image", args.base_image, hash.status().message());
  if (args.base_image.size() > bridge::kGonkaMaxBaseImageBytes) {
    return Bad("--base-image", args.base_image,
               absl::StrCat(args.base_image.size(), " bytes, the chain takes at most ",
                            bridge::kGonkaMaxBaseImageBytes));
  }
  if (!args.base_image.ends_with(common::HexEncode(*hash))) {
    return Bad("--base-image", args.base_image, "the chain takes the digest in lower case only");
  }
  return args.base_image;
}

int RunPropose(Context& ctx, const ProposeArgs& args) {
  if (args.gpu_profile.empty()) return ctx.BadInput(Bad("--gpu-profile", "", "is empty"));
  if (args.max_nodes == 0) return ctx.BadInput(Bad("--max-nodes", "0", "must be at least 1"));
  if (args.duration_blocks <= 0 || args.duration_blocks > bridge::kGonkaBlocksMax) {
    return ctx.BadInput(Bad("--duration-blocks", std::to_string(args.duration_blocks),
                            absl::StrCat("must be in [1, ", bridge::kGonkaBlocksMax, "]")));
  }
  auto base_image = ProposalBaseImage(args);
  if (!base_image.ok()) return ctx.BadInput(base_image.status());
  if (!args.run_key.empty()) {
    auto run_key = ParseAccountAddress("--run-key", args.run_key);
    if (!run_key.ok()) return ctx.BadInput(run_key.status());
  }
  if (!args.creator.empty()) {
    auto creator = ParseAccountAddress("--creator", args.creator);
    if (!creator.ok()) return ctx.BadInput(creator.status());
  }
  auto deposit = ParseAmountFlag("--deposit", args.deposit);
  if (!deposit.ok()) return ctx.BadInput(deposit.status());
  auto signer = LoadSigner(ctx, "gonka propose");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  auto params = ctx.chain().Params();
  if (!params.ok()) return ctx.ChainFailed(params.status());

  gv0::MsgCreateTrainshardProposal create;
  create.set_authority(params->gov_address());
  create.set_creator(args.creator.empty() ? signer->address : args.creator);
  create.set_gpu_profile_id(args.gpu_profile);
  create.set_max_nodes(args.max_nodes);
  create.set_max_duration_blocks(args.duration_blocks);
  create.set_base_image(*base_image);
  create.set_run_key(args.run_key);

  const google::protobuf::Any msg = bridge::GovProposalMsg(
      signer->address,
      args.title.empty()
          ? absl::StrCat("Gonka trainshard (", args.gpu_profile, ", up to ", args.max_nodes,
                         " nodes, ", args.duration_blocks, " blocks)")
          : args.title,
      args.summary, common::FormatAmount(*deposit), {bridge::PackMsg(create)});
  // The gov proposal's id: the trainshard proposal that assemble takes gets its own id only
  // when the passed proposal executes (event trainshard_proposal_created).
  return Broadcast(ctx, *signer, msg, args.wait, {{"", "proposal_id"}},
                   {{"base_image", *base_image}});
}

// --- gonka assemble | settle | kick

struct IdArgs {
  uint64_t id = 0;
  bool wait = false;
};

int RunAssemble(Context& ctx, const IdArgs& args) {
  auto signer = LoadSigner(ctx, "gonka assemble");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  gv0::MsgAssembleTrainshard msg;
  msg.set_creator(signer->address);
  msg.set_proposal_id(args.id);
  return Broadcast(ctx, *signer, bridge::PackMsg(msg), args.wait,
                   {{"trainshard_assembled", "trainshard_id"}});
}

int RunSettle(Context& ctx, const IdArgs& args) {
  auto signer = LoadSigner(ctx, "gonka settle");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  gv0::MsgSettleTrainshard msg;
  msg.set_creator(signer->address);
  msg.set_trainshard_id(args.id);
  return Broadcast(ctx, *signer, bridge::PackMsg(msg), args.wait);
}

struct KickArgs {
  uint64_t id = 0;
  std::string participant;
  std::string node;
  std::string reason;
  std::string request_id;
  bool wait = false;
};

int RunKick(Context& ctx, const KickArgs& args) {
  auto participant = ParseAccountAddress("--participant", args.participant);
  if (!participant.ok()) return ctx.BadInput(participant.status());
  if (args.node.empty()) return ctx.BadInput(Bad("--node", "", "is empty"));
  if (args.reason.size() > bridge::kGonkaMaxKickReasonBytes) {
    return ctx.BadInput(Bad("--reason", args.reason,
                            absl::StrCat(args.reason.size(), " bytes, the chain takes at most ",
                                         bridge::kGonkaMaxKickReasonBytes)));
  }
  if (args.request_id.empty() || args.request_id.size() > bridge::kGonkaMaxRequestIdBytes) {
    return ctx.BadInput(Bad("--request-id", args.request_id,
                            absl::StrCat("must be 1 to ", bridge::kGonkaMaxRequestIdBytes,
                                         " bytes (a retry with the same id is a no-op)")));
  }
  auto signer = LoadSigner(ctx, "gonka kick");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  gv0::MsgAutokickTrainshardNode msg;
  msg.set_creator(signer->address);
  msg.set_trainshard_id(args.id);
  msg.set_participant(args.participant);
  msg.set_node_id(args.node);
  msg.set_reason(args.reason);
  msg.set_request_id(args.request_id);
  return Broadcast(ctx, *signer, bridge::PackMsg(msg), args.wait);
}

// --- gonka opt-in | refresh

struct OptInArgs {
  std::string node;
  bool off = false;
  bool wait = false;
};

int RunOptIn(Context& ctx, const OptInArgs& args) {
  if (args.node.empty()) return ctx.BadInput(Bad("--node", "", "is empty"));
  auto signer = LoadSigner(ctx, "gonka opt-in");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  gv0::MsgSetTrainingNodeOptIn msg;
  msg.set_creator(signer->address);
  msg.set_node_id(args.node);
  msg.set_opt_in(!args.off);
  return Broadcast(ctx, *signer, bridge::PackMsg(msg), args.wait);
}

struct RefreshArgs {
  std::vector<std::string> nodes;
  std::string endpoint;
  bool wait = false;
};

int RunRefresh(Context& ctx, const RefreshArgs& args) {
  if (args.nodes.size() > bridge::kGonkaMaxRefreshNodes) {
    return ctx.BadInput(absl::InvalidArgumentError(absl::StrCat("--node: ", args.nodes.size(),
                                                                " given, the chain takes at most ",
                                                                bridge::kGonkaMaxRefreshNodes)));
  }
  std::set<std::string_view> seen;
  for (const std::string& node : args.nodes) {
    if (node.empty()) return ctx.BadInput(Bad("--node", "", "is empty"));
    if (!seen.insert(node).second) return ctx.BadInput(Bad("--node", node, "given twice"));
  }
  if (!args.endpoint.empty()) {
    absl::Status valid = bridge::ValidateTrainingEndpoint(args.endpoint);
    if (!valid.ok()) return ctx.BadInput(Bad("--endpoint", args.endpoint, valid.message()));
  }
  auto signer = LoadSigner(ctx, "gonka refresh");
  if (!signer.ok()) return ctx.BadInput(signer.status());
  gv0::MsgRefreshTrainingNodeOptIn msg;
  msg.set_creator(signer->address);
  for (const std::string& node : args.nodes) msg.add_node_ids(node);
  msg.set_endpoint(args.endpoint);
  return Broadcast(ctx, *signer, bridge::PackMsg(msg), args.wait);
}

// --- gonka shard | shards | proposal

// One call of Gonka's Query service on --chain, its error naming the method: a chain of the
// module's profile does not serve the service at all.
template <typename Request, typename Response>
absl::StatusOr<Response> QueryGonka(Context& ctx, absl::string_view method,
                                    grpc::Status (gv0::Query::Stub::*call)(grpc::ClientContext*,
                                                                           const Request&,
                                                                           Response*),
                                    const Request& request) {
  auto stub = gv0::Query::NewStub(NewChannel(ctx.options().chain));
  auto response = CallWithDeadline<Response>(ctx.options().timeout_ms,
                                             [&](grpc::ClientContext* context, Response* out) {
                                               return ((*stub).*call)(context, request, out);
                                             });
  if (!response.ok()) {
    return absl::Status(response.status().code(), absl::StrCat("inference.inference.Query/", method,
                                                               ": ", response.status().message()));
  }
  return response;
}

int RunShard(Context& ctx, uint64_t id) {
  gv0::QueryGetTrainshardRequest request;
  request.set_trainshard_id(id);
  auto response = QueryGonka(ctx, "Trainshard", &gv0::Query::Stub::Trainshard, request);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  if (!response->found()) {
    return ctx.ChainFailed(absl::NotFoundError(absl::StrCat("trainshard ", id, " not found")));
  }
  const gv0::Trainshard& shard = response->trainshard();
  if (ctx.json()) {
    ctx.PrintProtoJson(shard);
    return kExitOk;
  }
  KeyValues lines = {
      {"trainshard_id", std::to_string(shard.trainshard_id())},
      {"status", ShortEnumName(gv0::TrainshardStatus_Name(shard.status()), "TRAINSHARD_STATUS_")},
      {"creator", shard.creator()},
      {"proposal_id", std::to_string(shard.proposal_id())},
      {"gpu_profile_id", shard.gpu_profile_id()},
      {"base_image", shard.base_image()},
      {"run_key", shard.run_key().empty() ? std::string("none") : shard.run_key()},
      {"created_at_height", std::to_string(shard.created_at_height())},
      {"expires_at_height", std::to_string(shard.expires_at_height())},
  };
  if (shard.closed_at_height() != 0) {
    lines.emplace_back("closed_at_height", std::to_string(shard.closed_at_height()));
    lines.emplace_back("close_reason",
                       ShortEnumName(gv0::TrainshardCloseReason_Name(shard.close_reason()),
                                     "TRAINSHARD_CLOSE_REASON_"));
  }
  PrintKeyValues(ctx.out(), lines);
  if (shard.nodes_size() > 0) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& node : shard.nodes()) {
      rows.push_back(
          {node.participant(), node.node_id(), node.model_id(), std::to_string(node.poc_weight()),
           ShortEnumName(gv0::TrainshardNodeStatus_Name(node.status()), "TRAINSHARD_NODE_STATUS_"),
           node.endpoint(), node.release_reason()});
    }
    ctx.out() << "\n";
    PrintTable(ctx.out(),
               {"PARTICIPANT", "NODE", "MODEL", "WEIGHT", "STATUS", "ENDPOINT", "RELEASE_REASON"},
               rows);
  }
  return kExitOk;
}

int RunShards(Context& ctx) {
  gv0::QueryActiveTrainshardsRequest request;
  auto response =
      QueryGonka(ctx, "ActiveTrainshards", &gv0::Query::Stub::ActiveTrainshards, request);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*response);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& shard : response->trainshards()) {
    int active = 0;
    for (const auto& node : shard.nodes()) {
      if (node.status() == gv0::TRAINSHARD_NODE_STATUS_ACTIVE) ++active;
    }
    rows.push_back({std::to_string(shard.trainshard_id()), shard.gpu_profile_id(),
                    absl::StrCat(active, "/", shard.nodes_size()),
                    std::to_string(shard.expires_at_height()), shard.creator()});
  }
  PrintTable(ctx.out(), {"ID", "PROFILE", "ACTIVE/NODES", "EXPIRES", "CREATOR"}, rows);
  return kExitOk;
}

int RunProposal(Context& ctx, uint64_t id) {
  gv0::QueryGetTrainshardProposalRequest request;
  request.set_proposal_id(id);
  auto response =
      QueryGonka(ctx, "TrainshardProposal", &gv0::Query::Stub::TrainshardProposal, request);
  if (!response.ok()) return ctx.ChainFailed(response.status());
  if (!response->found()) {
    return ctx.ChainFailed(
        absl::NotFoundError(absl::StrCat("trainshard proposal ", id, " not found")));
  }
  const gv0::TrainshardProposal& proposal = response->proposal();
  if (ctx.json()) {
    ctx.PrintProtoJson(proposal);
    return kExitOk;
  }
  PrintKeyValues(
      ctx.out(),
      {{"id", std::to_string(proposal.id())},
       {"status", ShortEnumName(gv0::TrainshardProposalStatus_Name(proposal.status()),
                                "TRAINSHARD_PROPOSAL_STATUS_")},
       {"creator", proposal.creator()},
       {"gpu_profile_id", proposal.gpu_profile_id()},
       {"max_nodes", std::to_string(proposal.max_nodes())},
       {"max_duration_blocks", std::to_string(proposal.max_duration_blocks())},
       {"base_image", proposal.base_image()},
       {"run_key", proposal.run_key().empty() ? std::string("none") : proposal.run_key()}});
  return kExitOk;
}

// A required flag; an integer one takes only what UnsignedInteger accepts.
template <typename T>
void AddRequired(CLI::App* command, const std::string& flag, T& value, const std::string& help) {
  CLI::Option* option = command->add_option(flag, value, help)->required();
  if constexpr (std::is_integral_v<T>) option->transform(UnsignedInteger());
}

}  // namespace

void AddGonkaCommands(CLI::App& root, CommandTable& table) {
  CLI::App* gonka =
      root.add_subcommand("gonka", "Gonka's trainshards v0, on a chain of the gonka-v0 profile");
  gonka->require_subcommand(1);
  const std::string wait_help = "wait until the tx is in a block";

  auto propose_args = std::make_shared<ProposeArgs>();
  CLI::App* propose = gonka->add_subcommand(
      "propose", "submit a gov proposal that creates a trainshard proposal for --creator");
  AddRequired(propose, "--gpu-profile", propose_args->gpu_profile, "Gonka GPU profile id");
  AddRequired(propose, "--max-nodes", propose_args->max_nodes, "most nodes to reserve");
  AddRequired(propose, "--duration-blocks", propose_args->duration_blocks,
              "blocks from assembly to expiry");
  CLI::Option* run_spec = propose->add_option(
      "--run-spec", propose_args->run_spec_file,
      "run spec document, checked and pinned as base_image trainshard-run@sha256:<its SHA-256>");
  CLI::Option* base_image = propose->add_option("--base-image", propose_args->base_image,
                                                "REPOSITORY@sha256:<64 hex> to pin instead");
  run_spec->excludes(base_image);
  propose->add_option("--run-key", propose_args->run_key, "an address that may also kick nodes");
  propose->add_option("--creator", propose_args->creator,
                      "who may assemble and settle (default: the --key address)");
  AddRequired(propose, "--deposit", propose_args->deposit, "initial deposit, ngonka");
  propose->add_option("--title", propose_args->title, "proposal title");
  propose->add_option("--summary", propose_args->summary, "proposal summary");
  propose->add_flag("--wait", propose_args->wait, wait_help + " and print the gov proposal id");
  table.Add(propose, [propose_args](Context& ctx) { return RunPropose(ctx, *propose_args); });

  auto assemble_args = std::make_shared<IdArgs>();
  CLI::App* assemble =
      gonka->add_subcommand("assemble", "assemble a trainshard from a proposal (its creator)");
  AddRequired(assemble, "--proposal", assemble_args->id, "trainshard proposal id (not the gov id)");
  assemble->add_flag("--wait", assemble_args->wait, wait_help + " and print the trainshard id");
  table.Add(assemble, [assemble_args](Context& ctx) { return RunAssemble(ctx, *assemble_args); });

  auto settle_args = std::make_shared<IdArgs>();
  CLI::App* settle = gonka->add_subcommand("settle", "close a trainshard (its creator)");
  AddRequired(settle, "--id", settle_args->id, "trainshard id");
  settle->add_flag("--wait", settle_args->wait, wait_help);
  table.Add(settle, [settle_args](Context& ctx) { return RunSettle(ctx, *settle_args); });

  auto kick_args = std::make_shared<KickArgs>();
  CLI::App* kick = gonka->add_subcommand(
      "kick", "remove a node from a trainshard (its creator, run key or the node's host)");
  AddRequired(kick, "--id", kick_args->id, "trainshard id");
  AddRequired(kick, "--participant", kick_args->participant, "the node's host account");
  AddRequired(kick, "--node", kick_args->node, "the host's node id");
  AddRequired(kick, "--reason", kick_args->reason,
              absl::StrCat("why, at most ", bridge::kGonkaMaxKickReasonBytes, " bytes"));
  AddRequired(kick, "--request-id", kick_args->request_id,
              absl::StrCat("1 to ", bridge::kGonkaMaxRequestIdBytes,
                           " bytes; a retry with the same id is a no-op"));
  kick->add_flag("--wait", kick_args->wait, wait_help);
  table.Add(kick, [kick_args](Context& ctx) { return RunKick(ctx, *kick_args); });

  auto opt_in_args = std::make_shared<OptInArgs>();
  CLI::App* opt_in =
      gonka->add_subcommand("opt-in", "offer one of the --key host's nodes for training");
  AddRequired(opt_in, "--node", opt_in_args->node, "node id");
  opt_in->add_flag("--off", opt_in_args->off, "withdraw the offer instead");
  opt_in->add_flag("--wait", opt_in_args->wait, wait_help);
  table.Add(opt_in, [opt_in_args](Context& ctx) { return RunOptIn(ctx, *opt_in_args); });

  auto refresh_args = std::make_shared<RefreshArgs>();
  CLI::App* refresh =
      gonka->add_subcommand("refresh", "re-arm the opt-in of the --key host's nodes");
  AddRequired(refresh, "--node", refresh_args->nodes,
              absl::StrCat("node id (repeatable, at most ", bridge::kGonkaMaxRefreshNodes, ")"));
  refresh->add_option("--endpoint", refresh_args->endpoint,
                      "http(s) URL of the host's shard endpoint to publish (empty: withdraw)");
  refresh->add_flag("--wait", refresh_args->wait, wait_help);
  table.Add(refresh, [refresh_args](Context& ctx) { return RunRefresh(ctx, *refresh_args); });

  auto shard_id = std::make_shared<uint64_t>(0);
  CLI::App* shard = gonka->add_subcommand("shard", "a trainshard and its reserved nodes");
  AddRequired(shard, "--id", *shard_id, "trainshard id");
  table.Add(shard, [shard_id](Context& ctx) { return RunShard(ctx, *shard_id); });

  CLI::App* shards = gonka->add_subcommand("shards", "the active trainshards");
  table.Add(shards, [](Context& ctx) { return RunShards(ctx); });

  auto proposal_id = std::make_shared<uint64_t>(0);
  CLI::App* proposal = gonka->add_subcommand("proposal", "a trainshard proposal");
  AddRequired(proposal, "--id", *proposal_id, "trainshard proposal id");
  table.Add(proposal, [proposal_id](Context& ctx) { return RunProposal(ctx, *proposal_id); });
}

}  // namespace ts::sidecar
