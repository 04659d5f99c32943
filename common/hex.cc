#include "common/hex.h"

#include "absl/strings/str_cat.h"

namespace ts::common {
namespace {

std::string Encode(std::string_view bytes, const char* digits) {
  std::string out;
  out.resize(bytes.size() * 2);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto b = static_cast<unsigned char>(bytes[i]);
    out[2 * i] = digits[b >> 4];
    out[2 * i + 1] = digits[b & 0xf];
  }
  return out;
}

int Nibble(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string HexEncode(std::string_view bytes) { return Encode(bytes, "0123456789abcdef"); }
std::string HexEncodeUpper(std::string_view bytes) { return Encode(bytes, "0123456789ABCDEF"); }

absl::StatusOr<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hex string has odd length ", hex.size()));
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = Nibble(hex[2 * i]);
    int lo = Nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("not a hex character at offset ", 2 * i));
    }
    out[i] = static_cast<char>((hi << 4) | lo);
  }
  return out;
}

}  // namespace ts::common
