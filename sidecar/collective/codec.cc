#include "sidecar/collective/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include <zstd.h>

#include "absl/strings/str_cat.h"
#include "common/absl_view.h"
#include "common/status.h"

namespace ts::sidecar {
namespace {

// The wire formats are little-endian and the kernels copy bytes straight into integer arrays.
static_assert(std::endian::native == std::endian::little, "codecs assume a little-endian host");

// Elements converted per stack buffer: large enough to amortize the loop overhead, small enough to
// stay in L1 between the conversion and the copy.
constexpr size_t kChunk = 2048;

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kFloatExpBits = 0x7f800000u;      // abs bits at or above this: Inf or NaN
constexpr uint32_t kFp16MaxBits = 0x477fe000u;       // 65504, the largest finite fp16
constexpr uint32_t kBf16OverflowBits = 0x7f7f8000u;  // at or above this, bf16 rounds to Inf
constexpr uint16_t kHalfExpBits = 0x7c00;            // fp16 abs bits at or above: Inf or NaN
constexpr uint16_t kBf16ExpBits = 0x7f80;            // bf16 abs bits at or above: Inf or NaN

constexpr int kMaxLevelBits = 7;  // value_bits ≤ 8, one of which is the sign

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

absl::string_view KindName(Compression c) { return common::AsAbsl(CompressionName(c)); }

// GCC at -O2 vectorizes a loop only when its trip count is a known multiple of the vector width
// (its "very cheap" cost model), so the hot loops run over fixed groups of kLanes elements and
// finish the rest one at a time. Inside a group, choices are mask selects rather than branches,
// and narrow inputs are widened to 32 bits in a step of their own: both keep the loops in the
// shapes GCC vectorizes at -O2. The optimized builds compile this library at -O3 (CMakeLists.txt),
// where GCC also unrolls and keeps accumulators in registers; Clang vectorizes either way.
constexpr size_t kLanes = 16;

inline uint32_t Select(bool c, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (if_true & mask) | (if_false & ~mask);
}

template <bool kAdd, typename T>
inline void Store(T& out, T value) {
  if constexpr (kAdd) {
    out += value;
  } else {
    out = value;
  }
}

// out[i] = f(in[i]) (or += with kAdd), with f taking the element widened to W.
template <typename W, bool kAdd = false, typename In, typename Out, typename F>
void Map(const In* __restrict in, size_t n, Out* __restrict out, F f) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    W w[kLanes];
    for (size_t j = 0; j < kLanes; ++j) w[j] = static_cast<W>(in[i + j]);
    for (size_t j = 0; j < kLanes; ++j) Store<kAdd, Out>(out[i + j], f(w[j]));
  }
  for (; i < n; ++i) Store<kAdd, Out>(out[i], f(static_cast<W>(in[i])));
}

// The largest key(in[i]) (0 for none), the key being below 2^31 (so that the lane maxima compare
// as signed integers, which baseline x86-64 vector code can). Each lane keeps its own maximum
// across the groups and the lanes are combined once at the end: a horizontal step per group
// cost more than the maxima themselves.
template <typename W, typename In, typename F>
uint32_t MaxOf(const In* __restrict in, size_t n, F key) {
  int32_t lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lane[j] = std::max(lane[j], static_cast<int32_t>(key(static_cast<W>(in[i + j]))));
    }
  }
  int32_t m = 0;
  for (int32_t v : lane) m = std::max(m, v);
  for (; i < n; ++i) m = std::max(m, static_cast<int32_t>(key(static_cast<W>(in[i]))));
  return static_cast<uint32_t>(m);
}

// Whether any of the n values (as float bits) is Inf or NaN: their abs bits are ≥ 0x7f800000
// exactly when adding 2^23 carries into bit 31, so one OR over the lanes answers it — cheaper
// than a maximum, and the check every fp32 frame sent and received goes through.
// T is float or its bits (uint32_t).
template <typename T>
bool AnyNonFinite(const T* __restrict in, size_t n) {
  static_assert(sizeof(T) == sizeof(uint32_t));
  uint32_t lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      lane[j] |= (std::bit_cast<uint32_t>(in[i + j]) & kAbsMask) + 0x00800000u;
    }
  }
  uint32_t any = 0;
  for (uint32_t v : lane) any |= v;
  for (; i < n; ++i) any |= (std::bit_cast<uint32_t>(in[i]) & kAbsMask) + 0x00800000u;
  return (any & 0x80000000u) != 0;
}

// The largest |x| as float bits (for non-negative floats the bit patterns order like the values),
// which also answers "is any element Inf or NaN" (result ≥ kFloatExpBits) in the same pass. An
// integer max reduction vectorizes without -ffast-math; a float one would not.
uint32_t MaxAbsBits(const float* x, size_t n) {
  return MaxOf<float>(x, n, [](float v) { return Bits(v) & kAbsMask; });
}

uint32_t MaxAbsBits16(const uint16_t* h, size_t n) {
  return MaxOf<uint32_t>(h, n, [](uint32_t v) { return v & 0x7fffu; });
}

