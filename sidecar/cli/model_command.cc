// `trainshard model fetch|export|generate`: the trained model in the hands of whoever paid for it
// (docs/cli.md "Models").
//
//   fetch     the settled shard's final checkpoint, from its members, by the proposal's creator
//             or a reader the spec names (or a member): a signed ListArtifacts to every member,
//             then a multi-source fetch of the checkpoint artifact of the last round, kept only
//             if its root is the one the settlement on chain names — on a chain that records
//             none (gonka-v0), the one members holding more than 2/3 of the weight signed
//             (member_settlement.h) — (progress on stderr, progress.h);
//   export    a checkpoint as model.safetensors + config.json (+ tokenizer.model), the Hugging
//             Face Llama layout (worker/hf_export.h);
//   generate  text from a checkpoint: a worker process (ts_worker) started for the call, in a
//             private folder, loads the checkpoint and samples.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/partial_dir.h"
#include "common/process.h"
#include "sidecar/artifacts/store.h"
#include "sidecar/artifacts/transfer.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/member_settlement.h"
#include "sidecar/cli/output.h"
#include "sidecar/cli/progress.h"
#include "sidecar/peer/shard_directory.h"
#include "state/db.h"
#include "worker/client/worker_client.h"
#include "worker/hf_export.h"

namespace ts::sidecar {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointFile[] = "checkpoint.tsck";
constexpr char kTokenizerFile[] = "tokenizer.model";

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  common::Sha256Hasher hasher;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    hasher.Update(std::string_view(buffer.data(), static_cast<size_t>(in.gcount())));
  }
  return hasher.Finish();
}

// ---------------------------------------------------------------------------------------------
// fetch

struct FetchArgs {
  uint64_t shard = 0;
  std::string out;
  bool peer_tls = true;
};

