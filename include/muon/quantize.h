// 8-bit block-quantized optimizer state (docs/algorithms.md §8-bit state; the block-wise scheme of
// Dettmers et al., arXiv 2110.02861: per-block absmax, a 256-entry map, small tensors kept whole).
//
// A state tensor of a parameter with at least kMinElements elements and two or more dimensions is
// stored as one byte per element (its code) and one fp32 scale per block, the block's absmax:
// x = (absmax / 1.875) · v(code), v the code's value in its format (at most 1.875).
// Blocks are kBlock consecutive elements of one row (a slice along dim 0; a row's last block may
// be shorter), so that a shard of whole rows — FSDP2's Shard(0) — holds whole blocks and the bits
// do not depend on the world size.
//
// The maps are small floating-point formats scaled so that the largest entry is 1, which makes
// quantizing a rounding of the float's bits instead of a search over the map (docs: why these
// maps): the signed map (momentum, first moments) is a sign and an E4M3 magnitude (16 binades,
// 3 mantissa bits, smallest step 2⁻¹⁷/1.875), the unsigned map (second moments) an E5M3 magnitude
// (32 binades: a second moment spans the square of the gradients' range).
//
// Codes are the format value nearest y = x·(1.875 / absmax) (fp32 products, ties to the even code);
// a block whose absmax is below the smallest normal float (1.2e-38), zero included, is stored as
// zeros. NaN in a block makes its absmax NaN, so the whole block decodes to NaN.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace muon::q8 {

// Elements per block: the absmax costs 4/256 = 0.016 bytes per element (docs: the block size).
constexpr int64_t kBlock = 256;
// Tensors with fewer elements keep full-precision state (bitsandbytes' threshold).
constexpr int64_t kMinElements = 4096;

enum class CodeMap {
  signed_e4m3,    // momentum and first moments: codes 0–127 ≥ 0, 128–255 the negatives (128: −0)
  unsigned_e5m3,  // second moments: codes 0–255, all ≥ 0
};

// The largest magnitude of both formats before scaling: (1 + 7/8)·2⁰.
constexpr float kTop = 1.875f;

// Whether a parameter of shape `sizes` keeps 8-bit state when asked for it: at least kMinElements
// elements in two or more dimensions (a 1-D tensor's rows would be single elements).
bool quantizes(at::IntArrayRef sizes);

// Rows, elements per row and blocks per row of a state of shape `sizes` (rank ≥ 1).
struct BlockRows {
  int64_t rows, length, blocks;
};
BlockRows block_rows(at::IntArrayRef sizes);

// Calls f(block, first element, element count) for every block of a state of shape `sizes`
// (blocks numbered row by row, as absmax holds them), the blocks dealt to LibTorch's threads: each
// block is coded alone, so the bits do not depend on the thread count.
template <class F>
void for_each_block(at::IntArrayRef sizes, F&& f) {
  const auto rows = block_rows(sizes);
  at::parallel_for(0, rows.rows * rows.blocks, 128, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = (b % rows.blocks) * kBlock;
      f(b, (b / rows.blocks) * rows.length + start, std::min(kBlock, rows.length - start));
    }
  });
}

// The absmax tensor's shape for a state of shape `sizes`: {rows, blocks per row}.
std::vector<int64_t> absmax_shape(at::IntArrayRef sizes);

// v(code): the code's value in its format (exact in fp32; ±1.875 at most).
float format_value(CodeMap map, uint8_t code);
// The 256 values as an fp32 tensor on `device`.
at::Tensor format_table(CodeMap map, at::Device device);

