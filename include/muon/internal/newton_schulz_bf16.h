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

// Where the bf16 products run:
// - onednn: every product on the oneDNN this build links;
// - libtorch: the whole products with a bf16 result — each Gram restart's W ← R·W, and Gram's
//   result R·W, rounded to bf16 and widened — on LibTorch's own bf16 GEMM (at::mm, on the oneDNN
//   LibTorch bundles), the rest on ours: ATen has no bf16 product with an fp32 result or sum
//   on CPU, and the row blocks of the symmetric products ran no faster there;
// - emulated: fp32 products of the bf16-rounded operands (exact products, fp32 sums: onednn's
//   arithmetic, in another summation order), on the fp32 products' library at the fp32 rate — where
//   the CPU has no bf16 dot products (or the build no oneDNN), whose bf16 GEMMs would run at a
//   hundredth of it.
enum class Bf16Products { onednn, libtorch, emulated };

// Whether this CPU and build run bf16 products in hardware; else why not.
bool bf16_products_available();
std::string bf16_products_unavailable_reason();

// emulated where bf16_products_available() is false; libtorch where LibTorch's oneDNN is a newer
// release than the one this build links (PyPI's torch bundles a current one; Debian's links the
// system's, ours): its GEMM then ran the large products up to 1.6 times as fast
// (docs/algorithms.md); else onednn.
Bf16Products default_bf16_products();
// Where default_bf16_products() puts the products and why, e.g. "whole bf16 products on
// LibTorch's oneDNN 3.13.3 (newer than the linked oneDNN 2.6.3), the rest on the linked one";
// "emulated: " and why, where bf16_products_available() is false.
std::string bf16_products_description();

// G: (batch, rows, cols) contiguous float32, not written. Normalizes each matrix as
// orthogonalize() does, G / (‖G‖_F·safety + eps) (its sum of squares in double, so that any scale
// of G works), in the pass that rounds it to bf16; iterates it on its smaller side by `method`
// (plain, symmetric or gram, as the fp32 methods) into X (G's shape and dtype, not G) and returns
// X. The bf16 operands and the k×k matrices live in `ws` (slots operands and squares), so that a
// workspace reused for the same shape allocates nothing (LibTorch's GEMM, under
// Bf16Products::libtorch, allocates its oneDNN scratchpad per product: heap memory reused from
// one product to the next, ~2 MB at 1280×5120).
at::Tensor& bf16_iterations(const at::Tensor& G, at::Tensor& X, NsMethod method,
                            const CoefficientTable& table, int64_t steps,
                            const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws,
                            Bf16Products products);

}  // namespace muon::detail
