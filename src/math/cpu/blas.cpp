// Every BLAS product of the Newton–Schulz chain on CPU (plain, symmetric and Gram steps) over
// BLIS or any CBLAS — the fp32 ones on another sgemm where blas_sgemm.h chooses one. Over 400
// lines on purpose: the typed wrappers share the blocking and threading helpers at its top, which
// would otherwise have to become an internal header, and this is the one file that includes
// BLIS's or the CBLAS's headers.
#include "muon/internal/blas.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "blas_sgemm.h"
#include "muon/internal/kernel_choice.h"

#if MUON_HAVE_BLIS
#include <blis.h>
#elif MUON_HAVE_CBLAS
#include <cblas.h>
#include <dlfcn.h>
#endif

namespace muon::detail::blas {
namespace {

// The products follow LibTorch's intra-op thread count (at::set_num_threads,
// torch.set_num_threads): one knob for the whole step.
[[maybe_unused]] int threads() {
  return std::max(1, at::get_num_threads());
}

}  // namespace

// The library's own description; each build's products are in namespace lib below, and the
// public functions at the end send fp32 ones to another sgemm where blas_sgemm.h chooses one.
namespace lib {
std::string backend();
void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc);
}  // namespace lib

bool spread(int threads) {
  return threads > 1 && !at::in_parallel_region();
}

#if MUON_HAVE_BLIS

bool available() {
  return true;
}

double product_upper_flops(double k) {
  return k * k * (k + 1);  // gemmt: one triangle and the diagonal
}

namespace {

// BLIS's configuration, chosen from the CPU's feature bits before BLIS initializes: BLIS reads
// BLIS_ARCH_TYPE (the configuration's number) once, in bli_init(); the variable is set only for
// that call. A user's own BLIS_ARCH_TYPE is respected.
struct BlisSetup {
  std::string config, reason;
};

const BlisSetup& blis_setup() {
  static const BlisSetup setup = [] {
    const std::string own = bli_arch_string(bli_cpuid_query_id());
    BlisSetup s;
    if (std::getenv("BLIS_ARCH_TYPE") != nullptr) {
      bli_init();
      s.reason = "set by BLIS_ARCH_TYPE in the environment";
    } else {
      const auto choice = choose_blis_config(own, fp32_family(cpu_features()));
      for (int id = 0; id < BLIS_NUM_ARCHS; ++id) {
        if (choice.config == bli_arch_string(static_cast<arch_t>(id))) {
          setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 1);
        }
      }
      bli_init();
      unsetenv("BLIS_ARCH_TYPE");
      s.reason = choice.reason;
    }
    s.config = bli_arch_string(bli_arch_query_id());  // what BLIS runs
    return s;
  }();
  return setup;
}

// One BLIS call on one thread: the products are split between threads here (for_parts), so
// that each waits at one barrier per product — BLIS's own threads wait at spinning barriers
// inside every product, which stall for a whole time slice when another process holds a core.
// On BLIS's packed kernels only: its small-product ("sup") kernels, chosen by a call's sizes, sum
// in another order (BLIS 2.1's AVX2 ones), so a product split otherwise — on another thread
// count — would change bits; the packed kernels sum each entry over the whole inner dimension in
// one order whatever rows and columns a call covers (docs/algorithms.md §Same bits at any thread
// count).
struct SingleThreaded {
  SingleThreaded() {
    blis_setup();
    bli_rntm_init_from_global(&rntm);
    bli_rntm_set_num_threads(1, &rntm);
    bli_rntm_disable_l3_sup(&rntm);
  }
  rntm_t rntm;
};

// BLIS takes non-const operand pointers; it does not write them.
template <class T>
T* in(const T* p) {
  return const_cast<T*>(p);
}

// A strided operand: element (i, j) at data[i·rs + j·cs].
template <class T>
struct View {
  const T* data;
  int64_t rs, cs;
  View at(int64_t i, int64_t j) const { return {data + i * rs + j * cs, rs, cs}; }
  View t() const { return {data, cs, rs}; }
};

