// The transposed passes of the bf16 Newton–Schulz iterations (newton_schulz_bf16.cpp) for tall
// matrices, by tiles on LibTorch's threads (compiled with OpenMP: CMakeLists.txt).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "bf16_rounding.h"
#include "transpose_bf16.h"

namespace muon::detail {

// W16 (k×m) ← the bf16 rounding of (G·scale)ᵀ for the m×k fp32 G, and copy ← G·scale where
// given (G's layout), by 32×32 tiles through a local buffer: the reads run along G's rows and the
// writes along W16's.
void round_transposed(const at::Tensor& G, double scale, float* copy, const at::Tensor& W16) {
  constexpr int64_t kTile = 32;
  const int64_t m = G.size(0), k = G.size(1);
  const auto* x = G.data_ptr<float>();
  auto* w = W16.data_ptr<at::BFloat16>();
  at::parallel_for(0, (m + kTile - 1) / kTile, 1, [&](int64_t begin, int64_t end) {
    at::BFloat16 tile[kTile][kTile];
    for (int64_t i0 = begin * kTile; i0 < std::min(end * kTile, m); i0 += kTile) {
      const int64_t rows = std::min(kTile, m - i0);
      for (int64_t j0 = 0; j0 < k; j0 += kTile) {
        const int64_t cols = std::min(kTile, k - j0);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t at = (i0 + i) * k + j0;
          round_scaled_to_bf16(x + at, scale, copy != nullptr ? copy + at : nullptr, tile[i], cols);
        }
        write_transposed(tile[0], kTile, rows, cols, false, w + j0 * m + i0, m);
      }
    }
  });
}

// X (m×k fp32) ← the transpose of the k×m bf16 W16, widened (exactly), by 32×32 tiles
// transposed through a local buffer: the reads run along W16's rows and the writes along X's.
void widen_transposed(const at::Tensor& W16, const at::Tensor& X) {
  constexpr int64_t kTile = 32;
  const int64_t k = W16.size(0), m = W16.size(1);
  const auto* w = W16.data_ptr<at::BFloat16>();
  auto* x = X.data_ptr<float>();
  at::parallel_for(0, (m + kTile - 1) / kTile, 1, [&](int64_t begin, int64_t end) {
    at::BFloat16 tile[kTile][kTile];
    for (int64_t j0 = begin * kTile; j0 < std::min(end * kTile, m); j0 += kTile) {
      const int64_t rows = std::min(kTile, m - j0);  // of X
      for (int64_t i0 = 0; i0 < k; i0 += kTile) {
        const int64_t cols = std::min(kTile, k - i0);
        write_transposed(w + i0 * m + j0, m, cols, rows, false, tile[0], kTile);
        for (int64_t j = 0; j < rows; ++j) {
          float* row = x + (j0 + j) * k + i0;
          for (int64_t i = 0; i < cols; ++i) row[i] = static_cast<float>(tile[j][i]);
        }
      }
    }
  });
}

}  // namespace muon::detail
