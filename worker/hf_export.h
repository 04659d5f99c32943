// A trained checkpoint in the form the Hugging Face tools load (docs/worker.md "Export"):
// `model.safetensors` (the parameters under LlamaForCausalLM's tensor names and shapes, fp32
// little-endian, in the safetensors format: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw buffers), `config.json` (a
// LlamaConfig), and the run's SentencePiece `tokenizer.model` when one is given.
//
// The parameters are streamed from the checkpoint file to the safetensors file a chunk at a time
// (worker/value_stream.h), so a 1 B-parameter model exports without a copy in memory; the outer
// momentum is not exported. Plain C++ (no libtorch).
//
// Thread-safety: a pure function of its arguments and the files they name.
#ifndef TS_WORKER_HF_EXPORT_H_
#define TS_WORKER_HF_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model_config.h"

namespace ts::worker {

struct HfExportOptions {
  std::string checkpoint_file;  // a checkpoint of the llama family
  std::string tokenizer_file;   // copied as tokenizer.model; empty: none
  std::string out_dir;          // must not exist; made whole or not at all
  uint64_t checkpoint_bytes_max = uint64_t{64} << 30;
};

struct HfExportResult {
  ModelConfig config;
  uint64_t parameters = 0;
  uint64_t tensors = 0;
  std::string root;  // the checkpoint's root (SHA-256 of the whole file), checked on the way
  uint64_t safetensors_bytes = 0;
};

// Writes the export into out_dir (through a sibling temporary folder renamed at the end, so a
// failure leaves nothing). INVALID_ARGUMENT naming the file for a checkpoint that does not decode
// (DecodeCheckpointHeader's checks, a wrong size, a non-finite value) or one of the gpt family
// (which has no Llama layout); ALREADY_EXISTS when out_dir exists; NOT_FOUND for a missing
// file; INTERNAL for I/O errors.
absl::StatusOr<HfExportResult> ExportHuggingFace(const HfExportOptions& options);

// config.json's text for `config` (llama family): the LlamaConfig fields the model implies.
std::string LlamaConfigJson(const ModelConfig& config);

// The safetensors header (the JSON, padded with spaces to a multiple of 8 bytes, without the
// length prefix) for the config's parameters in ParameterLayout order, as fp32.
std::string SafetensorsHeader(const ModelConfig& config);

}  // namespace ts::worker

#endif  // TS_WORKER_HF_EXPORT_H_