// Typed BLIS calls: C (m×n, row-major with leading dimension ldc) = alpha·op + beta·C.
void gemm(int m, int n, int k, float alpha, View<float> a, View<float> b, float beta, float* c,
          int64_t rsc, int64_t csc) {
  SingleThreaded r;
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, in(a.data), a.rs, a.cs,
               in(b.data), b.rs, b.cs, &beta, c, rsc, csc, nullptr, &r.rntm);
}
void gemm(int m, int n, int k, double alpha, View<double> a, View<double> b, double beta, double* c,
          int64_t rsc, int64_t csc) {
  SingleThreaded r;
  bli_dgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, in(a.data), a.rs, a.cs,
               in(b.data), b.rs, b.cs, &beta, c, rsc, csc, nullptr, &r.rntm);
}
// C's upper triangle (m×m) = alpha·a·b + beta·C.
void gemmt(int m, int k, float alpha, View<float> a, View<float> b, float beta, float* c,
           int64_t ldc) {
  SingleThreaded r;
  bli_sgemmt_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, k, &alpha, in(a.data), a.rs,
                a.cs, in(b.data), b.rs, b.cs, &beta, c, ldc, 1, nullptr, &r.rntm);
}
void gemmt(int m, int k, double alpha, View<double> a, View<double> b, double beta, double* c,
           int64_t ldc) {
  SingleThreaded r;
  bli_dgemmt_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, k, &alpha, in(a.data), a.rs,
                a.cs, in(b.data), b.rs, b.cs, &beta, c, ldc, 1, nullptr, &r.rntm);
}
// C's upper triangle (m×m) = alpha·a·aᵀ + beta·C.
void syrk(int m, int k, float alpha, View<float> a, float beta, float* c, int64_t ldc) {
  SingleThreaded r;
  bli_ssyrk_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, m, k, &alpha, in(a.data), a.rs, a.cs, &beta, c, ldc,
               1, nullptr, &r.rntm);
}
void syrk(int m, int k, double alpha, View<double> a, double beta, double* c, int64_t ldc) {
  SingleThreaded r;
  bli_dsyrk_ex(BLIS_UPPER, BLIS_NO_TRANSPOSE, m, k, &alpha, in(a.data), a.rs, a.cs, &beta, c, ldc,
               1, nullptr, &r.rntm);
}
// Parts of a product of `flops`, one per thread of LibTorch's count; one for small products
// (below ~2 MFLOP a second thread costs more than it saves). Not finer parts dealt dynamically:
// each packs its own copy of the shared operand (docs/benchmarks.md §Steady under load).
int parts_for(double flops) {
  return flops < 2e6 ? 1 : threads();
}

// Runs part(t) for t in [0, parts), one part per thread of LibTorch's OpenMP pool (in order on
// one thread inside a parallel region: orthogonalize()'s lanes).
template <class Part>
void for_parts(int parts, Part&& part) {
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (spread(parts))
  for (int t = 0; t < parts; ++t) part(t);
}

// Boundary t of `parts` equal shares of [0, n), at multiples of 16 (the kernels' tile widths).
int share(int n, int t, int parts) {
  if (t >= parts) return n;
  return std::min(n, static_cast<int>(static_cast<int64_t>(n) * t / parts) / 16 * 16);
}

// Rows that cut the upper triangle of a k×k product into `parts` row blocks that take about as
// long: a block of rows [r0, r1) computes its (r1 − r0)²/2 triangle by syrk or gemmt and its
// (r1 − r0)·(k − r1) rectangle by gemm, and BLIS's triangles cost more per element than its
// rectangles (kTriangleCost, measured: docs/benchmarks.md §Steady under load). Cuts at multiples
// of 16 (the kernels' tile widths); returns parts + 1 rows from 0 to k.
std::vector<int> triangle_cuts(int k, int parts) {
  if (parts == 1) return {0, k};
  constexpr double kTriangleCost = 1.07;
  const auto cost = [&](int r0, int r1) {
    const double rows = r1 - r0;
    return kTriangleCost * rows * rows / 2 + rows * (k - r1);
  };
  // Greedy blocks of at most `budget` each, or of 16 rows where those cost more (a block's cost
  // grows with its last row).
  const auto cuts_within = [&](double budget) {
    std::vector<int> cuts{0};
    while (cuts.back() < k) {
      const int r0 = cuts.back();
      int r1 = std::min(k, r0 + 16);
      while (r1 < k && cost(r0, std::min(k, r1 + 16)) <= budget) r1 = std::min(k, r1 + 16);
      cuts.push_back(r1);
    }
    return cuts;
  };
  double low = 0, high = cost(0, k);  // the least budget that needs at most `parts` blocks
  for (int i = 0; i < 40; ++i) {
    const double middle = (low + high) / 2;
    (cuts_within(middle).size() <= static_cast<size_t>(parts) + 1 ? high : low) = middle;
  }
  auto cuts = cuts_within(high);
  cuts.resize(static_cast<size_t>(parts) + 1, k);  // fewer blocks than parts: the rest are empty
  return cuts;
}

