#include "newton_schulz_blas.h"

#include <algorithm>
#include <utility>

#include "muon/internal/blas.h"
#include "muon/error.h"
#include "upper_blocks.h"

namespace muon::detail {

bool have_blas() {
  return blas::available();
}

namespace {

// FLOPs of one triangle of a symmetric k×k product with inner dimension n: row blocks compute
// their diagonal blocks whole, BLIS's and a CBLAS's syrk one triangle.
double triangle_flops(double k, double n, int64_t block_rows) {
  if (block_rows == 0) return k * k * n;
  return 2 * n * static_cast<double>(upper_block_elements(static_cast<int64_t>(k), block_rows));
}

}  // namespace

double symmetric_flops(double k, double m, int64_t steps, int64_t block_rows) {
  const double iteration =
      triangle_flops(k, m, block_rows) + triangle_flops(k, k, block_rows) + 2 * k * k * m;
  return static_cast<double>(steps) * iteration;
}

// Follows gram_one()'s schedule step by step.
double gram_flops(double k, double m, int64_t steps, const std::vector<int64_t>& restarts,
                  int64_t block_rows) {
  const double syrk_w = triangle_flops(k, m, block_rows), product_w = 2 * k * k * m;
  const double syrk_a = triangle_flops(k, k, block_rows);
  const double product_a = block_rows > 0 ? syrk_a : blas::product_upper_flops(k);
  double flops = syrk_w;
  bool fresh = true;
  for (int64_t done = 1; done <= steps; ++done) {
    flops += syrk_a + (fresh ? 0 : product_a);
    fresh = false;
    if (done == steps) break;
    if (std::binary_search(restarts.begin(), restarts.end(), done)) {
      flops += product_w + syrk_w;
      fresh = true;
    } else {
      flops += syrk_a + product_a;
    }
  }
  return flops + product_w;
}

namespace {

using blas::Panel;

// Every k×k matrix below is symmetric, kept row-major: where only one triangle is computed it is
// the upper one in memory (a[i·k + j], j ≥ i), and mirror() copies it to the lower one.

// One matrix of the batch seen on its smaller side, k×m: a row-major rows×cols block as it is
// (rows ≤ cols), or read as its transpose (rows > cols) — no copies.
Panel panel_of(int64_t rows, int64_t cols) {
  if (rows <= cols) return {static_cast<int>(rows), static_cast<int>(cols), cols, 1};
  return {static_cast<int>(cols), static_cast<int>(rows), 1, cols};
}

// Asks for the first 32 elements of `rows` rows (leading dimension ld) from `first` on to be
// brought into cache for writing. The mirror's writes go down a column of tiles, one row (a
// different page) per 32 elements, which the hardware prefetchers do not follow: without this
// the transposes waited on memory (a 1024² fp32 mirror on two threads 0.65 → 0.38 ms).
template <class T>
void prefetch_for_writing(T* first, int ld, int rows) {
  constexpr int kLine = 64 / sizeof(T);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < 32; j += kLine) {
      __builtin_prefetch(first + static_cast<size_t>(r) * ld + j, /*for writing*/ 1);
    }
  }
}

// Copies the upper triangle of the row-major k×k `a` to the lower one, first calling
// visit_row(i) for each row i of the 32-row tile row being mirrored, so that a pass over the upper
// triangle's rows (i, i .. k) runs while they are in cache. Transposes 32×32 tiles through a local
// buffer so that both the reads and the writes run along rows: writing a column of a
// power-of-two-wide matrix directly hits one cache set (4× slower at k = 1024).
template <class T, class VisitRow>
void mirror(T* a, int k, VisitRow visit_row) {
  constexpr int kTile = 32;
  const int threads = blas::helper_threads();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (blas::spread(threads))
  for (int i0 = 0; i0 < k; i0 += kTile) {
    T tile[kTile][kTile];
    const int rows = std::min(kTile, k - i0);
    for (int i = i0; i < i0 + rows; ++i) visit_row(i);
    for (int i = i0; i < i0 + rows; ++i) {  // the diagonal tile
      for (int j = i + 1; j < i0 + rows; ++j) {
        a[static_cast<size_t>(j) * k + i] = a[static_cast<size_t>(i) * k + j];
      }
    }
    for (int j0 = i0 + kTile; j0 < k; j0 += kTile) {
      const int cols = std::min(kTile, k - j0);
      if (j0 + kTile < k) {  // the next tile's rows
        prefetch_for_writing(a + static_cast<size_t>(j0 + kTile) * k + i0, k,
                             std::min(kTile, k - j0 - kTile));
      }
      for (int i = 0; i < rows; ++i) {
        const T* row = a + static_cast<size_t>(i0 + i) * k + j0;
        for (int j = 0; j < cols; ++j) tile[j][i] = row[j];
      }
      for (int j = 0; j < cols; ++j) {
        T* row = a + static_cast<size_t>(j0 + j) * k + i0;
        for (int i = 0; i < rows; ++i) row[i] = tile[j][i];
      }
    }
  }
}

template <class T>
void mirror(T* a, int k) {
  mirror(a, k, [](int) {});
}

// A holds its upper triangle: mirrors it (A full on return) and forms Q = a·I + b·A + c·A², both
// triangles: the upper one of A² by one product, then a·I + b·A + c·A² summed row by row during
// the pass that mirrors it.
template <class T>
void polynomial(T* A, T* Q, int k, const Coefficients& abc) {
  const auto a = static_cast<T>(abc[0]), b = static_cast<T>(abc[1]), c = static_cast<T>(abc[2]);
  mirror(A, k);
  blas::square_upper(A, Q, k);  // A·Aᵀ = A²
  mirror(Q, k, [&](int i) {
    const size_t diagonal = static_cast<size_t>(i) * k + i;
    const T* __restrict__ from = A + diagonal;
    T* __restrict__ to = Q + diagonal;
    for (int j = 0; j < k - i; ++j) to[j] = c * to[j] + b * from[j];
    to[0] += a;
  });
}

