// The element passes of the bf16 Newton–Schulz iterations (newton_schulz_bf16.cpp): fp32 values
// rounded to bf16 and the sums of squares that normalize its input. Where the CPU has AVX512_BF16
// — every CPU whose bf16 products these iterations run on — they run on its conversion
// instruction, 16 values at a time; the portable loops (SSE2 at most) took a third of the
// iterations' time outside the products.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace muon::detail {

// out[j] ← v rounded to bf16 (nearest even) and, where `copy` is given, copy[j] ← v, for
// v = in[j]·scale formed in double and rounded to fp32: any scale is exact short of fp32's range,
// and inputs a power of two apart give the same bits. With AVX512_BF16 an fp32 subnormal (below
// 2⁻¹²⁶) rounds to zero: the instruction flushes them.
void round_scaled_to_bf16(const float* in, double scale, float* copy, at::BFloat16* out, int64_t n);

// out[j] ← in[j] rounded to bf16, to nearest even.
inline void round_to_bf16(const float* in, at::BFloat16* out, int64_t n) {
  round_scaled_to_bf16(in, 1.0, nullptr, out, n);
}

// Σ x[j]² over n values, in double — where an fp32 square neither overflows nor underflows — and
// in fixed pieces summed in order, so the same for every thread count. Threads over the pieces.
double sum_of_squares(const float* x, int64_t n);

}  // namespace muon::detail