// C's upper triangle (k×k, row-major) = alpha·W·Wᵀ + beta·C for the k×m panel W, in row blocks
// of about equal time (triangle_cuts): each block's triangle by syrk, the rest of its rows by gemm.
template <class T>
void syrk_upper(T alpha, View<T> w, int k, int m, T beta, T* c) {
  const int parts = parts_for(static_cast<double>(k) * k * m);
  const auto cuts = triangle_cuts(k, parts);
  for_parts(parts, [&](int t) {
    const int r0 = cuts[t], r1 = cuts[t + 1];
    if (r1 <= r0) return;
    syrk(r1 - r0, m, alpha, w.at(r0, 0), beta, c + static_cast<int64_t>(r0) * k + r0, k);
    if (r1 < k) {
      gemm(r1 - r0, k - r1, m, alpha, w.at(r0, 0), w.at(r1, 0).t(), beta,
           c + static_cast<int64_t>(r0) * k + r1, k, 1);
    }
  });
}

}  // namespace

std::string lib::backend() {
  const auto& s = blis_setup();
  return std::string("BLIS ") + bli_info_get_version_str() + ", configuration '" + s.config +
         "' (" + to_string(blis_config_family(s.config)) + " kernels): " + s.reason;
}

std::string kernel_family() {
  return to_string(blis_config_family(blis_setup().config));
}

int helper_threads() {
  return threads();
}

namespace lib {

template <class T>
void gram_upper(const T* W, const Panel& p, T* A) {
  syrk_upper(T(1), View<T>{W, p.rs, p.cs}, p.k, p.m, T(0), A);
}

template <class T>
void square_upper(const T* A, T* C, int k) {
  syrk_upper(T(1), View<T>{A, k, 1}, k, k, T(0), C);
}

// In row blocks of about equal time (triangle_cuts): each block's triangle by gemmt, the rest of
// its rows by gemm.
template <class T>
void product_upper(const T* A, const T* B, T* C, int k) {
  const View<T> a{A, k, 1}, b{B, k, 1};
  const int parts = parts_for(static_cast<double>(k) * k * k);
  const auto cuts = triangle_cuts(k, parts);
  for_parts(parts, [&](int t) {
    const int r0 = cuts[t], r1 = cuts[t + 1];
    if (r1 <= r0) return;
    gemmt(r1 - r0, k, T(1), a.at(r0, 0), b.at(0, r0), T(0), C + static_cast<int64_t>(r0) * k + r0,
          k);
    if (r1 < k) {
      gemm(r1 - r0, k - r1, k, T(1), a.at(r0, 0), b.at(0, r1), T(0),
           C + static_cast<int64_t>(r0) * k + r1, k, 1);
    }
  });
}

template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C) {
  const int parts = parts_for(2.0 * p.k * p.k * p.m);
  for_parts(parts, [&](int t) {
    const int j0 = share(p.m, t, parts), j1 = share(p.m, t + 1, parts);
    if (j1 > j0) {
      gemm(p.k, j1 - j0, p.k, T(1), View<T>{R, p.k, 1}, View<T>{B, p.rs, p.cs}.at(0, j0), T(0),
           C + j0 * p.cs, p.rs, p.cs);
    }
  });
}

void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc) {
  gemm(m, n, k, 1.0f, View<float>{a, lda, 1}, View<float>{b, ldb, 1}, 0.0f, c, ldc, 1);
}

}  // namespace lib

template <class T>
void gemm_square(const T* A, const T* B, T* C, int n) {
  lib::gemm_left(A, B, Panel{n, n, n, 1}, C);
}

#elif MUON_HAVE_CBLAS

bool available() {
  return true;
}

// The CBLAS is LibTorch's own BLAS (Debian: OpenBLAS through libblas.so), which picks its kernels
// and threads itself (OPENBLAS_CORETYPE, OPENBLAS_NUM_THREADS): named here as it reports them.
std::string lib::backend() {
  using Text = char* (*)();
  const auto config = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  const auto core = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (config == nullptr || core == nullptr) {
    return "CBLAS (not OpenBLAS: its own kernel choice and threads)";
  }
  return std::string("CBLAS: ") + config() + ", core '" + core() +
         "' (OpenBLAS's own choice; it keeps its own threads)";
}

std::string kernel_family() {
  using Text = char* (*)();
  const auto core = reinterpret_cast<Text>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (core == nullptr) return "unknown";
  const std::string name = core();
  // OpenBLAS's x86-64 cores by the instructions their kernels use.
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (name == wide) return to_string(VectorFamily::avx512);
  }
  for (const char* avx2 : {"Haswell", "Zen"}) {
    if (name == avx2) return to_string(VectorFamily::avx2);
  }
  return to_string(VectorFamily::none);
}

