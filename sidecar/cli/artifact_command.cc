// `trainshard artifact publish|list|fetch|verify|gc`: a shard's content-addressed artifacts
// through a host sidecar's artifact operator API. Publish and fetch show the host's progress on
// stderr (progress.h).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/hex.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/cli/artifact_client.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/parse.h"
#include "sidecar/cli/progress.h"

namespace ts::sidecar {
namespace pb = ::gonka::trainshard::v1;
namespace {

std::string Peer(const std::string& endpoint) { return "host " + endpoint; }

std::string Quote(const std::string& text) {
  constexpr size_t kShownMax = 120;
  return absl::StrCat("\"", text.size() > kShownMax ? text.substr(0, kShownMax) + "..." : text,
                      "\"");
}

absl::StatusOr<uint64_t> ParseShard(uint64_t shard) {
  if (shard == 0) return absl::InvalidArgumentError("--shard 0: not a shard id");
  return shard;
}

// protobuf JSON with the named bytes fields as lower-case hex instead of base64.
nlohmann::ordered_json JsonWithHex(const google::protobuf::Message& message,
                                   const std::vector<std::pair<std::string, std::string>>& hex) {
  nlohmann::ordered_json json = ProtoToJsonValue(message);
  for (const auto& [field, bytes] : hex) json[field] = common::HexEncode(bytes);
  return json;
}

void PrintFaults(Context& ctx, const pb::ArtifactProgress& p) {
  for (const auto& fault : p.peer_faults()) {
    ctx.err() << "warning: peer " << fault.peer() << (fault.corrupt() ? " (corrupt)" : "") << ": "
              << fault.reason() << "\n";
  }
}

struct PublishArgs {
  std::string host;
  uint64_t shard = 0;
  std::string dir;
  uint64_t round = 0;
  std::string parent;
  std::string kind;
  uint64_t chunk_size = 0;
};

int RunPublish(Context& ctx, const PublishArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto shard = ParseShard(args.shard);
  if (!shard.ok()) return ctx.BadInput(shard.status());
  pb::PublishArtifactRequest request;
  request.set_shard_id(*shard);
  request.set_round(args.round);
  // The sidecar reads the directory itself, so it gets the directory's own absolute path.
  char resolved[PATH_MAX];
  if (::realpath(args.dir.c_str(), resolved) == nullptr) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--dir ", Quote(args.dir), ": ", std::strerror(errno))));
  }
  struct stat st {};
  if (::stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return ctx.BadInput(
        absl::InvalidArgumentError(absl::StrCat("--dir ", Quote(args.dir), ": not a directory")));
  }
  request.set_source_dir(resolved);
  if (!args.parent.empty()) {
    auto parent = ParseHex32("--parent", args.parent);
    if (!parent.ok()) return ctx.BadInput(parent.status());
    request.set_parent(*parent);
  }
  if (!args.kind.empty()) {
    bool ok = args.kind.size() <= 32;
    for (char c : args.kind) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
    }
    if (!ok) {
      return ctx.BadInput(absl::InvalidArgumentError(
          absl::StrCat("--kind ", Quote(args.kind), ": expected [a-z0-9-]{1,32}")));
    }
    request.set_kind(args.kind);
  }
  if (args.chunk_size != 0) {
    if (args.chunk_size < kMinChunkSize || args.chunk_size > kMaxChunkSize) {
      return ctx.BadInput(
          absl::InvalidArgumentError(absl::StrCat("--chunk-size ", args.chunk_size, ": not in [",
                                                  kMinChunkSize, ", ", kMaxChunkSize, "]")));
    }
    request.set_chunk_size(static_cast<uint32_t>(args.chunk_size));
  }

  ArtifactClient client(*endpoint, ctx.options().timeout_ms);
  ProgressRenderer progress(ctx.err(), ctx.progress_mode(), "publish", &common::SystemClock());
  auto result =
      client.Publish(request, [&progress](const pb::ArtifactProgress& p) { progress.Update(p); });
  if (!result.ok()) {
    progress.Stop();
    return ctx.PeerFailed(Peer(*endpoint), result.status());
  }
  progress.Finish(result->bytes_total());
  if (ctx.json()) {
    ctx.PrintJson(JsonWithHex(*result, {{"artifact_id", result->artifact_id()}}));
    return kExitOk;
  }
  PrintKeyValues(ctx.out(), {{"artifact_id", common::HexEncode(result->artifact_id())},
                             {"source_dir", request.source_dir()},
                             {"bytes", std::to_string(result->bytes_total())},
                             {"chunks", std::to_string(result->chunks_total())},
                             {"chunks_present", std::to_string(result->chunks_present())}});
  return kExitOk;
}