// fp16 <-> fp32, branch-free (every case computed, one selected) so that the loops vectorize.
inline uint16_t HalfFromFloat(float x) {
  const uint32_t b = Bits(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & kAbsMask;
  // Normal fp16 (|x| ≥ 2^-14): rebias the exponent (127 → 15) and round the 23-bit mantissa to
  // 10 bits, nearest even; a mantissa carry correctly bumps the exponent.
  const uint32_t rebiased = a - 0x38000000u;
  const uint32_t normal = (rebiased + 0x0fffu + ((rebiased >> 13) & 1u)) >> 13;
  // Subnormal fp16: adding 0.5 puts |x| where the float spacing is 2^-24, exactly fp16's
  // subnormal step, so the addition rounds (nearest even) to a whole number of steps; the bit
  // difference from 0.5 is that number (0x400 = 2^-14 when it rounds up into the normals).
  const uint32_t subnormal = Bits(FromBits(a) + 0.5f) - Bits(0.5f);
  uint32_t h = Select(a >= 0x38800000u, normal, subnormal);
  h = std::min(h, 0x7bffu);                   // would round to Inf (≥ 65520): saturate
  h = Select(a > kFloatExpBits, 0x7e00u, h);  // NaN stays NaN
  return static_cast<uint16_t>(sign | h);
}

inline float FloatFromHalf(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t a = h & 0x7fffu;
  // Normal: rebias the exponent (15 → 127); Inf/NaN need the all-ones exponent.
  const uint32_t normal = (a << 13) + 0x38000000u;
  const uint32_t special = (a << 13) | kFloatExpBits;
  // Subnormal (and zero): the mantissa counts steps of 2^-24; the inverse of the encoder's trick.
  const uint32_t subnormal = Bits(FromBits(Bits(0.5f) + a) - 0.5f);
  uint32_t r = Select(a >= 0x0400u, normal, subnormal);
  r = Select(a >= kHalfExpBits, special, r);
  return FromBits(sign | r);
}

// Round to nearest even by adding half an output ulp minus one, plus the lowest kept bit, before
// truncating: ties then round up exactly when the kept part is odd.
inline uint16_t Bf16FromFloat(float x) {
  const uint32_t b = Bits(x);
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  // NaN stays NaN (forced quiet, so rounding cannot turn it into Inf).
  const uint32_t nan = (b >> 16) | 0x0040u;
  return static_cast<uint16_t>(Select((b & kAbsMask) > kFloatExpBits, nan, rounded));
}

// The first element of x (offset `base` in the whole input) that is not finite or whose abs bits
// exceed `limit_bits`, as an encoder error. Called only once a chunk's maximum flagged one.
absl::Status EncoderRangeError(Compression kind, const float* x, size_t n, size_t base,
                               uint32_t limit_bits, absl::string_view range) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t abs_bits = Bits(x[i]) & kAbsMask;
    if (abs_bits >= kFloatExpBits) {
      return absl::InvalidArgumentError(absl::StrCat("codec ", KindName(kind), ": element ",
                                                     base + i, " is not finite (", x[i], ")"));
    }
    if (abs_bits > limit_bits) {
      return absl::OutOfRangeError(absl::StrCat("codec ", KindName(kind), ": element ", base + i,
                                                " is ", x[i], ", beyond the ", range));
    }
  }
  return absl::InternalError("codec: range check found no offending element");
}

absl::Status NonFiniteInput(Compression kind, const float* x, size_t n, size_t base) {
  return EncoderRangeError(kind, x, n, base, kFloatExpBits - 1, "");
}

absl::Status DecodedNotFinite(Compression kind, size_t index, uint32_t bits) {
  return absl::InvalidArgumentError(absl::StrCat("codec ", KindName(kind), ": element ", index,
                                                 " is not finite (bits 0x", absl::Hex(bits), ")"));
}

// Bytes for k packed fields of `bits` each, padded to a whole byte.
size_t PackedBytes(size_t k, uint32_t bits) { return (k * bits + 7) / 8; }

uint32_t IndexBits(uint32_t block_elements) {
  return std::max<uint32_t>(1, std::bit_width(block_elements - 1));
}

size_t TopKBlockBytes(const CodecSpec& spec, size_t len) {
  const size_t k = std::min<size_t>(spec.topk_per_block, len);
  return 4 + PackedBytes(k, IndexBits(spec.block_elements)) + PackedBytes(k, spec.value_bits);
}

// ---- fp32 ----------------------------------------------------------------------------------

absl::Status EncodeFp32(std::span<const float> x, char* dst) {
  TS_RETURN_IF_ERROR(CheckFinite(x));
  if (!x.empty()) std::memcpy(dst, x.data(), 4 * x.size());
  return absl::OkStatus();
}

// out[base + i] = the float of bits[i] (or += with kAdd) for i < n; INVALID_ARGUMENT naming the
// element if any of them is not finite (then nothing is stored).
template <bool kAdd>
absl::Status StoreFp32Bits(Compression kind, const uint32_t* bits, size_t n, std::span<float> out,
                           size_t base) {
  if (AnyNonFinite(bits, n)) {
    for (size_t i = 0; i < n; ++i) {
      if ((bits[i] & kAbsMask) >= kFloatExpBits) return DecodedNotFinite(kind, base + i, bits[i]);
    }
  }
  Map<uint32_t, kAdd>(bits, n, out.data() + base, [](uint32_t b) { return FromBits(b); });
  return absl::OkStatus();
}

// fp32's bytes into `out`; errors name `kind` (kFp32, or kFp32Zstd for its stored mode).
template <bool kAdd>
absl::Status DecodeFp32(Compression kind, std::string_view bytes, std::span<float> out) {
  uint32_t buf[kChunk];
  for (size_t base = 0; base < out.size(); base += kChunk) {
    const size_t n = std::min(kChunk, out.size() - base);
    std::memcpy(buf, bytes.data() + 4 * base, 4 * n);
    TS_RETURN_IF_ERROR(StoreFp32Bits<kAdd>(kind, buf, n, out, base));
  }
  return absl::OkStatus();
}

// ---- fp16 / bf16 ---------------------------------------------------------------------------

