// The run's tokenizer: a SentencePiece BPE model trained on the corpus (docs/worker.md
// "Corpus and tokenizer"). The serialized model bytes are the tokenizer artifact; training them is
// deterministic (single thread, fixed seed, no input sampling), which worker_test checks by
// training twice. SentencePiece itself lives behind libts_sentencepiece_shim.so
// (sentencepiece_shim.h says why); it is opened on first use (dlmopen, its own link-map namespace),
// from the directory of the running executable or else from the build tree.
//
// Thread-safety: TrainTokenizer calls are serialized internally (SentencePiece's trainer keeps
// process-wide state). A Tokenizer is immutable after Load; its methods may be called from
// several threads.
#ifndef TS_WORKER_TOKENIZER_H_
#define TS_WORKER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::worker {

struct TokenizerOptions {
  uint32_t vocab_size = 1024;  // pieces, including <unk> (id 0) and </s> (id 1); no <s>
  uint32_t seed = 1;           // SentencePiece's random seed
};

// Trains a BPE model on `texts` (one document each). INVALID_ARGUMENT for no texts or a vocab
// size outside 8..65536; INTERNAL when SentencePiece refuses (e.g. a vocab larger than the corpus
// supports), with its message; FAILED_PRECONDITION when the shim cannot be opened.
absl::StatusOr<std::string> TrainTokenizer(std::span<const std::string> texts,
                                           const TokenizerOptions& options);

class Tokenizer {
 public:
  // INVALID_ARGUMENT when the bytes are not a SentencePiece model; FAILED_PRECONDITION when the
  // shim cannot be opened.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(std::string_view model);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  absl::StatusOr<std::vector<uint32_t>> Encode(std::string_view text) const;
  // INVALID_ARGUMENT for an id >= vocab_size().
  absl::StatusOr<std::string> Decode(std::span<const uint32_t> ids) const;
  uint32_t vocab_size() const { return vocab_size_; }
  uint32_t eos_id() const { return eos_id_; }

 private:
  Tokenizer(void* processor, uint32_t vocab_size, uint32_t eos_id)
      : processor_(processor), vocab_size_(vocab_size), eos_id_(eos_id) {}
  void* processor_;
  uint32_t vocab_size_;
  uint32_t eos_id_;
};

}  // namespace ts::worker

#endif  // TS_WORKER_TOKENIZER_H_
