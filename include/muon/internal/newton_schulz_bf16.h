// Internal: Newton–Schulz in bfloat16 on CPU. Every matrix product takes bf16 operands and
// accumulates in fp32 (oneDNN's bf16 kernels on CPUs with bf16 dot products, AVX512_BF16 or AMX:
// about twice the fp32 rate). The k×k matrices (A, the polynomial, Gram's R) are bf16, rounded
// once each; A² stays fp32 until the polynomial sums it, and so does the iterate W where a method
// adds a·W (docs/algorithms.md says why).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "muon/orthogonalize.h"

namespace muon::detail {

// Where the bf16 products run: oneDNN, or emulated by fp32 products of the bf16-rounded operands
// (exact products, fp32 sums: the same arithmetic, in another summation order) — what the tests
// measure bf16 accuracy with on a CPU without bf16 dot products.
enum class Bf16Products { onednn, emulated };

// Whether this CPU and build run bf16 products in hardware; else why not.
bool bf16_products_available();
std::string bf16_products_unavailable_reason();

// G: (batch, rows, cols) contiguous float32, not written. Normalizes each matrix as
// orthogonalize() does, G / (‖G‖_F·safety + eps) (its sum of squares in double, so that any scale
// of G works), in the pass that rounds it to bf16; iterates it on its smaller side by `method`
// (plain, symmetric or gram, as the fp32 methods) into X (G's shape and dtype, not G) and returns
// X. The bf16 operands and the k×k matrices live in `ws` (slots operands and squares), so that a
// workspace reused for the same shape allocates nothing.
at::Tensor& bf16_iterations(const at::Tensor& G, at::Tensor& X, NsMethod method,
                            const CoefficientTable& table, int64_t steps,
                            const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws,
                            Bf16Products products = Bf16Products::onednn);

}  // namespace muon::detail