absl::Status EncodeHalf(Compression kind, std::span<const float> x, char* dst) {
  const bool fp16 = kind == Compression::kFp16;
  // fp16 refuses what exceeds its largest finite value; bf16 only what would round to Inf.
  const uint32_t limit_bits = fp16 ? kFp16MaxBits : kBf16OverflowBits - 1;
  uint16_t buf[kChunk];
  for (size_t base = 0; base < x.size(); base += kChunk) {
    const size_t n = std::min(kChunk, x.size() - base);
    const float* chunk = x.data() + base;
    if (MaxAbsBits(chunk, n) > limit_bits) {
      return EncoderRangeError(kind, chunk, n, base, limit_bits,
                               fp16 ? "fp16 range ±65504" : "bf16 range ±3.38953e+38");
    }
    if (fp16) {
      Map<float>(chunk, n, buf, [](float v) { return HalfFromFloat(v); });
    } else {
      Map<float>(chunk, n, buf, [](float v) { return Bf16FromFloat(v); });
    }
    std::memcpy(dst + 2 * base, buf, 2 * n);
  }
  return absl::OkStatus();
}

template <bool kAdd>
absl::Status DecodeHalf(Compression kind, std::string_view bytes, std::span<float> out) {
  const bool fp16 = kind == Compression::kFp16;
  const uint16_t exp_bits = fp16 ? kHalfExpBits : kBf16ExpBits;
  uint16_t buf[kChunk];
  for (size_t base = 0; base < out.size(); base += kChunk) {
    const size_t n = std::min(kChunk, out.size() - base);
    std::memcpy(buf, bytes.data() + 2 * base, 2 * n);
    if (MaxAbsBits16(buf, n) >= exp_bits) {
      for (size_t i = 0; i < n; ++i) {
        if ((buf[i] & 0x7fff) >= exp_bits) return DecodedNotFinite(kind, base + i, buf[i]);
      }
    }
    if (fp16) {
      Map<uint32_t, kAdd>(buf, n, out.data() + base, [](uint32_t h) { return FloatFromHalf(h); });
    } else {
      Map<uint32_t, kAdd>(buf, n, out.data() + base, [](uint32_t h) { return FromBits(h << 16); });
    }
  }
  return absl::OkStatus();
}

// ---- int8 ----------------------------------------------------------------------------------

// Round half to even for |v| < 2^22: adding 1.5·2^23 moves v to where the float spacing is 1, so
// the addition itself rounds (to nearest even); subtracting is exact. Unlike nearbyint this
// vectorizes without SSE4.1, and it is exact IEEE arithmetic, so every build gets the same bits.
inline float RoundHalfEven(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return (v + kMagic) - kMagic;
}

void QuantizeInt8(const float* x, size_t n, float scale, int8_t* q) {
  Map<float>(x, n, q, [scale](float v) {
    v = RoundHalfEven(v / scale);
    // v / scale can exceed 127 by a rounding step (or more when the scale is subnormal).
    v = v < -127.0f ? -127.0f : v;
    v = v > 127.0f ? 127.0f : v;
    return static_cast<int8_t>(static_cast<int32_t>(v));
  });
}

absl::Status EncodeInt8(const CodecSpec& spec, std::span<const float> x, char* dst) {
  const size_t block = spec.block_elements;
  for (size_t base = 0; base < x.size(); base += block) {
    const size_t len = std::min(block, x.size() - base);
    const float* xb = x.data() + base;
    const uint32_t max_bits = MaxAbsBits(xb, len);
    if (max_bits >= kFloatExpBits) return NonFiniteInput(Compression::kInt8, xb, len, base);
    float scale = FromBits(max_bits) / 127.0f;
    // Near FLT_MAX, 127 · fl(max / 127) can round up to Inf, which a decoder refuses: one ulp
    // less keeps it finite, and the clamp to ±127 absorbs the difference.
    if (!std::isfinite(scale * 127.0f)) scale = std::nextafter(scale, 0.0f);
    std::memcpy(dst, &scale, 4);
    int8_t* q = reinterpret_cast<int8_t*>(dst + 4);
    if (scale == 0.0f) {
      // All-zero block (or one so tiny that max/127 underflows): every q is 0.
      std::memset(q, 0, len);
    } else {
      QuantizeInt8(xb, len, scale, q);
    }
    dst += 4 + len;
  }
  return absl::OkStatus();
}

template <bool kAdd>
absl::Status DecodeInt8(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  const size_t block = spec.block_elements;
  const char* src = bytes.data();
  for (size_t base = 0, b = 0; base < out.size(); base += block, ++b) {
    const size_t len = std::min(block, out.size() - base);
    float scale;
    std::memcpy(&scale, src, 4);
    // A finite scale whose 127 multiple is still finite keeps every decoded value finite; an
    // encoder never produces more (max|x| / 127 · 127 ≤ FLT_MAX).
    if (!(scale >= 0.0f) || !std::isfinite(scale * 127.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("codec int8: block ", b, " scale ", scale,
                                                     " is outside [0, FLT_MAX / 127]"));
    }
    const int8_t* q = reinterpret_cast<const int8_t*>(src + 4);
    // -128 is the only byte an encoder never writes; 127 − q maps it to 255, the largest key.
    if (MaxOf<int32_t>(q, len, [](int32_t v) { return static_cast<uint32_t>(127 - v); }) == 255) {
      const size_t at = std::find(q, q + len, int8_t{-128}) - q;
      return absl::InvalidArgumentError(absl::StrCat("codec int8: block ", b, " element ", at,
                                                     " value -128 is outside [-127, 127]"));
    }
    Map<int32_t, kAdd>(q, len, out.data() + base,
                       [scale](int32_t v) { return static_cast<float>(v) * scale; });
    src += 4 + len;
  }
  return absl::OkStatus();
}

