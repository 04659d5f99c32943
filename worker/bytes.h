// Little-endian integer and fp32 encoding for the worker's binary formats (checkpoints, data
// shards), and a bounds-checked reader over untrusted bytes. Internal to worker/.
//
// Thread-safety: pure functions; a ByteReader has one owner.
#ifndef TS_WORKER_BYTES_H_
#define TS_WORKER_BYTES_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace ts::worker::internal {

template <typename T>
void PutLe(std::string* out, T value) {
  char buf[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) {
    buf[i] = static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
  out->append(buf, sizeof(T));
}

template <typename T>
T GetLe(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return static_cast<T>(v);
}

// Appends fp32 values as little-endian IEEE-754 bit patterns.
inline void PutFloats(std::string* out, std::span<const float> values) {
  if constexpr (std::endian::native == std::endian::little) {
    out->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  } else {
    for (float f : values) PutLe<uint32_t>(out, std::bit_cast<uint32_t>(f));
  }
}

// Reads values.size() little-endian fp32 values from p.
inline void GetFloats(const char* p, std::span<float> values) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(values.data(), p, values.size() * sizeof(float));
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = std::bit_cast<float>(GetLe<uint32_t>(p + 4 * i));
    }
  }
}

// Sequential reads that fail (return false) instead of reading past the end.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }

  template <typename T>
  bool Read(T* value) {
    if (remaining() < sizeof(T)) return false;
    *value = GetLe<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool ReadBytes(size_t n, std::string_view* out) {
    if (remaining() < n) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

}  // namespace ts::worker::internal

#endif  // TS_WORKER_BYTES_H_
