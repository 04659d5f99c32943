// Helpers of the codec tests (codec_test.cc, codec_stage_test.cc): codec specs, random inputs,
// decoding that must succeed and decoding that must be refused; for tests only.
#ifndef TS_SIDECAR_COLLECTIVE_CODEC_TEST_UTIL_H_
#define TS_SIDECAR_COLLECTIVE_CODEC_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/status/status.h"
#include "sidecar/collective/codec.h"

namespace ts::sidecar::codec_testing {

// A codec spec of `kind` (the block, top-k and bit settings used where the kind has them).
inline CodecSpec Spec(Compression kind, uint32_t block = 4096, uint32_t topk = 64,
                      uint32_t bits = 2) {
  CodecSpec spec;
  spec.kind = kind;
  spec.block_elements = block;
  spec.topk_per_block = topk;
  spec.value_bits = bits;
  return spec;
}

// The spec in words, for failure messages.
inline std::string Name(const CodecSpec& spec) {
  return std::string(CompressionName(spec.kind)) + " block " + std::to_string(spec.block_elements) +
         " k " + std::to_string(spec.topk_per_block) + " bits " + std::to_string(spec.value_bits);
}

// n values from N(0, sd²), seeded.
inline std::vector<float> Normal(size_t n, float sd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// decode(bytes) into n values; a refusal fails the test (the values are then NaN).
inline std::vector<float> DecodeOrDie(const CodecSpec& spec, const std::string& bytes, size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  const absl::Status s = Decode(spec, bytes, std::span<float>(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// What Decode says of `bytes` as n values.
inline absl::Status DecodeBytes(const CodecSpec& spec, const std::string& bytes, size_t n) {
  std::vector<float> out(n);
  return Decode(spec, bytes, std::span<float>(out));
}

// Decode and DecodeAdd both refuse `bytes` as INVALID_ARGUMENT, the message containing `text`.
inline void ExpectRefused(const CodecSpec& spec, const std::string& bytes, size_t n,
                          const std::string& text) {
  const absl::Status s = DecodeBytes(spec, bytes, n);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << Name(spec) << ": " << text;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(text)) << Name(spec);
  std::vector<float> acc(n);
  EXPECT_EQ(DecodeAdd(spec, bytes, std::span<float>(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

// Overwrites the 4 bytes at `at` with v (little-endian, as the codecs write).
inline void PutFloat(std::string* bytes, size_t at, float v) {
  std::memcpy(bytes->data() + at, &v, 4);
}

}  // namespace ts::sidecar::codec_testing

#endif  // TS_SIDECAR_COLLECTIVE_CODEC_TEST_UTIL_H_