// ---- the zstd stage (int8-zstd, fp32-zstd) ------------------------------------------------

// Mode bytes of the zstd codecs.
constexpr uint8_t kZstdStored = 0;  // the bytes without the entropy stage follow as they are
constexpr uint8_t kZstdFrame = 1;   // the compressed form follows
// zstd level 1: on these bytes the gain is the entropy coding of the literals (matches are
// rare), which every level does; higher levels only cost time.
constexpr int kZstdLevel = 1;
// fp32's high bytes carry ~3.5 bits per symbol, so short matches are everywhere and cost more to
// find than they save: with a minimum match of 7 and a 4 Ki-entry hash table a 256 Ki-element
// chunk of Gaussian values compresses to 0.35 of its high bytes at 0.48 GB/s of them, against
// 0.39 at 0.25 GB/s with level 1's defaults (and the frame decompresses 1.6× faster).
constexpr int kPlaneMinMatch = 7;
constexpr int kPlaneHashLog = 12;
// A frame that asks for a window above 2^27 bytes is refused (zstd's own default limit); the
// content is at most one chunk anyway.
constexpr int kZstdWindowLogMax = 27;

// Per-thread zstd contexts (a compression context per codec, for their settings) and the bytes
// between the two stages (int8-zstd: the int8 encoding; fp32-zstd: the high bytes), reused call
// after call.
struct ZstdState {
  struct CCtxFree {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  struct DCtxFree {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
  };
  std::unique_ptr<ZSTD_CCtx, CCtxFree> int8_cctx;
  std::unique_ptr<ZSTD_CCtx, CCtxFree> plane_cctx;
  std::unique_ptr<ZSTD_DCtx, DCtxFree> dctx;
  std::string scratch;
};

std::unique_ptr<ZSTD_CCtx, ZstdState::CCtxFree> NewCCtx() {
  std::unique_ptr<ZSTD_CCtx, ZstdState::CCtxFree> c(ZSTD_createCCtx());
  TS_CHECK(c != nullptr);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_compressionLevel, kZstdLevel);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_contentSizeFlag, 1);
  ZSTD_CCtx_setParameter(c.get(), ZSTD_c_checksumFlag, 0);
  return c;
}

ZstdState& Zstd() {
  thread_local ZstdState state;
  if (!state.dctx) {
    state.int8_cctx = NewCCtx();
    state.plane_cctx = NewCCtx();
    ZSTD_CCtx_setParameter(state.plane_cctx.get(), ZSTD_c_minMatch, kPlaneMinMatch);
    ZSTD_CCtx_setParameter(state.plane_cctx.get(), ZSTD_c_hashLog, kPlaneHashLog);
    state.dctx.reset(ZSTD_createDCtx());
    TS_CHECK(state.dctx != nullptr);
    ZSTD_DCtx_setParameter(state.dctx.get(), ZSTD_d_windowLogMax, kZstdWindowLogMax);
  }
  return state;
}

// Compresses `src` into dst with `cctx` as one zstd frame that records its content size and is
// strictly smaller than `src` (zstd answers "destination too small" otherwise); returns its
// size, or 0 when no such frame exists and the bytes are to be stored as they are.
size_t ZstdInto(ZSTD_CCtx* cctx, std::string_view src, char* dst) {
  if (src.size() <= 1) return 0;
  const size_t n = ZSTD_compress2(cctx, dst, src.size() - 1, src.data(), src.size());
  return ZSTD_isError(n) ? 0 : n;
}

// Decompresses `frame` into the thread's scratch buffer (resized to `raw`). Everything about
// the frame is checked from its header before any of it is decompressed: it must be smaller
// than what it carries, be exactly one zstd frame and record a content size of `raw` bytes, so
// a peer cannot make the decoder allocate or work more than an uncompressed payload would.
absl::Status Unzstd(Compression kind, std::string_view frame, size_t raw) {
  if (frame.size() >= raw) {
    return absl::InvalidArgumentError(absl::StrCat("codec ", KindName(kind), ": frame of ",
                                                   frame.size(), " bytes is not smaller than the ",
                                                   raw, " bytes it carries"));
  }
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", KindName(kind), ": the frame header is damaged or records no content size"));
  }
  if (content != raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", KindName(kind), ": frame content size ", content, " bytes, expected ", raw));
  }
  const size_t compressed = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(compressed) || compressed != frame.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", KindName(kind), ": payload of ", frame.size(),
        " bytes is not exactly one zstd frame",
        ZSTD_isError(compressed) ? absl::StrCat(" (", ZSTD_getErrorName(compressed), ")")
                                 : absl::StrCat(" (the frame is ", compressed, " bytes)")));
  }
  ZstdState& z = Zstd();
  z.scratch.resize(raw);
  const size_t n =
      ZSTD_decompressDCtx(z.dctx.get(), z.scratch.data(), raw, frame.data(), frame.size());
  if (ZSTD_isError(n) || n != raw) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", KindName(kind), ": the frame does not decompress to ", raw, " bytes",
        ZSTD_isError(n) ? absl::StrCat(" (", ZSTD_getErrorName(n), ")") : std::string()));
  }
  return absl::OkStatus();
}

// ---- int8 + zstd ---------------------------------------------------------------------------

size_t Int8Size(const CodecSpec& spec, size_t elements) {
  const size_t blocks = (elements + spec.block_elements - 1) / spec.block_elements;
  return 4 * blocks + elements;
}

