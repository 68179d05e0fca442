// Internal: the fp32 products of muon/internal/blas.h on oneDNN's BLAS-like sgemm, where it is
// safe and fast: at the Newton–Schulz chain's shapes its jit GEMM kernels ran 5-18% faster than
// BLIS 0.9's skx kernels on an AVX-512 CPU (docs/benchmarks.md). oneDNN has no syrk or gemmt, so
// a symmetric product's upper triangle is its row blocks, one product each (upper_blocks.h); the
// blocks' diagonal blocks are computed whole, so their lower triangles are written too (the
// callers read only the upper triangle).
#pragma once

#include <string>

#include "muon/internal/blas.h"

namespace muon::detail::blas::onednn {

// Whether fp32 products run here: the CPU has AVX-512 (fp32_family), and LibTorch runs on the
// oneDNN release this build links (Debian's LibTorch links the system's). Beside a LibTorch that
// bundles another oneDNN (PyPI's), that copy exports weak symbols of oneDNN's own — the one-time
// set-up of the sgemm kernels among them — which take the place of the linked library's, and its
// sgemm fails.
bool chosen();
// Where they run, e.g. "oneDNN 2.6.3's sgemm (LibTorch's oneDNN 2.6.3 too)", or why not.
std::string description();

void gram_upper(const float* W, const Panel& p, float* A);
void square_upper(const float* A, float* C, int k);
void product_upper(const float* A, const float* B, float* C, int k);
void gemm_left(const float* R, const float* B, const Panel& p, float* C);

}  // namespace muon::detail::blas::onednn
