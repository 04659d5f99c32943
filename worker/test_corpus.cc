#include "worker/test_corpus.h"

#include <cstdio>
#include <cstdlib>

namespace ts::worker {
namespace {

// 8 of the 41 files (about 0.5 MB of text) keep tokenizer training well under a second.
constexpr size_t kFiles = 8;

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "test corpus: %s\n", s.ToString().c_str());
  std::abort();
}

TestCorpus* Build() {
  auto* c = new TestCorpus();
  auto files = DefaultFortuneFiles().first(kFiles);
  absl::StatusOr<std::vector<std::string>> docs = ReadFortuneFiles(kFortunesDir, files);
  if (!docs.ok()) Die(docs.status());
  c->documents = std::move(*docs);
  c->tokenizer_options = {.vocab_size = 512, .seed = 1};
  absl::StatusOr<std::string> model = TrainTokenizer(c->documents, c->tokenizer_options);
  if (!model.ok()) Die(model.status());
  c->tokenizer_model = std::move(*model);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(c->tokenizer_model);
  if (!tok.ok()) Die(tok.status());
  c->tokenizer = std::move(*tok);
  c->dataset_options = {.shard_tokens = 16384, .eval_every = 20};
  absl::StatusOr<Dataset> ds = BuildDataset(c->documents, *c->tokenizer, c->dataset_options);
  if (!ds.ok()) Die(ds.status());
  c->dataset = std::move(*ds);
  return c;
}

}  // namespace

const TestCorpus& GetTestCorpus() {
  static const TestCorpus* corpus = Build();
  return *corpus;
}

}  // namespace ts::worker