// Encodes kInt8 into the thread's buffer, then compresses it into dst (at most 1 + Int8Size
// bytes); returns the bytes written.
absl::StatusOr<size_t> EncodeInt8Zstd(const CodecSpec& spec, std::span<const float> x, char* dst) {
  ZstdState& z = Zstd();
  const size_t raw = Int8Size(spec, x.size());
  z.scratch.resize(raw);
  TS_RETURN_IF_ERROR(EncodeInt8(spec, x, z.scratch.data()));
  if (const size_t n = ZstdInto(z.int8_cctx.get(), z.scratch, dst + 1); n > 0) {
    dst[0] = static_cast<char>(kZstdFrame);
    return 1 + n;
  }
  dst[0] = static_cast<char>(kZstdStored);
  std::memcpy(dst + 1, z.scratch.data(), raw);
  return 1 + raw;
}

// `bytes` is 1 .. 1 + Int8Size long (IsEncodedSize, checked by the caller).
template <bool kAdd>
absl::Status DecodeInt8Zstd(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  const size_t raw = Int8Size(spec, out.size());
  const uint8_t mode = static_cast<uint8_t>(bytes[0]);
  const std::string_view body = bytes.substr(1);
  if (mode == kZstdStored) {
    if (body.size() != raw) {
      return absl::InvalidArgumentError(absl::StrCat("codec int8-zstd: stored payload of ",
                                                     body.size(), " bytes, expected ", raw));
    }
    return DecodeInt8<kAdd>(spec, body, out);
  }
  if (mode != kZstdFrame) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec int8-zstd: mode ", mode, " is unknown (0 stored, 1 zstd)"));
  }
  TS_RETURN_IF_ERROR(Unzstd(Compression::kInt8Zstd, body, raw));
  return DecodeInt8<kAdd>(spec, Zstd().scratch, out);
}

// ---- fp32 + zstd ---------------------------------------------------------------------------

// An fp32 value's high byte holds its sign and the top seven bits of its exponent; across a
// vector of gradients or weights the exponents cluster in a few binades, so that byte carries
// about 3.5 bits of information, while the low three bytes (the exponent's last bit and the
// mantissa) are close to random. The high bytes go through zstd as one plane; the low bytes go
// as they are. Mode 1 payload: the low three bytes of every element (element i at 3i, little-
// endian), then one zstd frame of the high bytes (element i at i). Mode 0: kFp32's bytes.

// Writes the low three bytes of every element to `low` and the high byte to `high`. Four
// elements' low bytes are twelve bytes, three words.
void SplitFp32(std::span<const float> x, char* __restrict low, char* __restrict high) {
  const size_t n = x.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t b[4];
    std::memcpy(b, x.data() + i, sizeof(b));
    const uint32_t w[3] = {(b[0] & 0xffffffu) | (b[1] << 24), (b[1] >> 8 & 0xffffu) | (b[2] << 16),
                           (b[2] >> 16 & 0xffu) | (b[3] << 8)};
    std::memcpy(low + 3 * i, w, sizeof(w));
    for (size_t j = 0; j < 4; ++j) high[i + j] = static_cast<char>(b[j] >> 24);
  }
  for (; i < n; ++i) {
    const uint32_t b = Bits(x[i]);
    std::memcpy(low + 3 * i, &b, 3);
    high[i] = static_cast<char>(b >> 24);
  }
}

// The inverse of SplitFp32 for `n` elements: their bits into `out`.
void MergeFp32(const char* __restrict low, const char* __restrict high, size_t n,
               uint32_t* __restrict out) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t w[3];
    std::memcpy(w, low + 3 * i, sizeof(w));
    uint8_t h[4];
    std::memcpy(h, high + i, sizeof(h));
    out[i] = (w[0] & 0xffffffu) | uint32_t{h[0]} << 24;
    out[i + 1] = (w[0] >> 24 | (w[1] & 0xffffu) << 8) | uint32_t{h[1]} << 24;
    out[i + 2] = (w[1] >> 16 | (w[2] & 0xffu) << 16) | uint32_t{h[2]} << 24;
    out[i + 3] = w[2] >> 8 | uint32_t{h[3]} << 24;
  }
  for (; i < n; ++i) {
    uint32_t b = 0;
    std::memcpy(&b, low + 3 * i, 3);
    out[i] = b | uint32_t{static_cast<uint8_t>(high[i])} << 24;
  }
}

absl::StatusOr<size_t> EncodeFp32Zstd(std::span<const float> x, char* dst) {
  TS_RETURN_IF_ERROR(CheckFinite(x));
  const size_t n = x.size();
  ZstdState& z = Zstd();
  z.scratch.resize(n);
  SplitFp32(x, dst + 1, z.scratch.data());
  if (const size_t frame = ZstdInto(z.plane_cctx.get(), z.scratch, dst + 1 + 3 * n); frame > 0) {
    dst[0] = static_cast<char>(kZstdFrame);
    return 1 + 3 * n + frame;
  }
  dst[0] = static_cast<char>(kZstdStored);
  if (n > 0) std::memcpy(dst + 1, x.data(), 4 * n);
  return 1 + 4 * n;
}

