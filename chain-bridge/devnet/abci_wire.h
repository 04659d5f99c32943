// The framing of CometBFT's ABCI socket protocol (v0.38, libs/protoio): every Request and
// Response travels as its protobuf encoding preceded by its length as an unsigned LEB128 varint
// (Go's binary.PutUvarint: 7 bits a byte, low bits first, high bit set on all but the last byte;
// at most 10 bytes for 64 bits). Shared by the ABCI server and the test's client.
//
// The decoder is stricter than CometBFT's reader in one way: it refuses a non-canonical prefix (a
// last byte of zero after the first, i.e. padding), which no conforming writer produces.
// Pure functions; thread-safe.
#ifndef TS_CHAIN_BRIDGE_DEVNET_ABCI_WIRE_H_
#define TS_CHAIN_BRIDGE_DEVNET_ABCI_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

namespace ts::bridge::devnet {

// The longest varint of a 64-bit value.
inline constexpr size_t kMaxLengthPrefixBytes = 10;

// Appends the varint of `length` to `out`.
void AppendLengthPrefix(uint64_t length, std::string* out);

// Appends `message`'s encoding to `out`, preceded by its length.
void AppendDelimited(const google::protobuf::MessageLite& message, std::string* out);

// A length prefix found at the front of some bytes.
struct LengthPrefix {
  bool complete = false;    // false: the bytes end inside the prefix; read more
  uint64_t length = 0;      // the message's length, when complete
  size_t prefix_bytes = 0;  // bytes the prefix took, when complete
};

// Reads the length prefix at the front of `bytes`. INVALID_ARGUMENT (the connection is then
// beyond repair) for a prefix of more than kMaxLengthPrefixBytes bytes, one whose value
// overflows 64 bits, or a non-canonical one.
absl::StatusOr<LengthPrefix> ParseLengthPrefix(std::string_view bytes);

}  // namespace ts::bridge::devnet

#endif  // TS_CHAIN_BRIDGE_DEVNET_ABCI_WIRE_H_
