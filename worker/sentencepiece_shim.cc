// The SentencePiece side of libts_sentencepiece_shim.so (see sentencepiece_shim.h for why it is
// a separate shared object). Includes SentencePiece and the standard library only: no Abseil.
#include "worker/sentencepiece_shim.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#define TS_SPM_EXPORT __attribute__((visibility("default")))

namespace {

char* Copy(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) return nullptr;
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

int Fail(char** error, const std::string& message) {
  if (error != nullptr) *error = Copy(message);
  return 1;
}

class TextIterator : public sentencepiece::SentenceIterator {
 public:
  TextIterator(const char* const* texts, const size_t* sizes, size_t count)
      : texts_(texts), sizes_(sizes), count_(count) {
    Load();
  }
  bool done() const override { return index_ >= count_; }
  void Next() override {
    ++index_;
    Load();
  }
  const std::string& value() const override { return current_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  void Load() {
    if (index_ < count_) current_.assign(texts_[index_], sizes_[index_]);
  }
  const char* const* texts_;
  const size_t* sizes_;
  size_t count_;
  size_t index_ = 0;
  std::string current_;
};

}  // namespace

extern "C" {

TS_SPM_EXPORT int ts_spm_train(const char* const* texts, const size_t* sizes, size_t count,
                               const char* args, unsigned seed, char** model, size_t* model_size,
                               char** error) {
  try {
    sentencepiece::SetRandomGeneratorSeed(seed);
    TextIterator it(texts, sizes, count);
    std::string serialized;
    const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &serialized);
    if (!status.ok()) return Fail(error, status.ToString());
    *model = static_cast<char*>(std::malloc(serialized.size() == 0 ? 1 : serialized.size()));
    if (*model == nullptr) return Fail(error, "out of memory");
    std::memcpy(*model, serialized.data(), serialized.size());
    *model_size = serialized.size();
    return 0;
  } catch (const std::exception& e) {
    return Fail(error, e.what());
  } catch (...) {
    return Fail(error, "unknown exception in SentencePiece training");
  }
}

TS_SPM_EXPORT int ts_spm_load(const char* model, size_t model_size, void** processor,
                              char** error) {
  try {
    auto* sp = new sentencepiece::SentencePieceProcessor();
    const auto status = sp->LoadFromSerializedProto(std::string(model, model_size));
    if (!status.ok()) {
      delete sp;
      return Fail(error, status.ToString());
    }
    *processor = sp;
    return 0;
  } catch (const std::exception& e) {
    return Fail(error, e.what());
  } catch (...) {
    return Fail(error, "unknown exception loading a SentencePiece model");
  }
}

TS_SPM_EXPORT void ts_spm_unload(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

TS_SPM_EXPORT int ts_spm_encode(const void* processor, const char* text, size_t size, int** ids,
                                size_t* count, char** error) {
  try {
    const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(processor);
    std::vector<int> out;
    const auto status = sp->Encode(std::string(text, size), &out);
    if (!status.ok()) return Fail(error, status.ToString());
    *ids = static_cast<int*>(std::malloc(out.empty() ? 1 : out.size() * sizeof(int)));
    if (*ids == nullptr) return Fail(error, "out of memory");
    if (!out.empty()) std::memcpy(*ids, out.data(), out.size() * sizeof(int));
    *count = out.size();
    return 0;
  } catch (const std::exception& e) {
    return Fail(error, e.what());
  } catch (...) {
    return Fail(error, "unknown exception in SentencePiece encode");
  }
}

TS_SPM_EXPORT int ts_spm_decode(const void* processor, const int* ids, size_t count, char** text,
                                size_t* size, char** error) {
  try {
    const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(processor);
    std::string out;
    const auto status = sp->Decode(std::vector<int>(ids, ids + count), &out);
    if (!status.ok()) return Fail(error, status.ToString());
    *text = Copy(out);
    if (*text == nullptr) return Fail(error, "out of memory");
    *size = out.size();
    return 0;
  } catch (const std::exception& e) {
    return Fail(error, e.what());
  } catch (...) {
    return Fail(error, "unknown exception in SentencePiece decode");
  }
}

TS_SPM_EXPORT int ts_spm_vocab_size(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

TS_SPM_EXPORT int ts_spm_eos_id(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->eos_id();
}

TS_SPM_EXPORT int ts_spm_unk_id(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->unk_id();
}

TS_SPM_EXPORT void ts_spm_free(void* buffer) { std::free(buffer); }

}  // extern "C"
