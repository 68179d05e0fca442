#include "blas.h"

#include <algorithm>
#include <cstddef>

#if MUON_HAVE_BLIS
#include <blis.h>
#include <dlfcn.h>

#include <cstdlib>
#include <thread>
#elif MUON_HAVE_CBLAS
#include <cblas.h>
#endif

namespace muon::detail::blas {

#if MUON_HAVE_BLIS

bool available() {
  return true;
}
const char* backend() {
  return "BLIS";
}

double product_upper_flops(double k) {
  return k * k * (k + 1);  // gemmt: one triangle and the diagonal
}

namespace {

// As many threads as the process's other BLAS work gets: OpenBLAS's own count where OpenBLAS is
// loaded (its setter is how the benchmark shares cores between in-process ranks), else
// BLIS_NUM_THREADS or OMP_NUM_THREADS (what launched ranks get), else every core — BLIS alone
// would default to one thread.
int threads() {
  using Getter = int (*)();
  static const auto openblas =
      reinterpret_cast<Getter>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (openblas != nullptr) return std::max(1, openblas());
  static const int fallback = [] {
    for (const char* name : {"BLIS_NUM_THREADS", "OMP_NUM_THREADS"}) {
      const char* value = std::getenv(name);
      if (value != nullptr && std::atoi(value) > 0) return std::atoi(value);
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return fallback;
}

}  // namespace

int helper_threads() {
  return threads();
}

namespace {

// A runtime for one call, so that a change of the thread count applies at once. (Started from
// the global one: the only initializer BLIS 0.9 and 1.x share.)
struct Runtime {
  Runtime() {
    bli_rntm_init_from_global(&rntm);
    bli_rntm_set_num_threads(threads(), &rntm);
  }
  rntm_t rntm;
};

// BLIS takes non-const operand pointers; it does not write them.
template <class T>
T* in(const T* p) {
  return const_cast<T*>(p);
}

// Typed BLIS calls by element type; k×k operands are row-major (row stride k, column stride 1).
void syrk(int n, int k, float alpha, const float* a, int64_t rs, int64_t cs, float beta, float* c) {
  Runtime r;
  bli_ssyrk_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, n, k, &alpha, in(a), rs, cs, &beta, c, n, 1, nullptr,
               &r.rntm);
}
void syrk(int n, int k, double alpha, const double* a, int64_t rs, int64_t cs, double beta,
          double* c) {
  Runtime r;
  bli_dsyrk_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, n, k, &alpha, in(a), rs, cs, &beta, c, n, 1, nullptr,
               &r.rntm);
}
void gemmt(int k, float* one, const float* a, const float* b, float* zero, float* c) {
  Runtime r;
  bli_sgemmt_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, k, k, one, in(a), k, 1, in(b), k,
                1, zero, c, k, 1, nullptr, &r.rntm);
}
void gemmt(int k, double* one, const double* a, const double* b, double* zero, double* c) {
  Runtime r;
  bli_dgemmt_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, k, k, one, in(a), k, 1, in(b), k,
                1, zero, c, k, 1, nullptr, &r.rntm);
}
void symm(const Panel& p, float* one, const float* s, const float* b, float* zero, float* c) {
  Runtime r;
  bli_ssymm_ex(BLIS_LEFT, BLIS_UPPER, BLIS_NO_CONJUGATE, BLIS_NO_TRANSPOSE, p.k, p.m, one, in(s),
               p.k, 1, in(b), p.rs, p.cs, zero, c, p.rs, p.cs, nullptr, &r.rntm);
}
void symm(const Panel& p, double* one, const double* s, const double* b, double* zero, double* c) {
  Runtime r;
  bli_dsymm_ex(BLIS_LEFT, BLIS_UPPER, BLIS_NO_CONJUGATE, BLIS_NO_TRANSPOSE, p.k, p.m, one, in(s),
               p.k, 1, in(b), p.rs, p.cs, zero, c, p.rs, p.cs, nullptr, &r.rntm);
}
void gemm(const Panel& p, float* one, const float* a, const float* b, float* zero, float* c) {
  Runtime r;
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, p.k, p.m, p.k, one, in(a), p.k, 1, in(b), p.rs,
               p.cs, zero, c, p.rs, p.cs, nullptr, &r.rntm);
}
void gemm(const Panel& p, double* one, const double* a, const double* b, double* zero, double* c) {
  Runtime r;
  bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, p.k, p.m, p.k, one, in(a), p.k, 1, in(b), p.rs,
               p.cs, zero, c, p.rs, p.cs, nullptr, &r.rntm);
}

}  // namespace

template <class T>
void gram_upper(const T* W, const Panel& p, T* A) {
  syrk(p.k, p.m, T(1), W, p.rs, p.cs, T(0), A);
}

template <class T>
void square_upper(T alpha, const T* A, T beta, T* C, int k) {
  syrk(k, k, alpha, A, k, 1, beta, C);
}

template <class T>
void product_upper(const T* A, const T* B, T* C, int k) {
  T one = 1, zero = 0;
  gemmt(k, &one, A, B, &zero, C);
}

template <class T>
void symm_left(const T* S, const T* B, const Panel& p, T* C) {
  T one = 1, zero = 0;
  symm(p, &one, S, B, &zero, C);
}

template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C) {
  T one = 1, zero = 0;
  gemm(p, &one, R, B, &zero, C);
}

#elif MUON_HAVE_CBLAS

