// The run's corpus and its cut into data shards. The corpus is the English text of Debian's
// `fortunes` package (docs/worker.md "Corpus and tokenizer" says why): fortune files are entries
// separated by lines holding only "%". Documents are tokenized, each followed by </s>, and every
// eval_every-th document goes to the held-out evaluation set; the rest form one token stream cut
// into shards of shard_tokens tokens.
//
// Thread-safety: pure functions, except ReadFortuneFiles, which reads files (safe to call
// concurrently).
#ifndef TS_WORKER_CORPUS_H_
#define TS_WORKER_CORPUS_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data_shard.h"
#include "worker/tokenizer.h"

namespace ts::worker {

// Cap on one corpus file (the largest fortune file is under 0.5 MiB).
inline constexpr uint64_t kCorpusFileBytesMax = uint64_t{64} << 20;

// The fortune files the corpus uses, in this order: every text file of `fortunes` 1:1.99.1
// (Debian 12) except the two of ASCII art ("art", "ascii-art").
std::span<const std::string_view> DefaultFortuneFiles();

// Splits one fortune file into documents: entries between "%" lines, runs of whitespace
// collapsed to one space, leading/trailing space removed, empty entries dropped.
std::vector<std::string> SplitFortunes(std::string_view file_text);

// Reads `files` from `dir` in order and splits each. NOT_FOUND naming a missing file (with the
// package to install), INVALID_ARGUMENT for a file larger than kCorpusFileBytesMax.
absl::StatusOr<std::vector<std::string>> ReadFortuneFiles(
    std::string_view dir, std::span<const std::string_view> files = DefaultFortuneFiles());

struct DatasetOptions {
  uint32_t shard_tokens = 65536;  // tokens per training shard (the last one may be shorter)
  uint32_t eval_every = 20;       // documents 0, eval_every, 2·eval_every, ... are held out
};

struct Dataset {
  std::vector<DataShard> train;
  DataShard eval;
  uint64_t documents = 0;
};

// INVALID_ARGUMENT for zero options or no documents; errors of the tokenizer pass through.
absl::StatusOr<Dataset> BuildDataset(std::span<const std::string> documents,
                                     const Tokenizer& tokenizer, const DatasetOptions& options);

}  // namespace ts::worker

#endif  // TS_WORKER_CORPUS_H_