// `bytes` is 1 .. 1 + 4n long (IsEncodedSize, checked by the caller).
template <bool kAdd>
absl::Status DecodeFp32Zstd(std::string_view bytes, std::span<float> out) {
  const size_t n = out.size();
  const uint8_t mode = static_cast<uint8_t>(bytes[0]);
  const std::string_view body = bytes.substr(1);
  if (mode == kZstdStored) {
    if (body.size() != 4 * n) {
      return absl::InvalidArgumentError(absl::StrCat("codec fp32-zstd: stored payload of ",
                                                     body.size(), " bytes, expected ", 4 * n));
    }
    return DecodeFp32<kAdd>(Compression::kFp32Zstd, body, out);
  }
  if (mode != kZstdFrame) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec fp32-zstd: mode ", mode, " is unknown (0 stored, 1 zstd)"));
  }
  if (body.size() <= 3 * n) {
    return absl::InvalidArgumentError(absl::StrCat("codec fp32-zstd: payload of ", body.size(),
                                                   " bytes has no room for a frame after the ",
                                                   3 * n, " low bytes"));
  }
  TS_RETURN_IF_ERROR(Unzstd(Compression::kFp32Zstd, body.substr(3 * n), n));
  const char* low = body.data();
  const char* high = Zstd().scratch.data();
  uint32_t buf[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t len = std::min(kChunk, n - base);
    MergeFp32(low + 3 * base, high + base, len, buf);
    TS_RETURN_IF_ERROR(StoreFp32Bits<kAdd>(Compression::kFp32Zstd, buf, len, out, base));
  }
  return absl::OkStatus();
}

// ---- top-k ---------------------------------------------------------------------------------

// Packs fields LSB-first into consecutive bytes.
class BitWriter {
 public:
  explicit BitWriter(char* dst) : dst_(reinterpret_cast<uint8_t*>(dst)) {}
  void Put(uint32_t value, uint32_t bits) {
    acc_ |= static_cast<uint64_t>(value) << used_;
    used_ += bits;
    while (used_ >= 8) {
      *dst_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      used_ -= 8;
    }
  }
  // Pads to a whole byte with zero bits; returns the position after the last byte.
  char* Finish() {
    if (used_ > 0) *dst_++ = static_cast<uint8_t>(acc_);
    acc_ = 0;
    used_ = 0;
    return reinterpret_cast<char*>(dst_);
  }

 private:
  uint8_t* dst_;
  uint64_t acc_ = 0;
  uint32_t used_ = 0;
};

// Reads fields written by BitWriter. The caller has checked the total size, so it never reads
// beyond the `bytes` it was given for one field group.
class BitReader {
 public:
  explicit BitReader(const char* src) : src_(reinterpret_cast<const uint8_t*>(src)) {}
  uint32_t Get(uint32_t bits) {
    while (have_ < bits) {
      acc_ |= static_cast<uint64_t>(*src_++) << have_;
      have_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << bits) - 1));
    acc_ >>= bits;
    have_ -= bits;
    return v;
  }
  // The padding left in the current byte, which a canonical encoding leaves zero.
  uint32_t Padding() const { return static_cast<uint32_t>(acc_); }
  const char* Finish() {
    acc_ = 0;
    have_ = 0;
    return reinterpret_cast<const char*>(src_);
  }

 private:
  const uint8_t* src_;
  uint64_t acc_ = 0;
  uint32_t have_ = 0;
};

absl::Status EncodeTopK(const CodecSpec& spec, std::span<const float> x, char* dst) {
  const size_t block = spec.block_elements;
  const uint32_t index_bits = IndexBits(spec.block_elements);
  const uint32_t level_bits = spec.value_bits - 1;
  const uint32_t max_level = (1u << level_bits) - 1;
  const float levels = static_cast<float>(1u << level_bits);
  // Selection keys: |x| bits in the high half, the complement of the index in the low half, so
  // that "larger key" means larger |x| and, among equal |x|, the lower index.
  std::vector<uint64_t> keys(std::min(block, x.size()));
  std::vector<uint32_t> kept(std::min<size_t>(spec.topk_per_block, keys.size()));
  for (size_t base = 0; base < x.size(); base += block) {
    const size_t len = std::min(block, x.size() - base);
    const size_t k = std::min<size_t>(spec.topk_per_block, len);
    const float* xb = x.data() + base;
    const uint32_t max_bits = MaxAbsBits(xb, len);
    if (max_bits >= kFloatExpBits) return NonFiniteInput(Compression::kTopK, xb, len, base);
    if (k == len) {
      for (size_t i = 0; i < k; ++i) kept[i] = static_cast<uint32_t>(i);
    } else {
      for (size_t i = 0; i < len; ++i) {
        keys[i] = (static_cast<uint64_t>(Bits(xb[i]) & kAbsMask) << 32) |
                  (0xffffffffu - static_cast<uint32_t>(i));
      }
      std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.begin() + len,
                       std::greater<uint64_t>());
      for (size_t i = 0; i < k; ++i) kept[i] = 0xffffffffu - static_cast<uint32_t>(keys[i]);
      std::sort(kept.begin(), kept.begin() + k);
    }
    // The largest |x| of the block is always kept, so it is the largest kept.
    const float m = FromBits(max_bits);
    std::memcpy(dst, &m, 4);
    BitWriter writer(dst + 4);
    for (size_t i = 0; i < k; ++i) writer.Put(kept[i], index_bits);
    dst = writer.Finish();
    writer = BitWriter(dst);
    for (size_t i = 0; i < k; ++i) {
      const float v = xb[kept[i]];
      uint32_t level = 0;
      if (m > 0.0f) {
        // |v| / m ≤ 1, and scaling by a power of two is exact: one rounding, then floor.
        const float scaled = std::floor(std::fabs(v) / m * levels);
        level = std::min(static_cast<uint32_t>(scaled), max_level);
      }
      const uint32_t sign = v < 0.0f ? 1u : 0u;
      writer.Put(level | (sign << level_bits), spec.value_bits);
    }
    dst = writer.Finish();
  }
  return absl::OkStatus();
}

