#include "worker/pack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/regular_file.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/data_shard.h"
#include "worker/tokenizer.h"

namespace ts::worker {
namespace {

namespace fs = std::filesystem;

// One input file is read whole; larger ones are refused with the advice to split them.
constexpr uint64_t kInputFileBytesMax = uint64_t{1} << 30;
constexpr uint64_t kTokenizerFileBytesMax = uint64_t{64} << 20;

absl::Status Bad(const std::string& where, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
}

// Length of the UTF-8 sequence starting at s[i], or 0 if it is not a valid one (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t Utf8Length(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

bool Blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

// Calls fn(line, number) for each line of `text` (1-based), after checking the line: no NUL,
// valid UTF-8, at most `line_bytes_max` bytes. A trailing "\r" is dropped.
absl::Status ForEachLine(const std::string& file, std::string_view text, uint64_t line_bytes_max,
                         const std::function<absl::Status(std::string_view, uint64_t)>& fn) {
  uint64_t number = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    ++number;
    const std::string where = absl::StrCat(file, ":", number);
    if (line.size() > line_bytes_max) {
      return Bad(where, absl::StrCat("line of ", line.size(), " bytes, more than ", line_bytes_max,
                                     " (--line-bytes-max)"));
    }
    if (line.find('\0') != std::string_view::npos) {
      return Bad(where, "holds a NUL byte: a binary file, not text");
    }
    for (size_t i = 0; i < line.size();) {
      const size_t n = Utf8Length(line, i);
      if (n == 0) return Bad(where, absl::StrCat("invalid UTF-8 at byte ", i + 1, " of the line"));
      i += n;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    TS_RETURN_IF_ERROR(fn(line, number));
    start = end + 1;
  }
  return absl::OkStatus();
}

// The documents of one input file, checked.
absl::StatusOr<std::vector<std::string>> FileDocuments(const std::string& file,
                                                       const PackOptions& options) {
  TS_ASSIGN_OR_RETURN(std::string text, common::ReadRegularFile("input", file, kInputFileBytesMax));
  if (text.empty()) return Bad(file, "is empty");
  std::vector<std::string> documents;
  if (options.jsonl_field.empty()) {
    // Paragraphs: runs of non-blank lines, joined with "\n".
    std::string paragraph;
    TS_RETURN_IF_ERROR(ForEachLine(
        file, text, options.line_bytes_max, [&](std::string_view line, uint64_t) -> absl::Status {
          if (Blank(line)) {
            if (!paragraph.empty()) documents.push_back(std::exchange(paragraph, std::string()));
            return absl::OkStatus();
          }
          if (!paragraph.empty()) paragraph += '\n';
          paragraph.append(line);
          return absl::OkStatus();
        }));
    if (!paragraph.empty()) documents.push_back(std::move(paragraph));
  } else {
    TS_RETURN_IF_ERROR(ForEachLine(
        file, text, options.line_bytes_max,
        [&](std::string_view line, uint64_t number) -> absl::Status {
          if (Blank(line)) return absl::OkStatus();
          const std::string where = absl::StrCat(file, ":", number);
          nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
          if (record.is_discarded()) return Bad(where, "not a JSON value");
          if (!record.is_object()) return Bad(where, "not a JSON object");
          auto field = record.find(options.jsonl_field);
          if (field == record.end()) {
            return Bad(where, absl::StrCat("no field \"", options.jsonl_field, "\""));
          }
          if (!field->is_string()) {
            return Bad(where, absl::StrCat("field \"", options.jsonl_field, "\" is ",
                                           field->type_name(), ", not a string"));
          }
          std::string document = field->get<std::string>();
          // The JSON parser accepts escapes that decode to invalid text.
          if (document.find('\0') != std::string::npos) {
            return Bad(where, absl::StrCat("field \"", options.jsonl_field, "\" holds a NUL"));
          }
          if (!Blank(document)) documents.push_back(std::move(document));
          return absl::OkStatus();
        }));
  }
  if (documents.empty()) return Bad(file, "holds no text");
  return documents;
}

// Every regular file under the inputs, in byte order of their paths within each input.
absl::StatusOr<std::vector<std::string>> InputFiles(const std::vector<std::string>& inputs) {
  if (inputs.empty()) return absl::InvalidArgumentError("--input: none given");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    struct stat st {};
    if (::lstat(input.c_str(), &st) != 0) {
      return Bad(absl::StrCat("--input ", input), std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) return Bad(absl::StrCat("--input ", input), "is a symlink");
    if (S_ISREG(st.st_mode)) {
      files.push_back(input);
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      return Bad(absl::StrCat("--input ", input), "is not a file or a folder");
    }
    std::vector<std::string> found;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(input, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const fs::file_status status = it->symlink_status(ec);
      if (ec) break;
      if (fs::is_symlink(status)) return Bad(it->path().string(), "is a symlink");
      if (fs::is_regular_file(status)) {
        found.push_back(it->path().string());
      } else if (!fs::is_directory(status)) {
        return Bad(it->path().string(), "is not a regular file");
      }
    }
    if (ec) return Bad(absl::StrCat("--input ", input), ec.message());
    if (found.empty()) return Bad(absl::StrCat("--input ", input), "holds no files");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

absl::Status WriteFile(const std::string& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": create: ", std::strerror(errno)));
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      const std::string message = absl::StrCat(path, ": write: ", std::strerror(err));
      return err == ENOSPC ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::InternalError(absl::StrCat(path, ": sync: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Removes a folder on every path out of PackDataset but the successful one.
class TempFolder {
 public:
  explicit TempFolder(std::string path) : path_(std::move(path)) {}
  ~TempFolder() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

}  // namespace

absl::StatusOr<PackedDataset> PackDataset(const PackOptions& options, const std::string& out_dir) {
  // Options first, then every input, before anything is written.
  if (options.tokenizer_file.empty() == (options.vocab == 0)) {
    return absl::InvalidArgumentError(
        "--vocab / --tokenizer: give one: a vocabulary to train a tokenizer at, or a "
        "SentencePiece model");
  }
  if (options.vocab != 0 && (options.vocab < 8 || options.vocab > 65536)) {
    return Bad("--vocab", absl::StrCat(options.vocab, " is outside 8..65536"));
  }
  if (options.shard_tokens < 64) {
    return Bad("--shard-tokens", absl::StrCat(options.shard_tokens, " is below 64"));
  }
  if (options.eval_every < 2) {
    return Bad("--eval-every", absl::StrCat(options.eval_every, " is below 2"));
  }
  if (options.line_bytes_max < 1) return Bad("--line-bytes-max", "0 is below 1");
  if (out_dir.empty()) return absl::InvalidArgumentError("--out: missing");
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out_dir, ec))) {
    return absl::AlreadyExistsError(absl::StrCat("--out ", out_dir, ": already exists"));
  }
  TS_ASSIGN_OR_RETURN(std::vector<std::string> files, InputFiles(options.inputs));

  PackedDataset out;
  out.input_files = files.size();
  // Pass 1: every file checked; the tokenizer's sample gathered from the documents in order.
  std::vector<std::string> sample;
  uint64_t sample_bytes = 0;
  for (const std::string& file : files) {
    TS_ASSIGN_OR_RETURN(std::vector<std::string> documents, FileDocuments(file, options));
    out.documents += documents.size();
    for (std::string& d : documents) {
      out.input_bytes += d.size();
      if (sample_bytes < options.tokenizer_sample_bytes) {
        sample_bytes += d.size();
        sample.push_back(std::move(d));
      }
    }
  }
  const uint64_t eval_documents = (out.documents + options.eval_every - 1) / options.eval_every;
  if (out.documents - eval_documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: ", out.documents, " documents leave none for training after every ",
                     options.eval_every, "th is held out (--eval-every)"));
  }

