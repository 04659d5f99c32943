// The input layout of the fuzz_sign_bytes target, shared with the seed writer so committed seeds
// and the target read fields the same way. Pure functions; thread-safe.
//
//   u8 flags || u8 len || kind || u8 len || chain_id || be64 shard_id || 65 B signature ||
//   message (the rest)
//
// A field cut short by the end of the input is taken as far as it goes, so every input maps to
// some call. Lengths are full bytes, so kinds above 32 and chain ids above 64 bytes are reached.
#ifndef TS_TESTS_FUZZ_SIGN_BYTES_INPUT_H_
#define TS_TESTS_FUZZ_SIGN_BYTES_INPUT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace ts::fuzz {

inline constexpr uint8_t kFlagSignAndRecover = 1;  // also sign with a key derived from the input

struct SignBytesInput {
  uint8_t flags = 0;
  std::string kind;
  std::string chain_id;
  uint64_t shard_id = 0;
  std::string signature;
  std::string message;
};

inline SignBytesInput ParseSignBytesInput(std::string_view in) {
  SignBytesInput out;
  auto take = [&in](size_t n) {
    std::string_view head = in.substr(0, n);
    in.remove_prefix(head.size());
    return std::string(head);
  };
  auto take_u8 = [&]() -> size_t {
    const std::string b = take(1);
    return b.empty() ? 0 : static_cast<uint8_t>(b[0]);
  };
  out.flags = static_cast<uint8_t>(take_u8());
  out.kind = take(take_u8());
  out.chain_id = take(take_u8());
  for (unsigned char c : take(8)) out.shard_id = (out.shard_id << 8) | c;
  out.signature = take(65);
  out.message = std::string(in);
  return out;
}

// Inverse of ParseSignBytesInput for fields within its limits (kind and chain_id under 256
// bytes, a 65-byte signature), for writing seeds.
inline std::string SerializeSignBytesInput(const SignBytesInput& in) {
  std::string out;
  out.push_back(static_cast<char>(in.flags));
  out.push_back(static_cast<char>(in.kind.size()));
  out += in.kind;
  out.push_back(static_cast<char>(in.chain_id.size()));
  out += in.chain_id;
  for (int shift = 56; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((in.shard_id >> shift) & 0xff));
  }
  out += in.signature;
  out += in.message;
  return out;
}

}  // namespace ts::fuzz

#endif  // TS_TESTS_FUZZ_SIGN_BYTES_INPUT_H_
