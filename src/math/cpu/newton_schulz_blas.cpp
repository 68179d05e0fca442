#include "newton_schulz_blas.h"

#include <algorithm>
#include <cstring>

#include "muon/error.h"

#if MUON_HAVE_CBLAS
#include <cblas.h>
#endif

namespace muon::detail {

#if MUON_HAVE_CBLAS

bool have_cblas() {
  return true;
}

namespace {

// CBLAS entry points by element type.
void syrk(CBLAS_ORDER o, int n, int k, float alpha, const float* a, int lda, float beta, float* c,
          int ldc) {
  cblas_ssyrk(o, CblasUpper, CblasNoTrans, n, k, alpha, a, lda, beta, c, ldc);
}
void syrk(CBLAS_ORDER o, int n, int k, double alpha, const double* a, int lda, double beta,
          double* c, int ldc) {
  cblas_dsyrk(o, CblasUpper, CblasNoTrans, n, k, alpha, a, lda, beta, c, ldc);
}
// C (m×n) = alpha·A (m×k)·B (k×n) + beta·C.
void gemm(CBLAS_ORDER o, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
          int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(o, CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm(CBLAS_ORDER o, int m, int n, int k, double alpha, const double* a, int lda,
          const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(o, CblasNoTrans, CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// C (m×n) = S·B, S m×m symmetric of which only the upper triangle (in `o`) is read.
void symm(CBLAS_ORDER o, int m, int n, const float* s, const float* b, int ldb, float* c,
          int ldc) {
  cblas_ssymm(o, CblasLeft, CblasUpper, m, n, 1.0f, s, m, b, ldb, 0.0f, c, ldc);
}
void symm(CBLAS_ORDER o, int m, int n, const double* s, const double* b, int ldb, double* c,
          int ldc) {
  cblas_dsymm(o, CblasLeft, CblasUpper, m, n, 1.0, s, m, b, ldb, 0.0, c, ldc);
}

// One matrix of the batch, seen on its smaller side: W is k×m in `order` with leading dim `ld`.
struct Side {
  CBLAS_ORDER order;
  int k, m, ld;
};

Side side_of(int64_t rows, int64_t cols) {
  // A row-major rows×cols block is, read column-major, its cols×rows transpose.
  if (rows <= cols)
    return {CblasRowMajor, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(cols)};
  return {CblasColMajor, static_cast<int>(cols), static_cast<int>(rows), static_cast<int>(cols)};
}

// syrk/symm with CblasUpper read and write the upper triangle *in the given order*: in memory that
// is the upper triangle for row-major and the lower one for column-major. Copies it to the other.
// Works in 16×16 tiles: with a power-of-two k, larger tiles of the transposed side collide in
// the cache (64×64 tiles took twice as long at k = 1024).
template <class T>
void mirror(T* a, int k, CBLAS_ORDER order) {
  constexpr int kTile = 16;
  const bool upper_filled = order == CblasRowMajor;
  for (int i0 = 0; i0 < k; i0 += kTile) {
    for (int j0 = i0; j0 < k; j0 += kTile) {
      for (int i = i0; i < std::min(i0 + kTile, k); ++i) {
        for (int j = std::max(j0, i + 1); j < std::min(j0 + kTile, k); ++j) {
          if (upper_filled) {
            a[j * k + i] = a[i * k + j];
          } else {
            a[i * k + j] = a[j * k + i];
          }
        }
      }
    }
  }
}

// Q ← c·A² + b·A + a·I, all k×k, A full on entry; Q holds the upper triangle (in `order`) only
// — what symm reads; mirror() it for a full matrix.
template <class T>
void polynomial(const T* A, T* Q, int k, CBLAS_ORDER order, const Coefficients& abc) {
  syrk(order, k, k, static_cast<T>(abc[2]), A, k, T(0), Q, k);  // c·A·Aᵀ = c·A² (A symmetric)
  const auto b = static_cast<T>(abc[1]);
  for (int64_t i = 0; i < static_cast<int64_t>(k) * k; ++i) Q[i] += b * A[i];
  for (int i = 0; i < k; ++i) Q[i * k + i] += static_cast<T>(abc[0]);
}

// A ← W·Wᵀ (full).
template <class T>
void gram(const T* W, const Side& s, T* A) {
  syrk(s.order, s.k, s.m, T(1), W, s.ld, T(0), A, s.k);
  mirror(A, s.k, s.order);
}

// W ← Q·W with Q = a·I + b·A + c·A² (folding a·W into Q's diagonal saves a copy of W).
template <class T>
void symmetric_one(T* W, T* W2, T* A, T* Q, const Side& s, const CoefficientTable& table,
                   int64_t steps) {
  const size_t elements = static_cast<size_t>(s.k) * s.m;
  for (int64_t t = 0; t < steps; ++t) {
    gram(W, s, A);
    polynomial(A, Q, s.k, s.order, table.row(t));
    symm(s.order, s.k, s.m, Q, W, s.ld, W2, s.ld);  // Q's upper triangle: no mirror needed
    std::swap(W, W2);
  }
  if (steps % 2 == 1) std::memcpy(W2, W, elements * sizeof(T));  // result back in the caller's W
}

template <class T>
void gram_one(T* W, T* W2, T* A, T* Q, T* R, T* tmp, const Side& s, const CoefficientTable& table,
              int64_t steps, int64_t restart) {
  const int k = s.k;
  const size_t square = static_cast<size_t>(k) * k;
  gram(W, s, A);
  bool fresh = true;  // R is the identity (not yet formed)
  for (int64_t t = 0; t < steps; ++t) {
    polynomial(A, Q, k, s.order, table.row(t));
    mirror(Q, k, s.order);
    if (fresh) {
      std::memcpy(R, Q, square * sizeof(T));
      fresh = false;
    } else {
      gemm(s.order, k, k, k, T(1), R, k, Q, k, T(0), tmp, k);
      std::swap(R, tmp);
    }
    if (t + 1 == steps) break;
    if (restart > 0 && (t + 1) % restart == 0) {  // W ← R·W, A ← W·Wᵀ from scratch
      gemm(s.order, k, s.m, k, T(1), R, k, W, s.ld, T(0), W2, s.ld);
      std::memcpy(W, W2, static_cast<size_t>(k) * s.m * sizeof(T));
      gram(W, s, A);
      fresh = true;
      continue;
    }
    // A ← A·Q², symmetrized: the factors commute in exact arithmetic only.
    syrk(s.order, k, k, T(1), Q, k, T(0), tmp, k);  // Q² = Q·Qᵀ
    mirror(tmp, k, s.order);
    gemm(s.order, k, k, k, T(1), A, k, tmp, k, T(0), Q, k);
    for (int i = 0; i < k; ++i) {
      for (int j = i; j < k; ++j) A[i * k + j] = A[j * k + i] = (Q[i * k + j] + Q[j * k + i]) / 2;
    }
  }
  if (fresh) return;  // no pending product (cannot happen with steps ≥ 1)
  gemm(s.order, k, s.m, k, T(1), R, k, W, s.ld, T(0), W2, s.ld);
  std::memcpy(W, W2, static_cast<size_t>(k) * s.m * sizeof(T));
}

template <class T>
at::Tensor run_symmetric(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                         OrthogonalizeWorkspace& ws) {
  const auto n = X.size(0), rows = X.size(1), cols = X.size(2);
  const auto s = side_of(rows, cols);
  auto out = ws.get(1, X.sizes(), X.options());
  out.copy_(X);
  auto other = ws.get(2, {rows * cols}, X.options());
  auto A = ws.get(3, {s.k, s.k}, X.options());
  auto B = ws.get(4, {s.k, s.k}, X.options());
  for (int64_t i = 0; i < n; ++i) {
    symmetric_one(out[i].data_ptr<T>(), other.data_ptr<T>(), A.data_ptr<T>(), B.data_ptr<T>(), s,
                  table, steps);
  }
  return out;
}

template <class T>
at::Tensor run_gram(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                    int64_t restart, OrthogonalizeWorkspace& ws) {
  const auto n = X.size(0), rows = X.size(1), cols = X.size(2);
  const auto s = side_of(rows, cols);
  auto out = ws.get(1, X.sizes(), X.options());
  out.copy_(X);
  auto other = ws.get(2, {rows * cols}, X.options());
  auto squares = ws.get(3, {4, s.k, s.k}, X.options());  // A, Q, R, scratch
  for (int64_t i = 0; i < n; ++i) {
    gram_one(out[i].data_ptr<T>(), other.data_ptr<T>(), squares[0].data_ptr<T>(),
             squares[1].data_ptr<T>(), squares[2].data_ptr<T>(), squares[3].data_ptr<T>(), s, table,
             steps, restart);
  }
  return out;
}

}  // namespace

at::Tensor symmetric_iterations(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                                OrthogonalizeWorkspace& ws) {
  return X.scalar_type() == at::kDouble ? run_symmetric<double>(X, table, steps, ws)
                                        : run_symmetric<float>(X, table, steps, ws);
}

at::Tensor gram_iterations(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                           int64_t restart, OrthogonalizeWorkspace& ws) {
  return X.scalar_type() == at::kDouble ? run_gram<double>(X, table, steps, restart, ws)
                                        : run_gram<float>(X, table, steps, restart, ws);
}

#else  // no CBLAS: orthogonalize() never selects these

bool have_cblas() {
  return false;
}

at::Tensor symmetric_iterations(const at::Tensor&, const CoefficientTable&, int64_t,
                                OrthogonalizeWorkspace&) {
  throw Error("orthogonalize: method 'symmetric' needs a CBLAS; this build has none");
}

at::Tensor gram_iterations(const at::Tensor&, const CoefficientTable&, int64_t, int64_t,
                           OrthogonalizeWorkspace&) {
  throw Error("orthogonalize: method 'gram' needs a CBLAS; this build has none");
}

#endif

}  // namespace muon::detail
