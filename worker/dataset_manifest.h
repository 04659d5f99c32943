// A packed dataset's folder and its manifest (docs/worker.md "Packed datasets"): what
// `trainshard data pack` writes (pack.h) and what a member checks after fetching a dataset
// artifact — every file's hash against the manifest, and the root. Plain C++ (no tokenizer, no
// libtorch), so the shard process can check a dataset too.
//
// Thread-safety: pure functions of the folder's files.
#ifndef TS_WORKER_DATASET_MANIFEST_H_
#define TS_WORKER_DATASET_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ts::worker {

inline constexpr char kDatasetManifestFile[] = "dataset.json";
inline constexpr char kDatasetTokenizerFile[] = "tokenizer.model";

struct PackedShard {
  std::string file;  // name in the folder
  std::string id;    // DataShardId: SHA-256 of the file
  uint64_t tokens = 0;
};

struct PackedDataset {
  uint32_t vocab = 0;
  std::string tokenizer_sha256;  // raw 32 bytes
  std::vector<PackedShard> train;
  PackedShard eval;
  uint64_t documents = 0;
  uint64_t input_files = 0;
  uint64_t input_bytes = 0;
  // SHA-256("gonka-trainshard/v1/dataset" || tokenizer_sha256 || train ids in order || eval id):
  // what a run spec's data.dataset_root pins.
  std::string root;
};

// Reads a packed folder's manifest and checks it against the files: every shard's id recomputed
// from its bytes, the tokenizer's hash, the root. INVALID_ARGUMENT naming the file for anything
// that does not match or is missing.
absl::StatusOr<PackedDataset> ReadPackedDataset(const std::string& dir);

// The root of a packed dataset, from its parts.
std::string PackedDatasetRoot(const std::string& tokenizer_sha256,
                              const std::vector<PackedShard>& train, const PackedShard& eval);

// The manifest's text (dataset.json) for `dataset`.
std::string DatasetManifestJson(const PackedDataset& dataset);

}  // namespace ts::worker

#endif  // TS_WORKER_DATASET_MANIFEST_H_
