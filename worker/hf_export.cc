#include "worker/hf_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/partial_dir.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/value_stream.h"

namespace ts::worker {
namespace {

// A float as the shortest decimal that reads back as it (1e-05, not 9.99999974737875e-06).
double Decimal(float value) { return std::stod(absl::StrCat(value)); }

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<int> OpenRead(const std::string& path, const std::string& field, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat(field, " \"", path, "\": no such file"));
    return Errno(absl::StrCat(field, " \"", path, "\""));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(field, " \"", path, "\": not a regular file"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<FileByteWriter*> Create(const std::string& path,
                                       std::unique_ptr<FileByteWriter>* out) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(absl::StrCat("cannot create ", path));
  *out = std::make_unique<FileByteWriter>(fd, path);
  return out->get();
}

absl::Status WriteWhole(const std::string& path, std::string_view bytes) {
  std::unique_ptr<FileByteWriter> writer;
  TS_RETURN_IF_ERROR(Create(path, &writer).status());
  TS_RETURN_IF_ERROR(writer->WriteBytes(bytes.data(), bytes.size()));
  return writer->Close().status();
}

absl::StatusOr<HfExportResult> WriteExport(const HfExportOptions& options, const std::string& dir) {
  uint64_t size = 0;
  TS_ASSIGN_OR_RETURN(int fd, OpenRead(options.checkpoint_file, "checkpoint", &size));
  if (size > options.checkpoint_bytes_max) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("checkpoint \"", options.checkpoint_file,
                                                   "\": ", size, " bytes, more than ",
                                                   options.checkpoint_bytes_max));
  }
  TS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointFileReader> reader,
                      CheckpointFileReader::Open(
                          fd, size, absl::StrCat("checkpoint \"", options.checkpoint_file, "\"")));
  const ModelConfig& config = reader->header().config;
  if (config.family != ModelFamily::kLlama) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint \"", options.checkpoint_file, "\": a ", ModelConfigString(config),
                     " model; only the llama family has the Hugging Face Llama layout"));
  }
  HfExportResult result;
  result.config = config;
  result.parameters = ParameterCount(config);
  result.tensors = ParameterLayout(config).size();

  const std::string header = SafetensorsHeader(config);
  std::unique_ptr<FileByteWriter> model;
  TS_RETURN_IF_ERROR(Create(dir + "/model.safetensors", &model).status());
  char length[8];
  uint64_t header_size = header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  TS_RETURN_IF_ERROR(model->WriteBytes(length, 8));
  TS_RETURN_IF_ERROR(model->WriteBytes(header.data(), header.size()));
  FileValueWriter values(model.get(), result.parameters);
  TS_RETURN_IF_ERROR(CopyValues(*reader, values, result.parameters));
  // The momentum is read (and checked) too, so the root covers the whole file.
  TS_RETURN_IF_ERROR(reader->Skip(reader->remaining()));
  TS_ASSIGN_OR_RETURN(result.root, reader->Finish());
  result.safetensors_bytes = model->written();
  TS_RETURN_IF_ERROR(model->Close().status());

  TS_RETURN_IF_ERROR(WriteWhole(dir + "/config.json", LlamaConfigJson(config)));
  if (!options.tokenizer_file.empty()) {
    uint64_t tokenizer_size = 0;
    TS_ASSIGN_OR_RETURN(int tfd, OpenRead(options.tokenizer_file, "tokenizer", &tokenizer_size));
    constexpr uint64_t kTokenizerBytesMax = uint64_t{64} << 20;
    if (tokenizer_size > kTokenizerBytesMax) {
      ::close(tfd);
      return absl::InvalidArgumentError(absl::StrCat("tokenizer \"", options.tokenizer_file,
                                                     "\": ", tokenizer_size, " bytes, more than ",
                                                     kTokenizerBytesMax));
    }
    FileByteReader in(tfd, tokenizer_size, options.tokenizer_file);
    std::string bytes(tokenizer_size, '\0');
    TS_RETURN_IF_ERROR(in.ReadBytes(bytes.data(), bytes.size()));
    TS_RETURN_IF_ERROR(WriteWhole(dir + "/tokenizer.model", bytes));
  }
  return result;
}

}  // namespace

std::string LlamaConfigJson(const ModelConfig& config) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = config.d_model;
  j["intermediate_size"] = config.mlp_hidden;
  j["num_hidden_layers"] = config.layers;
  j["num_attention_heads"] = config.heads;
  j["num_key_value_heads"] = config.kv_heads;
  j["head_dim"] = config.d_model / config.heads;
  j["vocab_size"] = config.vocab;
  j["max_position_embeddings"] = config.context;
  j["rms_norm_eps"] = Decimal(config.norm_eps);
  j["rope_theta"] = Decimal(config.rope_theta);
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = config.tie_embeddings;
  j["initializer_range"] = 0.02;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

std::string SafetensorsHeader(const ModelConfig& config) {
  nlohmann::ordered_json j;
  j["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec& t : ParameterLayout(config)) {
    nlohmann::ordered_json entry;
    entry["dtype"] = "F32";
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + 4 * t.numel};
    offset += 4 * t.numel;
    j[t.name] = std::move(entry);
  }
  std::string header = j.dump();
  // The buffers start 8-byte aligned: the format allows trailing spaces in the header for it.
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

absl::StatusOr<HfExportResult> ExportHuggingFace(const HfExportOptions& options) {
  TS_ASSIGN_OR_RETURN(common::PartialDir partial, common::PartialDir::Make("out", options.out_dir));
  TS_ASSIGN_OR_RETURN(HfExportResult result, WriteExport(options, partial.path()));
  TS_RETURN_IF_ERROR(partial.Commit());
  return result;
}

}  // namespace ts::worker
