// Compression of fp32 vectors for the collective's wire: none (fp32), fp32 with its high bytes
// entropy-coded (fp32-zstd, lossless), fp16, bf16, int8 with a per-block scale, int8 followed by a
// lossless entropy stage (zstd), and top-k per block with low-bit values (SparseLoCo-style) plus
// the error feedback that makes top-k converge. The byte layouts are in docs/collective.md
// ("Codecs"); the decoders read bytes from peers and refuse anything malformed with
// INVALID_ARGUMENT naming the field and the value, never reading out of bounds.
//
// Error bounds (|decoded − x| per element, for finite x; tested in codec_test.cc):
//   kFp32, kFp32Zstd  exact (the same bits).
//   kFp16   ≤ 2^-11 · |x| for 2^-14 ≤ |x| ≤ 65504 (round to nearest even); ≤ 2^-25 below
//           (subnormals); |x| > 65504 saturates to ±65504 — the encoder refuses such input
//           (OUT_OF_RANGE) instead of silently clipping.
//   kBf16   ≤ 2^-8 · |x| for |x| ≥ 2^-126 (round to nearest even; fp32's exponent range); ≤ 2^-134
//           below (fp32 subnormals); |x| ≥ 2^128 · (1 − 2^-9) ≈ 3.39618e38 would round to Inf and
//           is refused (OUT_OF_RANGE).
//   kInt8   ≤ s / 2 where s = max|x| over the element's block / 127 (symmetric, round to nearest),
//           plus fp32 rounding of at most s · 2^-16, for a normal s (max|x| ≥ 127 · 2^-126).
//   kInt8Zstd  the same as kInt8: the entropy stage is lossless.
//   kTopK   kept elements (the top k of each block by |x|): ≤ m / 2^(value_bits) where m is the
//           largest |x| kept in the block, plus fp32 rounding of at most m · 2^-23; dropped
//           elements decode to 0 (their error is what the ErrorFeedback carries to the next
//           round).
// Non-finite input (NaN, ±Inf) is refused by every encoder with INVALID_ARGUMENT naming the
// index, since one NaN would poison every participant's sum.
//
// Dense codecs (all but kTopK) are "ring-compatible": a partial sum can be decoded, added to and
// re-encoded at every hop of a ring. kTopK is not: its contributions are all-gathered.
//
// Every codec but the two zstd ones has one encoded size per element count (EncodedSize). Theirs
// depends on the values: a mode byte, then either the bytes of the codec without its entropy
// stage as they are (mode 0, when zstd would not make them smaller) or a compressed form (mode
// 1) — kInt8Zstd: one zstd frame of kInt8's bytes; kFp32Zstd: the low three bytes of every value
// as they are, then one zstd frame of the values' high bytes (sign and exponent), which is where
// fp32 gradients and weights are redundant. EncodedSize is their bound. Their decoders refuse a
// frame that would decompress to any other size than the one the element count gives before
// decompressing anything, so a peer cannot make them allocate or work more than an uncompressed
// payload would.
//
// Thread-safety: free functions are thread-safe (pure but for the zstd codecs' contexts and
// buffer, which are per thread); ErrorFeedback has one owner.
#ifndef TS_SIDECAR_COLLECTIVE_CODEC_H_
#define TS_SIDECAR_COLLECTIVE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ts::sidecar {

enum class Compression : uint8_t {
  kFp32 = 0,
  kFp16 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kTopK = 4,
  kInt8Zstd = 5,
  kFp32Zstd = 6,
};

// "fp32", "fp16", "bf16", "int8", "topk", "int8-zstd", "fp32-zstd".
std::string_view CompressionName(Compression c);
// INVALID_ARGUMENT "compression: unknown value '<name>' (fp32|fp16|bf16|int8|topk|int8-zstd|
// fp32-zstd)".
absl::StatusOr<Compression> ParseCompression(std::string_view name);

struct CodecSpec {
  Compression kind = Compression::kFp32;
  // Elements per block for kInt8 and kInt8Zstd (one fp32 scale each) and kTopK (one scale,
  // topk_per_block indices and values each). 1..65536.
  uint32_t block_elements = 4096;
  // kTopK: elements kept per block, 1..block_elements (64 of 4096 = 1.56 %).
  uint32_t topk_per_block = 64;
  // kTopK: bits per kept value including its sign, 2..8.
  uint32_t value_bits = 2;
};