namespace detail {

struct Format {
  int bias;             // exponent bias: the top binade is [1, 2)
  uint32_t top_code;    // the magnitude code of kTop
  float min_normal;     // 2^(1 − bias)
  float magic;          // 2^(24 − bias − 3): adding it rounds to the format's subnormal step
};
inline constexpr Format kSignedFormat{15, 127, 0x1p-14f, 0x1p6f};
inline constexpr Format kUnsignedFormat{31, 255, 0x1p-30f, 0x1p-10f};

inline uint32_t bits_of(float x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

inline float from_bits(uint32_t b) {
  float x = 0;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// The value of magnitude code `code` (exponent code >> 3, mantissa code & 7): fp32's own exponent
// and mantissa fields for a normal one; a subnormal one, m · 2^(1 − bias − 3), is the normal
// 2^(1 − bias)·(1 + m/8) less 2^(1 − bias), an exact subtraction. (Multiplying the fields by a
// power of two would be shorter, but a subnormal fp32 operand costs a microcode assist on Intel.)
template <const Format& F>
inline float magnitude_value(uint32_t code) {
  const bool subnormal = code < 8u;
  const uint32_t exponent_bias = static_cast<uint32_t>(127 - F.bias) + (subnormal ? 1u : 0u);
  return from_bits((code << 20) + (exponent_bias << 23)) - (subnormal ? F.min_normal : 0.0f);
}

// The magnitude code nearest m = |y| (m ≥ 0, or NaN: the top code), ties to even: for a normal
// m, fp32's exponent and top 3 mantissa bits rounded to nearest even; below the format's smallest
// normal, m + magic rounds m to the subnormal step in one fp32 addition. Masks, not branches or
// selects, and the format a constant: the loops over it vectorize.
template <const Format& F>
inline uint32_t magnitude_code(float m) {
  const uint32_t bits = bits_of(m);
  const uint32_t normal = ((bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20) -
                          (static_cast<uint32_t>(127 - F.bias) << 3);
  const uint32_t subnormal = bits_of(m + F.magic) - bits_of(F.magic);
  const uint32_t below = 0u - static_cast<uint32_t>(m < F.min_normal);  // all ones: subnormal
  return std::min((subnormal & below) | (normal & ~below), F.top_code);
}

// The codes and values of both maps on codes held in 32-bit integers (0–255). A loop that computes
// codes and stores them as bytes gets its integer steps narrowed to bytes by GCC, which costs more
// shuffles than it saves (an 8-bit AdamW step 12% slower, measured): computing the codes into
// uint32_t and narrowing them in a loop of their own keeps the steps in 32-bit lanes.
inline uint32_t signed_code32(float y) {
  const uint32_t sign = (bits_of(y) >> 24) & 0x80u;
  return sign | magnitude_code<kSignedFormat>(std::fabs(y));
}

inline uint32_t unsigned_code32(float y) {
  return magnitude_code<kUnsignedFormat>(std::fabs(y));
}

inline float signed_value32(uint32_t code) {
  return from_bits(((code & 0x80u) << 24) | bits_of(magnitude_value<kSignedFormat>(code & 0x7Fu)));
}

inline float unsigned_value32(uint32_t code) {
  return magnitude_value<kUnsignedFormat>(code);
}

}  // namespace detail

// The code of y = x·(1.875/absmax) in the signed map.
inline uint8_t signed_code(float y) {
  return static_cast<uint8_t>(detail::signed_code32(y));
}

// The code of y in the unsigned map (its magnitude: second moments are ≥ 0).
inline uint8_t unsigned_code(float y) {
  return static_cast<uint8_t>(detail::unsigned_code32(y));
}

// v(code) in the signed format: code 128 is −0.
inline float signed_value(uint8_t code) {
  return detail::signed_value32(code);
}

// v(code) in the unsigned format.
inline float unsigned_value(uint8_t code) {
  return detail::unsigned_value32(code);
}

// The scale a block of absolute maximum `absmax` stores: 0 below the smallest normal float, one
// quiet NaN for every NaN, else absmax.
inline float stored_absmax(float absmax) {
  if (absmax != absmax) return std::numeric_limits<float>::quiet_NaN();
  return absmax < std::numeric_limits<float>::min() ? 0.0f : absmax;
}

// The factor codes are taken of: 1.875/absmax, 0 for a zero absmax.
inline float code_factor(float stored) {
  return stored == 0.0f ? 0.0f : kTop / stored;
}

// The factor a block's codes decode with: absmax / 1.875 (one fp32 division per block).
inline float decode_step(float absmax) {
  return absmax / kTop;
}

// The fp32 tensor `codes` (uint8) and `absmax` stand for, of codes' shape, on their device.
at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& absmax, CodeMap map);

// Writes x (floating point, any dtype, rounded to fp32 first) into `codes` (uint8, x's shape,
// contiguous) and `absmax` (fp32, absmax_shape(x)): the block loop on CPU, quantize_generic
// elsewhere.
void quantize(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map);

// The same bits from ATen operations alone, on any device (the form tested against the CPU one).
void quantize_generic(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map);

}  // namespace muon::q8
