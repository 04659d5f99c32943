// The C interface of libts_sentencepiece_shim.so, the one piece of the worker that links
// SentencePiece. Debian's libsentencepiece exports its own bundled copy of protobuf's symbols,
// which collide with libprotobuf (linked by libtorch) and crash the process at load time when
// both are in the global symbol scope. So the shim is a separate shared object that tokenizer.cc
// opens with dlmopen(LM_ID_NEWLM): a link-map namespace of its own, with its own copies of
// SentencePiece, its protobuf and the C/C++ runtimes, that no other library binds to.
// (RTLD_DEEPBIND is not enough: SentencePiece's std::cerr would then bind to libstdc++'s
// never-constructed copy instead of the executable's, and crash on the first log line.) Memory
// crosses the boundary only as malloc'd buffers freed by ts_spm_free, in the shim's namespace. Its
// header is plain C so nothing else of either side leaks across (SentencePiece's header also
// redefines absl::string_view, which clashes with Abseil's).
//
// Every function returns 0 on success. On failure it returns non-zero and, where `error` is
// given, stores a malloc'd NUL-terminated message there. Buffers handed out are malloc'd; free
// them with ts_spm_free. Thread-safety: ts_spm_train is not reentrant (SentencePiece's trainer
// has process-wide state: its random seed and log level); a loaded processor may be used from
// several threads for encode/decode.
#ifndef TS_WORKER_SENTENCEPIECE_SHIM_H_
#define TS_WORKER_SENTENCEPIECE_SHIM_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Trains a model on `count` texts with SentencePiece's command-line style `args` and the random
// seed `seed`; the serialized ModelProto goes to *model / *model_size.
int ts_spm_train(const char* const* texts, const size_t* sizes, size_t count, const char* args,
                 unsigned seed, char** model, size_t* model_size, char** error);
// Loads a serialized model; *processor is released with ts_spm_unload.
int ts_spm_load(const char* model, size_t model_size, void** processor, char** error);
void ts_spm_unload(void* processor);
int ts_spm_encode(const void* processor, const char* text, size_t size, int** ids, size_t* count,
                  char** error);
int ts_spm_decode(const void* processor, const int* ids, size_t count, char** text, size_t* size,
                  char** error);
// Vocabulary size, and the ids of the special pieces (-1 where disabled).
int ts_spm_vocab_size(const void* processor);
int ts_spm_eos_id(const void* processor);
int ts_spm_unk_id(const void* processor);
void ts_spm_free(void* buffer);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TS_WORKER_SENTENCEPIECE_SHIM_H_
