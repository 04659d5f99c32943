// Test helper: a slice of the real corpus with its tokenizer and dataset, built once per
// process (the unit tests share it). Fails the calling test if the corpus is missing.
//
// Thread-safety: GetTestCorpus is safe to call from several threads (function-local static).
#ifndef TS_WORKER_TEST_CORPUS_H_
#define TS_WORKER_TEST_CORPUS_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/corpus.h"
#include "worker/tokenizer.h"

namespace ts::worker {

struct TestCorpus {
  std::vector<std::string> documents;  // the first files of DefaultFortuneFiles()
  TokenizerOptions tokenizer_options;
  std::string tokenizer_model;
  std::unique_ptr<Tokenizer> tokenizer;
  DatasetOptions dataset_options;
  Dataset dataset;
};

const TestCorpus& GetTestCorpus();

}  // namespace ts::worker

#endif  // TS_WORKER_TEST_CORPUS_H_
