#include "worker/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "worker/sentencepiece_shim.h"

#ifndef TS_SENTENCEPIECE_SHIM_PATH
#error "TS_SENTENCEPIECE_SHIM_PATH must name the built shim (worker/CMakeLists.txt)"
#endif

namespace ts::worker {
namespace {

constexpr char kShimName[] = "libts_sentencepiece_shim.so";

struct Shim {
  decltype(&ts_spm_train) train = nullptr;
  decltype(&ts_spm_load) load = nullptr;
  decltype(&ts_spm_unload) unload = nullptr;
  decltype(&ts_spm_encode) encode = nullptr;
  decltype(&ts_spm_decode) decode = nullptr;
  decltype(&ts_spm_vocab_size) vocab_size = nullptr;
  decltype(&ts_spm_eos_id) eos_id = nullptr;
  decltype(&ts_spm_free) free = nullptr;
};

template <typename F>
bool Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

absl::StatusOr<Shim> OpenShim() {
  std::vector<std::string> candidates;
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    candidates.push_back((std::filesystem::path(exe).parent_path() / kShimName).string());
  }
  candidates.push_back(TS_SENTENCEPIECE_SHIM_PATH);
  std::string tried;
  for (const std::string& path : candidates) {
    // A link-map namespace of its own: the shim, SentencePiece with its bundled protobuf, and
    // their own copy of the C and C++ runtimes never meet libtorch's libprotobuf.
    void* handle = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      absl::StrAppend(&tried, " ", path, ": ", dlerror(), ";");
      continue;
    }
    Shim s;
    if (!Resolve(handle, "ts_spm_train", &s.train) || !Resolve(handle, "ts_spm_load", &s.load) ||
        !Resolve(handle, "ts_spm_unload", &s.unload) ||
        !Resolve(handle, "ts_spm_encode", &s.encode) ||
        !Resolve(handle, "ts_spm_decode", &s.decode) ||
        !Resolve(handle, "ts_spm_vocab_size", &s.vocab_size) ||
        !Resolve(handle, "ts_spm_eos_id", &s.eos_id) || !Resolve(handle, "ts_spm_free", &s.free)) {
      return absl::FailedPreconditionError(
          absl::StrCat("tokenizer: ", path, " lacks a ts_spm_ symbol"));
    }
    return s;  // the handle stays open for the life of the process
  }
  return absl::FailedPreconditionError(absl::StrCat("tokenizer: cannot open", tried));
}

// Opened once per process; the result (or the error) is kept.
const absl::StatusOr<Shim>& GetShim() {
  static const absl::StatusOr<Shim>* shim = new absl::StatusOr<Shim>(OpenShim());
  return *shim;
}

// Takes ownership of a shim-allocated message.
std::string TakeError(const Shim& shim, char* error) {
  if (error == nullptr) return "unknown error";
  std::string message(error);
  shim.free(error);
  return message;
}

absl::Mutex train_mu(absl::kConstInit);

}  // namespace

absl::StatusOr<std::string> TrainTokenizer(std::span<const std::string> texts,
                                           const TokenizerOptions& options) {
  if (texts.empty()) return absl::InvalidArgumentError("tokenizer: no training texts");
  if (options.vocab_size < 8 || options.vocab_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: vocab_size ", options.vocab_size, " is outside 8..65536"));
  }
  TS_ASSIGN_OR_RETURN(const Shim& shim, GetShim());
  std::vector<const char*> ptrs;
  std::vector<size_t> sizes;
  ptrs.reserve(texts.size());
  sizes.reserve(texts.size());
  for (const std::string& t : texts) {
    ptrs.push_back(t.data());
    sizes.push_back(t.size());
  }
  // Determinism: one thread, every sentence in input order (no sampling, no shuffling), a fixed
  // seed. byte_fallback stays off, so every piece decodes to text.
  const std::string args =
      absl::StrCat("--model_type=bpe --vocab_size=", options.vocab_size,
                   " --num_threads=1 --input_sentence_size=0 --shuffle_input_sentence=false"
                   " --character_coverage=0.9995 --max_sentence_length=16384"
                   " --unk_id=0 --eos_id=1 --bos_id=-1 --pad_id=-1 --minloglevel=1");
  absl::MutexLock lock(&train_mu);
  char* model = nullptr;
  size_t model_size = 0;
  char* error = nullptr;
  if (shim.train(ptrs.data(), sizes.data(), ptrs.size(), args.c_str(), options.seed, &model,
                 &model_size, &error) != 0) {
    return absl::InternalError(
        absl::StrCat("tokenizer: training failed: ", TakeError(shim, error)));
  }
  std::string out(model, model_size);
  shim.free(model);
  return out;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(std::string_view model) {
  TS_ASSIGN_OR_RETURN(const Shim& shim, GetShim());
  void* processor = nullptr;
  char* error = nullptr;
  if (shim.load(model.data(), model.size(), &processor, &error) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: not a SentencePiece model: ", TakeError(shim, error)));
  }
  const int vocab = shim.vocab_size(processor);
  const int eos = shim.eos_id(processor);
  if (vocab < 2 || eos < 0 || eos >= vocab) {
    shim.unload(processor);
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: model with ", vocab, " pieces and eos id ", eos, " is unusable"));
  }
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(processor, static_cast<uint32_t>(vocab), static_cast<uint32_t>(eos)));
}

Tokenizer::~Tokenizer() { GetShim()->unload(processor_); }

absl::StatusOr<std::vector<uint32_t>> Tokenizer::Encode(std::string_view text) const {
  const Shim& shim = *GetShim();
  int* ids = nullptr;
  size_t count = 0;
  char* error = nullptr;
  if (shim.encode(processor_, text.data(), text.size(), &ids, &count, &error) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: encode failed: ", TakeError(shim, error)));
  }
  std::vector<uint32_t> out(ids, ids + count);
  shim.free(ids);
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const uint32_t> ids) const {
  std::vector<int> in;
  in.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: id[", i, "] = ", ids[i], " is not below ", vocab_size_));
    }
    in.push_back(static_cast<int>(ids[i]));
  }
  const Shim& shim = *GetShim();
  char* text = nullptr;
  size_t size = 0;
  char* error = nullptr;
  if (shim.decode(processor_, in.data(), in.size(), &text, &size, &error) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: decode failed: ", TakeError(shim, error)));
  }
  std::string out(text, size);
  shim.free(text);
  return out;
}

}  // namespace ts::worker