struct FetchArgs {
  std::string host;
  uint64_t shard = 0;
  std::string id;
  std::vector<std::string> peers;
  std::string out;
  std::string transport;
};

int RunFetch(Context& ctx, const FetchArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto shard = ParseShard(args.shard);
  if (!shard.ok()) return ctx.BadInput(shard.status());
  auto id = ParseHex32("--id", args.id);
  if (!id.ok()) return ctx.BadInput(id.status());
  pb::FetchArtifactRequest request;
  request.set_shard_id(*shard);
  request.set_artifact_id(*id);
  if (!args.transport.empty() && args.transport != "auto" && args.transport != "grpc") {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--transport ", Quote(args.transport), ": want auto or grpc")));
  }
  request.set_transport(args.transport);
  if (args.peers.size() > kFlagValuesMax) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--peer: ", args.peers.size(), " values is more than ", kFlagValuesMax)));
  }
  for (const auto& peer : args.peers) {
    auto address = ParseAccountAddress("--peer", peer);
    if (!address.ok()) return ctx.BadInput(address.status());
    for (const auto& seen : request.peers()) {
      if (seen == peer) {
        return ctx.BadInput(
            absl::InvalidArgumentError(absl::StrCat("--peer ", Quote(peer), ": given twice")));
      }
    }
    request.add_peers(peer);
  }
  if (!args.out.empty()) {
    std::string out = args.out;
    if (out.front() != '/') {
      char cwd[PATH_MAX];
      if (::getcwd(cwd, sizeof(cwd)) == nullptr) {
        return ctx.BadInput(absl::InvalidArgumentError(
            absl::StrCat("--out ", Quote(args.out), ": cannot resolve: ", std::strerror(errno))));
      }
      out = absl::StrCat(cwd, "/", out);
    }
    request.set_out_dir(out);
  }

  ArtifactClient client(*endpoint, ctx.options().timeout_ms);
  ProgressRenderer progress(ctx.err(), ctx.progress_mode(), "fetch", &common::SystemClock());
  auto result =
      client.Fetch(request, [&progress](const pb::ArtifactProgress& p) { progress.Update(p); });
  if (!result.ok()) {
    progress.Stop();
    return ctx.PeerFailed(Peer(*endpoint), result.status());
  }
  progress.Finish(result->bytes_total());
  if (ctx.json()) {
    ctx.PrintJson(JsonWithHex(*result, {{"artifact_id", result->artifact_id()}}));
    return kExitOk;
  }
  PrintFaults(ctx, *result);
  KeyValues lines = {{"artifact_id", common::HexEncode(result->artifact_id())},
                     {"bytes", std::to_string(result->bytes_total())},
                     {"bytes_fetched", std::to_string(result->bytes_fetched())},
                     {"chunks_fetched", std::to_string(result->chunks_fetched())},
                     {"chunks_present", std::to_string(result->chunks_present())}};
  if (!request.out_dir().empty()) lines.emplace_back("out", request.out_dir());
  PrintKeyValues(ctx.out(), lines);
  if (!result->bytes_by_peer().empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [peer, bytes] : result->bytes_by_peer()) {
      rows.push_back({peer, std::to_string(bytes)});
    }
    std::sort(rows.begin(), rows.end());
    ctx.out() << "\n";
    PrintTable(ctx.out(), {"PEER", "BYTES"}, rows);
  }
  return kExitOk;
}

struct ListArgs {
  std::string host;
  uint64_t shard = 0;
  bool all = false;
};

int RunList(Context& ctx, const ListArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto shard = ParseShard(args.shard);
  if (!shard.ok()) return ctx.BadInput(shard.status());
  ArtifactClient client(*endpoint, ctx.options().timeout_ms);
  auto list = client.List(*shard, args.all);
  if (!list.ok()) return ctx.PeerFailed(Peer(*endpoint), list.status());
  if (ctx.json()) {
    nlohmann::ordered_json artifacts = nlohmann::ordered_json::array();
    for (const auto& a : list->artifacts()) {
      artifacts.push_back(
          JsonWithHex(a, {{"artifact_id", a.artifact_id()}, {"parent", a.parent()}}));
    }
    ctx.PrintJson({{"artifacts", std::move(artifacts)}});
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& a : list->artifacts()) {
    rows.push_back({common::HexEncode(a.artifact_id()), std::to_string(a.round()), a.kind(),
                    std::to_string(a.files()), std::to_string(a.total_bytes()),
                    a.complete() ? "complete" : "incomplete", a.publisher()});
  }
  PrintTable(ctx.out(), {"ID", "ROUND", "KIND", "FILES", "BYTES", "STATE", "PUBLISHER"}, rows);
  return kExitOk;
}

