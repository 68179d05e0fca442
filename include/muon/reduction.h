// Sums of squares and 2-norms whose bits do not depend on LibTorch's thread count
// (docs/algorithms.md §Same bits at any thread count). Every norm an optimizer step takes —
// Newton–Schulz's normalization, MuonEq, NorMuon and Muon+, Dion's columns, LAMB's trust ratio,
// clipping's global norm — goes through these.
//
// ATen's CPU kernels split a reduction of one output over 32768 elements or more between the
// threads, each summing its share, so its bits follow the thread count; and a slice reduced alone
// or inside a batch (a matrix in one of Muon's lanes, or in the whole batch) need not get the same
// order either. Here every output over more than kReductionBlock elements is reduced in blocks of
// kReductionBlock consecutive elements, each block alone, and the blocks' sums are added in block
// order in fp64: the same bits for a slice whatever the thread count and whatever else is reduced
// beside it. Shorter outputs are reduced by ATen as they are (one thread each). On other devices
// ATen's own reduction runs: its bits do not depend on the host's threads.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace muon {

// Elements per block of a single-output reduction: under ATen's grain (32768), so each block is
// reduced on one thread.
constexpr int64_t kReductionBlock = int64_t{1} << 14;

// Σ x² over `dims` (every dim when empty), accumulated in `dtype` (fp64 for the blocks' sums of
// a blocked reduction, rounded to `dtype` once).
at::Tensor sum_of_squares(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
                          at::ScalarType dtype);

// √(Σ x²) over `dims` likewise: ‖x‖₂ of each slice.
at::Tensor vector_norm(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
                       at::ScalarType dtype);

}  // namespace muon
