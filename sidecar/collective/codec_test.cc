// Codec tests: the per-element error bounds stated in codec.h on random data (several sizes,
// blocks not filled, all-zero blocks, large and small magnitudes), exact sizes, refusals of
// malformed encodings and non-finite input, and the top-k byte ratio. The zstd codecs and error
// feedback: codec_stage_test.cc.
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

#include "sidecar/collective/codec_test_util.h"

namespace ts::sidecar {
namespace {

using codec_testing::DecodeBytes;
using codec_testing::DecodeOrDie;
using codec_testing::ExpectRefused;
using codec_testing::Name;
using codec_testing::Normal;
using codec_testing::PutFloat;
using codec_testing::Spec;
using ::testing::HasSubstr;

constexpr Compression kAllKinds[] = {
    Compression::kFp32, Compression::kFp16,     Compression::kBf16,    Compression::kInt8,
    Compression::kTopK, Compression::kInt8Zstd, Compression::kFp32Zstd};

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

}  // namespace
}  // namespace ts::sidecar
