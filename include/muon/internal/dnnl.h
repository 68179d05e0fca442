// Internal: matrix products through oneDNN (libdnnl, which Debian's LibTorch itself links), the
// library that runs bf16 products with fp32 accumulation on CPUs that have bf16 dot products
// (AVX512_BF16 or AMX) — at about twice the fp32 rate — and picks its kernels by instruction set.
// Its OpenMP threads are LibTorch's (at::set_num_threads). Without oneDNN in the build,
// available() is false and nothing else may be called.
#pragma once

#include <cstdint>
#include <string>

namespace muon::detail::dnnl {

enum class Type { f32, bf16 };

bool available();
// "oneDNN 2.6.3", or why it is absent.
std::string version();

// A strided matrix operand: element (i, j) at data[i·rs + j·cs] (in elements of its type).
struct Operand {
  const void* data;
  int64_t rs, cs;
};

// C (m×n) = A (m×k)·B (k×n) + beta·C (C not read when beta is 0); A and B of type `in`, C of
// type `out`, accumulated in fp32. C may be a strided view (rows rsc, columns csc apart). One
// primitive per shape, layout, types and beta is made on first use and kept. Throws muon::Error
// when oneDNN has no kernel for it on this CPU.
void matmul(int64_t m, int64_t n, int64_t k, Type in, Operand a, Operand b, Type out, void* c,
            int64_t rsc, int64_t csc, float beta = 0.0f);

// C (m×n, row-major, rows ldc apart) ← op(A)·op(B) in fp32 by oneDNN's BLAS-like sgemm (its jit
// GEMM kernels), on the calling thread's OpenMP team: op(A) is m×k, A row-major with rows lda
// apart, read transposed where ta; likewise B (k×n) with tb. Throws muon::Error where it fails.
void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float* c, int64_t ldc);

// The kernel oneDNN picks for an n×n×n product of `in` into `out` (e.g. "brg:avx512_core_amx",
// "gemm:jit"), or "" when it has none on this CPU.
std::string kernel(Type in, Type out, int64_t n = 512);

}  // namespace muon::detail::dnnl
