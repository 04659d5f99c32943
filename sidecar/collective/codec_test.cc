// Codec tests: the per-element error bounds stated in codec.h on random data (several sizes,
// blocks not filled, all-zero blocks, large and small magnitudes), exact sizes, refusals of
// malformed encodings and non-finite input, the top-k byte ratio, and error feedback keeping the
// accumulated error bounded over 100 rounds (against no feedback, whose error grows linearly),
// and the zstd codecs: int8-zstd gives the same values as int8 and fp32-zstd the same bits as
// fp32, each in fewer bytes, and their frames are held to their bounds.
#include "sidecar/collective/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

constexpr Compression kAllKinds[] = {
    Compression::kFp32, Compression::kFp16,     Compression::kBf16,    Compression::kInt8,
    Compression::kTopK, Compression::kInt8Zstd, Compression::kFp32Zstd};

CodecSpec Spec(Compression kind, uint32_t block = 4096, uint32_t topk = 64, uint32_t bits = 2) {
  CodecSpec spec;
  spec.kind = kind;
  spec.block_elements = block;
  spec.topk_per_block = topk;
  spec.value_bits = bits;
  return spec;
}

std::string Name(const CodecSpec& spec) {
  return std::string(CompressionName(spec.kind)) + " block " + std::to_string(spec.block_elements) +
         " k " + std::to_string(spec.topk_per_block) + " bits " + std::to_string(spec.value_bits);
}

std::vector<float> Normal(size_t n, float sd, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Magnitudes spread over many binades (2^lo .. 2^hi), random signs; every `zero_every`-th
// block of `block` elements is all zero.
std::vector<float> Wide(size_t n, int lo, int hi, uint64_t seed, size_t block = 0,
                        size_t zero_every = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(lo, hi);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::ldexp(mant(rng), expo(rng)) * ((rng() & 1) != 0 ? -1.0f : 1.0f);
    if (zero_every != 0 && (i / block) % zero_every == 0) x[i] = 0.0f;
  }
  return x;
}

std::vector<float> DecodeOrDie(const CodecSpec& spec, const std::string& bytes, size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  const absl::Status s = Decode(spec, bytes, std::span<float>(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// The kept indices of one top-k block, chosen here independently of the codec: by |x|
// descending, ties to the lower index.
std::vector<size_t> ReferenceTopK(const float* x, size_t len, size_t k) {
  std::vector<size_t> idx(len);
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

// Checks every element of decode(encode(x)) against codec.h's bound; returns how many elements
// were checked (so that a test cannot pass by checking nothing).
size_t CheckBounds(const CodecSpec& spec, const std::vector<float>& x) {
  std::string bytes;
  const absl::Status s = Encode(spec, x, &bytes);
  EXPECT_TRUE(s.ok()) << s;
  if (HasFixedSize(spec.kind)) {
    EXPECT_EQ(bytes.size(), EncodedSize(spec, x.size())) << Name(spec);
  } else {
    EXPECT_LE(bytes.size(), EncodedSize(spec, x.size())) << Name(spec);
  }
  const std::vector<float> y = DecodeOrDie(spec, bytes, x.size());
  size_t checked = 0;
  for (size_t base = 0; base < x.size(); base += spec.block_elements) {
    const size_t len = std::min<size_t>(spec.block_elements, x.size() - base);
    double max_abs = 0;
    for (size_t i = 0; i < len; ++i) max_abs = std::max<double>(max_abs, std::fabs(x[base + i]));
    std::vector<bool> kept(len, true);
    if (spec.kind == Compression::kTopK) {
      std::fill(kept.begin(), kept.end(), false);
      for (size_t i : ReferenceTopK(&x[base], len, std::min<size_t>(spec.topk_per_block, len))) {
        kept[i] = true;
      }
    }
    for (size_t i = 0; i < len; ++i) {
      const double xv = x[base + i];
      const double yv = y[base + i];
      const double err = std::fabs(yv - xv);
      const double ax = std::fabs(xv);
      double bound = 0;
      switch (spec.kind) {
        case Compression::kFp32:
        case Compression::kFp32Zstd:
          if (std::bit_cast<uint32_t>(x[base + i]) != std::bit_cast<uint32_t>(y[base + i])) {
            ADD_FAILURE() << Name(spec) << " element " << base + i << " changed";
            return checked;
          }
          break;
        case Compression::kFp16:
          bound = ax >= std::ldexp(1.0, -14) ? std::ldexp(ax, -11) : std::ldexp(1.0, -25);
          break;
        case Compression::kBf16:
          bound = ax >= std::ldexp(1.0, -126) ? std::ldexp(ax, -8) : std::ldexp(1.0, -134);
          break;
        case Compression::kInt8:
        case Compression::kInt8Zstd: {
          const double scale = max_abs / 127;
          bound = scale * (0.5 + std::ldexp(1.0, -16));
          break;
        }
        case Compression::kTopK:
          if (!kept[i]) {
            // Dropped: exactly 0 (the error feedback carries it).
            if (yv != 0.0) {
              ADD_FAILURE() << Name(spec) << " dropped element " << base + i << " decoded " << yv;
              return checked;
            }
            ++checked;
            continue;
          }
          bound = max_abs *
                  (std::ldexp(1.0, -static_cast<int>(spec.value_bits)) + std::ldexp(1.0, -23));
          // A kept element decodes to the middle of a level: never 0 unless the block is.
          if (kept[i] && max_abs > 0 && yv == 0.0) {
            ADD_FAILURE() << Name(spec) << " kept element " << base + i << " decoded 0";
            return checked;
          }
          break;
      }
      if (!(err <= bound)) {
        ADD_FAILURE() << Name(spec) << " n " << x.size() << " element " << base + i << " x " << xv
                      << " decoded " << yv << " error " << err << " > bound " << bound;
        return checked;
      }
      ++checked;
    }
  }
  return checked;
}

TEST(CodecNames, ParseAndName) {
  for (Compression c : kAllKinds) {
    auto parsed = ParseCompression(CompressionName(c));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  auto bad = ParseCompression("zstd");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'zstd'"));
}

TEST(CodecSpec, ValidationNamesFieldAndValue) {
  struct Case {
    CodecSpec spec;
    const char* text;
  };
  const Case cases[] = {
      {Spec(Compression::kInt8, 0), "block_elements 0"},
      {Spec(Compression::kTopK, 65537, 64), "block_elements 65537"},
      {Spec(Compression::kTopK, 4096, 0), "topk_per_block 0"},
      {Spec(Compression::kTopK, 16, 17), "topk_per_block 17"},
      {Spec(Compression::kTopK, 4096, 64, 1), "value_bits 1"},
      {Spec(Compression::kTopK, 4096, 64, 9), "value_bits 9"},
      {Spec(static_cast<Compression>(9)), "kind 9"},
  };
  for (const Case& c : cases) {
    const absl::Status s = ValidateCodecSpec(c.spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.text));
    // Encode and Decode refuse the same spec.
    std::string out;
    const std::vector<float> x(4, 1.0f);
    EXPECT_EQ(Encode(c.spec, x, &out).code(), absl::StatusCode::kInvalidArgument);
    std::vector<float> y(4);
    EXPECT_EQ(Decode(c.spec, "", std::span<float>(y)).code(), absl::StatusCode::kInvalidArgument);
  }
  // Fields a codec does not read are not its concern.
  EXPECT_TRUE(ValidateCodecSpec(Spec(Compression::kFp16, 0, 0, 0)).ok());
  EXPECT_TRUE(ValidateCodecSpec(Spec(Compression::kInt8, 65536, 0, 0)).ok());
  EXPECT_TRUE(ValidateCodecSpec(Spec(Compression::kTopK, 1, 1, 8)).ok());
}

TEST(CodecSize, ExactLayouts) {
  EXPECT_EQ(EncodedSize(Spec(Compression::kFp32), 5), 20u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kFp16), 5), 10u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kBf16), 5), 10u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kInt8), 4097), 2 * 4 + 4097u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kInt8, 1), 3), 3 * 5u);
  // 64 of 4096 at 2 bits: 4 (scale) + 64 · 12 / 8 (indices) + 64 · 2 / 8 (values).
  EXPECT_EQ(EncodedSize(Spec(Compression::kTopK), 4096), 116u);
  // A last block of 10 keeps all 10: 4 + ceil(10 · 12 / 8) + ceil(10 · 2 / 8).
  EXPECT_EQ(EncodedSize(Spec(Compression::kTopK), 2 * 4096 + 10), 2 * 116 + 4 + 15 + 3u);
  // Block of 1: one index bit, padded to a byte.
  EXPECT_EQ(EncodedSize(Spec(Compression::kTopK, 1, 1, 8), 3), 3 * (4 + 1 + 1u));
  // int8-zstd: at most the mode byte and int8's bytes.
  EXPECT_EQ(EncodedSize(Spec(Compression::kInt8Zstd), 4097), 1 + 2 * 4 + 4097u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kInt8Zstd), 0), 1u);
  for (Compression c : kAllKinds) {
    if (HasFixedSize(c)) {
      EXPECT_EQ(EncodedSize(Spec(c), 0), 0u);
    }
  }
  EXPECT_FALSE(HasFixedSize(Compression::kInt8Zstd));
  EXPECT_TRUE(HasFixedSize(Compression::kInt8));
  // fp32-zstd: at most the mode byte and fp32's bytes.
  EXPECT_EQ(EncodedSize(Spec(Compression::kFp32Zstd), 5), 1 + 4 * 5u);
  EXPECT_EQ(EncodedSize(Spec(Compression::kFp32Zstd), 0), 1u);
  EXPECT_FALSE(HasFixedSize(Compression::kFp32Zstd));
  for (Compression c : kAllKinds) {
    EXPECT_EQ(IsLossless(c), c == Compression::kFp32 || c == Compression::kFp32Zstd)
        << CompressionName(c);
  }
}

