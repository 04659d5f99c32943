#include "worker/value_stream.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/bytes.h"

namespace ts::worker {
namespace {

// A header is at most this long: 256 layers of a dozen tensors with their names and shapes.
constexpr uint64_t kHeaderReadMax = uint64_t{4} << 20;
constexpr size_t kWriteBufferBytes = size_t{4} << 20;

absl::Status CheckFinite(std::span<const float> values, const std::string& what, uint64_t first) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", first + i, "] is ", values[i], ", not finite"));
    }
  }
  return absl::OkStatus();
}

// Reads values.size() fp32 values from `bytes` into `values`.
absl::Status ReadFloats(FileByteReader& bytes, std::span<float> values) {
  if constexpr (std::endian::native == std::endian::little) {
    return bytes.ReadBytes(reinterpret_cast<char*>(values.data()), values.size() * sizeof(float));
  } else {
    std::string raw(values.size() * sizeof(float), '\0');
    TS_RETURN_IF_ERROR(bytes.ReadBytes(raw.data(), raw.size()));
    internal::GetFloats(raw.data(), values);
    return absl::OkStatus();
  }
}

}  // namespace

absl::Status VectorReader::Read(std::span<float> out) {
  if (out.size() > remaining()) {
    return absl::InvalidArgumentError(
        absl::StrCat("values: ", out.size(), " asked, ", remaining(), " left"));
  }
  std::copy_n(values_.begin() + static_cast<std::ptrdiff_t>(pos_), out.size(), out.begin());
  pos_ += out.size();
  return absl::OkStatus();
}

absl::Status VectorWriter::Write(std::span<const float> values) {
  out_->insert(out_->end(), values.begin(), values.end());
  return absl::OkStatus();
}

absl::Status DifferenceReader::Read(std::span<float> out) {
  TS_RETURN_IF_ERROR(a_->Read(out));
  scratch_.resize(out.size());
  TS_RETURN_IF_ERROR(b_->Read(scratch_));
  for (size_t i = 0; i < out.size(); ++i) out[i] = out[i] - scratch_[i];
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

FileByteReader::FileByteReader(int fd, uint64_t size, std::string description)
    : fd_(fd), size_(size), description_(std::move(description)) {}

FileByteReader::~FileByteReader() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileByteReader::ReadBytes(char* out, uint64_t size) {
  if (size > size_ - position_) {
    return absl::InvalidArgumentError(absl::StrCat(description_, ": ends at byte ", size_, ", ",
                                                   size, " more wanted at ", position_));
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd_, out + done, static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat(description_, ": read at byte ", position_ + done,
                                              ": ",
                                              n < 0 ? std::strerror(errno) : "the file shrank"));
    }
    done += static_cast<uint64_t>(n);
  }
  hasher_.Update(std::string_view(out, size));
  position_ += size;
  return absl::OkStatus();
}

std::string FileByteReader::Digest() { return hasher_.Finish(); }

absl::Status FileByteReader::Seek(uint64_t position) {
  if (position > size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(description_, ": seek to ", position, " past the end at ", size_));
  }
  if (::lseek(fd_, static_cast<off_t>(position), SEEK_SET) < 0) {
    return absl::InternalError(absl::StrCat(description_, ": seek: ", std::strerror(errno)));
  }
  position_ = position;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

CheckpointFileReader::CheckpointFileReader(std::unique_ptr<FileByteReader> bytes,
                                           CheckpointHeader header)
    : bytes_(std::move(bytes)), header_(std::move(header)) {
  remaining_ = header_.value_bytes / sizeof(float);
}

absl::StatusOr<std::unique_ptr<CheckpointFileReader>> CheckpointFileReader::Open(
    int fd, uint64_t size, std::string description) {
  auto bytes = std::make_unique<FileByteReader>(fd, size, description);
  // The header is read in full first (it is at most a few hundred KiB), checked, then the file's
  // size against the values it implies, before any value is read.
  std::string prefix(std::min(size, kHeaderReadMax), '\0');
  {
    // Read without hashing: the hash is taken over the file from the start again below.
    uint64_t done = 0;
    while (done < prefix.size()) {
      const ssize_t n =
          ::pread(fd, prefix.data() + done, prefix.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return absl::InternalError(absl::StrCat(
            description, ": read: ", n < 0 ? std::strerror(errno) : "the file shrank"));
      }
      done += static_cast<uint64_t>(n);
    }
  }
  absl::StatusOr<CheckpointHeader> header = DecodeCheckpointHeader(prefix);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(description, ": ", header.status().message()));
  }
  if (size != header->header_bytes + header->value_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(description, ": checkpoint: ", size - std::min(size, header->header_bytes),
                     " bytes of values, expected ", header->value_bytes));
  }
  std::string skip(header->header_bytes, '\0');
  TS_RETURN_IF_ERROR(bytes->ReadBytes(skip.data(), skip.size()));
  return std::unique_ptr<CheckpointFileReader>(
      new CheckpointFileReader(std::move(bytes), *std::move(header)));
}

