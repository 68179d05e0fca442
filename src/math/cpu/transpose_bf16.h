// Transposes of 16-bit (bf16) tiles for the bf16 Newton–Schulz passes (newton_schulz_bf16.cpp):
// the mirror writes of its symmetric fills and its transposed rounding of tall matrices.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace muon::detail {

// dst ← the transpose of the 8×8 block of 16-bit values at src (rows `src_stride` elements apart;
// dst's rows `dst_stride` apart): in SSE2 registers by three rounds of interleaving (16-, 32-, then
// 64-bit), where an element at a time made the mirror writes half of a symmetric fill's time.
inline void transpose_8x8(const uint16_t* src, int64_t src_stride, uint16_t* dst,
                          int64_t dst_stride) {
#if defined(__SSE2__)
  __m128i r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
  }
  for (int i = 0; i < 4; ++i) {  // a[2i] = r0 r1 interleaved: 00 10 01 11 02 12 03 13 for i = 0
    a[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // b[4h] = 00 10 20 30 01 11 21 31 for h = 0
    for (int i = 0; i < 2; ++i) {
      b[4 * h + 2 * i] = _mm_unpacklo_epi32(a[4 * h + i], a[4 * h + i + 2]);
      b[4 * h + 2 * i + 1] = _mm_unpackhi_epi32(a[4 * h + i], a[4 * h + i + 2]);
    }
  }
  for (int j = 0; j < 4; ++j) {  // column 2j, then 2j + 1: the first four rows, then the last four
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * j * dst_stride),
                     _mm_unpacklo_epi64(b[j], b[j + 4]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * j + 1) * dst_stride),
                     _mm_unpackhi_epi64(b[j], b[j + 4]));
  }
#else
  for (int64_t j = 0; j < 8; ++j) {
    for (int64_t i = 0; i < 8; ++i) dst[j * dst_stride + i] = src[i * src_stride + j];
  }
#endif
}

// dst(j, i) ← tile(i, j) for i < rows and j < cols — only for i < j when `above_diagonal` — where
// the tile's rows are `tile_stride` elements apart and dst's `dst_stride`: by 8×8 blocks, an
// element at a time only along the edges and the diagonal.
inline void write_transposed(const at::BFloat16* tile, int64_t tile_stride, int64_t rows,
                             int64_t cols, bool above_diagonal, at::BFloat16* dst,
                             int64_t dst_stride) {
  const auto* t = reinterpret_cast<const uint16_t*>(tile);
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t jb = 0; jb < cols; jb += 8) {
    for (int64_t ib = 0; ib < rows; ib += 8) {
      if (above_diagonal && ib >= jb + 8) break;  // this block and the ones under it: i > j
      if (ib + 8 <= rows && jb + 8 <= cols && (!above_diagonal || ib + 8 <= jb)) {
        transpose_8x8(t + ib * tile_stride + jb, tile_stride, d + jb * dst_stride + ib, dst_stride);
        continue;
      }
      for (int64_t j = jb; j < std::min(jb + 8, cols); ++j) {
        const int64_t end = std::min(ib + 8, above_diagonal ? std::min(j, rows) : rows);
        for (int64_t i = ib; i < end; ++i) d[j * dst_stride + i] = t[i * tile_stride + j];
      }
    }
  }
}

// W16 (k×m) ← the bf16 rounding of (G·scale)ᵀ for the m×k fp32 G, and copy ← G·scale where
// given (G's layout). (transpose_bf16.cpp)
void round_transposed(const at::Tensor& G, double scale, float* copy, const at::Tensor& W16);

// X (m×k fp32) ← the transpose of the k×m bf16 W16, widened (exactly). (transpose_bf16.cpp)
void widen_transposed(const at::Tensor& W16, const at::Tensor& X);

}  // namespace muon::detail