TEST(CodecConversion, Fp16ExhaustiveAndRoundingAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t a = h & 0x7fff;
    const float v = Fp16ToFloat(static_cast<uint16_t>(h));
    if (a > 0x7c00) {
      EXPECT_TRUE(std::isnan(v)) << h;
      continue;
    }
    // Reference value from the fields, in double.
    const int e = static_cast<int>(a >> 10);
    const double m = a & 0x3ff;
    double ref = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
    if (e == 31) ref = std::numeric_limits<double>::infinity();
    if ((h & 0x8000) != 0) ref = -ref;
    ASSERT_EQ(static_cast<double>(v), ref) << std::hex << h;
    if (a < 0x7c00) {
      ASSERT_EQ(FloatToFp16(v), h) << std::hex << h;
    }
  }
  // Every midpoint between neighbours rounds to the even one; one float ulp either side
  // rounds to the nearer.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      const double lo = Fp16ToFloat(static_cast<uint16_t>(h));
      const double hi = Fp16ToFloat(static_cast<uint16_t>(h + 1));
      const float mid = static_cast<float>((lo + hi) / 2) * sign;  // exact: 12 significant bits
      ASSERT_EQ(FloatToFp16(mid), s | ((h % 2 == 0) ? h : h + 1)) << std::hex << h;
      ASSERT_EQ(FloatToFp16(std::nextafter(mid, 0.0f)), s | h) << std::hex << h;
      ASSERT_EQ(FloatToFp16(std::nextafter(mid, 1e9f * sign)), s | (h + 1)) << std::hex << h;
    }
  }
  // Beyond 65504: saturation (the encoder refuses such input before converting).
  EXPECT_EQ(FloatToFp16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(-1e30f), 0xfbff);
  EXPECT_EQ(FloatToFp16(std::numeric_limits<float>::infinity()), 0x7bff);
  EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FloatToFp16(1e-10f), 0);  // below half the smallest subnormal
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
}

TEST(CodecConversion, Bf16RoundsToNearestEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint32_t a = b & 0x7fff;
    const float v = Bf16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(std::bit_cast<uint32_t>(v), b << 16);
    if (a >= 0x7f80) continue;
    ASSERT_EQ(FloatToBf16(v), b);
    if (a == 0x7f7f) continue;  // the next one up is Inf
    const uint32_t mid_bits = (b << 16) | 0x8000u;
    const uint32_t even = (b % 2 == 0) ? b : b + 1;
    ASSERT_EQ(FloatToBf16(std::bit_cast<float>(mid_bits)), even) << std::hex << b;
    ASSERT_EQ(FloatToBf16(std::bit_cast<float>(mid_bits - 1)), b) << std::hex << b;
    ASSERT_EQ(FloatToBf16(std::bit_cast<float>(mid_bits + 1)), b + 1) << std::hex << b;
  }
  const uint16_t nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  // A NaN whose payload sits only in the low half stays NaN instead of rounding to Inf.
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::bit_cast<float>(0x7f800001u)))));
}

// The bound of every codec on normal data, several sizes (1 element, sizes that leave the last
// block short, several blocks).
TEST(CodecRoundTrip, ErrorWithinStatedBoundOnRandomData) {
  const size_t sizes[] = {1, 2, 7, 63, 64, 65, 1000, 4095, 4096, 4097, 3 * 4096 + 5};
  size_t checked = 0;
  uint64_t seed = 1;
  for (Compression kind : kAllKinds) {
    for (size_t n : sizes) {
      checked += CheckBounds(Spec(kind), Normal(n, 1.0f, seed++));
    }
  }
  EXPECT_GT(checked, 5 * 20000u);
}

