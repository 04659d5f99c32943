#include "worker/corpus.h"

#include <array>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace ts::worker {
namespace {

constexpr std::array<std::string_view, 41> kFortuneFiles = {
    "computers", "cookie",       "debian",   "definitions", "disclaimer",    "drugs",
    "education", "ethnic",       "food",     "fortunes",    "goedel",        "humorists",
    "kids",      "knghtbrd",     "law",      "linux",       "linuxcookie",   "literature",
    "love",      "magic",        "medicine", "men-women",   "miscellaneous", "news",
    "paradoxum", "people",       "perl",     "pets",        "platitudes",    "politics",
    "pratchett", "riddles",      "science",  "songs-poems", "sports",        "startrek",
    "tao",       "translate-me", "wisdom",   "work",        "zippy"};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void Flush(std::string* doc, std::vector<std::string>* out) {
  while (!doc->empty() && doc->back() == ' ') doc->pop_back();
  if (!doc->empty()) out->push_back(std::move(*doc));
  doc->clear();
}

}  // namespace

std::span<const std::string_view> DefaultFortuneFiles() { return kFortuneFiles; }

std::vector<std::string> SplitFortunes(std::string_view text) {
  std::vector<std::string> out;
  std::string doc;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      Flush(&doc, &out);
      continue;
    }
    for (char c : line) {
      if (IsSpace(c)) {
        if (!doc.empty() && doc.back() != ' ') doc.push_back(' ');
      } else {
        doc.push_back(c);
      }
    }
    if (!doc.empty() && doc.back() != ' ') doc.push_back(' ');
  }
  Flush(&doc, &out);
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadFortuneFiles(std::string_view dir,
                                                          std::span<const std::string_view> files) {
  std::vector<std::string> docs;
  for (std::string_view name : files) {
    const std::filesystem::path path = std::filesystem::path(dir) / name;
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) {
      return absl::NotFoundError(absl::StrCat("corpus: ", path.string(), ": ", ec.message(),
                                              " (Debian package 'fortunes')"));
    }
    if (size > kCorpusFileBytesMax) {
      return absl::InvalidArgumentError(absl::StrCat("corpus: ", path.string(), " has ", size,
                                                     " bytes, over ", kCorpusFileBytesMax));
    }
    std::ifstream in(path, std::ios::binary);
    std::string text(size, '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(size))) {
      return absl::NotFoundError(absl::StrCat("corpus: cannot read ", path.string()));
    }
    for (std::string& d : SplitFortunes(text)) docs.push_back(std::move(d));
  }
  return docs;
}

absl::StatusOr<Dataset> BuildDataset(std::span<const std::string> documents,
                                     const Tokenizer& tokenizer, const DatasetOptions& options) {
  if (options.shard_tokens == 0 || options.eval_every == 0) {
    return absl::InvalidArgumentError(absl::StrCat("dataset: shard_tokens ", options.shard_tokens,
                                                   " and eval_every ", options.eval_every,
                                                   " must be positive"));
  }
  if (documents.empty()) return absl::InvalidArgumentError("dataset: no documents");
  Dataset ds;
  ds.documents = documents.size();
  ds.eval.vocab = tokenizer.vocab_size();
  std::vector<uint32_t> stream;
  for (size_t i = 0; i < documents.size(); ++i) {
    TS_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, tokenizer.Encode(documents[i]));
    std::vector<uint32_t>& dst = (i % options.eval_every == 0) ? ds.eval.tokens : stream;
    dst.insert(dst.end(), ids.begin(), ids.end());
    dst.push_back(tokenizer.eos_id());
  }
  for (size_t start = 0; start < stream.size(); start += options.shard_tokens) {
    const size_t end = std::min(stream.size(), start + size_t{options.shard_tokens});
    DataShard shard;
    shard.vocab = tokenizer.vocab_size();
    shard.tokens.assign(stream.begin() + static_cast<int64_t>(start),
                        stream.begin() + static_cast<int64_t>(end));
    ds.train.push_back(std::move(shard));
  }
  return ds;
}

}  // namespace ts::worker
