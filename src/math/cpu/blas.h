// Internal: the dense products the CPU Newton–Schulz methods (newton_schulz_blas.cpp) are built
// of, on BLIS where the build found it and on any CBLAS otherwise. BLIS is preferred: its gemmt
// computes one triangle of a product at GEMM speed, and its syrk runs closer to GEMM speed than
// OpenBLAS 0.3.21's (docs/benchmarks.md).
#pragma once

#include <cstdint>

namespace muon::detail::blas {

// Whether this build has a backend; without one the functions below must not be called.
bool available();
// "BLIS", "CBLAS" or "none".
const char* backend();

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
// C's upper triangle ← alpha·A·Aᵀ + beta·C for k×k A.
template <class T>
void square_upper(T alpha, const T* A, T beta, T* C, int k);
// C's upper triangle ← A·B for k×k A and B whose product is symmetric.
template <class T>
void product_upper(const T* A, const T* B, T* C, int k);
// C ← S·B, reading only the upper triangle of the k×k symmetric S.
template <class T>
void symm_left(const T* S, const T* B, const Panel& p, T* C);
// C ← R·B for a k×k R.
template <class T>
void gemm_left(const T* R, const T* B, const Panel& p, T* C);

// Threads for the passes between products (mirroring a triangle): the backend's own count where
// its workers are an OpenMP team that such a pass reuses (BLIS), else 1 — OpenBLAS's spinning
// pthreads would compete with them.
int helper_threads();

// The FLOPs product_upper() performs for k×k factors (the cost model counts them).
double product_upper_flops(double k);

}  // namespace muon::detail::blas