// Magnitudes across many binades (within each codec's range), with all-zero blocks.
TEST(CodecRoundTrip, LargeSmallAndZeroBlocks) {
  size_t checked = 0;
  uint64_t seed = 100;
  for (Compression kind : kAllKinds) {
    const uint32_t block = 256;
    const CodecSpec spec = Spec(kind, block, 16, 3);
    // Large: fp16 stays below 65504; the others go far above.
    const int hi = kind == Compression::kFp16 ? 14 : 100;
    checked += CheckBounds(spec, Wide(5000, 0, hi, seed++, block, 3));
    // Small: fp16 reaches into its subnormals and below; bf16 and fp32 into fp32 subnormals.
    // int8's bound holds for a normal scale, so its block maxima stay ≥ 127 · 2^-126.
    const int lo = kind == Compression::kInt8 ? -110 : (kind == Compression::kFp16 ? -30 : -140);
    checked += CheckBounds(spec, Wide(5000, lo, lo + 20, seed++, block, 4));
    // Everything at once: the block scale follows the largest, the rest may round to 0.
    if (kind != Compression::kFp16) checked += CheckBounds(spec, Wide(5000, -60, 60, seed++));
    // All zero.
    checked += CheckBounds(spec, std::vector<float>(700, 0.0f));
  }
  EXPECT_GT(checked, 5 * 14000u);
}

TEST(CodecRoundTrip, TopKAndInt8ShapesAndBits) {
  size_t checked = 0;
  uint64_t seed = 200;
  const struct {
    uint32_t block, k, bits;
  } shapes[] = {{1, 1, 2},     {7, 3, 2},    {8, 8, 4},       {4096, 64, 2},
                {4096, 64, 8}, {1000, 1, 3}, {65536, 100, 5}, {300, 299, 7}};
  for (const auto& s : shapes) {
    for (size_t n : {size_t{1}, size_t{s.block} + 1, std::min<size_t>(3 * s.block + 2, 20000)}) {
      checked +=
          CheckBounds(Spec(Compression::kTopK, s.block, s.k, s.bits), Normal(n, 2.0f, seed++));
      checked += CheckBounds(Spec(Compression::kInt8, s.block), Normal(n, 2.0f, seed++));
    }
  }
  EXPECT_EQ(checked, 2 * 123598u);  // every element of every case
}

TEST(CodecRoundTrip, ExtremeFiniteValues) {
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> x = {max, -max, 1.0f, -3e38f, 0.0f, 1e-45f};
  for (Compression kind : {Compression::kFp32, Compression::kInt8, Compression::kTopK,
                           Compression::kInt8Zstd, Compression::kFp32Zstd}) {
    const CodecSpec spec = Spec(kind, 4, 2, 8);
    std::string bytes;
    ASSERT_TRUE(Encode(spec, x, &bytes).ok()) << Name(spec);
    const std::vector<float> y = DecodeOrDie(spec, bytes, x.size());
    for (float v : y) EXPECT_TRUE(std::isfinite(v)) << Name(spec);
    EXPECT_NEAR(y[0] / max, 1.0, 0.01) << Name(spec);
  }
  // bf16: up to the largest value that does not round to Inf.
  const float bf16_ok = std::bit_cast<float>(0x7f7f7fffu);
  std::string bytes;
  ASSERT_TRUE(Encode(Spec(Compression::kBf16), std::vector<float>{bf16_ok, -bf16_ok}, &bytes).ok());
  EXPECT_EQ(DecodeOrDie(Spec(Compression::kBf16), bytes, 2)[1], -std::bit_cast<float>(0x7f7f0000u));
  // fp16: exactly 65504 is fine.
  bytes.clear();
  ASSERT_TRUE(
      Encode(Spec(Compression::kFp16), std::vector<float>{65504.0f, -65504.0f}, &bytes).ok());
  EXPECT_EQ(DecodeOrDie(Spec(Compression::kFp16), bytes, 2)[0], 65504.0f);
}

TEST(CodecRoundTrip, DecodeAddAddsExactlyWhatDecodeGives) {
  uint64_t seed = 300;
  for (Compression kind : kAllKinds) {
    const CodecSpec spec = Spec(kind, 100, 10, 3);
    const std::vector<float> x = Normal(1234, 1.0f, seed++);
    std::string bytes;
    ASSERT_TRUE(Encode(spec, x, &bytes).ok());
    const std::vector<float> decoded = DecodeOrDie(spec, bytes, x.size());
    std::vector<float> acc = Normal(x.size(), 5.0f, seed++);
    std::vector<float> expected(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) expected[i] = acc[i] + decoded[i];
    ASSERT_TRUE(DecodeAdd(spec, bytes, std::span<float>(acc)).ok());
    for (size_t i = 0; i < acc.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(acc[i]), std::bit_cast<uint32_t>(expected[i]))
          << CompressionName(kind) << " element " << i;
    }
  }
}

TEST(CodecEncode, AppendsAndIsDeterministic) {
  for (Compression kind : kAllKinds) {
    const CodecSpec spec = Spec(kind, 512, 32, 4);
    const std::vector<float> x = Normal(3000, 1.0f, 7);
    std::string a = "prefix";
    std::string b;
    ASSERT_TRUE(Encode(spec, x, &a).ok());
    ASSERT_TRUE(Encode(spec, x, &b).ok());
    EXPECT_EQ(a.substr(0, 6), "prefix");
    EXPECT_EQ(a.substr(6), b) << CompressionName(kind);
  }
}

TEST(CodecTopK, TiesKeepTheLowerIndexAndIndicesAscend) {
  // Equal magnitudes everywhere but one: the largest, then the lowest indices.
  std::vector<float> x(16, 1.0f);
  x[9] = -4.0f;
  x[3] = -1.0f;
  const CodecSpec spec = Spec(Compression::kTopK, 16, 4, 2);
  std::string bytes;
  ASSERT_TRUE(Encode(spec, x, &bytes).ok());
  const std::vector<float> y = DecodeOrDie(spec, bytes, x.size());
  std::vector<size_t> nonzero;
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] != 0.0f) nonzero.push_back(i);
  }
  EXPECT_EQ(nonzero, (std::vector<size_t>{0, 1, 2, 9}));
  // m = 4, 2 bits: |x| = 4 → level 1 → 3; |x| = 1 → level 0 → 1.
  EXPECT_EQ(y[9], -3.0f);
  EXPECT_EQ(y[0], 1.0f);
  // Byte layout: m, then indices 0, 1, 2, 9 at 4 bits LSB-first, then values 0b00 ×3, 0b11.
  ASSERT_EQ(bytes.size(), 4u + 2 + 1);
  float m;
  std::memcpy(&m, bytes.data(), 4);
  EXPECT_EQ(m, 4.0f);
  EXPECT_EQ(static_cast<uint8_t>(bytes[4]), 0x10);
  EXPECT_EQ(static_cast<uint8_t>(bytes[5]), 0x92);
  EXPECT_EQ(static_cast<uint8_t>(bytes[6]), 0xc0);
}

