// Decoding a ChunkData answer (hash = 1, data = 2, both bytes) straight from the pieces a
// message arrived in, copying the data once into the caller's buffer — the fetcher's receive
// path, which skips protobuf's parser to avoid a second copy of every chunk. The bytes come from
// a peer, so every length is checked against what is left and against the caller's capacity.
// Accepts exactly what protobuf's parser would, minus groups and field number 0 (refused), and
// yields the same values (a field seen twice keeps its last value).
//
// Thread-safety: pure function; thread-safe.
#ifndef TS_SIDECAR_ARTIFACTS_CHUNK_WIRE_H_
#define TS_SIDECAR_ARTIFACTS_CHUNK_WIRE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ts::sidecar {

// Decodes the message whose bytes are the concatenation of `pieces`. The hash (at most 32 bytes)
// goes to `hash`, the data to data[0, *data_size) (at most `capacity` bytes). INVALID_ARGUMENT
// describing what is wrong: a truncated tag, varint or field, a wire type that is not one of
// varint / 64-bit / length-delimited / 32-bit, field 1 or 2 not length-delimited, a hash over
// 32 bytes, data over `capacity`.
absl::Status DecodeChunkData(const std::vector<std::string_view>& pieces, std::string* hash,
                             char* data, size_t capacity, size_t* data_size);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_ARTIFACTS_CHUNK_WIRE_H_
