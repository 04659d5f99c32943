#include "sidecar/artifacts/chunk_wire.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

// Protobuf reads a field tag or a length in at most 5 bytes.
constexpr int kMaxTagBytes = 5;

// Reads protobuf wire data across the pieces of a message.
class PieceReader {
 public:
  explicit PieceReader(const std::vector<std::string_view>& pieces) : pieces_(pieces) {
    for (std::string_view piece : pieces_) left_ += piece.size();
  }
  size_t left() const { return left_; }

  // A varint of at most `max_bytes` bytes (protobuf reads tags and lengths in at most 5, other
  // varints in at most 10; a longer encoding of the same value is refused, as protobuf does).
  bool Varint(uint64_t* value, int max_bytes = 10) {
    *value = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      uint8_t byte;
      if (!Copy(reinterpret_cast<char*>(&byte), 1)) return false;
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Copies the next n bytes to out (nullptr: skips them). False if fewer are left.
  bool Copy(char* out, size_t n) {
    if (n > left_) return false;
    left_ -= n;
    while (n > 0) {
      const std::string_view piece = pieces_[index_];
      const size_t take = std::min(n, piece.size() - offset_);
      if (out != nullptr) {
        std::memcpy(out, piece.data() + offset_, take);
        out += take;
      }
      n -= take;
      offset_ += take;
      if (offset_ == piece.size()) {
        ++index_;
        offset_ = 0;
      }
    }
    // Step over empty pieces so the next read starts in a piece with bytes.
    while (index_ < pieces_.size() && offset_ == pieces_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
    return true;
  }

 private:
  const std::vector<std::string_view>& pieces_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t left_ = 0;
};

}  // namespace

absl::Status DecodeChunkData(const std::vector<std::string_view>& pieces, std::string* hash,
                             char* data, size_t capacity, size_t* data_size) {
  PieceReader in(pieces);
  hash->clear();
  *data_size = 0;
  while (in.left() > 0) {
    uint64_t tag;
    if (!in.Varint(&tag, kMaxTagBytes) || tag > UINT32_MAX) {
      return absl::InvalidArgumentError("truncated or oversized field tag");
    }
    const uint64_t field = tag >> 3;
    const uint64_t wire_type = tag & 7;
    if (field == 0) return absl::InvalidArgumentError("field number 0");
    uint64_t length = 0;
    switch (wire_type) {
      case 0:  // varint
        if (field == 1 || field == 2) {
          return absl::InvalidArgumentError(absl::StrCat("field ", field, " is not bytes"));
        }
        if (!in.Varint(&length)) return absl::InvalidArgumentError("truncated varint");
        continue;
      case 1:  // 64-bit
        length = 8;
        break;
      case 5:  // 32-bit
        length = 4;
        break;
      case 2:  // length-delimited
        if (!in.Varint(&length, kMaxTagBytes)) {
          return absl::InvalidArgumentError("truncated or oversized length");
        }
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("wire type ", wire_type, " of field ", field));
    }
    if (length > in.left()) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", field, ": ", length, " bytes, ", in.left(), " left"));
    }
    if ((field == 1 || field == 2) && wire_type != 2) {
      return absl::InvalidArgumentError(absl::StrCat("field ", field, " is not bytes"));
    }
    if (field == 1) {
      if (length > common::kSha256Size) {
        return absl::InvalidArgumentError(absl::StrCat("hash: ", length, " bytes"));
      }
      hash->resize(length);
      in.Copy(hash->data(), length);
    } else if (field == 2) {
      if (length > capacity) {
        return absl::InvalidArgumentError(
            absl::StrCat("data: ", length, " bytes, more than the chunk size ", capacity));
      }
      in.Copy(data, length);
      *data_size = length;
    } else {
      in.Copy(nullptr, length);
    }
  }
  return absl::OkStatus();
}

}  // namespace ts::sidecar
