// Internal: Newton–Schulz iterations on CPU through BLIS or a CBLAS, exploiting symmetry
// (docs/design.md §Newton–Schulz orthogonalization: methods and cost model).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "muon/orthogonalize.h"

namespace muon::detail {

// Whether the library was built with BLIS or a CBLAS (muon/internal/blas.h) to run the routines
// below.
bool have_blas();

// Both take X (batch, rows, cols), contiguous float32 or float64, already normalized, which they
// overwrite, and return the iterated matrices: X itself or a workspace tensor of its shape. Each
// matrix is iterated on its smaller side k×m (k = min(rows, cols)); a tall matrix is read as its
// transpose through strides, so nothing is copied or transposed.
//
// symmetric: per iteration A = W·Wᵀ and A² by syrk (one triangle each, k²m + k³ flops) and
// W ← (a·I + b·A + c·A²)·W by one product (2k²m): 3k²m + k³ against the plain chain's 4k²m + 2k³.
at::Tensor symmetric_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                                OrthogonalizeWorkspace& ws);

// gram: iterates on the k×k Gram matrix (Gram Newton–Schulz). Touches W (k²m per syrk, 2k²m per
// product) only to form A at the start, at each restart and for the result; per iteration ~4k³
// on the k×k side. `restarts`: sorted iteration counts after which W and A are formed afresh.
at::Tensor gram_iterations(at::Tensor& X, const CoefficientTable& table, int64_t steps,
                           const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws);

// The cost model `automatic` chooses by: FLOPs of each method for `steps` iterations on a k×m
// side (k ≤ m), counting a product known to be symmetric at what computes it: row blocks of
// `block_rows` rows each (upper_blocks.h: bf16, and fp32 where blas::fp32_on_sgemm()), or the
// library's triangles where block_rows is 0.
double symmetric_flops(double k, double m, int64_t steps, int64_t block_rows);
double gram_flops(double k, double m, int64_t steps, const std::vector<int64_t>& restarts,
                  int64_t block_rows);

}  // namespace muon::detail
