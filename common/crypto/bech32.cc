#include "common/crypto/bech32.h"

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/status.h"

namespace ts::common {
namespace {

// Debian's Abseil is built with its own absl::string_view (ABSL_OPTION_USE_STD_STRING_VIEW 0),
// which StrCat takes but std::string_view does not convert to.
absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::string_view kCharset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";
constexpr size_t kChecksumSize = 6;
constexpr size_t kMaxLength = 90;
constexpr size_t kAccountIdSize = 20;

// Reverse of kCharset for lower-case input; -1 for characters outside the alphabet.
int CharValue(char c) {
  for (size_t i = 0; i < kCharset.size(); ++i) {
    if (kCharset[i] == c) return static_cast<int>(i);
  }
  return -1;
}

char ToLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

uint32_t PolyMod(const std::vector<uint8_t>& values) {
  static constexpr uint32_t kGen[5] = {0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3};
  uint32_t chk = 1;
  for (uint8_t v : values) {
    const uint32_t top = chk >> 25;
    chk = ((chk & 0x1ffffff) << 5) ^ v;
    for (int i = 0; i < 5; ++i) {
      if ((top >> i) & 1) chk ^= kGen[i];
    }
  }
  return chk;
}

// The hrp expanded as BIP-173 feeds it to the checksum: high bits, a zero, low bits.
std::vector<uint8_t> HrpExpand(std::string_view hrp) {
  std::vector<uint8_t> out;
  out.reserve(hrp.size() * 2 + 1);
  for (char c : hrp) out.push_back(static_cast<uint8_t>(static_cast<unsigned char>(c) >> 5));
  out.push_back(0);
  for (char c : hrp) out.push_back(static_cast<uint8_t>(static_cast<unsigned char>(c) & 31));
  return out;
}

// Regroups `in` from `from_bits`-bit to `to_bits`-bit values. With `pad`, a short final group is
// zero-padded; without it, the leftover must be shorter than `from_bits` and all zero, which
// makes the decoding of 5-bit data to bytes canonical.
bool ConvertBits(const uint8_t* in, size_t size, int from_bits, int to_bits, bool pad,
                 std::vector<uint8_t>* out) {
  uint32_t acc = 0;
  int bits = 0;
  const uint32_t max_value = (1u << to_bits) - 1;
  for (size_t i = 0; i < size; ++i) {
    acc = (acc << from_bits) | in[i];
    bits += from_bits;
    while (bits >= to_bits) {
      bits -= to_bits;
      out->push_back(static_cast<uint8_t>((acc >> bits) & max_value));
    }
    acc &= (1u << bits) - 1;  // keep only the bits not yet emitted, so acc never overflows
  }
  if (pad) {
    if (bits > 0) out->push_back(static_cast<uint8_t>((acc << (to_bits - bits)) & max_value));
    return true;
  }
  return bits < from_bits && acc == 0;
}

std::string Quote(std::string_view text) {
  // Bounded so an attacker-sized string does not end up in logs whole.
  return absl::StrCat("'", ToAbsl(text.substr(0, 100)), text.size() > 100 ? "...'" : "'");
}

}  // namespace

std::string Bech32EncodeRaw(std::string_view hrp, const std::vector<uint8_t>& values) {
  std::string lower_hrp(hrp.size(), '\0');
  for (size_t i = 0; i < hrp.size(); ++i) {
    TS_CHECK(hrp[i] >= 33 && hrp[i] <= 126);
    lower_hrp[i] = ToLower(hrp[i]);
  }
  std::vector<uint8_t> checked = HrpExpand(lower_hrp);
  for (uint8_t v : values) {
    TS_CHECK(v < 32);
    checked.push_back(v);
  }
  checked.insert(checked.end(), kChecksumSize, 0);
  const uint32_t mod = PolyMod(checked) ^ 1;
  std::string out = lower_hrp;
  out.reserve(lower_hrp.size() + 1 + values.size() + kChecksumSize);
  out.push_back('1');
  for (uint8_t v : values) out.push_back(kCharset[v]);
  for (size_t i = 0; i < kChecksumSize; ++i) {
    out.push_back(kCharset[(mod >> (5 * (kChecksumSize - 1 - i))) & 31]);
  }
  return out;
}

absl::StatusOr<Bech32Data> Bech32DecodeRaw(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bech32 ", Quote(text), ": ", ToAbsl(why)));
  };
  if (text.size() > kMaxLength) {
    return bad(absl::StrCat("length ", text.size(), " exceeds ", kMaxLength));
  }
  bool has_lower = false;
  bool has_upper = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 33 || c > 126) return bad(absl::StrCat("character out of range at offset ", i));
    if (c >= 'a' && c <= 'z') has_lower = true;
    if (c >= 'A' && c <= 'Z') has_upper = true;
  }
  if (has_lower && has_upper) return bad("mixed case");
  const size_t sep = text.rfind('1');
  if (sep == std::string_view::npos) return bad("no separator '1'");
  if (sep == 0) return bad("empty human-readable part");
  if (text.size() - sep - 1 < kChecksumSize) return bad("data part shorter than the checksum");

  Bech32Data result;
  result.hrp.resize(sep);
  for (size_t i = 0; i < sep; ++i) result.hrp[i] = ToLower(text[i]);
  std::vector<uint8_t> checked = HrpExpand(result.hrp);
  for (size_t i = sep + 1; i < text.size(); ++i) {
    const int v = CharValue(ToLower(text[i]));
    if (v < 0) return bad(absl::StrCat("invalid data character at offset ", i));
    checked.push_back(static_cast<uint8_t>(v));
  }
  if (PolyMod(checked) != 1) return bad("checksum mismatch");
  const size_t data_size = text.size() - sep - 1 - kChecksumSize;
  result.values.assign(checked.end() - static_cast<ptrdiff_t>(data_size + kChecksumSize),
                       checked.end() - static_cast<ptrdiff_t>(kChecksumSize));
  return result;
}