int RunFetch(Context& ctx, const FetchArgs& args) {
  auto key = ctx.LoadKey("model fetch");
  if (!key.ok()) return ctx.BadInput(key.status());
  auto partial = common::PartialDir::Make("--out", args.out);
  if (!partial.ok()) return ctx.LocalFailed(partial.status());
  const std::string self = common::AddressFromPublicKey(key->public_key());

  auto status = ctx.chain().Status();
  if (!status.ok()) return ctx.ChainFailed(status.status());
  auto shard = ctx.chain().Shard(args.shard);
  if (!shard.ok()) return ctx.ChainFailed(shard.status());
  auto settled = ctx.chain().Settlement(args.shard);
  pb::Settlement settlement;
  if (absl::IsUnimplemented(settled.status())) {
    // A chain that records no settlement (gonka-v0): the members' own signatures stand in.
    std::vector<SettlementMember> signers;
    for (const pb::Reservation& r : shard->reservations()) {
      signers.push_back(
          {r.host(), r.endpoint(), args.peer_tls ? r.tls_cert_sha256() : "", r.frozen_weight()});
    }
    auto from_members =
        SettlementFromMembers(signers, status->chain_id, args.shard, ctx.options().timeout_ms);
    if (!from_members.ok()) return ctx.PeerFailed("members", from_members.status());
    settlement = *std::move(from_members);
  } else if (absl::IsNotFound(settled.status())) {
    return ctx.LocalFailed(absl::FailedPreconditionError(
        absl::StrCat("shard ", args.shard, " is ", pb::ShardStatus_Name(shard->status()),
                     " without a settlement: its final checkpoint is the one a settlement names")));
  } else if (!settled.ok()) {
    return ctx.ChainFailed(settled.status());
  } else {
    settlement = settled->settlement();
  }
  const std::string& want_root = settlement.final_checkpoint_root();
  const uint64_t round = settlement.rounds_completed();
  std::vector<FetchPeer> members;
  for (const pb::Reservation& r : shard->reservations()) {
    if (r.host() == self) continue;
    members.push_back(
        FetchPeer{r.host(), r.endpoint(), args.peer_tls ? r.tls_cert_sha256() : std::string()});
  }
  if (members.empty()) {
    return ctx.LocalFailed(absl::FailedPreconditionError(
        absl::StrCat("shard ", args.shard, " has no member to fetch from")));
  }

  // A private artifact store for the fetch, in the partial folder: chunks are checked as they
  // arrive, and an interrupted fetch leaves nothing behind.
  const std::string store_dir = partial->path() + "/store";
  std::error_code made;
  fs::create_directories(store_dir + "/artifacts", made);
  if (made) {
    return ctx.LocalFailed(absl::InternalError(absl::StrCat(store_dir, ": ", made.message())));
  }
  state::DbOptions db_options;
  db_options.tables = {std::string(kTableArtifacts)};
  auto db = state::Db::Open(store_dir + "/db", db_options);
  if (!db.ok()) return ctx.LocalFailed(db.status());
  const StoreQuota quota{shard->spec().artifact_quota().bytes_max(),
                         shard->spec().artifact_quota().files_max()};
  auto store = ArtifactStore::Open(store_dir + "/artifacts", db->get(), status->chain_id,
                                   args.shard, quota, &common::SystemClock());
  if (!store.ok()) return ctx.LocalFailed(store.status());
  ChainShardDirectory directory(&ctx.chain(), &common::SystemClock());
  FetchContext context;
  context.key = &*key;
  context.self_address = self;
  context.store = store->get();
  context.directory = &directory;
  context.clock = &common::SystemClock();

  // The last round's checkpoint artifacts and who holds each; the members normally all hold
  // the first member's (shard_run.cc, PublishCheckpoint).
  std::map<std::string, std::vector<FetchPeer>> holders;
  std::vector<std::string> refusals;
  for (const PeerArtifacts& answer :
       ListPeerArtifacts(context, args.shard, members,
                         common::SystemClock().MonotonicMs() + ctx.options().timeout_ms)) {
    if (!answer.artifacts.ok()) {
      refusals.push_back(absl::StrCat(answer.address, ": ", answer.artifacts.status().ToString()));
      continue;
    }
    for (const pb::ArtifactSummary& a : *answer.artifacts) {
      if (a.kind() != kReaderKind || a.round() != round || !a.complete()) continue;
      for (const FetchPeer& m : members) {
        if (m.address == answer.address) holders[a.artifact_id()].push_back(m);
      }
    }
  }
  if (holders.empty()) {
    return ctx.PeerFailed(
        "members", absl::NotFoundError(absl::StrCat(
                       "no member lists a checkpoint of round ", round, " of shard ", args.shard,
                       refusals.empty() ? "" : ": ", absl::StrJoin(refusals, "; "))));
  }
  std::vector<std::string> tried;
  int index = 0;
  for (const auto& [id, peers] : holders) {
    FetchRequest request;
    request.shard_id = args.shard;
    request.artifact_id = id;
    request.peers = peers;
    // Called from the fetcher threads (serialised); the renderer is thread-safe.
    ProgressRenderer progress(ctx.err(), ctx.progress_mode(), "fetch", &common::SystemClock());
    context.progress = [&progress](const pb::ArtifactProgress& p) { progress.Update(p); };
    auto fetched = FetchArtifact(context, request);
    context.progress = nullptr;
    if (!fetched.ok()) {
      progress.Stop();
      tried.push_back(absl::StrCat(common::HexEncode(id), ": ", fetched.status().ToString()));
      continue;
    }
    const std::string exported = absl::StrCat(partial->path(), "/export-", index++);
    absl::Status written =
        (*store)->Export(id, exported, [&progress](const pb::ArtifactProgress& p) {
          progress.Update("exporting", p.bytes_done(), p.bytes_total());
        });
    if (!written.ok()) {
      progress.Stop();
      tried.push_back(absl::StrCat(common::HexEncode(id), ": ", written.ToString()));
      continue;
    }
    auto root = FileSha256(exported + "/" + kCheckpointFile);
    if (!root.ok() || *root != want_root) {
      progress.Stop();
      tried.push_back(absl::StrCat(
          common::HexEncode(id), ": ",
          root.ok() ? absl::StrCat("root ", common::HexEncode(*root), " is not the settled one")
                    : root.status().ToString()));
      continue;
    }
    progress.Finish(fetched->bytes_total());
    std::error_code ec;
    const bool has_tokenizer = fs::exists(exported + "/" + kTokenizerFile, ec);
    const uint64_t bytes = fs::file_size(exported + "/" + kCheckpointFile, ec);
    absl::Status committed = partial->Commit(exported);
    if (!committed.ok()) return ctx.LocalFailed(committed);
    std::vector<std::string> from;
    for (const FetchPeer& p : peers) from.push_back(p.address);
    if (ctx.json()) {
      ctx.PrintJson({{"shard_id", args.shard},
                     {"round", round},
                     {"root", common::HexEncode(want_root)},
                     {"artifact_id", common::HexEncode(id)},
                     {"out", args.out},
                     {"checkpoint", absl::StrCat(args.out, "/", kCheckpointFile)},
                     {"tokenizer",
                      has_tokenizer ? absl::StrCat(args.out, "/", kTokenizerFile) : std::string()},
                     {"checkpoint_bytes", bytes},
                     {"from", from}});
    } else {
      PrintKeyValues(ctx.out(), {{"shard", std::to_string(args.shard)},
                                 {"round", std::to_string(round)},
                                 {"root", common::HexEncode(want_root) + " (the settled one)"},
                                 {"checkpoint", absl::StrCat(args.out, "/", kCheckpointFile)},
                                 {"tokenizer", has_tokenizer ? std::string(kTokenizerFile) : "-"},
                                 {"bytes", std::to_string(bytes)},
                                 {"from", absl::StrJoin(from, ", ")}});
    }
    return kExitOk;
  }
  return ctx.PeerFailed("members", absl::UnavailableError(absl::StrCat(
                                       "no checkpoint of round ", round, " with the settled root ",
                                       common::HexEncode(want_root),
                                       " could be fetched: ", absl::StrJoin(tried, "; "))));
}