template <bool kAdd>
absl::Status DecodeTopK(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  const size_t block = spec.block_elements;
  const uint32_t index_bits = IndexBits(spec.block_elements);
  const uint32_t level_bits = spec.value_bits - 1;
  const uint32_t level_mask = (1u << level_bits) - 1;
  const float inv_levels = 1.0f / static_cast<float>(1u << level_bits);  // exact: power of two
  std::vector<uint32_t> index(std::min<size_t>(spec.topk_per_block, out.size()));
  const char* src = bytes.data();
  for (size_t base = 0, b = 0; base < out.size(); base += block, ++b) {
    const size_t len = std::min(block, out.size() - base);
    const size_t k = std::min<size_t>(spec.topk_per_block, len);
    float m;
    std::memcpy(&m, src, 4);
    if (!(m >= 0.0f) || !std::isfinite(m)) {
      return absl::InvalidArgumentError(absl::StrCat("codec topk: block ", b, " scale ", m,
                                                     " is not a finite non-negative number"));
    }
    BitReader reader(src + 4);
    for (size_t i = 0; i < k; ++i) {
      index[i] = reader.Get(index_bits);
      if (index[i] >= len) {
        return absl::InvalidArgumentError(absl::StrCat("codec topk: block ", b, " index ", index[i],
                                                       " is outside the block (length ", len, ")"));
      }
      if (i > 0 && index[i] <= index[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat("codec topk: block ", b, " index ", index[i],
                                                       " follows ", index[i - 1],
                                                       " (indices must strictly increase)"));
      }
    }
    if (reader.Padding() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("codec topk: block ", b,
                                                     " index padding bits are not zero (0x",
                                                     absl::Hex(reader.Padding()), ")"));
    }
    src = reader.Finish();
    float* ob = out.data() + base;
    if constexpr (!kAdd) std::fill(ob, ob + len, 0.0f);
    reader = BitReader(src);
    for (size_t i = 0; i < k; ++i) {
      const uint32_t v = reader.Get(spec.value_bits);
      // Mid-rise reconstruction: the middle of the level's interval [L, L + 1) · m / 2^(b−1).
      const float magnitude = (static_cast<float>(v & level_mask) + 0.5f) * inv_levels * m;
      const float value = (v >> level_bits) != 0 ? -magnitude : magnitude;
      if constexpr (kAdd) {
        ob[index[i]] += value;
      } else {
        ob[index[i]] = value;
      }
    }
    if (reader.Padding() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("codec topk: block ", b,
                                                     " value padding bits are not zero (0x",
                                                     absl::Hex(reader.Padding()), ")"));
    }
    src = reader.Finish();
  }
  return absl::OkStatus();
}

template <bool kAdd>
absl::Status DecodeImpl(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  TS_RETURN_IF_ERROR(ValidateCodecSpec(spec));
  if (!IsEncodedSize(spec, out.size(), bytes.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec ", KindName(spec.kind), ": ", bytes.size(), " bytes for ", out.size(),
                     " elements, expected ", HasFixedSize(spec.kind) ? "" : "1 to ",
                     EncodedSize(spec, out.size())));
  }
  switch (spec.kind) {
    case Compression::kFp32:
      return DecodeFp32<kAdd>(Compression::kFp32, bytes, out);
    case Compression::kFp16:
    case Compression::kBf16:
      return DecodeHalf<kAdd>(spec.kind, bytes, out);
    case Compression::kInt8:
      return DecodeInt8<kAdd>(spec, bytes, out);
    case Compression::kTopK:
      return DecodeTopK<kAdd>(spec, bytes, out);
    case Compression::kInt8Zstd:
      return DecodeInt8Zstd<kAdd>(spec, bytes, out);
    case Compression::kFp32Zstd:
      return DecodeFp32Zstd<kAdd>(bytes, out);
  }
  return absl::InternalError("codec: unreachable");
}

}  // namespace

std::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kFp32:
      return "fp32";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
    case Compression::kInt8:
      return "int8";
    case Compression::kTopK:
      return "topk";
    case Compression::kInt8Zstd:
      return "int8-zstd";
    case Compression::kFp32Zstd:
      return "fp32-zstd";
  }
  return "unknown";
}

absl::StatusOr<Compression> ParseCompression(std::string_view name) {
  for (Compression c :
       {Compression::kFp32, Compression::kFp16, Compression::kBf16, Compression::kInt8,
        Compression::kTopK, Compression::kInt8Zstd, Compression::kFp32Zstd}) {
    if (name == CompressionName(c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("compression: unknown value '", common::AsAbsl(name),
                   "' (fp32|fp16|bf16|int8|topk|int8-zstd|fp32-zstd)"));
}

absl::Status ValidateCodecSpec(const CodecSpec& spec) {
  if (spec.kind > Compression::kFp32Zstd) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec spec: kind ", static_cast<int>(spec.kind), " is unknown"));
  }
  // Block and top-k fields only matter to the codecs that read them.
  if (HasBlocks(spec.kind)) {
    if (spec.block_elements < 1 || spec.block_elements > 65536) {
      return absl::InvalidArgumentError(absl::StrCat(
          "codec spec: block_elements ", spec.block_elements, " is outside [1, 65536]"));
    }
  }
  if (spec.kind == Compression::kTopK) {
    if (spec.topk_per_block < 1 || spec.topk_per_block > spec.block_elements) {
      return absl::InvalidArgumentError(absl::StrCat("codec spec: topk_per_block ",
                                                     spec.topk_per_block, " is outside [1, ",
                                                     spec.block_elements, "]"));
    }
    if (spec.value_bits < 2 || spec.value_bits > kMaxLevelBits + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("codec spec: value_bits ", spec.value_bits, " is outside [2, 8]"));
    }
  }
  return absl::OkStatus();
}

bool HasFixedSize(Compression kind) {
  return kind != Compression::kInt8Zstd && kind != Compression::kFp32Zstd;
}

bool IsLossless(Compression kind) {
  return kind == Compression::kFp32 || kind == Compression::kFp32Zstd;
}

