#include "worker/dataset_manifest.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/regular_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ts::worker {
namespace {

constexpr uint64_t kManifestBytesMax = uint64_t{16} << 20;
constexpr char kRootDomain[] = "gonka-trainshard/v1/dataset";
// A shard or tokenizer file is hashed whole; larger ones are not a dataset's.
constexpr uint64_t kDatasetFileBytesMax = uint64_t{4} << 30;

absl::Status Bad(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
}

nlohmann::ordered_json ShardJson(const PackedShard& s) {
  return {{"file", s.file}, {"id", common::HexEncode(s.id)}, {"tokens", s.tokens}};
}

}  // namespace

std::string PackedDatasetRoot(const std::string& tokenizer_sha256,
                              const std::vector<PackedShard>& train, const PackedShard& eval) {
  common::Sha256Hasher hasher;
  hasher.Update(kRootDomain);
  hasher.Update(tokenizer_sha256);
  for (const PackedShard& s : train) hasher.Update(s.id);
  hasher.Update(eval.id);
  return hasher.Finish();
}

std::string DatasetManifestJson(const PackedDataset& d) {
  nlohmann::ordered_json manifest;
  manifest["version"] = 1;
  manifest["vocab"] = d.vocab;
  manifest["tokenizer"] = kDatasetTokenizerFile;
  manifest["tokenizer_sha256"] = common::HexEncode(d.tokenizer_sha256);
  manifest["documents"] = d.documents;
  manifest["input_files"] = d.input_files;
  manifest["input_bytes"] = d.input_bytes;
  manifest["train"] = nlohmann::ordered_json::array();
  for (const PackedShard& s : d.train) manifest["train"].push_back(ShardJson(s));
  manifest["eval"] = ShardJson(d.eval);
  manifest["root"] = common::HexEncode(d.root);
  return manifest.dump(1) + "\n";
}

absl::StatusOr<PackedDataset> ReadPackedDataset(const std::string& dir) {
  const std::string manifest_path = dir + "/" + kDatasetManifestFile;
  TS_ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("dataset manifest", manifest_path,
                                                                kManifestBytesMax));
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) { return Bad(manifest_path, why); };
  if (m.is_discarded() || !m.is_object()) return bad("not a JSON object");
  if (m.value("version", 0) != 1) return bad("version is not 1");
  PackedDataset out;
  if (!m.contains("vocab") || !m["vocab"].is_number_unsigned()) return bad("vocab missing");
  out.vocab = m["vocab"].get<uint32_t>();
  if (out.vocab < 8 || out.vocab > 65536) return bad("vocab outside 8..65536");
  out.documents = m.value("documents", uint64_t{0});
  // A file named by the manifest: a plain name in the folder, its SHA-256 from its bytes.
  auto hash_file =
      [&](const nlohmann::json& name) -> absl::StatusOr<std::pair<std::string, std::string>> {
    if (!name.is_string()) return bad("a file name is not a string");
    const std::string file = name.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file[0] == '.') {
      return bad(absl::StrCat("file \"", file, "\" is not a plain name in the folder"));
    }
    TS_ASSIGN_OR_RETURN(std::string bytes, common::ReadRegularFile("dataset file", dir + "/" + file,
                                                                   kDatasetFileBytesMax));
    return std::make_pair(file, common::Sha256(bytes));
  };
  auto shard = [&](const nlohmann::json& j) -> absl::StatusOr<PackedShard> {
    if (!j.is_object()) return bad("a shard entry is not an object");
    TS_ASSIGN_OR_RETURN(auto hashed, hash_file(j.value("file", nlohmann::json())));
    const std::string claimed = j.value("id", std::string());
    if (common::HexEncode(hashed.second) != claimed) {
      return Bad(dir + "/" + hashed.first, absl::StrCat("has id ", common::HexEncode(hashed.second),
                                                        ", the manifest says ", claimed));
    }
    return PackedShard{hashed.first, hashed.second, j.value("tokens", uint64_t{0})};
  };
  TS_ASSIGN_OR_RETURN(auto tokenizer, hash_file(m.value("tokenizer", nlohmann::json())));
  if (common::HexEncode(tokenizer.second) != m.value("tokenizer_sha256", std::string())) {
    return Bad(dir + "/" + tokenizer.first, "does not have the manifest's tokenizer_sha256");
  }
  out.tokenizer_sha256 = tokenizer.second;
  if (!m.contains("train") || !m["train"].is_array() || m["train"].empty()) {
    return bad("train: no shards");
  }
  for (const auto& j : m["train"]) {
    TS_ASSIGN_OR_RETURN(PackedShard s, shard(j));
    out.train.push_back(std::move(s));
  }
  TS_ASSIGN_OR_RETURN(out.eval, shard(m.value("eval", nlohmann::json())));
  out.root = PackedDatasetRoot(out.tokenizer_sha256, out.train, out.eval);
  if (common::HexEncode(out.root) != m.value("root", std::string())) {
    return bad(absl::StrCat("root is ", m.value("root", std::string()), ", the files give ",
                            common::HexEncode(out.root)));
  }
  return out;
}

}  // namespace ts::worker