// ---------------------------------------------------------------------------------------------
// export

// ExportHuggingFace returns only once the export is whole, so its progress is a start line and
// the final one (with the checkpoint's bytes over the time taken).
int RunExport(Context& ctx, const worker::HfExportOptions& options) {
  std::error_code ec;
  uint64_t checkpoint_bytes = fs::file_size(options.checkpoint_file, ec);
  if (ec) checkpoint_bytes = 0;  // ExportHuggingFace reports why
  ProgressRenderer progress(ctx.err(), ctx.progress_mode(), "export", &common::SystemClock());
  progress.Update("exporting", /*bytes_done=*/0, checkpoint_bytes);
  auto result = worker::ExportHuggingFace(options);
  if (!result.ok()) {
    progress.Stop();
    return ctx.LocalFailed(result.status());
  }
  progress.Finish(checkpoint_bytes > 0 ? checkpoint_bytes : result->safetensors_bytes);
  const std::string model = worker::ModelConfigString(result->config);
  if (ctx.json()) {
    ctx.PrintJson({{"out", options.out_dir},
                   {"root", common::HexEncode(result->root)},
                   {"model", model},
                   {"parameters", result->parameters},
                   {"tensors", result->tensors},
                   {"safetensors_bytes", result->safetensors_bytes},
                   {"tokenizer", !options.tokenizer_file.empty()}});
    return kExitOk;
  }
  PrintKeyValues(ctx.out(), {{"out", options.out_dir},
                             {"files", options.tokenizer_file.empty()
                                           ? "model.safetensors, config.json"
                                           : "model.safetensors, config.json, tokenizer.model"},
                             {"root", common::HexEncode(result->root)},
                             {"model", model},
                             {"parameters", std::to_string(result->parameters)},
                             {"tensors", std::to_string(result->tensors)}});
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// generate

struct GenerateArgs {
  std::string checkpoint;
  std::string tokenizer;
  std::string prompt;
  uint32_t max_tokens = 48;
  float temperature = 0.8f;
  float top_p = 0.95f;
  uint32_t top_k = 0;
  uint64_t seed = 1;
  uint32_t samples = 1;
  int threads = 2;
  std::string worker_binary;
};

// Puts `path` into the worker's folder as `name`: a hard link where the filesystem allows
// (no copy of a large checkpoint), a copy otherwise.
absl::Status Place(const std::string& flag, const std::string& path, const std::string& dir,
                   const std::string& name) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " \"", path, "\": not a regular file"));
  }
  fs::create_hard_link(path, dir + "/" + name, ec);
  if (ec) fs::copy_file(path, dir + "/" + name, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(flag, " \"", path, "\": cannot be read: ", ec.message()));
  }
  return absl::OkStatus();
}