  std::string model;
  if (!options.tokenizer_file.empty()) {
    TS_ASSIGN_OR_RETURN(model, common::ReadRegularFile("--tokenizer", options.tokenizer_file,
                                                       kTokenizerFileBytesMax));
  } else {
    TS_ASSIGN_OR_RETURN(model, TrainTokenizer(sample, {.vocab_size = options.vocab}));
  }
  sample.clear();
  sample.shrink_to_fit();
  auto tokenizer = Tokenizer::Load(model);
  if (!tokenizer.ok()) {
    return Bad(
        options.tokenizer_file.empty() ? "tokenizer" : "--tokenizer " + options.tokenizer_file,
        absl::StrCat("does not load: ", tokenizer.status().message()));
  }
  out.vocab = (*tokenizer)->vocab_size();
  if (out.vocab < 8 || out.vocab > 65536) {
    return Bad("--tokenizer " + options.tokenizer_file,
               absl::StrCat("has ", out.vocab, " pieces, outside 8..65536"));
  }
  out.tokenizer_sha256 = common::Sha256(model);

  // Pass 2: tokenized into shards in a folder of its own, renamed into place at the end.
  TempFolder temp(absl::StrCat(out_dir, ".tmp-", ::getpid()));
  fs::remove_all(temp.path(), ec);
  if (!fs::create_directories(temp.path(), ec) || ec) {
    return absl::InternalError(absl::StrCat("--out ", out_dir, ": ", ec.message()));
  }
  TS_RETURN_IF_ERROR(WriteFile(temp.path() + "/" + kDatasetTokenizerFile, model));
  DataShard train{out.vocab, {}};
  DataShard eval{out.vocab, {}};
  auto flush = [&](bool last) -> absl::Status {
    while (train.tokens.size() >= options.shard_tokens || (last && !train.tokens.empty())) {
      const size_t take = std::min<size_t>(train.tokens.size(), options.shard_tokens);
      DataShard shard{out.vocab, std::vector<uint32_t>(
                                     train.tokens.begin(),
                                     train.tokens.begin() + static_cast<std::ptrdiff_t>(take))};
      train.tokens.erase(train.tokens.begin(),
                         train.tokens.begin() + static_cast<std::ptrdiff_t>(take));
      char name[32];
      std::snprintf(name, sizeof(name), "train-%05zu.tsds", out.train.size());
      const std::string bytes = EncodeDataShard(shard);
      TS_RETURN_IF_ERROR(WriteFile(temp.path() + "/" + name, bytes));
      out.train.push_back({name, DataShardId(bytes), take});
    }
    return absl::OkStatus();
  };
  uint64_t index = 0;
  for (const std::string& file : files) {
    TS_ASSIGN_OR_RETURN(std::vector<std::string> documents, FileDocuments(file, options));
    for (const std::string& d : documents) {
      TS_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, (*tokenizer)->Encode(d));
      ids.push_back((*tokenizer)->eos_id());
      std::vector<uint32_t>& dst = index++ % options.eval_every == 0 ? eval.tokens : train.tokens;
      dst.insert(dst.end(), ids.begin(), ids.end());
      TS_RETURN_IF_ERROR(flush(/*last=*/false));
    }
  }
  TS_RETURN_IF_ERROR(flush(/*last=*/true));
  if (eval.tokens.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: the held-out set has ", eval.tokens.size(),
                     " tokens; a model needs at least 2 to be evaluated (more text, or a lower "
                     "--eval-every)"));
  }
  {
    const std::string bytes = EncodeDataShard(eval);
    TS_RETURN_IF_ERROR(WriteFile(temp.path() + "/eval.tsds", bytes));
    out.eval = {"eval.tsds", DataShardId(bytes), eval.tokens.size()};
  }
  out.root = PackedDatasetRoot(out.tokenizer_sha256, out.train, out.eval);

  TS_RETURN_IF_ERROR(WriteFile(temp.path() + "/" + kDatasetManifestFile, DatasetManifestJson(out)));
  if (::rename(temp.path().c_str(), out_dir.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--out ", out_dir, ": rename: ", std::strerror(errno)));
  }
  temp.Release();
  return out;
}

}  // namespace ts::worker