// One line: "clean", or what the store holds besides verified, referenced chunks.
std::string VerifySummary(const pb::VerifyArtifactsResponse& report) {
  std::vector<std::string> parts;
  if (report.modified_size() > 0 || report.missing_size() > 0) {
    parts.push_back(absl::StrCat("damaged (", report.modified_size(), " modified, ",
                                 report.missing_size(), " missing chunks)"));
  }
  if (report.unreferenced_size() > 0) {
    parts.push_back(absl::StrCat(report.unreferenced_size(), " unreferenced chunks holding ",
                                 report.unreferenced_bytes(),
                                 " bytes (`trainshard artifact gc` removes them)"));
  }
  if (report.incomplete_size() > 0) {
    parts.push_back(absl::StrCat(report.incomplete_size(), " incomplete artifacts"));
  }
  return parts.empty() ? "clean" : absl::StrJoin(parts, "; ");
}

int RunVerify(Context& ctx, const std::string& host, uint64_t shard_flag) {
  auto endpoint = ParseHostTarget("--host", host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto shard = ParseShard(shard_flag);
  if (!shard.ok()) return ctx.BadInput(shard.status());
  ArtifactClient client(*endpoint, ctx.options().timeout_ms);
  auto report = client.Verify(*shard);
  if (!report.ok()) return ctx.PeerFailed(Peer(*endpoint), report.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*report);
  } else {
    PrintKeyValues(ctx.out(), {{"artifacts_checked", std::to_string(report->artifacts_checked())},
                               {"chunks_ok", std::to_string(report->chunks_ok())},
                               {"modified", std::to_string(report->modified_size())},
                               {"missing", std::to_string(report->missing_size())},
                               {"unreferenced", std::to_string(report->unreferenced_size())},
                               {"unreferenced_bytes", std::to_string(report->unreferenced_bytes())},
                               {"incomplete", std::to_string(report->incomplete_size())},
                               {"summary", VerifySummary(*report)}});
    for (const auto& h : report->modified()) ctx.out() << "modified " << h << "\n";
    for (const auto& h : report->missing()) ctx.out() << "missing " << h << "\n";
    for (const auto& h : report->unreferenced()) ctx.out() << "unreferenced " << h << "\n";
    for (const auto& h : report->incomplete()) ctx.out() << "incomplete " << h << "\n";
  }
  // Like a refused transaction: the report is printed, and damage exits 1 so scripts notice.
  if (report->modified_size() > 0 || report->missing_size() > 0) {
    ctx.err() << "error: the artifact store of shard " << *shard
              << " is damaged: " << report->modified_size() << " modified and "
              << report->missing_size() << " missing chunks\n";
    return kExitRefused;
  }
  return kExitOk;
}

struct GcArgs {
  std::string host;
  uint64_t shard = 0;
  bool drop_incomplete = false;
  std::vector<std::string> drop;
};

int RunGc(Context& ctx, const GcArgs& args) {
  auto endpoint = ParseHostTarget("--host", args.host);
  if (!endpoint.ok()) return ctx.BadInput(endpoint.status());
  auto shard = ParseShard(args.shard);
  if (!shard.ok()) return ctx.BadInput(shard.status());
  pb::GcArtifactsRequest request;
  request.set_shard_id(*shard);
  request.set_drop_incomplete(args.drop_incomplete);
  if (args.drop.size() > kFlagValuesMax) {
    return ctx.BadInput(absl::InvalidArgumentError(
        absl::StrCat("--drop: ", args.drop.size(), " values is more than ", kFlagValuesMax)));
  }
  for (const auto& text : args.drop) {
    auto id = ParseHex32("--drop", text);
    if (!id.ok()) return ctx.BadInput(id.status());
    request.add_drop_artifacts(*id);
  }
  ArtifactClient client(*endpoint, ctx.options().timeout_ms);
  auto result = client.Gc(request);
  if (!result.ok()) return ctx.PeerFailed(Peer(*endpoint), result.status());
  if (ctx.json()) {
    ctx.PrintProtoJson(*result);
    return kExitOk;
  }
  PrintKeyValues(ctx.out(), {{"artifacts_dropped", std::to_string(result->artifacts_dropped())},
                             {"chunks_removed", std::to_string(result->chunks_removed())},
                             {"bytes_freed", std::to_string(result->bytes_freed())}});
  return kExitOk;
}

}  // namespace

