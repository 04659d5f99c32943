// Fuzzes the chunk stream's framing (sidecar/artifacts/chunk_stream_wire.h): the first byte
// chooses the side. Server side: a request header and the GetChunksRequest it announces, read
// as the server reads them. Fetcher side: a sequence of frames, each header decoded and its
// payload consumed as the fetcher would (chunk bytes, error message), until the input ends or
// a header is refused. Whatever is accepted must re-encode to the same header bytes, and no
// accepted length may exceed its cap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/chunk_stream_wire.h"

namespace {

using ts::sidecar::ChunkStreamFrame;
using ts::sidecar::ChunkStreamFrameType;

// Small caps, so that accepted and refused lengths are both reached.
constexpr uint32_t kMaxBody = 4096;
constexpr uint32_t kMaxChunk = 1024;

void Server(std::string_view in) {
  if (in.size() < ts::sidecar::kChunkStreamRequestHeaderBytes) return;
  auto length = ts::sidecar::DecodeChunkStreamRequestHeader(
      in.substr(0, ts::sidecar::kChunkStreamRequestHeaderBytes), kMaxBody);
  if (!length.ok()) return;
  if (*length == 0 || *length > kMaxBody) std::abort();
  if (ts::sidecar::EncodeChunkStreamRequestHeader(*length) !=
      in.substr(0, ts::sidecar::kChunkStreamRequestHeaderBytes)) {
    std::abort();
  }
  in.remove_prefix(ts::sidecar::kChunkStreamRequestHeaderBytes);
  if (in.size() < *length) return;
  gonka::trainshard::v1::GetChunksRequest request;
  (void)request.ParseFromArray(in.data(), static_cast<int>(*length));
}

void Fetcher(std::string_view in) {
  while (in.size() >= ts::sidecar::kChunkStreamFrameHeaderBytes) {
    const std::string_view header = in.substr(0, ts::sidecar::kChunkStreamFrameHeaderBytes);
    auto frame = ts::sidecar::DecodeChunkStreamFrameHeader(header, kMaxChunk);
    if (!frame.ok()) return;
    in.remove_prefix(header.size());
    char again[ts::sidecar::kChunkStreamFrameHeaderBytes];
    switch (frame->type) {
      case ChunkStreamFrameType::kChunk:
        if (frame->size > kMaxChunk || frame->hash.size() != 32) std::abort();
        ts::sidecar::EncodeChunkFrameHeader(frame->index, frame->size, frame->hash, again);
        if (std::string_view(again, sizeof(again)) != header) std::abort();
        break;
      case ChunkStreamFrameType::kError: {
        if (frame->size > ts::sidecar::kMaxChunkStreamErrorBytes) std::abort();
        const std::string_view message = in.substr(0, frame->size);
        const absl::Status status = ts::sidecar::ChunkStreamErrorStatus(*frame, message);
        if (status.ok()) std::abort();
        for (char c : status.message()) {
          if (c < 0x20 || c > 0x7e) std::abort();
        }
        break;
      }
      case ChunkStreamFrameType::kEnd:
        if (frame->size != 0) std::abort();
        ts::sidecar::EncodeEndFrameHeader(frame->index, again);
        if (std::string_view(again, sizeof(again)) != header) std::abort();
        break;
    }
    if (in.size() < frame->size) return;
    in.remove_prefix(frame->size);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    Server(in);
  } else {
    Fetcher(in);
  }
  return 0;
}