int helper_threads() {
  return 1;  // OpenBLAS's spinning pthreads would compete with an OpenMP team here
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
}  // namespace

double product_upper_flops(double k) {
  double flops = 0;
  for (double i0 = 0; i0 < k; i0 += kProductBlock) {
    flops += 2 * std::min(double{kProductBlock}, k - i0) * (k - i0) * k;
  }
  return flops;
}

namespace lib {

template <class T>
void gram_upper(const T* W, const Panel& p, T* A) {
  const Layout l(p);
  syrk(l.order, l.upper(), p.k, p.m, T(1), W, l.ld, T(0), A);
}

template <class T>
void square_upper(const T* A, T* C, int k) {
  syrk(CblasRowMajor, CblasUpper, k, k, T(1), A, k, T(0), C);
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
void gemm_left(const T* R, const T* B, const Panel& p, T* C) {
  const Layout l(p);
  gemm(l.order, l.square(), p.k, p.m, p.k, R, p.k, B, l.ld, C, l.ld);
}

void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc) {
  gemm(CblasRowMajor, CblasNoTrans, m, n, k, a, static_cast<int>(lda), b, static_cast<int>(ldb),
       c, static_cast<int>(ldc));
}

}  // namespace lib

template <class T>
void gemm_square(const T* A, const T* B, T* C, int n) {
  gemm(CblasRowMajor, CblasNoTrans, n, n, n, A, n, B, n, C, n);
}

#else  // no backend: available() is false and orthogonalize() never calls the others

bool available() {
  return false;
}
std::string lib::backend() {
  return "none (neither BLIS nor a CBLAS in this build: Newton–Schulz runs on ATen's GEMMs)";
}
std::string kernel_family() {
  return "none";
}
int helper_threads() {
  return 1;
}
double product_upper_flops(double k) {
  return 2 * k * k * k;
}
namespace lib {

template <class T>
void gram_upper(const T*, const Panel&, T*) {}
template <class T>
void square_upper(const T*, T*, int) {}
template <class T>
void product_upper(const T*, const T*, T*, int) {}
template <class T>
void gemm_left(const T*, const T*, const Panel&, T*) {}

// ATen's GEMM, where there is no library of our own.
void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  auto out = at::from_blob(c, {m, n}, {ldc, 1}, options);
  at::mm_out(out, at::from_blob(const_cast<float*>(a), {m, k}, {lda, 1}, options),
             at::from_blob(const_cast<float*>(b), {k, n}, {ldb, 1}, options));
}
}  // namespace lib

template <class T>
void gemm_square(const T*, const T*, T*, int) {}

#endif

std::string backend() {
  if (!available()) return lib::backend();
  if (!sgemm::chosen()) return lib::backend() + "; fp32 too (" + sgemm::description() + ")";
  return lib::backend() + "; fp32 products on " + sgemm::description() + " instead";
}

bool fp32_on_sgemm() {
  return available() && sgemm::chosen();
}

bool fp32_on_onednn() {
  return fp32_on_sgemm() && sgemm::on_onednn();
}

// The products: fp32 ones on the sgemm where one was chosen (fp64 ones always on the library).

template <class T>
void gram_upper(const T* W, const Panel& p, T* A) {
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm::chosen()) return sgemm::gram_upper(W, p, A);
  }
  lib::gram_upper(W, p, A);
}

template <class T>
void square_upper(const T* A, T* C, int k) {
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm::chosen()) return sgemm::square_upper(A, C, k);
  }
  lib::square_upper(A, C, k);
}

template <class T>
void product_upper(const T* A, const T* B, T* C, int k) {
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm::chosen()) return sgemm::product_upper(A, B, C, k);
  }
  lib::product_upper(A, B, C, k);
}

template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C) {
  if constexpr (std::is_same_v<T, float>) {
    if (sgemm::chosen()) return sgemm::gemm_left(R, B, p, C);
  }
  lib::gemm_left(R, B, p, C);
}

void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc) {
  if (sgemm::chosen()) return sgemm::gemm_rows(m, n, k, a, lda, b, ldb, c, ldc);
  lib::gemm_rows(m, n, k, a, lda, b, ldb, c, ldc);
}

#define MUON_INSTANTIATE(T)                                      \
  template void gram_upper(const T*, const Panel&, T*);          \
  template void square_upper(const T*, T*, int);                 \
  template void product_upper(const T*, const T*, T*, int);      \
  template void gemm_left(const T*, const T*, const Panel&, T*); \
  template void gemm_square(const T*, const T*, T*, int);
MUON_INSTANTIATE(float)
MUON_INSTANTIATE(double)
#undef MUON_INSTANTIATE

}  // namespace muon::detail::blas