bool available() {
  return true;
}
const char* backend() {
  return "CBLAS";
}
int helper_threads() {
  return 1;
}

namespace {

// Rows per GEMM of product_upper(): 128 ran fastest with OpenBLAS (a 1024² product in 0.69× the
// full GEMM's time).
constexpr int kProductBlock = 128;

// A Panel as CBLAS sees it: row-major with leading dimension rs, or column-major with cs.
struct Layout {
  explicit Layout(const Panel& p)
      : order(p.cs == 1 ? CblasRowMajor : CblasColMajor),
        ld(static_cast<int>(p.cs == 1 ? p.rs : p.cs)) {}
  // Row-major memory's upper triangle of a k×k matrix, named in `order`.
  CBLAS_UPLO upper() const { return order == CblasRowMajor ? CblasUpper : CblasLower; }
  // How a row-major k×k matrix reads in `order`.
  CBLAS_TRANSPOSE square() const { return order == CblasRowMajor ? CblasNoTrans : CblasTrans; }
  CBLAS_ORDER order;
  int ld;
};

// CBLAS calls by element type.
void syrk(CBLAS_ORDER o, CBLAS_UPLO uplo, int n, int k, float alpha, const float* a, int lda,
          float beta, float* c) {
  cblas_ssyrk(o, uplo, CblasNoTrans, n, k, alpha, a, lda, beta, c, n);
}
void syrk(CBLAS_ORDER o, CBLAS_UPLO uplo, int n, int k, double alpha, const double* a, int lda,
          double beta, double* c) {
  cblas_dsyrk(o, uplo, CblasNoTrans, n, k, alpha, a, lda, beta, c, n);
}
void gemm(CBLAS_ORDER o, CBLAS_TRANSPOSE ta, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(o, ta, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}
void gemm(CBLAS_ORDER o, CBLAS_TRANSPOSE ta, int m, int n, int k, const double* a, int lda,
          const double* b, int ldb, double* c, int ldc) {
  cblas_dgemm(o, ta, CblasNoTrans, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc);
}
void symm(CBLAS_ORDER o, CBLAS_UPLO uplo, int m, int n, const float* s, const float* b, int ldb,
          float* c) {
  cblas_ssymm(o, CblasLeft, uplo, m, n, 1.0f, s, m, b, ldb, 0.0f, c, ldb);
}
void symm(CBLAS_ORDER o, CBLAS_UPLO uplo, int m, int n, const double* s, const double* b, int ldb,
          double* c) {
  cblas_dsymm(o, CblasLeft, uplo, m, n, 1.0, s, m, b, ldb, 0.0, c, ldb);
}

}  // namespace

double product_upper_flops(double k) {
  double flops = 0;
  for (double i0 = 0; i0 < k; i0 += kProductBlock) {
    flops += 2 * std::min(double{kProductBlock}, k - i0) * (k - i0) * k;
  }
  return flops;
}

template <class T>
void gram_upper(const T* W, const Panel& p, T* A) {
  const Layout l(p);
  syrk(l.order, l.upper(), p.k, p.m, T(1), W, l.ld, T(0), A);
}

template <class T>
void square_upper(T alpha, const T* A, T beta, T* C, int k) {
  syrk(CblasRowMajor, CblasUpper, k, k, alpha, A, k, beta, C);
}

// GEMMs on block rows compute the upper triangle plus the diagonal blocks: ~(1 + 1/blocks)·k³ of
// the 2k³ FLOPs.
template <class T>
void product_upper(const T* A, const T* B, T* C, int k) {
  for (int i0 = 0; i0 < k; i0 += kProductBlock) {
    const int rows = std::min(kProductBlock, k - i0);
    gemm(CblasRowMajor, CblasNoTrans, rows, k - i0, k, A + static_cast<size_t>(i0) * k, k, B + i0,
         k, C + static_cast<size_t>(i0) * k + i0, k);
  }
}

template <class T>
void symm_left(const T* S, const T* B, const Panel& p, T* C) {
  const Layout l(p);
  symm(l.order, l.upper(), p.k, p.m, S, B, l.ld, C);
}

template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C) {
  const Layout l(p);
  gemm(l.order, l.square(), p.k, p.m, p.k, R, p.k, B, l.ld, C, l.ld);
}

#else  // no backend: available() is false and orthogonalize() never calls the others

bool available() {
  return false;
}
const char* backend() {
  return "none";
}
int helper_threads() {
  return 1;
}
double product_upper_flops(double k) {
  return 2 * k * k * k;
}
template <class T>
void gram_upper(const T*, const Panel&, T*) {}
template <class T>
void square_upper(T, const T*, T, T*, int) {}
template <class T>
void product_upper(const T*, const T*, T*, int) {}
template <class T>
void symm_left(const T*, const T*, const Panel&, T*) {}
template <class T>
void gemm_left(const T*, const T*, const Panel&, T*) {}

#endif

#define MUON_INSTANTIATE(T)                                      \
  template void gram_upper(const T*, const Panel&, T*);          \
  template void square_upper(T, const T*, T, T*, int);           \
  template void product_upper(const T*, const T*, T*, int);      \
  template void symm_left(const T*, const T*, const Panel&, T*); \
  template void gemm_left(const T*, const T*, const Panel&, T*);
MUON_INSTANTIATE(float)
MUON_INSTANTIATE(double)
#undef MUON_INSTANTIATE

}  // namespace muon::detail::blas