std::string Bech32Encode(std::string_view hrp, std::string_view bytes) {
  std::vector<uint8_t> values;
  values.reserve((bytes.size() * 8 + 4) / 5);
  ConvertBits(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 8, 5, /*pad=*/true,
              &values);
  return Bech32EncodeRaw(hrp, values);
}

absl::StatusOr<std::string> Bech32Decode(std::string_view expected_hrp, std::string_view text) {
  TS_ASSIGN_OR_RETURN(Bech32Data data, Bech32DecodeRaw(text));
  if (data.hrp != expected_hrp) {
    return absl::InvalidArgumentError(absl::StrCat("bech32 ", Quote(text), ": prefix '", data.hrp,
                                                   "', want '", ToAbsl(expected_hrp), "'"));
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(data.values.size() * 5 / 8);
  if (!ConvertBits(data.values.data(), data.values.size(), 5, 8, /*pad=*/false, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bech32 ", Quote(text), ": non-canonical padding"));
  }
  return std::string(bytes.begin(), bytes.end());
}

std::string AddressFromPublicKey(std::string_view public_key, std::string_view hrp) {
  return AddressFromBytes(Ripemd160(Sha256(public_key)), hrp);
}

std::string AddressFromBytes(std::string_view id20, std::string_view hrp) {
  TS_CHECK(id20.size() == kAccountIdSize);
  return Bech32Encode(hrp, id20);
}

absl::StatusOr<std::string> ParseAddress(std::string_view field, std::string_view address,
                                         std::string_view hrp) {
  auto decoded = Bech32Decode(hrp, address);
  if (!decoded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(field), ": ", Quote(address),
                     " is not a valid address: ", decoded.status().message()));
  }
  if (decoded->size() != kAccountIdSize) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(field), ": ", Quote(address), " carries ",
                                                   decoded->size(), " bytes, want ",
                                                   kAccountIdSize));
  }
  return *std::move(decoded);
}

std::string ModuleAddress(std::string_view module_name, std::string_view hrp) {
  return AddressFromBytes(Sha256(module_name).substr(0, kAccountIdSize), hrp);
}

}  // namespace ts::common
