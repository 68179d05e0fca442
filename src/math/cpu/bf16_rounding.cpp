#include "bf16_rounding.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "muon/internal/kernel_choice.h"
#include "muon/stochastic_rounding.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MUON_AVX512_BF16 1
#define MUON_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define MUON_AVX512_BF16 0
#endif

namespace muon::detail {
namespace {

bool use_avx512_bf16() {
#if MUON_AVX512_BF16
  static const bool use =
      cpu_features().avx512_bf16 && cpu_features().avx512bw && cpu_features().avx512vl;
  return use;
#else
  return false;
#endif
}

void round_scaled_portable(const float* in, double scale, float* copy, at::BFloat16* out,
                           int64_t n) {
  if (scale == 1.0 && copy == nullptr) {  // a loop the compiler vectorizes
    for (int64_t j = 0; j < n; ++j) out[j].x = sr::nearest_bits(in[j]);
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const auto v = static_cast<float>(static_cast<double>(in[j]) * scale);
    if (copy != nullptr) copy[j] = v;
    out[j].x = sr::nearest_bits(v);
  }
}

double sum_of_squares_portable(const float* x, int64_t n) {
  double lanes[8] = {};  // independent sums: a loop the compiler can vectorize
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(x[j + l]) * x[j + l];
  }
  for (; j < n; ++j) lanes[j % 8] += static_cast<double>(x[j]) * x[j];
  double sum = 0;
  for (const double l : lanes) sum += l;
  return sum;
}

#if MUON_AVX512_BF16
// GCC 12 warns of the "undefined" source operand inside its own AVX-512 conversion intrinsics
// (GCC bug 105593, fixed in 13).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// The 16 fp32 values of v as two halves of 8 doubles.
MUON_TARGET_AVX512_BF16 inline __m512d low_half(__m512 v) {
  return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}
MUON_TARGET_AVX512_BF16 inline __m512d high_half(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

MUON_TARGET_AVX512_BF16 void round_scaled_avx512(const float* in, double scale, float* copy,
                                                 at::BFloat16* out, int64_t n) {
  const __m512d s = _mm512_set1_pd(scale);
  const bool scaled = scale != 1.0;
  for (int64_t j = 0; j < n; j += 16) {
    const auto mask = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(mask, in + j);
    if (scaled) {
      const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(low_half(v), s));
      const __m256 hi = _mm512_cvtpd_ps(_mm512_mul_pd(high_half(v), s));
      v = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                              _mm256_castps_pd(hi), 1));
    }
    if (copy != nullptr) _mm512_mask_storeu_ps(copy + j, mask, v);
    const __m256bh rounded = _mm512_cvtneps_pbh(v);
    _mm256_mask_storeu_epi16(out + j, mask, reinterpret_cast<const __m256i&>(rounded));
  }
}

MUON_TARGET_AVX512_BF16 double sum_of_squares_avx512(const float* x, int64_t n) {
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    const auto mask = static_cast<__mmask16>(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + j);
    low = _mm512_fmadd_pd(low_half(v), low_half(v), low);
    high = _mm512_fmadd_pd(high_half(v), high_half(v), high);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(low, high));
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

void round_scaled_to_bf16(const float* in, double scale, float* copy, at::BFloat16* out,
                          int64_t n) {
#if MUON_AVX512_BF16
  if (use_avx512_bf16()) return round_scaled_avx512(in, scale, copy, out, n);
#endif
  round_scaled_portable(in, scale, copy, out, n);
}

double sum_of_squares(const float* x, int64_t n) {
  // At most 64 pieces of at least 2¹⁶ values: their sizes depend on n alone.
  constexpr int64_t kMaxPieces = 64, kMinPiece = int64_t{1} << 16;
  const int64_t piece = std::max(kMinPiece, (n + kMaxPieces - 1) / kMaxPieces);
  const int64_t pieces = (n + piece - 1) / piece;
  double partial[kMaxPieces] = {};
  at::parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t count = std::min(piece, n - p * piece);
#if MUON_AVX512_BF16
      if (use_avx512_bf16()) {
        partial[p] = sum_of_squares_avx512(x + p * piece, count);
        continue;
      }
#endif
      partial[p] = sum_of_squares_portable(x + p * piece, count);
    }
  });
  double sum = 0;
  for (int64_t p = 0; p < pieces; ++p) sum += partial[p];
  return sum;
}

}  // namespace muon::detail
