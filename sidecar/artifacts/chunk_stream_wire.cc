#include "sidecar/artifacts/chunk_stream_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"

namespace ts::sidecar {
namespace {

constexpr char kRequestMagic[4] = {'T', 'S', 'C', 'Q'};
constexpr char kFrameMagic[4] = {'T', 'S', 'C', 'A'};

void PutU32(uint32_t value, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i)
    value |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return value;
}

bool AllZero(std::string_view bytes) {
  for (char c : bytes) {
    if (c != 0) return false;
  }
  return true;
}

void EncodeHeader(ChunkStreamFrameType type, uint32_t index, uint32_t size, std::string_view hash,
                  char* out) {
  std::memcpy(out, kFrameMagic, 4);
  out[4] = static_cast<char>(type);
  out[5] = out[6] = out[7] = 0;
  PutU32(index, out + 8);
  PutU32(size, out + 12);
  std::memset(out + 16, 0, common::kSha256Size);
  // An empty view may have no data pointer at all, which memcpy must not see.
  if (!hash.empty()) std::memcpy(out + 16, hash.data(), std::min(hash.size(), common::kSha256Size));
}

}  // namespace

std::string EncodeChunkStreamRequestHeader(uint32_t body_size) {
  std::string out(kChunkStreamRequestHeaderBytes, '\0');
  std::memcpy(out.data(), kRequestMagic, 4);
  out[4] = static_cast<char>(kChunkStreamVersion);
  PutU32(body_size, out.data() + 8);
  return out;
}

absl::StatusOr<uint32_t> DecodeChunkStreamRequestHeader(std::string_view header,
                                                        uint32_t max_body_bytes) {
  if (header.size() != kChunkStreamRequestHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream request header: ", header.size(),
                                                   " bytes, want ",
                                                   kChunkStreamRequestHeaderBytes));
  }
  if (std::memcmp(header.data(), kRequestMagic, 4) != 0) {
    return absl::InvalidArgumentError("chunk stream request header: magic is not TSCQ");
  }
  const uint8_t version = static_cast<uint8_t>(header[4]);
  if (version != kChunkStreamVersion) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream request header: version ", version,
                                                   ", want ", kChunkStreamVersion));
  }
  if (!AllZero(header.substr(5, 3))) {
    return absl::InvalidArgumentError("chunk stream request header: reserved bytes not zero");
  }
  const uint32_t length = GetU32(header.data() + 8);
  if (length == 0 || length > max_body_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream request header: length ", length,
                                                   " is outside 1..", max_body_bytes));
  }
  return length;
}

void EncodeChunkFrameHeader(uint32_t index, uint32_t size, std::string_view hash, char* out) {
  EncodeHeader(ChunkStreamFrameType::kChunk, index, size, hash, out);
}

void EncodeEndFrameHeader(uint32_t chunks_sent, char* out) {
  EncodeHeader(ChunkStreamFrameType::kEnd, chunks_sent, 0, {}, out);
}

std::string EncodeErrorFrame(const absl::Status& status) {
  std::string_view message(status.message().data(), status.message().size());
  if (message.size() > kMaxChunkStreamErrorBytes)
    message = message.substr(0, kMaxChunkStreamErrorBytes);
  // An OK status has no business in an error frame; it goes out as UNKNOWN.
  const uint32_t code = status.ok() ? static_cast<uint32_t>(absl::StatusCode::kUnknown)
                                    : static_cast<uint32_t>(status.code());
  std::string out(kChunkStreamFrameHeaderBytes + message.size(), '\0');
  EncodeHeader(ChunkStreamFrameType::kError, code, static_cast<uint32_t>(message.size()), {},
               out.data());
  if (!message.empty()) {
    std::memcpy(out.data() + kChunkStreamFrameHeaderBytes, message.data(), message.size());
  }
  return out;
}

absl::StatusOr<ChunkStreamFrame> DecodeChunkStreamFrameHeader(std::string_view header,
                                                              uint32_t max_chunk_bytes) {
  if (header.size() != kChunkStreamFrameHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk stream frame header: ", header.size(),
                                                   " bytes, want ", kChunkStreamFrameHeaderBytes));
  }
  if (std::memcmp(header.data(), kFrameMagic, 4) != 0) {
    return absl::InvalidArgumentError("chunk stream frame header: magic is not TSCA");
  }
  if (!AllZero(header.substr(5, 3))) {
    return absl::InvalidArgumentError("chunk stream frame header: reserved bytes not zero");
  }
  ChunkStreamFrame frame;
  frame.index = GetU32(header.data() + 8);
  frame.size = GetU32(header.data() + 12);
  const std::string_view hash = header.substr(16, common::kSha256Size);
  const uint8_t type = static_cast<uint8_t>(header[4]);
  switch (type) {
    case static_cast<uint8_t>(ChunkStreamFrameType::kChunk):
      frame.type = ChunkStreamFrameType::kChunk;
      if (frame.size > max_chunk_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk stream frame: chunk size ", frame.size, " over the cap of ", max_chunk_bytes));
      }
      frame.hash.assign(hash);
      return frame;
    case static_cast<uint8_t>(ChunkStreamFrameType::kError):
      frame.type = ChunkStreamFrameType::kError;
      if (frame.size > kMaxChunkStreamErrorBytes) {
        return absl::InvalidArgumentError(absl::StrCat("chunk stream frame: error message of ",
                                                       frame.size, " bytes, at most ",
                                                       kMaxChunkStreamErrorBytes));
      }
      if (frame.index == 0 ||
          frame.index > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk stream frame: error code ", frame.index, " is not an error code"));
      }
      break;
    case static_cast<uint8_t>(ChunkStreamFrameType::kEnd):
      frame.type = ChunkStreamFrameType::kEnd;
      if (frame.size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk stream frame: end frame with size ", frame.size));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("chunk stream frame: type ", type, " is not chunk, error or end"));
  }
  if (!AllZero(hash)) {
    return absl::InvalidArgumentError("chunk stream frame: hash set on a frame without a chunk");
  }
  return frame;
}

absl::Status ChunkStreamErrorStatus(const ChunkStreamFrame& frame, std::string_view message) {
  std::string clean(message);
  for (char& c : clean) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return absl::Status(static_cast<absl::StatusCode>(frame.index), clean);
}

}  // namespace ts::sidecar
