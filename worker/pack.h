// `trainshard data pack`: a user's text — plain text files, folders of them, or JSON Lines with a
// named text field — turned into a dataset (docs/worker.md "Packed datasets"): a tokenizer
// (SentencePiece, trained at a given vocabulary on the text, or the user's own model) and
// content-addressed token shards with a held-out set, in a folder with a manifest
// (dataset.json). The folder is what a member publishes as a `dataset` artifact, and its root is
// what a run spec pins.
//
// Every input is checked before anything is written: a file that is empty, holds a NUL byte
// (binary) or invalid UTF-8, a line longer than the cap, a JSON Lines record that does not parse
// or lacks the field (or whose field is not a string), a tokenizer that does not load — each an
// INVALID_ARGUMENT naming the file and the line. The folder is written under a temporary name and
// renamed into place at the end, so a failure leaves no partial dataset.
//
// Thread-safety: PackDataset may run on several threads (the tokenizer trainer serializes
// itself); ReadPackedDataset is a pure function of the folder's files.
#ifndef TS_WORKER_PACK_H_
#define TS_WORKER_PACK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/dataset_manifest.h"

namespace ts::worker {

inline constexpr uint64_t kPackLineBytesDefault = 1 << 20;

struct PackOptions {
  // Files or folders (walked recursively, in byte order of their paths; symlinks refused).
  std::vector<std::string> inputs;
  // Empty: plain text, one document per paragraph (lines up to a blank line). Otherwise every
  // input is JSON Lines and each record's `jsonl_field` (a string) is one document.
  std::string jsonl_field;
  // Train a tokenizer of this many pieces (8..65536) on the text, or load `tokenizer_file`.
  uint32_t vocab = 0;
  std::string tokenizer_file;
  uint32_t shard_tokens = 1 << 20;  // tokens per training shard
  uint32_t eval_every = 100;        // every eval_every-th document is held out
  uint64_t line_bytes_max = kPackLineBytesDefault;
  // The tokenizer is trained on the documents in order up to this many bytes.
  uint64_t tokenizer_sample_bytes = uint64_t{64} << 20;
};

// Packs `options.inputs` into a new folder `out_dir` (which must not exist). INVALID_ARGUMENT
// naming the option, the file and the line for bad input (above); ALREADY_EXISTS for an existing
// out_dir; errors of the tokenizer (FAILED_PRECONDITION when SentencePiece is not available).
absl::StatusOr<PackedDataset> PackDataset(const PackOptions& options, const std::string& out_dir);

}  // namespace ts::worker

#endif  // TS_WORKER_PACK_H_
