// Codec tests, continued: the zstd codecs (int8-zstd gives the same values as int8 and
// fp32-zstd the same bits as fp32, each in fewer bytes, and their frames are held to their
// bounds) and error feedback keeping the accumulated error bounded over 100 rounds (against no
// feedback, whose error grows linearly).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sidecar/collective/codec.h"
#include "sidecar/collective/codec_test_util.h"

namespace ts::sidecar {
namespace {

using codec_testing::DecodeBytes;
using codec_testing::DecodeOrDie;
using codec_testing::ExpectRefused;
using codec_testing::Normal;
using codec_testing::PutFloat;
using codec_testing::Spec;
using ::testing::HasSubstr;

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
