#include "newton_schulz_blas.h"

#include <algorithm>
#include <utility>

#include "muon/error.h"

#if MUON_HAVE_CBLAS
#include <cblas.h>
#endif

namespace muon::detail {

namespace {

// Rows per GEMM of symmetric_product(): 128 ran fastest here (a 1024² product in 0.69× the full
// GEMM's time).
constexpr int kProductBlock = 128;

// FLOPs of symmetric_product() for k×k factors.
double symmetric_product_flops(double k) {
  double flops = 0;
  for (double i0 = 0; i0 < k; i0 += kProductBlock) {
    flops += 2 * std::min(double{kProductBlock}, k - i0) * (k - i0) * k;
  }
  return flops;
}

}  // namespace

double symmetric_flops(double k, double m, int64_t steps) {
  return static_cast<double>(steps) * (3 * k * k * m + k * k * k);
}

// Follows gram_one()'s schedule step by step.
double gram_flops(double k, double m, int64_t steps, const std::vector<int64_t>& restarts) {
  const double syrk_w = k * k * m, product_w = 2 * k * k * m, syrk_a = k * k * k;
  const double product_a = symmetric_product_flops(k);
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

#if MUON_HAVE_CBLAS

bool have_cblas() {
  return true;
}

namespace {

// Every k×k matrix below is symmetric, kept row-major: where only one triangle is computed it is
// the upper one in memory (a[i·k + j], j ≥ i), and mirror() copies it to the lower one.

// CBLAS entry points by element type.
// C's triangle `uplo` ← alpha·A·Aᵀ + beta·C, A n×k.
void syrk(CBLAS_ORDER o, CBLAS_UPLO uplo, int n, int k, float alpha, const float* a, int lda,
          float beta, float* c, int ldc) {
  cblas_ssyrk(o, uplo, CblasNoTrans, n, k, alpha, a, lda, beta, c, ldc);
}
void syrk(CBLAS_ORDER o, CBLAS_UPLO uplo, int n, int k, double alpha, const double* a, int lda,
          double beta, double* c, int ldc) {
  cblas_dsyrk(o, uplo, CblasNoTrans, n, k, alpha, a, lda, beta, c, ldc);
}
// C (m×n) = A (m×k)·B (k×n).
void gemm(CBLAS_ORDER o, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float* c, int ldc) {
  cblas_sgemm(o, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
void gemm(CBLAS_ORDER o, int m, int n, int k, const double* a, int lda, const double* b, int ldb,
          double* c, int ldc) {
  cblas_dgemm(o, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}
// C (m×n) = S·B, S m×m symmetric of which only the triangle `uplo` (in `o`) is read.
void symm(CBLAS_ORDER o, CBLAS_UPLO uplo, int m, int n, const float* s, const float* b, int ldb,
          float* c, int ldc) {
  cblas_ssymm(o, CblasLeft, uplo, m, n, 1.0f, s, m, b, ldb, 0.0f, c, ldc);
}
void symm(CBLAS_ORDER o, CBLAS_UPLO uplo, int m, int n, const double* s, const double* b, int ldb,
          double* c, int ldc) {
  cblas_dsymm(o, CblasLeft, uplo, m, n, 1.0, s, m, b, ldb, 0.0, c, ldc);
}

// One matrix of the batch, seen on its smaller side: W is k×m in `order` with leading dim `ld`.
struct Side {
  CBLAS_ORDER order;
  int k, m, ld;
  // The triangle, named in `order`, that is the upper one in row-major memory.
  CBLAS_UPLO upper() const { return order == CblasRowMajor ? CblasUpper : CblasLower; }
};

Side side_of(int64_t rows, int64_t cols) {
  // A row-major rows×cols block is, read column-major, its cols×rows transpose.
  if (rows <= cols)
    return {CblasRowMajor, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(cols)};
  return {CblasColMajor, static_cast<int>(cols), static_cast<int>(rows), static_cast<int>(cols)};
}

// Copies the upper triangle of the row-major k×k `a` to the lower one, calling visit(index) for
// each upper entry a[index] (diagonal included) while its tile is in cache. Transposes 32×32
// tiles through a local buffer so that both the reads and the writes run along rows: writing a
// column of a power-of-two-wide matrix directly hits one cache set (4× slower at k = 1024).
template <class T, class Visit>
void mirror(T* a, int k, Visit visit) {
  constexpr int kTile = 32;
  T tile[kTile][kTile];
  for (int i0 = 0; i0 < k; i0 += kTile) {
    const int rows = std::min(kTile, k - i0);
    for (int i = i0; i < i0 + rows; ++i) {  // the diagonal tile
      visit(static_cast<size_t>(i) * k + i);
      for (int j = i + 1; j < i0 + rows; ++j) {
        visit(static_cast<size_t>(i) * k + j);
        a[j * k + i] = a[i * k + j];
      }
    }
    for (int j0 = i0 + kTile; j0 < k; j0 += kTile) {
      const int cols = std::min(kTile, k - j0);
      for (int i = 0; i < rows; ++i) {
        const size_t row = static_cast<size_t>(i0 + i) * k + j0;
        for (int j = 0; j < cols; ++j) {
          visit(row + j);
          tile[j][i] = a[row + j];
        }
      }
      for (int j = 0; j < cols; ++j) {
        for (int i = 0; i < rows; ++i) a[(j0 + j) * k + i0 + i] = tile[j][i];
      }
    }
  }
}

template <class T>
void mirror(T* a, int k) {
  mirror(a, k, [](size_t) {});
}

// C's upper triangle ← A·B for k×k A and B whose product is symmetric (commuting symmetric
// factors: here polynomials in the same Gram matrix). GEMMs on block rows compute the upper
// triangle plus the diagonal blocks: ~(1 + 1/blocks)·k³ of the 2k³ FLOPs.
template <class T>
void symmetric_product(const T* A, const T* B, T* C, int k) {
  for (int i0 = 0; i0 < k; i0 += kProductBlock) {
    const int rows = std::min(kProductBlock, k - i0);
    gemm(CblasRowMajor, rows, k - i0, k, A + static_cast<size_t>(i0) * k, k, B + i0, k,
         C + static_cast<size_t>(i0) * k + i0, k);
  }
}

// A holds its upper triangle: mirrors it (A full on return) and forms the upper triangle of
// Q = a·I + b·A + c·A². b·A + a·I is written during the mirror's pass over A, and syrk adds c·A²
// onto it (with β = 1 it also skips zeroing Q first).
template <class T>
void polynomial(T* A, T* Q, int k, const Coefficients& abc) {
  const auto b = static_cast<T>(abc[1]);
  mirror(A, k, [&](size_t i) { Q[i] = b * A[i]; });
  for (int i = 0; i < k; ++i) Q[static_cast<size_t>(i) * k + i] += static_cast<T>(abc[0]);
  syrk(CblasRowMajor, CblasUpper, k, k, static_cast<T>(abc[2]), A, k, T(1), Q, k);  // + c·A·Aᵀ
}

// A's upper triangle ← W·Wᵀ.
template <class T>
void gram(const T* W, const Side& s, T* A) {
  syrk(s.order, s.upper(), s.k, s.m, T(1), W, s.ld, T(0), A, s.k);
}

// Iterates W_{t+1} = Q_t·W_t with Q_t = a·I + b·A_t + c·A_t², A_t = W_t·W_tᵀ (folding a·W into
// Q's diagonal saves a pass over W), alternating between the buffers `W` and `other`; returns
// the one holding the result.
template <class T>
T* symmetric_one(T* W, T* other, T* A, T* Q, const Side& s, const CoefficientTable& table,
                 int64_t steps) {
  for (int64_t t = 0; t < steps; ++t) {
    gram(W, s, A);
    polynomial(A, Q, s.k, table.row(t));
    symm(s.order, s.upper(), s.k, s.m, Q, W, s.ld, other, s.ld);  // Q's upper triangle suffices
    std::swap(W, other);
  }
  return W;
}

// Gram Newton–Schulz (Zhang, Amsel, Chen, Dao, "Gram Newton-Schulz", 2026): with R the product
// of the Q_t since W was last formed, W_T = R·W, and the Gram matrix follows as A_{t+1} = A_t·Q_t²
// (all Q_t are polynomials in the same A, so they commute). A restart forms W = R·W and A = W·Wᵀ
// afresh. A is kept as its upper triangle (polynomial() mirrors it), Q, R and q² full. Alternates
// W between `W` and `other`; returns the one holding the result.
template <class T>
T* gram_one(T* W, T* other, T* A, T* Q, T* R, T* S, const Side& s, const CoefficientTable& table,
            int64_t steps, const std::vector<int64_t>& restarts) {
  const int k = s.k;
  gram(W, s, A);
  bool fresh = true;  // R is the identity
  for (int64_t t = 0; t < steps; ++t) {
    polynomial(A, Q, k, table.row(t));
    mirror(Q, k);
    const T* q = Q;
    if (fresh) {  // R = Q: take the buffer instead of copying it
      std::swap(R, Q);
      q = R;
      fresh = false;
    } else {
      symmetric_product(R, Q, S, k);
      mirror(S, k);
      std::swap(R, S);
    }
    const int64_t done = t + 1;
    if (done == steps) break;
    if (std::binary_search(restarts.begin(), restarts.end(), done)) {
      gemm(s.order, k, s.m, k, R, k, W, s.ld, other, s.ld);
      std::swap(W, other);
      gram(W, s, A);
      fresh = true;
      continue;
    }
    // A ← A·q², q² = q·qᵀ by syrk. S holds nothing needed now, and Q nothing once q² is formed
    // (q is either Q itself or R).
    syrk(CblasRowMajor, CblasUpper, k, k, T(1), q, k, T(0), S, k);
    mirror(S, k);
    symmetric_product(A, S, Q, k);
    std::swap(A, Q);
  }
  gemm(s.order, k, s.m, k, R, k, W, s.ld, other, s.ld);
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

template <class T>
at::Tensor run_symmetric(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                         OrthogonalizeWorkspace& ws) {
  const auto s = side_of(X.size(1), X.size(2));
  auto other = ws.get(1, X.sizes(), X.options());
  auto squares = ws.get(2, {2, s.k, s.k}, X.options());  // A, Q
  T* A = squares[0].data_ptr<T>();
  T* Q = squares[1].data_ptr<T>();
  return for_each_matrix<T>(
      X, other, [&](T* W, T* W2) { return symmetric_one(W, W2, A, Q, s, table, steps); });
}

template <class T>
at::Tensor run_gram(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                    const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws) {
  const auto s = side_of(X.size(1), X.size(2));
  auto other = ws.get(1, X.sizes(), X.options());
  auto squares = ws.get(2, {4, s.k, s.k}, X.options());  // A, Q, R, scratch
  return for_each_matrix<T>(X, other, [&](T* W, T* W2) {
    return gram_one(W, W2, squares[0].data_ptr<T>(), squares[1].data_ptr<T>(),
                    squares[2].data_ptr<T>(), squares[3].data_ptr<T>(), s, table, steps, restarts);
  });
}

}  // namespace

at::Tensor symmetric_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                                OrthogonalizeWorkspace& ws) {
  return X.scalar_type() == at::kDouble ? run_symmetric<double>(X, table, steps, ws)
                                        : run_symmetric<float>(X, table, steps, ws);
}

at::Tensor gram_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                           const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws) {
  return X.scalar_type() == at::kDouble ? run_gram<double>(X, table, steps, restarts, ws)
                                        : run_gram<float>(X, table, steps, restarts, ws);
}

#else  // no CBLAS: orthogonalize() never selects these

bool have_cblas() {
  return false;
}

at::Tensor symmetric_iterations(at::Tensor&, const CoefficientTable&, int64_t,
                                OrthogonalizeWorkspace&) {
  throw Error("orthogonalize: method 'symmetric' needs a CBLAS; this build has none");
}

at::Tensor gram_iterations(at::Tensor&, const CoefficientTable&, int64_t,
                           const std::vector<int64_t>&, OrthogonalizeWorkspace&) {
  throw Error("orthogonalize: method 'gram' needs a CBLAS; this build has none");
}

#endif

}  // namespace muon::detail
