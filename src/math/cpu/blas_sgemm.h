// Internal: the fp32 products of muon/internal/blas.h on an sgemm where one ran them
// faster than BLIS 0.9's skx kernels on AVX-512 CPUs (docs/benchmarks.md): oneDNN's BLAS-like
// sgemm (its jit GEMM kernels) where LibTorch runs on the oneDNN release this build links
// (Debian's LibTorch), else the sgemm of LibTorch's own BLAS where that is MKL (PyPI's torch on
// x86-64) — the rule is choose_fp32_gemm() (kernel_choice.h). Neither has a syrk or gemmt here,
// so a symmetric product's upper triangle is its row blocks, one product each (upper_blocks.h);
// the blocks' diagonal blocks are computed whole, so their lower triangles are written too (the
// callers read only the upper triangle).
#pragma once

#include <string>

#include "muon/internal/blas.h"

namespace muon::detail::blas::sgemm {

// Whether fp32 products run here rather than on the library.
bool chosen();
// Whether that sgemm is oneDNN's (else LibTorch's BLAS).
bool on_onednn();
// Where they run, e.g. "oneDNN 2.6.3's sgemm (LibTorch's oneDNN too)", or why not.
std::string description();

void gram_upper(const float* W, const Panel& p, float* A);
void square_upper(const float* A, float* C, int k);
void product_upper(const float* A, const float* B, float* C, int k);
void gemm_left(const float* R, const float* B, const Panel& p, float* C);
void gemm_rows(int m, int n, int k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc);

}  // namespace muon::detail::blas::sgemm