// INVALID_ARGUMENT naming the field and value when a spec is out of the ranges above.
absl::Status ValidateCodecSpec(const CodecSpec& spec);

// Whether every encoding of `elements` values has the same size (all kinds but the two zstd
// ones).
bool HasFixedSize(Compression kind);
// Whether decoding gives back exactly the encoded values (kFp32, kFp32Zstd).
bool IsLossless(Compression kind);
// Whether the codec reads CodecSpec::block_elements (kInt8, kInt8Zstd, kTopK).
bool HasBlocks(Compression kind);
// The size in bytes of Encode(spec, x) for x.size() == elements: exact for fixed-size codecs, the
// largest possible for the zstd codecs (the spec must be valid).
size_t EncodedSize(const CodecSpec& spec, size_t elements);
// Whether `bytes` is a possible encoded size of `elements` values: EncodedSize for fixed-size
// codecs, 1 to EncodedSize for the zstd codecs.
bool IsEncodedSize(const CodecSpec& spec, size_t elements, size_t bytes);

// Appends the encoding of `x` to `*out`. Errors: INVALID_ARGUMENT (bad spec, non-finite input
// naming the index), OUT_OF_RANGE (fp16 overflow naming the index and value).
absl::Status Encode(const CodecSpec& spec, std::span<const float> x, std::string* out);
// The same into `out`, which must hold at least EncodedSize(spec, x.size()) bytes
// (INVALID_ARGUMENT naming both sizes otherwise); returns the bytes written (the whole bound but
// for the zstd codecs). On error the contents of `out` are unspecified.
absl::StatusOr<size_t> EncodeInto(const CodecSpec& spec, std::span<const float> x,
                                  std::span<char> out);
// What Encode refuses for fp32: INVALID_ARGUMENT naming the first Inf or NaN. For a sender
// that passes fp32 values on the wire as they are, without a copy.
absl::Status CheckFinite(std::span<const float> x);

// Decodes `bytes` (exactly EncodedSize(spec, out.size()) long; for the zstd codecs at most that)
// into `out`, overwriting it. INVALID_ARGUMENT when the size differs (naming both), a zstd
// codec's mode is unknown or its zstd frame is damaged or records another content size, an
// fp32/fp16/bf16 element is Inf or NaN, a scale is negative or not finite (int8: or 127 · scale
// overflows), an int8 value is −128, a top-k index is out of its block, indices within a block
// are not strictly increasing, or top-k padding bits are not zero — anything an encoder never
// writes, so every decoded value is finite and an encoding is canonical (for the zstd codecs:
// what their frames decompress to is; zstd frames are not).
absl::Status Decode(const CodecSpec& spec, std::string_view bytes, std::span<float> out);

// Decodes and adds: out[i] += decoded[i]. Same errors as Decode; on error `out` may be partly
// updated (callers discard it: an operation that fails never yields a result).
absl::Status DecodeAdd(const CodecSpec& spec, std::string_view bytes, std::span<float> out);

// fp32 <-> bf16 / fp16 conversion, round to nearest even (exposed for bf16 buffers).
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToFp16(float x);  // saturates to ±65504 (callers check range first)
float Fp16ToFloat(uint16_t h);

// Error feedback for lossy codecs (SparseLoCo / EF-SGD): the residual of what compression
// dropped is added to the next round's input, optionally decayed.
//   e ← decay · e + x;  c ← Encode(e);  e ← e − Decode(c)
// so the accumulated error stays bounded by what one round's compression can drop.
class ErrorFeedback {
 public:
  // `decay` in [0, 1]; SparseLoCo uses 0.95 for top-k. Elements fixed at construction.
  ErrorFeedback(size_t elements, float decay);

  // Compresses x + residual; appends the encoding to *out and updates the residual. Errors as
  // Encode plus INVALID_ARGUMENT when x.size() differs from the constructed size.
  absl::Status Compress(const CodecSpec& spec, std::span<const float> x, std::string* out);

  std::span<const float> residual() const { return residual_; }

 private:
  float decay_;
  std::vector<float> residual_;
  std::vector<float> scratch_;
};

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_COLLECTIVE_CODEC_H_