// Iterates W_{t+1} = Q_t·W_t with Q_t = a·I + b·A_t + c·A_t², A_t = W_t·W_tᵀ (folding a·W into
// Q's diagonal saves a pass over W), alternating between the buffers `W` and `other`; returns
// the one holding the result.
template <class T>
T* symmetric_one(T* W, T* other, T* A, T* Q, const Panel& p, const CoefficientTable& table,
                 int64_t steps) {
  for (int64_t t = 0; t < steps; ++t) {
    blas::gram_upper(W, p, A);
    polynomial(A, Q, p.k, table.row(t));
    blas::gemm_left(Q, W, p, other);
    std::swap(W, other);
  }
  return W;
}

// Gram Newton–Schulz (Zhang, Amsel, Chen, Dao, "Gram Newton-Schulz", 2026): with R the product
// of the Q_t since W was last formed, W_T = R·W, and the Gram matrix follows as A_{t+1} = A_t·Q_t²
// (all Q_t are polynomials in the same A, so they commute and every product here is symmetric:
// only its upper triangle is computed). A restart forms W = R·W and A = W·Wᵀ afresh. A is kept as
// its upper triangle (polynomial() mirrors it), Q, R and q² full. Alternates W between `W` and
// `other`; returns the one holding the result.
template <class T>
T* gram_one(T* W, T* other, T* A, T* Q, T* R, T* S, const Panel& p, const CoefficientTable& table,
            int64_t steps, const std::vector<int64_t>& restarts) {
  const int k = p.k;
  blas::gram_upper(W, p, A);
  bool fresh = true;  // R is the identity
  for (int64_t t = 0; t < steps; ++t) {
    polynomial(A, Q, k, table.row(t));
    const T* q = Q;
    if (fresh) {  // R = Q: take the buffer instead of copying it
      std::swap(R, Q);
      q = R;
      fresh = false;
    } else {
      blas::product_upper(R, Q, S, k);
      mirror(S, k);
      std::swap(R, S);
    }
    const int64_t done = t + 1;
    if (done == steps) break;
    if (std::binary_search(restarts.begin(), restarts.end(), done)) {
      blas::gemm_left(R, W, p, other);
      std::swap(W, other);
      blas::gram_upper(W, p, A);
      fresh = true;
      continue;
    }
    // A ← A·q², q² = q·qᵀ by syrk. S holds nothing needed now, and Q nothing once q² is formed
    // (q is either Q itself or R).
    blas::square_upper(q, S, k);
    mirror(S, k);
    blas::product_upper(A, S, Q, k);
    std::swap(A, Q);
  }
  blas::gemm_left(R, W, p, other);
  return other;
}

// Runs `one` on each matrix of the batch X (n, rows, cols), alternating with `other` of the same
// shape; every matrix ends in the same one of the two, which is returned.
template <class T, class One>
at::Tensor for_each_matrix(at::Tensor& X, at::Tensor& other, One one) {
  T* result = nullptr;
  for (int64_t i = 0; i < X.size(0); ++i) result = one(X[i].data_ptr<T>(), other[i].data_ptr<T>());
  return result == X[X.size(0) - 1].data_ptr<T>() ? X : other;
}

using Slot = OrthogonalizeWorkspace::Slot;

template <class T>
at::Tensor run_symmetric(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                         OrthogonalizeWorkspace& ws) {
  const auto p = panel_of(X.size(1), X.size(2));
  auto other = ws.get(Slot::iterate, X.sizes(), X.options());
  auto squares = ws.get(Slot::squares, {2, p.k, p.k}, X.options());  // A, Q
  T* A = squares[0].data_ptr<T>();
  T* Q = squares[1].data_ptr<T>();
  return for_each_matrix<T>(
      X, other, [&](T* W, T* W2) { return symmetric_one(W, W2, A, Q, p, table, steps); });
}

template <class T>
at::Tensor run_gram(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                    const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws) {
  const auto p = panel_of(X.size(1), X.size(2));
  auto other = ws.get(Slot::iterate, X.sizes(), X.options());
  auto squares = ws.get(Slot::squares, {4, p.k, p.k}, X.options());  // A, Q, R, scratch
  return for_each_matrix<T>(X, other, [&](T* W, T* W2) {
    return gram_one(W, W2, squares[0].data_ptr<T>(), squares[1].data_ptr<T>(),
                    squares[2].data_ptr<T>(), squares[3].data_ptr<T>(), p, table, steps, restarts);
  });
}

}  // namespace

at::Tensor symmetric_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                                OrthogonalizeWorkspace& ws) {
  check(have_blas(),
        "orthogonalize: method 'symmetric' needs BLIS or a CBLAS; this build has none");
  return X.scalar_type() == at::kDouble ? run_symmetric<double>(X, table, steps, ws)
                                        : run_symmetric<float>(X, table, steps, ws);
}

at::Tensor gram_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                           const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws) {
  check(have_blas(), "orthogonalize: method 'gram' needs BLIS or a CBLAS; this build has none");
  return X.scalar_type() == at::kDouble ? run_gram<double>(X, table, steps, restarts, ws)
                                        : run_gram<float>(X, table, steps, restarts, ws);
}

}  // namespace muon::detail
