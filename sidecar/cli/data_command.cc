// `trainshard data pack|show`: a user's text turned into a packed dataset (worker/pack.h,
// docs/worker.md "Packed datasets"), and a packed folder checked and described. A member then
// publishes the folder as a `dataset` artifact of the shard (`trainshard artifact publish --kind
// dataset`), and the run spec pins its root.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hex.h"
#include "sidecar/cli/commands.h"
#include "sidecar/cli/output.h"
#include "worker/pack.h"

namespace ts::sidecar {
namespace {

void PrintDataset(Context& ctx, const worker::PackedDataset& d, const std::string& dir) {
  uint64_t train_tokens = 0;
  for (const auto& s : d.train) train_tokens += s.tokens;
  if (ctx.json()) {
    ctx.PrintJson({{"dir", dir},
                   {"root", common::HexEncode(d.root)},
                   {"vocab", d.vocab},
                   {"tokenizer_sha256", common::HexEncode(d.tokenizer_sha256)},
                   {"documents", d.documents},
                   {"train_shards", d.train.size()},
                   {"train_tokens", train_tokens},
                   {"eval_tokens", d.eval.tokens}});
    return;
  }
  PrintKeyValues(ctx.out(), {{"dir", dir},
                             {"root", common::HexEncode(d.root)},
                             {"vocab", std::to_string(d.vocab)},
                             {"documents", std::to_string(d.documents)},
                             {"train_shards", std::to_string(d.train.size())},
                             {"train_tokens", std::to_string(train_tokens)},
                             {"eval_tokens", std::to_string(d.eval.tokens)}});
}

int RunPack(Context& ctx, const worker::PackOptions& options, const std::string& out) {
  auto packed = worker::PackDataset(options, out);
  if (!packed.ok()) return ctx.LocalFailed(packed.status());
  PrintDataset(ctx, *packed, out);
  return kExitOk;
}

int RunShow(Context& ctx, const std::string& dir) {
  auto dataset = worker::ReadPackedDataset(dir);
  if (!dataset.ok()) return ctx.LocalFailed(dataset.status());
  PrintDataset(ctx, *dataset, dir);
  return kExitOk;
}

}  // namespace

void AddDataCommands(CLI::App& root, CommandTable& table) {
  CLI::App* data = root.add_subcommand("data", "datasets packed from your own text");
  data->require_subcommand(1);

  auto pack_options = std::make_shared<worker::PackOptions>();
  auto pack_out = std::make_shared<std::string>();
  CLI::App* pack = data->add_subcommand(
      "pack", "text files, folders or JSON Lines into a dataset: a tokenizer and token shards");
  pack->add_option("--input", pack_options->inputs, "a file or a folder (repeatable)")
      ->required()
      ->take_all();
  pack->add_option("--jsonl-field", pack_options->jsonl_field,
                   "the inputs are JSON Lines; each record's FIELD (a string) is a document");
  pack->add_option("--vocab", pack_options->vocab, "train a tokenizer of this many pieces")
      ->transform(UnsignedInteger());
  pack->add_option("--tokenizer", pack_options->tokenizer_file,
                   "a SentencePiece model to use instead of training one");
  pack->add_option("--shard-tokens", pack_options->shard_tokens, "tokens per training shard")
      ->transform(UnsignedInteger());
  pack->add_option("--eval-every", pack_options->eval_every,
                   "every Nth document is held out for evaluation")
      ->transform(UnsignedInteger());
  pack->add_option("--line-bytes-max", pack_options->line_bytes_max, "longest line accepted")
      ->transform(UnsignedInteger());
  pack->add_option("--out", *pack_out, "the dataset folder to make (must not exist)")->required();
  table.Add(pack, [pack_options, pack_out](Context& ctx) {
    return RunPack(ctx, *pack_options, *pack_out);
  });

  auto show_dir = std::make_shared<std::string>();
  CLI::App* show = data->add_subcommand("show", "check a packed dataset folder and print its root");
  show->add_option("--dir", *show_dir, "the dataset folder")->required();
  table.Add(show, [show_dir](Context& ctx) { return RunShow(ctx, *show_dir); });
}

}  // namespace ts::sidecar