TEST(CodecTopK, ByteRatioOfSparseLoCoSettingsIsAtLeast100) {
  const CodecSpec spec = Spec(Compression::kTopK, 4096, 64, 2);  // 1.56 %, 2-bit values
  for (size_t n : {size_t{16} << 20, size_t{1000000}}) {
    const double ratio = 4.0 * static_cast<double>(n) / static_cast<double>(EncodedSize(spec, n));
    std::printf("topk 64/4096 at 2 bits, %zu elements: %.1fx smaller than fp32\n", n, ratio);
    EXPECT_GE(ratio, 100.0);
  }
  // And the encoder writes exactly that many bytes.
  const std::vector<float> x = Normal(100000, 1.0f, 11);
  std::string bytes;
  ASSERT_TRUE(Encode(spec, x, &bytes).ok());
  EXPECT_EQ(bytes.size(), EncodedSize(spec, x.size()));
  EXPECT_GE(4.0 * x.size() / bytes.size(), 100.0);
}

TEST(CodecEncode, RefusesNonFiniteNamingTheIndex) {
  for (Compression kind : kAllKinds) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x = Normal(5000, 1.0f, 3);
      x[4321] = bad;
      std::string out = "keep";
      const absl::Status s = Encode(Spec(kind, 1000, 10, 2), x, &out);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << CompressionName(kind);
      EXPECT_THAT(std::string(s.message()), HasSubstr("element 4321 is not finite"));
      EXPECT_EQ(out, "keep");  // a refused input leaves nothing behind
    }
  }
}

TEST(CodecEncode, IntoAReusedBufferMatchesEncode) {
  const std::vector<float> x = Normal(10000, 1.0f, 11);
  for (Compression kind : kAllKinds) {
    const CodecSpec spec = Spec(kind, 1000, 10, 3);
    std::string want;
    ASSERT_TRUE(Encode(spec, x, &want).ok()) << CompressionName(kind);
    // A buffer holding other bytes (a reused one) of the bound's size: what it returns as
    // written is overwritten and is Encode's output.
    const size_t bound = EncodedSize(spec, x.size());
    std::string out(bound, '\xa5');
    absl::StatusOr<size_t> written = EncodeInto(spec, x, std::span<char>(out.data(), out.size()));
    ASSERT_TRUE(written.ok()) << written.status();
    EXPECT_EQ(*written, want.size()) << CompressionName(kind);
    EXPECT_EQ(out.substr(0, *written), want) << CompressionName(kind);
    std::string short_out(bound - 1, '\0');
    const absl::StatusOr<size_t> s =
        EncodeInto(spec, x, std::span<char>(short_out.data(), short_out.size()));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr(absl::StrCat("holds ", bound - 1, " bytes")));
  }
}

TEST(CodecEncode, CheckFiniteNamesTheIndex) {
  std::vector<float> x = Normal(5000, 1.0f, 4);
  EXPECT_TRUE(CheckFinite(x).ok());
  x[3999] = std::numeric_limits<float>::infinity();
  const absl::Status s = CheckFinite(x);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element 3999 is not finite"));
}

