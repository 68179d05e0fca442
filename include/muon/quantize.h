// 8-bit block-quantized optimizer state (docs/algorithms.md §8-bit state; the block-wise scheme of
// Dettmers et al., arXiv 2110.02861: per-block absmax, a 256-entry map, small tensors kept whole).
//
// A state tensor of a parameter with at least kMinElements elements and two or more dimensions is
// stored as one byte per element (its code) and one fp32 scale per block: x = absmax · map[code].
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
// Codes are the map entry nearest y = x·(1.875 / absmax) (fp32 products, ties to the even code);
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

// map[code] as fp32: the format's value of `code` divided by kTop (correctly rounded).
float map_value(CodeMap map, uint8_t code);
// The 256 entries as an fp32 tensor on `device`.
at::Tensor map_table(CodeMap map, at::Device device);

namespace detail {

struct Format {
  int bias;           // exponent bias: the top binade is [1, 2)
  uint32_t top_code;  // the magnitude code of kTop
  float min_normal;   // 2^(1 − bias)
  float magic;        // 2^(24 − bias − 3): adding it rounds to the format's subnormal step
};
constexpr Format kSignedFormat{15, 127, 0x1p-14f, 0x1p6f};
constexpr Format kUnsignedFormat{31, 255, 0x1p-30f, 0x1p-10f};

inline uint32_t bits_of(float x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The magnitude code nearest m = |y| (m ≥ 0, or NaN: the top code), ties to even: for a normal
// m, fp32's exponent and top 3 mantissa bits rounded to nearest even; below the format's smallest
// normal, m + magic rounds m to the subnormal step in one fp32 addition. (Selects, not branches:
// the loops over it vectorize.)
inline uint32_t magnitude_code(float m, const Format& f) {
  const uint32_t bits = bits_of(m);
  const uint32_t normal = ((bits + 0x7FFFFu + ((bits >> 20) & 1u)) >> 20) -
                          (static_cast<uint32_t>(127 - f.bias) << 3);
  const uint32_t subnormal = bits_of(m + f.magic) - bits_of(f.magic);
  const uint32_t code = m < f.min_normal ? subnormal : normal;
  return code < f.top_code ? code : f.top_code;
}

}  // namespace detail

// The code of y = x·(1.875/absmax) in the signed map.
inline uint8_t signed_code(float y) {
  const uint32_t sign = (detail::bits_of(y) >> 24) & 0x80u;
  return static_cast<uint8_t>(sign | detail::magnitude_code(std::fabs(y), detail::kSignedFormat));
}

// The code of y in the unsigned map (its magnitude: second moments are ≥ 0).
inline uint8_t unsigned_code(float y) {
  return static_cast<uint8_t>(detail::magnitude_code(std::fabs(y), detail::kUnsignedFormat));
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

// Decodes `n` codes of one block into fp32: out[i] = absmax · map[codes[i]].
void decode_block(CodeMap map, const uint8_t* codes, float absmax, float* out, int64_t n);
// Encodes `n` fp32 values as one block: writes their codes and returns the stored absmax.
float encode_block(CodeMap map, const float* x, uint8_t* codes, int64_t n);

// The fp32 tensor `codes` (uint8) and `absmax` stand for, of codes' shape, on their device.
at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& absmax, CodeMap map);

// Writes x (floating point, any dtype, rounded to fp32 first) into `codes` (uint8, x's shape,
// contiguous) and `absmax` (fp32, absmax_shape(x)): the block loop on CPU, quantize_generic
// elsewhere.
void quantize(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map);

// The same bits from ATen operations alone, on any device (the form tested against the CPU one).
void quantize_generic(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map);

}  // namespace muon::q8
