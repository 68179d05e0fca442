#include "blas_sgemm.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "muon/error.h"
#include "muon/internal/dnnl.h"
#include "muon/internal/kernel_choice.h"
#include "muon/internal/lanes.h"
#include "upper_blocks.h"

// The calling thread's OpenMP thread count (OneThread), in libgomp and LLVM's libomp alike.
#ifdef _OPENMP
#include <omp.h>
#else  // Clang's sanitizer build links libgomp without compiling OpenMP, and has no omp.h of it
extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);
#endif

namespace muon::detail::blas::sgemm {
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

// MKL's Fortran sgemm (LP64: 32-bit sizes) and its version, where LibTorch's BLAS is MKL linked
// into libtorch_cpu (PyPI's x86-64 wheels), which exports both. Looked up through LibTorch's own
// library and kept only where that library defines it, so that no other BLAS in the process
// (NumPy's, the system's, one LibTorch links dynamically) answers for it.
using FortranSgemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                              const float*, const float*, const int*, const float*, const int*,
                              const float*, float*, const int*);
struct LibTorchMkl {
  FortranSgemm sgemm = nullptr;
  std::string version;                      // "MKL 2024.2"; "" where there is none
  // MKL's Fortran mkl_set_num_threads_local (the argument by address, as sgemm_'s), where it is
  // exported: the C name resolves to it in LibTorch's library and would read an int as an address.
  int (*set_local_threads)(const int*) = nullptr;
};

const LibTorchMkl& libtorch_mkl() {
  static const LibTorchMkl mkl = []() -> LibTorchMkl {
    Dl_info where{};
    // The context lives in LibTorch's library; the handle stays open for the process.
    if (!at::hasMKL() || dladdr(&at::globalContext(), &where) == 0 || !where.dli_fname) return {};
    void* library = dlopen(where.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (library == nullptr) return {};
    const auto sgemm = reinterpret_cast<FortranSgemm>(dlsym(library, "sgemm_"));
    const auto version =
        reinterpret_cast<void (*)(char*, int)>(dlsym(library, "MKL_Get_Version_String"));
    Dl_info defined{};
    if (sgemm == nullptr || version == nullptr ||
        dladdr(reinterpret_cast<void*>(sgemm), &defined) == 0 || defined.dli_fname == nullptr ||
        std::string(defined.dli_fname) != where.dli_fname) {
      return {};
    }
    char text[200] = {};
    version(text, sizeof text - 1);
    // "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build …" → "MKL 2024.2"
    const std::string full = text;
    const auto at = full.find("Version ");
    const std::string number = at == std::string::npos ? "" : full.substr(at + 8);
    const auto release = number.substr(0, number.find_first_of("- "));
    const auto set_local_threads =
        reinterpret_cast<int (*)(const int*)>(dlsym(library, "mkl_set_num_threads_local_"));
    return {sgemm, release.empty() ? "MKL" : "MKL " + release, set_local_threads};
  }();
  return mkl;
}

const Fp32GemmChoice& choice() {
  static const Fp32GemmChoice c = choose_fp32_gemm(
      cpu_features(),
      {dnnl::available() ? dnnl::version() : "", at::get_mkldnn_version(), libtorch_mkl().version});
  return c;
}

// C (m×n, rows ldc apart) ← a·b, on the calling thread.
void product(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, float* c,
             int64_t ldc) {
  ldc = std::max(ldc, n);
  const OneThread alone;
  if (choice().gemm == Fp32Gemm::onednn_sgemm) {
    dnnl::sgemm(a.transposed(), b.transposed(), m, n, k, a.data, a.ld(m, k), b.data, b.ld(k, n), c,
                ldc);
    return;
  }
  // MKL's is column-major: the row-major C = a·b is its Cᵀ = bᵀ·aᵀ, and a row-major operand read
  // as it is is its transpose there — the same transposition flags, the operands swapped.
  const int64_t lda = a.ld(m, k), ldb = b.ld(k, n);
  check(std::max({m, n, k, lda, ldb, ldc}) <= std::numeric_limits<int>::max(),
        "fp32 Newton–Schulz on MKL: a ", m, "x", k, " by ", k, "x", n,
        " product exceeds its 32-bit sizes and strides");
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  const int ldai = static_cast<int>(lda), ldbi = static_cast<int>(ldb);
  const int ldci = static_cast<int>(ldc);
  const float one = 1.0f, zero = 0.0f;
  libtorch_mkl().sgemm(b.transposed() ? "T" : "N", a.transposed() ? "T" : "N", &ni, &mi, &ki, &one,
                       b.data, &ldbi, a.data, &ldai, &zero, c, &ldci);
}

// C's upper triangle (k×k, row-major) ← a·b for k×n a and n×k b whose product is symmetric, by
// the row blocks of upper_blocks.h (block i0: a's rows i0 .. i0 + kFp32BlockRows times b's
// columns i0 .. k), each cut into column parts; the tiles are dealt to the threads.
void upper(const Operand& a, const Operand& b, int64_t k, int64_t n, float* C) {
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (first row, first column)
  for (int64_t i0 = 0; i0 < k; i0 += kFp32BlockRows) {
    for (int64_t j0 = i0; j0 < k; j0 += kColumnsPerCall) tiles.emplace_back(i0, j0);
  }
  detail::for_each_in_lanes(static_cast<int64_t>(tiles.size()),
                            std::max<int64_t>(1, detail::lane_threads()),
                            [&](int64_t tile, int64_t) {
                              const auto [i0, j0] = tiles[static_cast<size_t>(tile)];
                              product(std::min(kFp32BlockRows, k - i0),
                                      std::min(kColumnsPerCall, k - j0), n, a.at(i0, 0),
                                      b.at(0, j0), C + i0 * k + j0, k);
                            });
}

}  // namespace

bool chosen() {
  return choice().gemm != Fp32Gemm::library;
}

bool on_onednn() {
  return choice().gemm == Fp32Gemm::onednn_sgemm;
}

std::string description() {
  return choice().reason;
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

// By parts of B's columns (for_each_column_part), each product on its thread's core. A column-major
// panel (a tall matrix read as its transpose) as Cᵀ = Bᵀ·Rᵀ, whose rows are C's columns.
void gemm_left(const float* R, const float* B, const Panel& p, float* C) {
  const Operand r{R, p.k, 1}, b{B, p.rs, p.cs};
  for_each_column_part(p.m, [&](int64_t j0, int64_t columns) {
    if (!b.transposed()) {
      product(p.k, columns, p.k, r, b.at(0, j0), C + j0, p.rs);
    } else {
      product(columns, p.k, p.k, b.at(0, j0).t(), r.t(), C + j0 * p.cs, p.cs);
    }
  });
}

void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc) {
  product(m, n, k, {a, lda, 1}, {b, ldb, 1}, c, ldc);
}

}  // namespace muon::detail::blas::sgemm

namespace muon::detail::blas {

OneThread::OneThread() : openmp_(omp_get_max_threads()) {
  omp_set_num_threads(1);
  const int one = 1;
  if (const auto set = sgemm::libtorch_mkl().set_local_threads) mkl_ = set(&one);
}

OneThread::~OneThread() {
  omp_set_num_threads(openmp_);
  if (const auto set = sgemm::libtorch_mkl().set_local_threads) set(&mkl_);
}

}  // namespace muon::detail::blas
