// Streaming the worker's large files — checkpoints and pseudo-gradient (Δ) files — a chunk at a
// time, so no process holds a second copy of the model in memory to read or write one
// (docs/worker.md "Files at size"). A reader checks what it reads as it goes (the checkpoint's
// header and size first, every value finite) and hashes every byte; a writer hashes what it
// writes, so the SHA-256 of a file (a checkpoint's root, a Δ's hash) comes for free.
//
// Values are fp32, little-endian on disk. Plain C++ (no libtorch).
//
// Thread-safety: a reader or writer has one owner.
#ifndef TS_WORKER_VALUE_STREAM_H_
#define TS_WORKER_VALUE_STREAM_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/crypto/hash.h"
#include "worker/checkpoint.h"

namespace ts::worker {

// A sequence of fp32 values, read in order.
class ValueReader {
 public:
  virtual ~ValueReader() = default;
  // The next out.size() values. INVALID_ARGUMENT for a value that is not finite or a source that
  // ends early (both naming the source and the index).
  virtual absl::Status Read(std::span<float> out) = 0;
  // Values not read yet.
  virtual uint64_t remaining() const = 0;
};

// A sequence of fp32 values, written in order.
class ValueWriter {
 public:
  virtual ~ValueWriter() = default;
  virtual absl::Status Write(std::span<const float> values) = 0;
};

// Over a vector the caller keeps alive (tests, tools, small models).
class VectorReader final : public ValueReader {
 public:
  explicit VectorReader(std::span<const float> values) : values_(values) {}
  absl::Status Read(std::span<float> out) override;
  uint64_t remaining() const override { return values_.size() - pos_; }

 private:
  std::span<const float> values_;
  size_t pos_ = 0;
};

class VectorWriter final : public ValueWriter {
 public:
  explicit VectorWriter(std::vector<float>* out) : out_(out) {}
  absl::Status Write(std::span<const float> values) override;

 private:
  std::vector<float>* out_;
};

// Values as `a` − `b`, elementwise in fp32 (a base minus a Δ).
class DifferenceReader final : public ValueReader {
 public:
  DifferenceReader(ValueReader* a, ValueReader* b) : a_(a), b_(b) {}
  absl::Status Read(std::span<float> out) override;
  uint64_t remaining() const override { return a_->remaining(); }

 private:
  ValueReader* a_;
  ValueReader* b_;
  std::vector<float> scratch_;
};

// An open file read sequentially through a buffer, every byte hashed. Owns the descriptor.
class FileByteReader {
 public:
  FileByteReader(int fd, uint64_t size, std::string description);
  ~FileByteReader();
  FileByteReader(const FileByteReader&) = delete;
  FileByteReader& operator=(const FileByteReader&) = delete;

  // Exactly out.size() bytes; INVALID_ARGUMENT when the file ends first, INTERNAL on errors.
  absl::Status ReadBytes(char* out, uint64_t size);
  uint64_t position() const { return position_; }
  // Moves to byte `position` without hashing what lies between.
  absl::Status Seek(uint64_t position);
  uint64_t size() const { return size_; }
  const std::string& description() const { return description_; }
  // SHA-256 of every byte read so far.
  std::string Digest();

 private:
  int fd_;
  uint64_t size_;
  std::string description_;
  uint64_t position_ = 0;
  common::Sha256Hasher hasher_;
};

// A checkpoint file: the header is read and checked at Open (and the file's size against what
// it implies), then the values are read in order — the parameters, then the momentum if any.
class CheckpointFileReader final : public ValueReader {
 public:
  // Takes `fd` (owned, positioned at 0) of a file of `size` bytes. INVALID_ARGUMENT naming
  // `description` as DecodeCheckpointHeader, and for a size other than the header implies.
  static absl::StatusOr<std::unique_ptr<CheckpointFileReader>> Open(int fd, uint64_t size,
                                                                    std::string description);

  const CheckpointHeader& header() const { return header_; }
  absl::Status Read(std::span<float> out) override;
  uint64_t remaining() const override { return remaining_; }
  // Reads (and checks) `count` values without keeping them.
  absl::Status Skip(uint64_t count);
  // Moves to value `index` (0: the first parameter; ParameterCount: the first momentum value)
  // without reading what lies between; the root is then unknown (Finish is FAILED_PRECONDITION).
  absl::Status SeekValue(uint64_t index);
  // Reads what is left and returns the root: SHA-256 of the whole file.
  absl::StatusOr<std::string> Finish();

 private:
  CheckpointFileReader(std::unique_ptr<FileByteReader> bytes, CheckpointHeader header);
  std::unique_ptr<FileByteReader> bytes_;
  CheckpointHeader header_;
  uint64_t remaining_ = 0;
  uint64_t index_ = 0;  // values read so far
  bool seeked_ = false;
};

// A file of raw fp32 values (a Δ): exactly `count` of them, each finite.
class RawValuesReader final : public ValueReader {
 public:
  // Takes `fd` (owned). INVALID_ARGUMENT naming `description` when size != 4 · count.
  static absl::StatusOr<std::unique_ptr<RawValuesReader>> Open(int fd, uint64_t size,
                                                               uint64_t count,
                                                               std::string description);
  absl::Status Read(std::span<float> out) override;
  uint64_t remaining() const override { return remaining_; }

 private:
  explicit RawValuesReader(std::unique_ptr<FileByteReader> bytes, uint64_t count)
      : bytes_(std::move(bytes)), remaining_(count) {}
  std::unique_ptr<FileByteReader> bytes_;
  uint64_t remaining_;
  uint64_t index_ = 0;
};

// Bytes to an open file, hashed as written. Owns the descriptor. The caller commits the file
// (rename) after Close.
class FileByteWriter {
 public:
  FileByteWriter(int fd, std::string description);
  ~FileByteWriter();
  FileByteWriter(const FileByteWriter&) = delete;
  FileByteWriter& operator=(const FileByteWriter&) = delete;

  absl::Status WriteBytes(const char* data, uint64_t size);
  // fsync and close; returns the SHA-256 of everything written.
  absl::StatusOr<std::string> Close();
  uint64_t written() const { return written_; }

 private:
  absl::Status Flush();
  int fd_;
  std::string description_;
  std::string buffer_;
  uint64_t written_ = 0;
  common::Sha256Hasher hasher_;
};

// Values as fp32 little-endian bytes to a FileByteWriter, exactly `count` of them.
class FileValueWriter final : public ValueWriter {
 public:
  FileValueWriter(FileByteWriter* out, uint64_t count) : out_(out), remaining_(count) {}
  absl::Status Write(std::span<const float> values) override;
  uint64_t remaining() const { return remaining_; }

 private:
  FileByteWriter* out_;
  uint64_t remaining_;
};

// Reads `count` values from `in` and writes them to `out`, a chunk at a time.
absl::Status CopyValues(ValueReader& in, ValueWriter& out, uint64_t count);

// Values are moved in chunks of this many (16 MiB of fp32).
inline constexpr uint64_t kValueChunk = uint64_t{4} << 20;

}  // namespace ts::worker

#endif  // TS_WORKER_VALUE_STREAM_H_
