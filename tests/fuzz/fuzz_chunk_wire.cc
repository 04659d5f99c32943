// Fuzzes the fetcher's hand-written ChunkData decoder (sidecar/artifacts/chunk_wire.h), which
// reads every chunk a peer sends. The first two bytes choose where the message is split into
// pieces; whatever the decoder accepts must be what protobuf's own parser reads from the same
// bytes, and nothing may be written past the caller's buffer (ASan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gonka/trainshard/v1/shard.pb.h"
#include "sidecar/artifacts/chunk_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t capacity = data[0] % 64;
  const size_t step = 1 + data[1] % 8;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at < bytes.size(); at += step) pieces.push_back(bytes.substr(at, step));

  // Exactly `capacity` bytes, so ASan sees any write past them.
  std::unique_ptr<char[]> buffer(new char[capacity == 0 ? 1 : capacity]);
  std::string hash;
  size_t data_size = 0;
  const absl::Status status =
      ts::sidecar::DecodeChunkData(pieces, &hash, buffer.get(), capacity, &data_size);
  if (!status.ok()) return 0;

  gonka::trainshard::v1::ChunkData reference;
  if (!reference.ParseFromString(std::string(bytes))) std::abort();
  if (reference.hash() != hash) std::abort();
  if (data_size > capacity || reference.data() != std::string_view(buffer.get(), data_size)) {
    std::abort();
  }
  return 0;
}
