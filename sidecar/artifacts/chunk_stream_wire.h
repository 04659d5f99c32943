// The chunk stream's framing: a plain TCP path for chunk bodies beside the ArtifactTransfer gRPC
// service (docs/artifacts.md, "Chunk stream"). gRPC's HTTP/2 costs more CPU per byte than
// hashing the bytes does; on this path the server hands chunk files to the kernel (sendfile)
// and the fetcher receives each chunk straight into its page-aligned buffer.
//
// One request per connection, client to server:
//   "TSCQ" | version u8 (1) | 3 zero bytes | length u32 | GetChunksRequest (length bytes)
// then frames, server to client:
//   "TSCA" | type u8 | 3 zero bytes | index u32 | size u32 | hash 32 bytes     (48 bytes)
//   kChunk: the chunk at request position `index` follows, `size` bytes, hash = its SHA-256
//   kError: `size` bytes of message follow; index = the absl::StatusCode; hash all zero
//   kEnd:   size 0; index = the number of chunks sent; hash all zero
// Integers are little-endian. Every length is checked against its cap before anything is read
// or allocated; these decoders are what a peer's bytes meet first (tests/fuzz/fuzz_chunk_stream).
//
// Thread-safety: pure functions; thread-safe.
#ifndef TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_WIRE_H_
#define TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::sidecar {

inline constexpr size_t kChunkStreamRequestHeaderBytes = 12;
inline constexpr size_t kChunkStreamFrameHeaderBytes = 48;
inline constexpr uint8_t kChunkStreamVersion = 1;
// Longest error message a server may send (longer ones are cut when encoded).
inline constexpr size_t kMaxChunkStreamErrorBytes = 4096;

enum class ChunkStreamFrameType : uint8_t { kChunk = 1, kError = 2, kEnd = 3 };

struct ChunkStreamFrame {
  ChunkStreamFrameType type = ChunkStreamFrameType::kEnd;
  uint32_t index = 0;
  uint32_t size = 0;
  std::string hash;  // 32 bytes for kChunk, empty otherwise
};

// The request header for a request body of `body_size` bytes.
std::string EncodeChunkStreamRequestHeader(uint32_t body_size);
// The body length the header announces. INVALID_ARGUMENT for a wrong size, magic or version,
// non-zero reserved bytes, an empty body or one over `max_body_bytes`.
absl::StatusOr<uint32_t> DecodeChunkStreamRequestHeader(std::string_view header,
                                                        uint32_t max_body_bytes);

// Frame headers (kChunkStreamFrameHeaderBytes each) into `out`.
void EncodeChunkFrameHeader(uint32_t index, uint32_t size, std::string_view hash, char* out);
void EncodeEndFrameHeader(uint32_t chunks_sent, char* out);
// An error frame: header and message (cut to kMaxChunkStreamErrorBytes).
std::string EncodeErrorFrame(const absl::Status& status);

// Decodes a frame header. INVALID_ARGUMENT naming the field for a wrong size or magic, an unknown
// type, non-zero reserved bytes, a chunk over `max_chunk_bytes`, an error message over
// kMaxChunkStreamErrorBytes or with an unknown / OK code, an end frame with a size, or a non-zero
// hash where none belongs.
absl::StatusOr<ChunkStreamFrame> DecodeChunkStreamFrameHeader(std::string_view header,
                                                              uint32_t max_chunk_bytes);

// The status an error frame carries: its code (from the header) and its message, every byte
// outside printable ASCII replaced by '?', so a peer cannot write raw bytes into logs.
absl::Status ChunkStreamErrorStatus(const ChunkStreamFrame& frame, std::string_view message);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_CHUNK_STREAM_WIRE_H_
