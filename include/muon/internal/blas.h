// Internal: the dense products the CPU Newton–Schulz methods (newton_schulz_blas.cpp) are built
// of, on BLIS where the build found it and on any CBLAS otherwise. BLIS is preferred: its gemmt
// computes one triangle of a product at GEMM speed, and its syrk runs closer to GEMM speed than
// OpenBLAS 0.3.21's (docs/benchmarks.md). fp32 products run on oneDNN's or LibTorch's MKL sgemm
// instead where that is safe and faster (src/math/cpu/blas_sgemm.h).
#pragma once

#include <cstdint>
#include <string>

namespace muon::detail::blas {

// Whether this build has a backend; without one the functions below must not be called.
bool available();
// The library, the kernels it runs and why, e.g. "BLIS 0.9.0, configuration 'skx' (avx512
// kernels): chosen from the CPU's feature bits (avx512); BLIS's own detection picked 'generic'",
// then "; fp32 products on oneDNN 2.6.3's sgemm (LibTorch's oneDNN too) instead" where those run
// on another sgemm (kernel_choice.h's choose_fp32_gemm), else "; fp32 too (" and why ")".
std::string backend();
// Whether fp32 products run on another sgemm than the library's, a symmetric product's triangle as
// row blocks of it (fp64 ones always run on the library); and whether that sgemm is oneDNN's.
bool fp32_on_sgemm();
bool fp32_on_onednn();
// The vector family of those kernels: "avx512", "avx2", "none" (reference code) or "unknown".
std::string kernel_family();

// The layout of a k×m operand: element (i, j) at data[i·rs + j·cs], one of rs and cs being 1.
// W and the results of products with it share it. k×k matrices are contiguous row-major, and
// "upper" is their upper triangle in memory (a[i·k + j], j ≥ i).
struct Panel {
  int k, m;
  int64_t rs, cs;
};

// A's upper triangle ← W·Wᵀ.
template <class T>
void gram_upper(const T* W, const Panel& p, T* A);
// C's upper triangle ← A·Aᵀ for k×k A.
template <class T>
void square_upper(const T* A, T* C, int k);
// C's upper triangle ← A·B for k×k A and B whose product is symmetric.
template <class T>
void product_upper(const T* A, const T* B, T* C, int k);
// C ← R·B for a k×k R.
template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C);

// C ← A·B for row-major n×n A, B on BLIS or the CBLAS, fp32 too (the plain GEMM `muon bench`
// times next to LibTorch's and oneDNN's).
template <class T>
void gemm_square(const T* A, const T* B, T* C, int n);

// C (m×n, rows ldc apart) ← A·B for row-major fp32 A (m×k, rows lda apart) and B (k×n, rows
// ldb apart), one call on the calling thread, where the fp32 products run: BLIS's packed kernels,
// the CBLAS, oneDNN's or MKL's sgemm (ATen's GEMM in a build without any). The emulated bf16
// products (newton_schulz_bf16.h) call it, in parts cut where the data says.
void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc);

// Threads for the passes between products (mirroring a triangle): LibTorch's count with BLIS,
// whose products run on the same OpenMP team; 1 with a CBLAS — OpenBLAS's spinning pthreads would
// compete with one.
int helper_threads();

// Whether a loop over `threads` parts runs on that many threads: not inside a parallel region
// (orthogonalize()'s lanes), where it runs in order on the calling thread.
bool spread(int threads);

// The FLOPs product_upper() performs for k×k factors (the cost model counts them).
double product_upper_flops(double k);

// Runs the products called in its scope — oneDNN's and MKL's sgemm, LibTorch's GEMMs and
// factorizations — on the calling thread alone: OpenMP's thread count and MKL's local one are 1
// until it ends. Their own threads may split a product's inner dimension, and MKL's (PyPI's
// wheels) then changes its bits with their count; split between threads by the caller instead,
// into calls that each run whole on one thread, the bits do not depend on the thread count
// (docs/algorithms.md §Same bits at any thread count).
class OneThread {
 public:
  OneThread();
  ~OneThread();
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int openmp_, mkl_ = 0;
};

}  // namespace muon::detail::blas
