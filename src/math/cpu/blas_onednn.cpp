#include "blas_onednn.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <algorithm>
#include <cstdint>

#include "muon/internal/dnnl.h"
#include "muon/internal/kernel_choice.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "upper_blocks.h"

namespace muon::detail::blas::onednn {
namespace {

// A strided operand, element (i, j) at data[i·rs + j·cs] with rs or cs 1, as sgemm takes it: a
// row-major matrix read as it is (cs 1, rows rs apart) or transposed (rs 1, its rows cs apart).
struct Operand {
  const float* data;
  int64_t rs, cs;

  Operand at(int64_t i, int64_t j) const { return {data + i * rs + j * cs, rs, cs}; }
  Operand t() const { return {data, cs, rs}; }
  bool transposed() const { return cs != 1; }
  // Its leading dimension as an rows×cols operand: where one row or column is all there is, both
  // strides may be 1, and sgemm still wants the row length.
  int64_t ld(int64_t rows, int64_t cols) const {
    return transposed() ? std::max(cs, rows) : std::max(rs, cols);
  }
};

// C (m×n, rows ldc apart) ← a·b.
void product(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
             int64_t ldc) {
  dnnl::sgemm(a.transposed(), b.transposed(), m, n, k, a.data, a.ld(m, k), b.data, b.ld(k, n), c,
              std::max(ldc, n));
}

// C's upper triangle (k×k, row-major) ← a·b for k×n a and n×k b whose product is symmetric, by
// the row blocks of upper_blocks.h: block i0 is a's rows i0 .. i0 + kFp32BlockRows times b's
// columns i0 .. k.
void upper(const Operand& a, const Operand& b, int64_t k, int64_t n, float* C) {
  for_each_upper_block(k, kFp32BlockRows, /*deal=*/true, [&](int64_t i0) {
    const int64_t rows = std::min(kFp32BlockRows, k - i0);
    product(rows, k - i0, n, a.at(i0, 0), b.at(0, i0), C + i0 * k + i0, k);
  });
}

struct Choice {
  bool chosen;
  std::string description;
};

const Choice& choice() {
  static const Choice c = [] {
    if (!dnnl::available()) return Choice{false, "no oneDNN in this build"};
    if (fp32_family(cpu_features()) != VectorFamily::avx512) {
      return Choice{false, "its sgemm outran BLIS on AVX-512 CPUs only"};
    }
    const auto ours = dnnl::version(), theirs = at::get_mkldnn_version();
    if (release_of(theirs) != release_of(ours)) {
      return Choice{false, "LibTorch bundles another oneDNN (" + theirs + "), whose symbols would "
                           "take the place of " + ours + "'s own"};
    }
    return Choice{true, ours + "'s sgemm (LibTorch's oneDNN too)"};
  }();
  return c;
}

}  // namespace

bool chosen() {
  return choice().chosen;
}

std::string description() {
  return choice().description;
}

void gram_upper(const float* W, const Panel& p, float* A) {
  const Operand w{W, p.rs, p.cs};
  upper(w, w.t(), p.k, p.m, A);
}

void square_upper(const float* A, float* C, int k) {
  const Operand a{A, k, 1};
  upper(a, a.t(), k, k, C);
}

void product_upper(const float* A, const float* B, float* C, int k) {
  upper({A, k, 1}, {B, k, 1}, k, k, C);
}

// By parts of B's columns, one per thread, each product on its thread's core (as the library's
// own products, blas.cpp); a product under ~2 MFLOP on one thread. A column-major panel (a tall
// matrix read as its transpose) as Cᵀ = Bᵀ·Rᵀ, whose rows are C's columns.
void gemm_left(const float* R, const float* B, const Panel& p, float* C) {
  const bool small = 2.0 * p.k * p.k * p.m < 2e6;
  const Operand r{R, p.k, 1}, b{B, p.rs, p.cs};
  at::parallel_for(0, p.m, small ? p.m : 16, [&](int64_t j0, int64_t j1) {
    if (!b.transposed()) {
      product(p.k, j1 - j0, p.k, r, b.at(0, j0), C + j0, p.rs);
    } else {
      product(j1 - j0, p.k, p.k, b.at(0, j0).t(), r.t(), C + j0 * p.cs, p.cs);
    }
  });
}

}  // namespace muon::detail::blas::onednn
