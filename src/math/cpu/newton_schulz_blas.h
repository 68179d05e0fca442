// Internal: Newton–Schulz iterations on CPU through CBLAS, exploiting symmetry (SPEC §1, issue 4).
#pragma once

#include <ATen/ATen.h>

#include "muon/orthogonalize.h"

namespace muon::detail {

// Whether the library was built with a CBLAS (syrk/symm) to run the routines below.
bool have_cblas();

// Both take X (batch, rows, cols), contiguous float32 or float64, already normalized, and return
// the iterated matrices in a workspace tensor of the same shape. Each matrix is iterated on its
// smaller side k×m (k = min(rows, cols)); a tall matrix is read as its transpose in column-major
// order, so nothing is copied or transposed.
//
// symmetric: per iteration A = W·Wᵀ and A² by syrk (one triangle each, k²m + k³ flops) and
// W ← (a·I + b·A + c·A²)·W by one GEMM (2k²m): 3k²m + k³ against the plain chain's 4k²m + 2k³.
at::Tensor symmetric_iterations(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                                OrthogonalizeWorkspace& ws);

// gram: iterates on the k×k Gram matrix only (Gram Newton–Schulz). With Q_t = a·I + b·A_t + c·A_t²,
// W_T = Q_{T−1}⋯Q_0·W_0 and A_{t+1} = A_t·Q_t² (the Q_t are polynomials in A_0, so they commute):
// k²m + 2k²m for the two products with W and about 6k³ per iteration. `restart` > 0 rebuilds W and
// A from scratch after every `restart` iterations to stop rounding drift.
at::Tensor gram_iterations(const at::Tensor& X, const CoefficientTable& table, int64_t steps,
                           int64_t restart, OrthogonalizeWorkspace& ws);

}  // namespace muon::detail
