#include "chain-bridge/devnet/abci_wire.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ts::bridge::devnet {

void AppendLengthPrefix(uint64_t length, std::string* out) {
  while (length >= 0x80) {
    out->push_back(static_cast<char>(0x80 | (length & 0x7f)));
    length >>= 7;
  }
  out->push_back(static_cast<char>(length));
}

void AppendDelimited(const google::protobuf::MessageLite& message, std::string* out) {
  const size_t length = message.ByteSizeLong();
  AppendLengthPrefix(length, out);
  const size_t at = out->size();
  out->resize(at + length);
  // The size was just computed, so the serialization fills exactly the space made for it.
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out->data() + at));
}

absl::StatusOr<LengthPrefix> ParseLengthPrefix(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const uint8_t byte = static_cast<uint8_t>(bytes[i]);
    if (i == kMaxLengthPrefixBytes - 1 && byte > 1) {
      // The tenth byte carries bit 63 alone: anything more is past 64 bits.
      return absl::InvalidArgumentError(
          absl::StrCat("length prefix: overflows 64 bits (tenth byte 0x", absl::Hex(byte), ")"));
    }
    value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      if (byte == 0 && i > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("length prefix: not canonical (", i + 1, " bytes ending in zero)"));
      }
      return LengthPrefix{/*complete=*/true, value, /*prefix_bytes=*/i + 1};
    }
  }
  // Only reachable with fewer than kMaxLengthPrefixBytes bytes, all with the high bit set: the
  // tenth byte either ends the prefix or is refused above.
  return LengthPrefix{};
}

}  // namespace ts::bridge::devnet