absl::Status CheckpointFileReader::Read(std::span<float> out) {
  if (out.size() > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat(bytes_->description(), ": ", out.size(),
                                                   " values asked, ", remaining_, " left"));
  }
  TS_RETURN_IF_ERROR(ReadFloats(*bytes_, out));
  const uint64_t count = ParameterCount(header_.config);
  // A chunk may straddle the parameters and the momentum: name each part as what it is.
  const uint64_t in_params = index_ < count ? std::min<uint64_t>(out.size(), count - index_) : 0;
  TS_RETURN_IF_ERROR(CheckFinite(out.first(in_params), bytes_->description() + ": params", index_));
  TS_RETURN_IF_ERROR(CheckFinite(out.subspan(in_params), bytes_->description() + ": momentum",
                                 index_ + in_params - count));
  index_ += out.size();
  remaining_ -= out.size();
  return absl::OkStatus();
}

absl::Status CheckpointFileReader::Skip(uint64_t count) {
  std::vector<float> chunk;
  while (count > 0) {
    chunk.resize(std::min(count, kValueChunk));
    TS_RETURN_IF_ERROR(Read(chunk));
    count -= chunk.size();
  }
  return absl::OkStatus();
}

absl::Status CheckpointFileReader::SeekValue(uint64_t index) {
  const uint64_t total = header_.value_bytes / sizeof(float);
  if (index > total) {
    return absl::InvalidArgumentError(
        absl::StrCat(bytes_->description(), ": value ", index, " of ", total));
  }
  TS_RETURN_IF_ERROR(bytes_->Seek(header_.header_bytes + index * sizeof(float)));
  index_ = index;
  remaining_ = total - index;
  seeked_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointFileReader::Finish() {
  if (seeked_) {
    return absl::FailedPreconditionError(
        absl::StrCat(bytes_->description(), ": no root after a seek"));
  }
  TS_RETURN_IF_ERROR(Skip(remaining_));
  return bytes_->Digest();
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RawValuesReader>> RawValuesReader::Open(int fd, uint64_t size,
                                                                       uint64_t count,
                                                                       std::string description) {
  auto bytes = std::make_unique<FileByteReader>(fd, size, description);
  if (size != count * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat(description, " holds ", size, " bytes, not 4 x ", count, " parameters"));
  }
  return std::unique_ptr<RawValuesReader>(new RawValuesReader(std::move(bytes), count));
}

absl::Status RawValuesReader::Read(std::span<float> out) {
  if (out.size() > remaining_) {
    return absl::InvalidArgumentError(absl::StrCat(bytes_->description(), ": ", out.size(),
                                                   " values asked, ", remaining_, " left"));
  }
  TS_RETURN_IF_ERROR(ReadFloats(*bytes_, out));
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          bytes_->description(), " holds a value that is not finite (index ", index_ + i, ")"));
    }
  }
  index_ += out.size();
  remaining_ -= out.size();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

FileByteWriter::FileByteWriter(int fd, std::string description)
    : fd_(fd), description_(std::move(description)) {
  buffer_.reserve(kWriteBufferBytes);
}

FileByteWriter::~FileByteWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileByteWriter::Flush() {
  std::string_view data = buffer_;
  while (!data.empty()) {
    const ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      const std::string message = absl::StrCat(description_, ": write: ", std::strerror(err));
      return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status FileByteWriter::WriteBytes(const char* data, uint64_t size) {
  if (fd_ < 0) return absl::FailedPreconditionError(description_ + ": written after Close");
  hasher_.Update(std::string_view(data, size));
  written_ += size;
  while (size > 0) {
    const size_t take = std::min<uint64_t>(size, kWriteBufferBytes - buffer_.size());
    buffer_.append(data, take);
    data += take;
    size -= take;
    if (buffer_.size() == kWriteBufferBytes) TS_RETURN_IF_ERROR(Flush());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileByteWriter::Close() {
  TS_RETURN_IF_ERROR(Flush());
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::InternalError(absl::StrCat(description_, ": sync: ", std::strerror(errno)));
  }
  return hasher_.Finish();
}

absl::Status FileValueWriter::Write(std::span<const float> values) {
  if (values.size() > remaining_) {
    return absl::InternalError(
        absl::StrCat(values.size(), " values written where ", remaining_, " were left"));
  }
  remaining_ -= values.size();
  if constexpr (std::endian::native == std::endian::little) {
    return out_->WriteBytes(reinterpret_cast<const char*>(values.data()),
                            values.size() * sizeof(float));
  } else {
    std::string raw;
    internal::PutFloats(&raw, values);
    return out_->WriteBytes(raw.data(), raw.size());
  }
}

absl::Status CopyValues(ValueReader& in, ValueWriter& out, uint64_t count) {
  std::vector<float> chunk;
  while (count > 0) {
    chunk.resize(std::min(count, kValueChunk));
    TS_RETURN_IF_ERROR(in.Read(chunk));
    TS_RETURN_IF_ERROR(out.Write(chunk));
    count -= chunk.size();
  }
  return absl::OkStatus();
}

}  // namespace ts::worker