bool HasBlocks(Compression kind) {
  return kind == Compression::kInt8 || kind == Compression::kInt8Zstd || kind == Compression::kTopK;
}

bool IsEncodedSize(const CodecSpec& spec, size_t elements, size_t bytes) {
  const size_t bound = EncodedSize(spec, elements);
  return HasFixedSize(spec.kind) ? bytes == bound : bytes >= 1 && bytes <= bound;
}

size_t EncodedSize(const CodecSpec& spec, size_t elements) {
  switch (spec.kind) {
    case Compression::kFp32:
      return 4 * elements;
    case Compression::kFp16:
    case Compression::kBf16:
      return 2 * elements;
    case Compression::kInt8:
      return Int8Size(spec, elements);
    case Compression::kInt8Zstd:
      return 1 + Int8Size(spec, elements);
    case Compression::kFp32Zstd:
      return 1 + 4 * elements;
    case Compression::kTopK: {
      const size_t full = elements / spec.block_elements;
      const size_t rest = elements % spec.block_elements;
      return full * TopKBlockBytes(spec, spec.block_elements) +
             (rest > 0 ? TopKBlockBytes(spec, rest) : 0);
    }
  }
  return 0;
}

namespace {

// Encodes into at most EncodedSize(spec, x.size()) bytes at dst (exactly that for fixed-size
// codecs); the spec is valid. Returns the bytes written.
absl::StatusOr<size_t> EncodeValid(const CodecSpec& spec, std::span<const float> x, char* dst) {
  absl::Status status;
  switch (spec.kind) {
    case Compression::kFp32:
      status = EncodeFp32(x, dst);
      break;
    case Compression::kFp16:
    case Compression::kBf16:
      status = EncodeHalf(spec.kind, x, dst);
      break;
    case Compression::kInt8:
      status = EncodeInt8(spec, x, dst);
      break;
    case Compression::kTopK:
      status = EncodeTopK(spec, x, dst);
      break;
    case Compression::kInt8Zstd:
      return EncodeInt8Zstd(spec, x, dst);
    case Compression::kFp32Zstd:
      return EncodeFp32Zstd(x, dst);
  }
  if (!status.ok()) return status;
  return EncodedSize(spec, x.size());
}

}  // namespace

absl::StatusOr<size_t> EncodeInto(const CodecSpec& spec, std::span<const float> x,
                                  std::span<char> out) {
  TS_RETURN_IF_ERROR(ValidateCodecSpec(spec));
  const size_t want = EncodedSize(spec, x.size());
  if (out.size() < want) {
    return absl::InvalidArgumentError(absl::StrCat("encode: output holds ", out.size(),
                                                   " bytes, the encoding of ", x.size(),
                                                   " elements needs ", want));
  }
  return EncodeValid(spec, x, out.data());
}

absl::Status Encode(const CodecSpec& spec, std::span<const float> x, std::string* out) {
  TS_RETURN_IF_ERROR(ValidateCodecSpec(spec));
  const size_t start = out->size();
  out->resize(start + EncodedSize(spec, x.size()));
  absl::StatusOr<size_t> written = EncodeValid(spec, x, out->data() + start);
  // A refused input leaves nothing behind: the caller's buffer is as it was.
  out->resize(written.ok() ? start + *written : start);
  return written.status();
}

absl::Status CheckFinite(std::span<const float> x) {
  for (size_t base = 0; base < x.size(); base += kChunk) {
    const size_t n = std::min(kChunk, x.size() - base);
    if (AnyNonFinite(x.data() + base, n)) {
      return NonFiniteInput(Compression::kFp32, x.data() + base, n, base);
    }
  }
  return absl::OkStatus();
}

absl::Status Decode(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  return DecodeImpl</*kAdd=*/false>(spec, bytes, out);
}

absl::Status DecodeAdd(const CodecSpec& spec, std::string_view bytes, std::span<float> out) {
  return DecodeImpl</*kAdd=*/true>(spec, bytes, out);
}

uint16_t FloatToBf16(float x) { return Bf16FromFloat(x); }

float Bf16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToFp16(float x) { return HalfFromFloat(x); }

float Fp16ToFloat(uint16_t h) { return FloatFromHalf(h); }

ErrorFeedback::ErrorFeedback(size_t elements, float decay)
    : decay_(decay), residual_(elements, 0.0f), scratch_(elements, 0.0f) {
  TS_CHECK(decay >= 0.0f && decay <= 1.0f);
}

absl::Status ErrorFeedback::Compress(const CodecSpec& spec, std::span<const float> x,
                                     std::string* out) {
  if (x.size() != residual_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback: input has ", x.size(),
                                                   " elements, expected ", residual_.size()));
  }
  const size_t n = x.size();
  const float decay = decay_;
  float* __restrict e = residual_.data();
  float* __restrict s = scratch_.data();
  const float* __restrict in = x.data();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) s[i + j] = decay * e[i + j] + in[i + j];
  }
  for (; i < n; ++i) s[i] = decay * e[i] + in[i];
  const size_t start = out->size();
  // On a refused input the residual is untouched (Encode leaves *out as it was).
  TS_RETURN_IF_ERROR(Encode(spec, scratch_, out));
  // Decoding our own encoding cannot fail; the residual is what the wire did not carry.
  const absl::Status decoded =
      Decode(spec, std::string_view(out->data() + start, out->size() - start), residual_);
  TS_CHECK(decoded.ok());
  for (i = 0; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) e[i + j] = s[i + j] - e[i + j];
  }
  for (; i < n; ++i) e[i] = s[i] - e[i];
  return absl::OkStatus();
}

}  // namespace ts::sidecar
