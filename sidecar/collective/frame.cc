#include "sidecar/collective/frame.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ts::sidecar {
namespace {

void PutU16(char* out, uint16_t v) {
  out[0] = static_cast<char>(v & 0xff);
  out[1] = static_cast<char>(v >> 8);
}

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint16_t GetU16(const char* in) {
  return static_cast<uint16_t>(static_cast<uint8_t>(in[0]) |
                               (static_cast<uint16_t>(static_cast<uint8_t>(in[1])) << 8));
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

bool IsAddressChar(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// Length of the well-formed UTF-8 sequence at s[at..] (1..4), or 0 if it is not one (overlong
// forms, surrogates and code points above U+10FFFF are not well-formed). *code_point receives
// the decoded value.
size_t Utf8SequenceAt(std::string_view s, size_t at, uint32_t* code_point) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(at);
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  size_t len = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    len = 2;
    cp = b0 & 0x1f;
    min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3;
    cp = b0 & 0x0f;
    min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4;
    cp = b0 & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - at < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(at + i);
    if ((b & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  *code_point = cp;
  return len;
}

bool IsControl(uint32_t cp) { return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f); }

}  // namespace

void PutU64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetU64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
  return v;
}

void EncodeFrameHeader(const FrameHeader& header, char* out) {
  PutU32(out, kFrameMagic);
  out[4] = static_cast<char>(kFrameVersion);
  out[5] = static_cast<char>(static_cast<uint8_t>(header.type));
  PutU16(out + 6, header.flags);
  PutU64(out + 8, header.op_id);
  PutU32(out + 16, header.step);
  PutU32(out + 20, header.chunk);
  PutU32(out + 24, header.payload_size);
  PutU32(out + 28, 0);
}

std::string EncodeFrameHeader(const FrameHeader& header) {
  std::string out(kFrameHeaderSize, '\0');
  EncodeFrameHeader(header, out.data());
  return out;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(std::string_view bytes, uint32_t max_data_payload) {
  if (bytes.size() != kFrameHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header: ", bytes.size(), " bytes, want ", kFrameHeaderSize));
  }
  const char* in = bytes.data();
  const uint32_t magic = GetU32(in);
  if (magic != kFrameMagic) {
    return absl::InvalidArgumentError(absl::StrCat("frame header: magic 0x",
                                                   absl::Hex(magic, absl::kZeroPad8), ", want 0x",
                                                   absl::Hex(kFrameMagic, absl::kZeroPad8)));
  }
  const uint8_t version = static_cast<uint8_t>(in[4]);
  if (version != kFrameVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header: version ", version, ", want ", kFrameVersion));
  }
  const uint8_t type = static_cast<uint8_t>(in[5]);
  if (type < static_cast<uint8_t>(FrameType::kHello) ||
      type > static_cast<uint8_t>(FrameType::kClose)) {
    return absl::InvalidArgumentError(absl::StrCat("frame header: unknown type ", type));
  }
  FrameHeader header;
  header.type = static_cast<FrameType>(type);
  header.flags = GetU16(in + 6);
  if (header.flags != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header: flags 0x", absl::Hex(header.flags), ", want 0"));
  }
  header.op_id = GetU64(in + 8);
  header.step = GetU32(in + 16);
  header.chunk = GetU32(in + 20);
  header.payload_size = GetU32(in + 24);
  const uint32_t reserved = GetU32(in + 28);
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame header: reserved 0x", absl::Hex(reserved), ", want 0"));
  }
  uint32_t cap = 0;
  const char* what = "";
  switch (header.type) {
    case FrameType::kHeartbeat:
    case FrameType::kClose:
      if (header.payload_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("frame header: payload_size ", header.payload_size, " on a ",
                         header.type == FrameType::kHeartbeat ? "heartbeat" : "close", ", want 0"));
      }
      return header;
    case FrameType::kHello:
    case FrameType::kHelloAck:
      cap = kMaxHelloPayload;
      what = "hello";
      break;
    case FrameType::kAbort:
      cap = kMaxAbortPayload;
      what = "abort";
      break;
    case FrameType::kData:
      cap = max_data_payload;
      what = "data";
      break;
  }
  if (header.payload_size > cap) {
    return absl::ResourceExhaustedError(absl::StrCat("frame header: payload_size ",
                                                     header.payload_size, " of a ", what,
                                                     " frame is over its cap ", cap));
  }
  return header;
}

std::string EncodeAbort(std::string_view blamed_address, std::string_view reason) {
  // Whatever the caller passes, the result decodes: an address that DecodeAbort would refuse
  // is left out, control characters and invalid UTF-8 in the reason become '?', and the
  // reason is cut at a character boundary to fit kMaxAbortPayload.
  bool address_ok = blamed_address.size() <= 255;
  for (char c : blamed_address) address_ok = address_ok && IsAddressChar(c);
  if (!address_ok) blamed_address = {};
  std::string out;
  out.reserve(std::min<size_t>(kMaxAbortPayload, 1 + blamed_address.size() + reason.size()));
  out.push_back(static_cast<char>(blamed_address.size()));
  out.append(blamed_address);
  size_t at = 0;
  while (at < reason.size()) {
    uint32_t cp = 0;
    const size_t len = Utf8SequenceAt(reason, at, &cp);
    const bool good = len != 0 && !IsControl(cp);
    const size_t add = good ? len : 1;
    if (out.size() + add > kMaxAbortPayload) break;
    if (good) {
      out.append(reason.substr(at, len));
    } else {
      out.push_back('?');
    }
    at += len == 0 ? 1 : len;
  }
  return out;
}

absl::StatusOr<AbortPayload> DecodeAbort(std::string_view payload) {
  if (payload.size() > kMaxAbortPayload) {
    return absl::InvalidArgumentError(
        absl::StrCat("abort: ", payload.size(), " bytes, at most ", kMaxAbortPayload));
  }
  if (payload.empty()) return absl::InvalidArgumentError("abort: empty, want an address length");
  const size_t address_size = static_cast<uint8_t>(payload[0]);
  if (address_size > payload.size() - 1) {
    return absl::InvalidArgumentError(absl::StrCat("abort: address length ", address_size,
                                                   " past the end (", payload.size() - 1,
                                                   " bytes follow)"));
  }
  AbortPayload out;
  const std::string_view address = payload.substr(1, address_size);
  for (size_t i = 0; i < address.size(); ++i) {
    if (!IsAddressChar(address[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "abort: address byte ", i, " is 0x",
          absl::Hex(static_cast<uint8_t>(address[i]), absl::kZeroPad2), ", want [a-z0-9]"));
    }
  }
  const std::string_view reason = payload.substr(1 + address_size);
  for (size_t at = 0; at < reason.size();) {
    uint32_t cp = 0;
    const size_t len = Utf8SequenceAt(reason, at, &cp);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "abort: reason byte ", at, " (0x",
          absl::Hex(static_cast<uint8_t>(reason[at]), absl::kZeroPad2), ") is not valid UTF-8"));
    }
    if (IsControl(cp)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "abort: reason byte ", at, " is control character U+", absl::Hex(cp, absl::kZeroPad4)));
    }
    at += len;
  }
  out.blamed_address = std::string(address);
  out.reason = std::string(reason);
  return out;
}

}  // namespace ts::sidecar
