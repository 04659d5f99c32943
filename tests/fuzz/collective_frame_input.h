// The input layout of the fuzz_collective_frame target and the fixed world it checks inputs
// against (keys, group, clock), shared with the seed writer so committed seeds reach the deep
// end of the target. Header-only; thread-safe after the first call (function-local statics).
//
//   u8 mode || rest
//   mode % 4 == 0  a frame: 32-byte header, then its payload (as far as the input goes),
//                  dispatched on the type: abort, hello / ack, data (codec spec from step and
//                  chunk, see CodecSpecOfFrame)
//   mode % 4 == 1  an abort payload
//   mode % 4 == 2  a hello payload, checked as the listener (member 1) checks it
//   mode % 4 == 3  codec bytes: u8 kind || u16 block_elements − 1 || u8 topk − 1 ||
//                  u8 value_bits || u16 elements || encoded bytes (little-endian)
#ifndef TS_TESTS_FUZZ_COLLECTIVE_FRAME_INPUT_H_
#define TS_TESTS_FUZZ_COLLECTIVE_FRAME_INPUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/crypto/bech32.h"
#include "common/crypto/secp256k1.h"
#include "common/status.h"
#include "sidecar/collective/codec.h"
#include "sidecar/collective/transport.h"

namespace ts::fuzz {

inline constexpr uint8_t kModeFrame = 0;
inline constexpr uint8_t kModeAbort = 1;
inline constexpr uint8_t kModeHello = 2;
inline constexpr uint8_t kModeCodec = 3;

inline constexpr std::string_view kCollectiveChainId = "gonka-devnet";
inline constexpr int64_t kCollectiveNowUnixMs = 1767225600000;  // 2026-01-01
// The listener whose checks mode 2 runs, and the dialer an ack is checked by.
inline constexpr size_t kCollectiveListener = 1;
inline constexpr size_t kCollectiveDialer = 0;
inline constexpr size_t kCollectiveMembers = 3;
inline constexpr uint32_t kCollectiveMaxData = 1u << 20;
inline constexpr size_t kMaxCodecElements = 1u << 16;

// A clock stopped at kCollectiveNowUnixMs.
class FixedClock final : public common::Clock {
 public:
  int64_t NowUnixMs() override { return kCollectiveNowUnixMs; }
  int64_t MonotonicMs() override { return 0; }
  void SleepMs(int64_t) override {}
};

inline const common::PrivateKey& CollectiveKey(size_t member) {
  static const std::vector<common::PrivateKey>* keys = [] {
    auto* out = new std::vector<common::PrivateKey>();
    for (size_t i = 0; i < kCollectiveMembers; ++i) {
      auto key = common::PrivateKey::FromBytes(std::string(32, static_cast<char>(0x21 + i)));
      TS_CHECK(key.ok());
      out->push_back(*std::move(key));
    }
    return out;
  }();
  return (*keys)[member];
}

inline const sidecar::GroupSpec& CollectiveGroup() {
  static const sidecar::GroupSpec* group = [] {
    auto* g = new sidecar::GroupSpec();
    g->shard_id = 1;
    g->session = 5;
    for (size_t i = 0; i < kCollectiveMembers; ++i) {
      g->members.push_back({common::AddressFromPublicKey(CollectiveKey(i).public_key()),
                            "10.0.0." + std::to_string(i + 1) + ":7500"});
    }
    return g;
  }();
  return *group;
}

inline const std::string& CollectiveMeshId() {
  static const std::string* id = new std::string(sidecar::MeshIdOf(CollectiveGroup()));
  return *id;
}

// Codec kinds the inputs choose among (a kind byte is taken modulo this).
inline constexpr uint32_t kCodecKinds = static_cast<uint32_t>(sidecar::Compression::kFp32Zstd) + 1;

// A data frame's codec: step = u8 kind || u8 value_bits || u16 elements; chunk = u16
// block_elements − 1 || u16 topk − 1.
inline sidecar::CodecSpec CodecSpecOfFrame(uint32_t step, uint32_t chunk, size_t* elements) {
  sidecar::CodecSpec spec;
  spec.kind = static_cast<sidecar::Compression>((step & 0xff) % kCodecKinds);
  spec.value_bits = (step >> 8) & 0xff;
  *elements = step >> 16;
  spec.block_elements = (chunk & 0xffff) + 1;
  spec.topk_per_block = (chunk >> 16) + 1;
  return spec;
}

inline uint32_t StepOfCodec(const sidecar::CodecSpec& spec, size_t elements) {
  return static_cast<uint32_t>(spec.kind) | (spec.value_bits << 8) |
         (static_cast<uint32_t>(elements) << 16);
}

inline uint32_t ChunkOfCodec(const sidecar::CodecSpec& spec) {
  return (spec.block_elements - 1) | ((spec.topk_per_block - 1) << 16);
}

struct CodecInput {
  sidecar::CodecSpec spec;
  size_t elements = 0;
  std::string_view bytes;
};

inline CodecInput ParseCodecInput(std::string_view in) {
  CodecInput out;
  uint8_t head[7] = {};
  for (size_t i = 0; i < sizeof(head) && i < in.size(); ++i) head[i] = static_cast<uint8_t>(in[i]);
  out.spec.kind = static_cast<sidecar::Compression>(head[0] % kCodecKinds);
  out.spec.block_elements = (head[1] | (uint32_t{head[2]} << 8)) + 1;
  out.spec.topk_per_block = uint32_t{head[3]} + 1;
  out.spec.value_bits = head[4];
  out.elements = head[5] | (size_t{head[6]} << 8);
  out.bytes = in.size() > sizeof(head) ? in.substr(sizeof(head)) : std::string_view();
  return out;
}

inline std::string SerializeCodecInput(const sidecar::CodecSpec& spec, size_t elements,
                                       std::string_view bytes) {
  std::string out;
  out.push_back(static_cast<char>(spec.kind));
  out.push_back(static_cast<char>((spec.block_elements - 1) & 0xff));
  out.push_back(static_cast<char>((spec.block_elements - 1) >> 8));
  out.push_back(static_cast<char>(spec.topk_per_block - 1));
  out.push_back(static_cast<char>(spec.value_bits));
  out.push_back(static_cast<char>(elements & 0xff));
  out.push_back(static_cast<char>(elements >> 8));
  out.append(bytes);
  return out;
}

}  // namespace ts::fuzz

#endif  // TS_TESTS_FUZZ_COLLECTIVE_FRAME_INPUT_H_