TEST(CodecEncode, RangeRefusals) {
  std::vector<float> x(100, 1.0f);
  x[42] = -70000.0f;
  std::string out;
  absl::Status s = Encode(Spec(Compression::kFp16), x, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element 42 is -70000"));
  EXPECT_TRUE(out.empty());
  x[42] = 65504.5f;
  EXPECT_EQ(Encode(Spec(Compression::kFp16), x, &out).code(), absl::StatusCode::kOutOfRange);
  x[42] = 3.4e38f;
  s = Encode(Spec(Compression::kBf16), x, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element 42"));
  // The other codecs carry fp32's whole range.
  for (Compression kind : {Compression::kFp32, Compression::kInt8, Compression::kTopK,
                           Compression::kInt8Zstd, Compression::kFp32Zstd}) {
    EXPECT_TRUE(Encode(Spec(kind), x, &out).ok()) << CompressionName(kind);
  }
}

absl::Status DecodeBytes(const CodecSpec& spec, const std::string& bytes, size_t n) {
  std::vector<float> out(n);
  return Decode(spec, bytes, std::span<float>(out));
}

void ExpectRefused(const CodecSpec& spec, const std::string& bytes, size_t n,
                   const std::string& text) {
  const absl::Status s = DecodeBytes(spec, bytes, n);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << Name(spec) << ": " << text;
  EXPECT_THAT(std::string(s.message()), HasSubstr(text)) << Name(spec);
  std::vector<float> acc(n);
  EXPECT_EQ(DecodeAdd(spec, bytes, std::span<float>(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

void PutFloat(std::string* bytes, size_t at, float v) { std::memcpy(bytes->data() + at, &v, 4); }

TEST(CodecDecode, RefusesWrongSize) {
  for (Compression kind : kAllKinds) {
    if (!HasFixedSize(kind)) continue;  // CodecInt8Zstd and CodecFp32Zstd below
    const CodecSpec spec = Spec(kind, 100, 10, 2);
    std::string bytes;
    ASSERT_TRUE(Encode(spec, Normal(250, 1.0f, 5), &bytes).ok());
    const size_t size = bytes.size();
    ExpectRefused(spec, bytes + "x", 250, std::to_string(size + 1) + " bytes for 250 elements");
    ExpectRefused(spec, bytes.substr(0, size - 1), 250, "expected " + std::to_string(size));
    // One more block's worth of elements (top-k's size depends only on the block count).
    ExpectRefused(spec, bytes, 350, "for 350 elements");
  }
}

TEST(CodecDecode, RefusesNonFiniteElements) {
  std::string fp32(40, '\0');
  PutFloat(&fp32, 4 * 7, std::numeric_limits<float>::quiet_NaN());
  ExpectRefused(Spec(Compression::kFp32), fp32, 10, "element 7 is not finite");
  std::string half(20, '\0');
  half[2 * 3 + 1] = static_cast<char>(0xfc);  // -Inf in fp16
  ExpectRefused(Spec(Compression::kFp16), half, 10, "element 3 is not finite (bits 0xfc00)");
  half[2 * 3 + 1] = static_cast<char>(0x7f);  // bf16 0x7f00 is finite …
  half[2 * 3] = static_cast<char>(0x80);      // … 0x7f80 is Inf
  ExpectRefused(Spec(Compression::kBf16), half, 10, "element 3 is not finite (bits 0x7f80)");
}

TEST(CodecDecode, Int8RefusesBadScaleAndMinus128) {
  const CodecSpec spec = Spec(Compression::kInt8, 8);
  std::string good;
  ASSERT_TRUE(Encode(spec, Normal(20, 1.0f, 9), &good).ok());
  ASSERT_TRUE(DecodeBytes(spec, good, 20).ok());
  const size_t block1 = 4 + 8;  // second block's scale
  for (float scale : {-1.0f, std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(), 3e37f}) {
    std::string bytes = good;
    PutFloat(&bytes, block1, scale);
    ExpectRefused(spec, bytes, 20, "block 1 scale");
  }
  std::string bytes = good;
  bytes[block1 + 4 + 3] = static_cast<char>(-128);
  ExpectRefused(spec, bytes, 20, "block 1 element 3 value -128");
}

TEST(CodecDecode, TopKRefusesBadIndicesScaleAndPadding) {
  // Block 6 (3 index bits), k 2, 4 value bits: per block 4 + 1 + 1 bytes.
  const CodecSpec spec = Spec(Compression::kTopK, 6, 2, 4);
  const std::vector<float> x = {0.1f, 5.0f, 0.2f, -3.0f, 0.0f, 0.3f, 1.0f, 2.0f, 0.5f};
  std::string good;
  ASSERT_TRUE(Encode(spec, x, &good).ok());
  ASSERT_EQ(good.size(), 2 * 6u);
  ASSERT_TRUE(DecodeBytes(spec, good, x.size()).ok());
  // First block's indices byte: 1 | 3 << 3.
  ASSERT_EQ(static_cast<uint8_t>(good[4]), 1 | (3 << 3));
  auto with_byte = [&](size_t at, uint8_t v) {
    std::string b = good;
    b[at] = static_cast<char>(v);
    return b;
  };
  ExpectRefused(spec, with_byte(4, 1 | (7 << 3)), x.size(), "block 0 index 7 is outside the block");
  ExpectRefused(spec, with_byte(4, 3 | (1 << 3)), x.size(), "block 0 index 1 follows 3");
  ExpectRefused(spec, with_byte(4, 3 | (3 << 3)), x.size(), "block 0 index 3 follows 3");
  ExpectRefused(spec, with_byte(4, 1 | (3 << 3) | 0x40), x.size(), "index padding bits");
  // The second block has 3 elements: index 3 is outside it.
  ExpectRefused(spec, with_byte(6 + 4, 0 | (3 << 3)), x.size(),
                "block 1 index 3 is outside the block (length 3)");
  for (float m :
       {-2.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::string b = good;
    PutFloat(&b, 6, m);
    ExpectRefused(spec, b, x.size(), "block 1 scale");
  }
  // Values padding: k 3 at 3 bits uses 9 bits of 16.
  const CodecSpec spec3 = Spec(Compression::kTopK, 4, 3, 3);
  std::string b3;
  ASSERT_TRUE(Encode(spec3, std::vector<float>{1, 2, 3, 4}, &b3).ok());
  ASSERT_EQ(b3.size(), 4u + 1 + 2);
  b3[6] = static_cast<char>(static_cast<uint8_t>(b3[6]) | 0x80);
  ExpectRefused(spec3, b3, 4, "value padding bits");
}

// Random bytes of the right size: a decoder answers OK or INVALID_ARGUMENT, never reads out of
// bounds (ASan) and never yields a non-finite value.
TEST(CodecDecode, RandomBytesNeverCrashOrYieldNonFinite) {
  std::mt19937_64 rng(77);
  for (Compression kind : kAllKinds) {
    for (const CodecSpec& spec : {Spec(kind, 16, 3, 2), Spec(kind, 5, 5, 8), Spec(kind, 1, 1, 3)}) {
      for (size_t n : {size_t{1}, size_t{17}, size_t{100}}) {
        for (int trial = 0; trial < 200; ++trial) {
          std::string bytes(EncodedSize(spec, n), '\0');
          for (char& c : bytes) c = static_cast<char>(rng());
          std::vector<float> out(n);
          const absl::Status s = Decode(spec, bytes, std::span<float>(out));
          if (s.ok()) {
            for (float v : out) ASSERT_TRUE(std::isfinite(v)) << Name(spec);
          } else {
            ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
          }
        }
      }
    }
  }
}

// ---- int8-zstd -----------------------------------------------------------------------------

// The entropy stage is lossless: int8-zstd decodes to int8's values, bit for bit, in fewer bytes.
// Gaussian values quantized at 4096 per block carry about 7.2 bits of entropy per element
// (σ spans ~36 of the 127 levels), so about 0.9 of int8's bytes is what an entropy coder can
// reach; heavier tails (pseudo-gradients) give more.
TEST(CodecInt8Zstd, SameValuesAsInt8InFewerBytes) {
  const size_t n = 1u << 20;
  const std::vector<float> x = Normal(n, 0.01f, 81);
  std::string int8, zstd;
  ASSERT_TRUE(Encode(Spec(Compression::kInt8), x, &int8).ok());
  ASSERT_TRUE(Encode(Spec(Compression::kInt8Zstd), x, &zstd).ok());
  ASSERT_EQ(static_cast<uint8_t>(zstd[0]), 1);  // a zstd frame
  const std::vector<float> a = DecodeOrDie(Spec(Compression::kInt8), int8, n);
  const std::vector<float> b = DecodeOrDie(Spec(Compression::kInt8Zstd), zstd, n);
  ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  const double ratio = static_cast<double>(zstd.size()) / int8.size();
  std::printf("int8-zstd: %zu of int8's %zu bytes (%.4f) on Gaussian values\n", zstd.size(),
              int8.size(), ratio);
  EXPECT_LT(ratio, 0.95);
  // DecodeAdd adds the same values.
  std::vector<float> acc(n, 1.0f);
  ASSERT_TRUE(DecodeAdd(Spec(Compression::kInt8Zstd), zstd, std::span<float>(acc)).ok());
  for (size_t i = 0; i < n; i += 997) ASSERT_EQ(acc[i], 1.0f + a[i]) << i;
}

// Where zstd cannot make the bytes smaller (a handful of values: its frame header alone is
// larger), they are stored as they are, behind mode 0.
TEST(CodecInt8Zstd, StoresWhatDoesNotCompress) {
  const CodecSpec spec = Spec(Compression::kInt8Zstd);
  const std::vector<float> x = {0.5f, -1.0f, 0.25f};
  std::string bytes;
  ASSERT_TRUE(Encode(spec, x, &bytes).ok());
  EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0);
  EXPECT_EQ(bytes.size(), EncodedSize(spec, x.size()));
  std::string int8;
  ASSERT_TRUE(Encode(Spec(Compression::kInt8), x, &int8).ok());
  EXPECT_EQ(bytes.substr(1), int8);
  EXPECT_EQ(DecodeOrDie(spec, bytes, 3), DecodeOrDie(Spec(Compression::kInt8), int8, 3));
}

TEST(CodecInt8Zstd, RefusesBadModesSizesAndFrames) {
  const CodecSpec spec = Spec(Compression::kInt8Zstd);
  std::string frame;
  ASSERT_TRUE(Encode(spec, Normal(3000, 1.0f, 82), &frame).ok());
  ASSERT_EQ(static_cast<uint8_t>(frame[0]), 1);
  ASSERT_TRUE(DecodeBytes(spec, frame, 3000).ok());
  ExpectRefused(spec, "", 3000, "0 bytes for 3000 elements, expected 1 to 3005");
  ExpectRefused(spec, std::string(3006, '\0'), 3000, "3006 bytes for 3000 elements");
  std::string mode2 = frame;
  mode2[0] = 2;
  ExpectRefused(spec, mode2, 3000, "mode 2 is unknown");
  // A frame of another element count's bytes (3004 of them) read as 2999 elements (3003).
  ExpectRefused(spec, frame, 2999, "frame content size 3004 bytes, expected 3003");
  ExpectRefused(spec, frame.substr(0, frame.size() - 1), 3000, "not exactly one zstd frame");
  ExpectRefused(spec, frame + "x", 3000, "not exactly one zstd frame (the frame is");
  std::string header = frame;
  header[1] ^= 0x55;  // the frame's magic number
  ExpectRefused(spec, header, 3000, "frame header is damaged");
  // Stored bytes of the wrong size.
  std::string stored;
  ASSERT_TRUE(Encode(spec, std::vector<float>{1.0f, 2.0f}, &stored).ok());
  ASSERT_EQ(static_cast<uint8_t>(stored[0]), 0);
  ExpectRefused(spec, stored.substr(0, stored.size() - 1), 2, "stored payload of 5 bytes");
  // A frame is only ever written when it is smaller than what it carries.
  std::string not_smaller = stored;
  not_smaller[0] = 1;
  ExpectRefused(spec, not_smaller, 2, "not smaller than the 6 bytes");
  // The stored int8 bytes are checked as int8's are.
  std::string minus128 = stored;
  minus128[1 + 4] = static_cast<char>(-128);
  ExpectRefused(spec, minus128, 2, "value -128");
}

// A small frame that would decompress to far more than its element count needs (a
// "decompression bomb": a million zeros in a few hundred bytes) is refused from its header, before
// anything is decompressed.
TEST(CodecInt8Zstd, RefusesAFrameThatWouldDecompressToMoreThanItsElements) {
  const CodecSpec spec = Spec(Compression::kInt8Zstd);
  std::string bomb;
  ASSERT_TRUE(Encode(spec, std::vector<float>(1u << 20, 0.0f), &bomb).ok());
  ASSERT_EQ(static_cast<uint8_t>(bomb[0]), 1);
  ASSERT_LT(bomb.size(), 1000u);
  const size_t n = 1000;  // int8: 1004 bytes, bound 1005
  ExpectRefused(spec, bomb, n,
                absl::StrCat("frame content size ", (1u << 20) + 4 * 256, " bytes, expected 1004"));
}

// ---- fp32-zstd -----------------------------------------------------------------------------

// Values with the spread of a pseudo-gradient: each "tensor" of 4096 elements Gaussian with its
// own scale, the scales spread over 2^-16 .. 2^-4.
std::vector<float> TensorLike(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> expo(-16, -4);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  float scale = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 4096 == 0) scale = std::ldexp(1.0f, expo(rng));
    x[i] = dist(rng) * scale;
  }
  return x;
}

// Lossless: the decoded bits are the input's. A Gaussian's high bytes (sign and the top of the
// exponent) hold about 3.5 bits of information, so about (24 + 3.5) / 32 ≈ 0.86 of fp32's
// bytes is what coding them alone can reach; stated: below 0.9.
TEST(CodecFp32Zstd, SameBitsAsFp32InFewerBytes) {
  const size_t n = 1u << 20;
  for (const auto& [what, x] :
       {std::pair{"Gaussian", Normal(n, 0.01f, 91)}, std::pair{"tensor-like", TensorLike(n, 92)}}) {
    std::string fp32, zstd;
    ASSERT_TRUE(Encode(Spec(Compression::kFp32), x, &fp32).ok());
    ASSERT_TRUE(Encode(Spec(Compression::kFp32Zstd), x, &zstd).ok());
    ASSERT_EQ(static_cast<uint8_t>(zstd[0]), 1) << what;  // low bytes and a zstd frame
    // The low three bytes of every element, as they are, after the mode byte.
    for (size_t i = 0; i < n; i += 4099) {
      ASSERT_EQ(zstd.substr(1 + 3 * i, 3), fp32.substr(4 * i, 3)) << what << " element " << i;
    }
    const std::vector<float> y = DecodeOrDie(Spec(Compression::kFp32Zstd), zstd, n);
    ASSERT_EQ(std::memcmp(x.data(), y.data(), n * sizeof(float)), 0) << what;
    const double ratio = static_cast<double>(zstd.size()) / fp32.size();
    std::printf("fp32-zstd: %zu of fp32's %zu bytes (%.4f) on %s values\n", zstd.size(),
                fp32.size(), ratio, what);
    EXPECT_LT(ratio, 0.9) << what;
    EXPECT_GT(ratio, 0.75) << what;  // the low bytes are not compressed
    std::vector<float> acc(n, 1.0f);
    ASSERT_TRUE(DecodeAdd(Spec(Compression::kFp32Zstd), zstd, std::span<float>(acc)).ok());
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(acc[i], 1.0f + x[i]) << i;
  }
}

// High bytes with nothing to gain (random bit patterns) and a handful of values (the frame
// header alone is larger) are stored as fp32's bytes behind mode 0.
TEST(CodecFp32Zstd, StoresWhatDoesNotCompress) {
  const CodecSpec spec = Spec(Compression::kFp32Zstd);
  std::mt19937_64 rng(93);
  std::vector<float> random_bits(5000);
  for (float& v : random_bits) {
    // Any finite bit pattern: an exponent field other than all ones.
    uint32_t b = static_cast<uint32_t>(rng());
    if ((b & 0x7f800000u) == 0x7f800000u) b &= 0xbfffffffu;
    v = std::bit_cast<float>(b);
  }
  for (const std::vector<float>& x : {random_bits, std::vector<float>{0.5f, -1.0f, 0.25f}}) {
    std::string bytes, fp32;
    ASSERT_TRUE(Encode(spec, x, &bytes).ok());
    ASSERT_TRUE(Encode(Spec(Compression::kFp32), x, &fp32).ok());
    EXPECT_EQ(static_cast<uint8_t>(bytes[0]), 0) << x.size();
    EXPECT_EQ(bytes.size(), EncodedSize(spec, x.size()));
    EXPECT_EQ(bytes.substr(1), fp32);
    const std::vector<float> y = DecodeOrDie(spec, bytes, x.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
  }
  // No elements: the mode byte alone.
  std::string empty;
  ASSERT_TRUE(Encode(spec, std::vector<float>{}, &empty).ok());
  EXPECT_EQ(empty, std::string(1, '\0'));
}

TEST(CodecFp32Zstd, RefusesBadModesSizesAndFrames) {
  const CodecSpec spec = Spec(Compression::kFp32Zstd);
  const size_t n = 3000;
  std::string good;
  ASSERT_TRUE(Encode(spec, Normal(n, 1.0f, 94), &good).ok());
  ASSERT_EQ(static_cast<uint8_t>(good[0]), 1);
  ASSERT_TRUE(DecodeBytes(spec, good, n).ok());
  ExpectRefused(spec, "", n, "0 bytes for 3000 elements, expected 1 to 12001");
  ExpectRefused(spec, std::string(12002, '\0'), n, "12002 bytes for 3000 elements");
  std::string mode2 = good;
  mode2[0] = 2;
  ExpectRefused(spec, mode2, n, "mode 2 is unknown");
  // The low bytes take 3n of the payload; a payload with no room after them holds no frame.
  ExpectRefused(spec, good.substr(0, 1 + 3 * n), n, "no room for a frame after the 9000 low bytes");
  // The same bytes read as 2990 elements: the frame starts 30 bytes early, inside the low bytes.
  ExpectRefused(spec, good, 2990, "fp32-zstd");
  // The frame truncated or followed by more bytes.
  ExpectRefused(spec, good.substr(0, good.size() - 1), n, "not exactly one zstd frame");
  ExpectRefused(spec, good + "x", n, "not exactly one zstd frame (the frame is");
  std::string header = good;
  header[1 + 3 * n] ^= 0x55;  // the frame's magic number
  ExpectRefused(spec, header, n, "frame header is damaged");
  // A frame of another count's high bytes: 3000 low bytes' worth shorter, the same frame.
  std::string other;
  ASSERT_TRUE(Encode(spec, Normal(n + 1000, 1.0f, 95), &other).ok());
  ASSERT_EQ(static_cast<uint8_t>(other[0]), 1);
  const std::string other_frame = other.substr(1 + 3 * (n + 1000));
  ExpectRefused(spec, good.substr(0, 1 + 3 * n) + other_frame, n,
                "frame content size 4000 bytes, expected 3000");
  // Stored bytes of the wrong size, and a stored Inf.
  std::string stored;
  ASSERT_TRUE(Encode(spec, std::vector<float>{1.0f, 2.0f}, &stored).ok());
  ASSERT_EQ(static_cast<uint8_t>(stored[0]), 0);
  ExpectRefused(spec, stored.substr(0, stored.size() - 1), 2, "stored payload of 7 bytes");
  std::string inf = stored;
  PutFloat(&inf, 1 + 4, std::numeric_limits<float>::infinity());
  ExpectRefused(spec, inf, 2, "element 1 is not finite");
  // A frame is only ever written when it is smaller than the high bytes it carries: here the
  // stored payload read as six low bytes and a two-byte frame of two high bytes.
  std::string not_smaller = stored;
  not_smaller[0] = 1;
  ExpectRefused(spec, not_smaller, 2, "frame of 2 bytes is not smaller than the 2 bytes");
}

// Reassembled values that are not finite are refused, naming the element: here every high
// byte is 0x7f (an exponent field of 254 or 255 depending on the low bytes' top bit) and
// element 1234's low bytes carry the exponent's last bit.
TEST(CodecFp32Zstd, RefusesReassembledNonFiniteValues) {
  const CodecSpec spec = Spec(Compression::kFp32Zstd);
  const size_t n = 4000;
  std::vector<float> x(n, std::bit_cast<float>(0x7f000000u));  // 2^127: high byte 0x7f
  std::string bytes;
  ASSERT_TRUE(Encode(spec, x, &bytes).ok());
  ASSERT_EQ(static_cast<uint8_t>(bytes[0]), 1);
  ASSERT_TRUE(DecodeBytes(spec, bytes, n).ok());
  bytes[1 + 3 * 1234 + 2] = static_cast<char>(0x80);  // exponent 255, mantissa 0: Inf
  ExpectRefused(spec, bytes, n, "element 1234 is not finite (bits 0x7f800000)");
}

// A small frame that would decompress to far more high bytes than the element count has is
// refused from its header, before anything is decompressed.
TEST(CodecFp32Zstd, RefusesAFrameThatWouldDecompressToMoreThanItsElements) {
  const CodecSpec spec = Spec(Compression::kFp32Zstd);
  const size_t big = 1u << 20;
  std::string bomb;
  ASSERT_TRUE(Encode(spec, std::vector<float>(big, 0.0f), &bomb).ok());
  ASSERT_EQ(static_cast<uint8_t>(bomb[0]), 1);
  const std::string frame = bomb.substr(1 + 3 * big);
  ASSERT_LT(frame.size(), 1000u);
  const size_t n = 1000;
  ExpectRefused(spec, std::string(1, '\1') + std::string(3 * n, '\0') + frame, n,
                absl::StrCat("frame content size ", big, " bytes, expected 1000"));
}

// ---- error feedback ----------------------------------------------------------------------

double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

double Norm(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

struct Accumulated {
  std::vector<double> error_norm;  // after each round: ‖Σ decoded − Σ inputs‖
  std::vector<double> residual_norm;
  double input_norm = 0;  // of one round's input (the largest)
};

// 100 rounds of `inputs(round)` through the codec, with error feedback (decay) or without
// (each round encoded on its own).
template <typename Inputs>
Accumulated RunRounds(const CodecSpec& spec, size_t n, bool feedback, float decay, Inputs inputs) {
  ErrorFeedback ef(n, decay);
  std::vector<double> sum_in(n, 0.0);
  std::vector<double> sum_out(n, 0.0);
  Accumulated acc;
  for (int round = 0; round < 100; ++round) {
    const std::vector<float> x = inputs(round);
    acc.input_norm = std::max(acc.input_norm, Norm(x));
    std::string bytes;
    const absl::Status s = feedback ? ef.Compress(spec, x, &bytes) : Encode(spec, x, &bytes);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(bytes.size(), EncodedSize(spec, n));
    const std::vector<float> y = DecodeOrDie(spec, bytes, n);
    std::vector<double> diff(n);
    for (size_t i = 0; i < n; ++i) {
      sum_in[i] += x[i];
      sum_out[i] += y[i];
      diff[i] = sum_out[i] - sum_in[i];
    }
    acc.error_norm.push_back(Norm(diff));
    acc.residual_norm.push_back(Norm(ef.residual()));
  }
  return acc;
}

// With decay 1, Σ decoded = Σ inputs − residual exactly (up to fp32 rounding): the accumulated
// error is the residual. Top-k keeps at least a δ = k/d share of a vector's energy, so the
// residual stays below about 2/δ · |g| (16 here, before quantization); stated: ≤ 8 |g| at every
// round (measured 3.6 |g|). Without feedback the same fixed input accumulates its compression
// error every round: exactly linear, 73 |g| after 100 rounds.
TEST(ErrorFeedback, TopKAccumulatedErrorStaysBoundedOver100Rounds) {
  const size_t n = 4096;
  const CodecSpec spec = Spec(Compression::kTopK, 256, 32, 2);  // 1/8 kept, 2-bit values
  const std::vector<float> g = Normal(n, 1.0f, 21);
  auto fixed = [&](int) { return g; };
  const Accumulated with = RunRounds(spec, n, /*feedback=*/true, 1.0f, fixed);
  const Accumulated without = RunRounds(spec, n, /*feedback=*/false, 1.0f, fixed);
  const double one = with.input_norm;
  std::printf(
      "topk EF, fixed input: error after 1/50/100 rounds = %.2f/%.2f/%.2f x |g| "
      "(without EF: %.2f/%.2f/%.2f)\n",
      with.error_norm[0] / one, with.error_norm[49] / one, with.error_norm[99] / one,
      without.error_norm[0] / one, without.error_norm[49] / one, without.error_norm[99] / one);
  for (int t = 0; t < 100; ++t) {
    // The accumulated error is the residual (fp32 rounding aside) …
    EXPECT_NEAR(with.error_norm[t], with.residual_norm[t], 1e-3 * one) << t;
    // … and it stays below a constant times one round's input at every round.
    EXPECT_LE(with.error_norm[t], 8.0 * one) << "round " << t;
  }
  // Not growing: the second half's worst is no worse than the first half's.
  EXPECT_LE(*std::max_element(with.error_norm.begin() + 50, with.error_norm.end()),
            1.05 * *std::max_element(with.error_norm.begin(), with.error_norm.begin() + 50));
  // Without feedback it grows linearly: round t carries t times round 1's error.
  EXPECT_NEAR(without.error_norm[99], 100 * without.error_norm[0], 1e-3 * without.error_norm[99]);
  EXPECT_GE(without.error_norm[99], 50.0 * one);
  EXPECT_LE(with.error_norm[99], without.error_norm[99] / 10);
}

// SparseLoCo's settings (64 of 4096 at 2 bits), inputs = a common direction plus fresh noise
// every round. Top-k keeps a δ = k/d share of the energy, so the residual settles at most near
// 2/δ · |x| (here 128); measured it approaches ≈ 37 |x| (after 1000 rounds; 30 after 100).
// Stated: ≤ d/k = 64 × one round's input at every round, with growth slowing down; without
// feedback the error grows linearly and passes that bound within 100 rounds.
TEST(ErrorFeedback, TopKSparseLoCoSettingsRandomInputs) {
  const size_t n = 4096;
  const CodecSpec spec = Spec(Compression::kTopK, 4096, 64, 2);
  const std::vector<float> mean = Normal(n, 1.0f, 31);
  std::mt19937_64 rng(32);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  auto inputs = [&](int) {
    std::vector<float> x = mean;
    for (float& v : x) v += noise(rng);
    return x;
  };
  const Accumulated with = RunRounds(spec, n, /*feedback=*/true, 1.0f, inputs);
  rng.seed(32);
  const Accumulated without = RunRounds(spec, n, /*feedback=*/false, 1.0f, inputs);
  const double one = with.input_norm;
  const auto& e = with.error_norm;
  const auto& e0 = without.error_norm;
  std::printf(
      "topk 64/4096 EF, random inputs: error after 1/50/100 rounds = %.2f/%.2f/%.2f x "
      "|x| (without EF: %.2f/%.2f/%.2f)\n",
      e[0] / one, e[49] / one, e[99] / one, e0[0] / one, e0[49] / one, e0[99] / one);
  for (int t = 0; t < 100; ++t) {
    EXPECT_NEAR(e[t], with.residual_norm[t], 1e-3 * one) << t;
    EXPECT_LE(e[t], 64.0 * one) << "round " << t;
  }
  // Growth slows down with feedback: the second 50 rounds add less than half of the first 50.
  EXPECT_LE(e[99] - e[49], (e[49] - e[0]) / 2);
  // Without: linear (round 100 ≈ 2 × round 50), beyond the bound above.
  EXPECT_GE(e0[99], 1.9 * e0[49]);
  EXPECT_GE(e0[99], 64.0 * one);
}

TEST(ErrorFeedback, DecayedResidualStaysBounded) {
  // SparseLoCo's decay: the residual is a geometric sum of dropped parts, ≤ |x| / (1 − decay).
  const size_t n = 4096;
  const CodecSpec spec = Spec(Compression::kTopK, 4096, 64, 2);
  const std::vector<float> g = Normal(n, 1.0f, 41);
  const Accumulated with = RunRounds(spec, n, /*feedback=*/true, 0.95f, [&](int) { return g; });
  for (int t = 0; t < 100; ++t) {
    EXPECT_LE(with.residual_norm[t], with.input_norm / (1 - 0.95)) << t;
  }
  EXPECT_LE(*std::max_element(with.residual_norm.begin() + 50, with.residual_norm.end()),
            1.05 * *std::max_element(with.residual_norm.begin(), with.residual_norm.begin() + 50));
}

TEST(ErrorFeedback, Int8AccumulatedErrorStaysBounded) {
  const size_t n = 4000;
  const CodecSpec spec = Spec(Compression::kInt8, 256);
  const std::vector<float> g = Normal(n, 1.0f, 51);
  auto fixed = [&](int) { return g; };
  const Accumulated with = RunRounds(spec, n, /*feedback=*/true, 1.0f, fixed);
  const Accumulated without = RunRounds(spec, n, /*feedback=*/false, 1.0f, fixed);
  // Each residual element is at most half a quantization step of its block (s / 2, s ≤
  // max|x + e| / 127), so the accumulated error stays ≤ √n · s / 2 ≈ 1 % of |g| here.
  double max_abs = 0;
  for (float v : g) max_abs = std::max<double>(max_abs, std::fabs(v));
  const double bound = std::sqrt(static_cast<double>(n)) * 0.5 * (max_abs * 1.01 / 127);
  std::printf("int8 EF: error after 100 rounds = %.4f x |g| (bound %.4f; without EF %.4f)\n",
              with.error_norm[99] / with.input_norm, bound / with.input_norm,
              without.error_norm[99] / with.input_norm);
  for (int t = 0; t < 100; ++t) EXPECT_LE(with.error_norm[t], bound) << t;
  EXPECT_NEAR(without.error_norm[99], 100 * without.error_norm[0], 1e-3 * without.error_norm[99]);
  EXPECT_LE(with.error_norm[99], without.error_norm[99] / 20);
}

TEST(ErrorFeedback, RefusedInputLeavesResidualAndOutputAlone) {
  ErrorFeedback ef(100, 1.0f);
  const CodecSpec spec = Spec(Compression::kTopK, 50, 5, 2);
  std::string out;
  ASSERT_TRUE(ef.Compress(spec, Normal(100, 1.0f, 61), &out).ok());
  const std::vector<float> before(ef.residual().begin(), ef.residual().end());
  std::vector<float> bad = Normal(100, 1.0f, 62);
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  out = "keep";
  const absl::Status s = ef.Compress(spec, bad, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("element 17"));
  EXPECT_EQ(out, "keep");
  EXPECT_TRUE(std::equal(before.begin(), before.end(), ef.residual().begin()));
  const absl::Status wrong = ef.Compress(spec, std::vector<float>(99, 0.0f), &out);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("99 elements, expected 100"));
}

}  // namespace
}  // namespace ts::sidecar