void AddArtifactCommands(CLI::App& root, CommandTable& table) {
  CLI::App* artifact =
      root.add_subcommand("artifact", "a shard's artifacts, through a host sidecar");
  artifact->require_subcommand(1);
  const std::string host_help = kHostFlagHelp;
  const std::string shard_help = "shard id";

  auto publish_args = std::make_shared<PublishArgs>();
  CLI::App* publish =
      artifact->add_subcommand("publish", "chunk, store and sign a directory as an artifact");
  publish->add_option("--host", publish_args->host, host_help)->required();
  publish->add_option("--shard", publish_args->shard, shard_help)
      ->transform(UnsignedInteger())
      ->required();
  publish->add_option("--dir", publish_args->dir, "directory whose regular files make the artifact")
      ->required();
  publish->add_option("--round", publish_args->round, "training round (default 0)")
      ->transform(UnsignedInteger());
  publish->add_option("--parent", publish_args->parent, "parent artifact id (64 hex)");
  publish->add_option("--kind", publish_args->kind, "checkpoint (default), data, eval, ...");
  publish->add_option("--chunk-size", publish_args->chunk_size, "bytes per chunk (default 1 MiB)")
      ->transform(UnsignedInteger());
  table.Add(publish, [publish_args](Context& ctx) { return RunPublish(ctx, *publish_args); });

  auto list_args = std::make_shared<ListArgs>();
  CLI::App* list = artifact->add_subcommand("list", "the artifacts the sidecar stores");
  list->add_option("--host", list_args->host, host_help)->required();
  list->add_option("--shard", list_args->shard, shard_help)
      ->transform(UnsignedInteger())
      ->required();
  list->add_flag("--all", list_args->all, "also incomplete (interrupted) fetches");
  table.Add(list, [list_args](Context& ctx) { return RunList(ctx, *list_args); });

  auto fetch_args = std::make_shared<FetchArgs>();
  CLI::App* fetch =
      artifact->add_subcommand("fetch", "fetch an artifact from the shard's other members");
  fetch->add_option("--host", fetch_args->host, host_help)->required();
  fetch->add_option("--shard", fetch_args->shard, shard_help)
      ->transform(UnsignedInteger())
      ->required();
  fetch->add_option("--id", fetch_args->id, "artifact id (64 hex)")->required();
  fetch->add_option("--peer", fetch_args->peers,
                    "member address to fetch from, repeatable (default: every other member)");
  fetch->add_option("--transport", fetch_args->transport,
                    "auto (each peer's chunk stream where offered; the default) or grpc");
  fetch->add_option("--out", fetch_args->out,
                    "then write the files here (created; must not exist or be empty)");
  table.Add(fetch, [fetch_args](Context& ctx) { return RunFetch(ctx, *fetch_args); });

  auto verify_host = std::make_shared<std::string>();
  auto verify_shard = std::make_shared<uint64_t>(0);
  CLI::App* verify =
      artifact->add_subcommand("verify", "re-hash every stored chunk and check the manifests");
  verify->add_option("--host", *verify_host, host_help)->required();
  verify->add_option("--shard", *verify_shard, shard_help)
      ->transform(UnsignedInteger())
      ->required();
  table.Add(verify, [verify_host, verify_shard](Context& ctx) {
    return RunVerify(ctx, *verify_host, *verify_shard);
  });

  auto gc_args = std::make_shared<GcArgs>();
  CLI::App* gc = artifact->add_subcommand("gc", "drop artifacts and remove unreferenced chunks");
  gc->add_option("--host", gc_args->host, host_help)->required();
  gc->add_option("--shard", gc_args->shard, shard_help)->transform(UnsignedInteger())->required();
  gc->add_flag("--drop-incomplete", gc_args->drop_incomplete, "also drop incomplete fetches");
  gc->add_option("--drop", gc_args->drop, "artifact id to drop (64 hex), repeatable");
  table.Add(gc, [gc_args](Context& ctx) { return RunGc(ctx, *gc_args); });
}

}  // namespace ts::sidecar