int RunGenerate(Context& ctx, const GenerateArgs& args) {
  std::string dir = "/tmp/trainshard-generate-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    return ctx.LocalFailed(absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno))));
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  const std::string work = dir + "/work";
  fs::create_directory(work);
  absl::Status placed = Place("--checkpoint", args.checkpoint, work, kCheckpointFile);
  if (placed.ok()) placed = Place("--tokenizer", args.tokenizer, work, kTokenizerFile);
  if (!placed.ok()) return ctx.BadInput(placed);

  worker::WorkerProcessOptions options;
  options.binary =
      common::SiblingExecutable(args.worker_binary, "ts_worker", "../../worker/ts_worker");
  options.socket_path = dir + "/worker.sock";
  options.work_dir = work;
  options.threads = args.threads;
  options.log_file = dir + "/worker.log";
  options.client.call_timeout_ms = std::max<int64_t>(ctx.options().timeout_ms, 60'000);
  auto process = worker::WorkerProcess::Start(options);
  if (!process.ok()) return ctx.LocalFailed(process.status());
  worker::WorkerClient& client = (*process)->client();
  pb::LoadCheckpointRequest load;
  load.set_checkpoint_file(kCheckpointFile);
  auto loaded = client.LoadCheckpoint(load, /*timeout_ms=*/600'000);
  if (!loaded.ok()) return ctx.LocalFailed(loaded.status());
  std::vector<std::string> texts;
  for (uint32_t i = 0; i < args.samples; ++i) {
    pb::SampleRequest request;
    request.set_prompt_text(args.prompt);
    request.set_tokenizer_file(kTokenizerFile);
    request.set_count(args.max_tokens);
    request.set_seed(args.seed + i);
    request.set_temperature(args.temperature);
    request.set_top_p(args.top_p);
    request.set_top_k(args.top_k);
    auto sampled = client.Sample(request, /*timeout_ms=*/600'000);
    if (!sampled.ok()) return ctx.BadInput(sampled.status());
    texts.push_back(sampled->text());
  }
  (void)(*process)->Stop();
  if (ctx.json()) {
    ctx.PrintJson({{"root", common::HexEncode(loaded->root())},
                   {"model", loaded->kind()},
                   {"parameters", loaded->parameters()},
                   {"samples", texts}});
    return kExitOk;
  }
  for (const std::string& text : texts) ctx.out() << text << "\n";
  return kExitOk;
}

}  // namespace

void AddModelCommands(CLI::App& root, CommandTable& table) {
  CLI::App* model = root.add_subcommand("model", "the trained model: fetch, export, generate");
  model->require_subcommand(1);

  auto fetch_args = std::make_shared<FetchArgs>();
  CLI::App* fetch = model->add_subcommand(
      "fetch",
      "the settled shard's final checkpoint and tokenizer, from its members (--key: the "
      "creator, a reader the spec names, or a member)");
  fetch->add_option("--shard", fetch_args->shard, "shard id")
      ->transform(UnsignedInteger())
      ->required();
  fetch->add_option("--out", fetch_args->out, "folder to make (must not exist)")->required();
  fetch->add_flag("--peer-tls,!--plaintext", fetch_args->peer_tls,
                  "talk TLS to the members, pinning the certificate each reservation names "
                  "(the default); --plaintext for members whose peer_tls is false");
  table.Add(fetch, [fetch_args](Context& ctx) { return RunFetch(ctx, *fetch_args); });

  auto export_args = std::make_shared<worker::HfExportOptions>();
  CLI::App* exp = model->add_subcommand(
      "export",
      "a llama checkpoint as model.safetensors + config.json (+ tokenizer.model), "
      "the Hugging Face Llama layout");
  exp->add_option("--checkpoint", export_args->checkpoint_file, "checkpoint file")->required();
  exp->add_option("--tokenizer", export_args->tokenizer_file, "SentencePiece model to include");
  exp->add_option("--out", export_args->out_dir, "folder to make (must not exist)")->required();
  table.Add(exp, [export_args](Context& ctx) { return RunExport(ctx, *export_args); });

  auto generate_args = std::make_shared<GenerateArgs>();
  CLI::App* generate =
      model->add_subcommand("generate", "continue a prompt with a checkpoint and its tokenizer");
  generate->add_option("--checkpoint", generate_args->checkpoint, "checkpoint file")->required();
  generate->add_option("--tokenizer", generate_args->tokenizer, "the run's SentencePiece model")
      ->required();
  generate->add_option("--prompt", generate_args->prompt, "text to continue")->required();
  generate->add_option("--max-tokens", generate_args->max_tokens, "tokens to add, 1..4096")
      ->check(CLI::Range(1, 4096));
  generate->add_option("--temperature", generate_args->temperature, "(0, 100]")
      ->check(CLI::Range(1e-6, 100.0));
  generate->add_option("--top-p", generate_args->top_p, "nucleus mass, [0, 1] (0 or 1: no cut)")
      ->check(CLI::Range(0.0, 1.0));
  generate->add_option("--top-k", generate_args->top_k, "most likely tokens kept (0: all)")
      ->transform(UnsignedInteger());
  generate->add_option("--seed", generate_args->seed, "seed of the first sample")
      ->transform(UnsignedInteger());
  generate->add_option("--samples", generate_args->samples, "continuations, 1..16, seeds seed..")
      ->check(CLI::Range(1, 16));
  generate->add_option("--threads", generate_args->threads, "torch threads, 1..256")
      ->check(CLI::Range(1, 256));
  generate->add_option("--worker-binary", generate_args->worker_binary,
                       "the ts_worker executable (default: beside trainshard)");
  table.Add(generate, [generate_args](Context& ctx) { return RunGenerate(ctx, *generate_args); });
}

}  // namespace ts::sidecar
