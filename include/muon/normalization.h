// Post-orthogonalization normalizations of Muon's update (docs/design.md §NorMuon and Muon+). Pure
// functions of tensors shaped (..., rows, cols); computed in float32 (float64 stays float64).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "muon/enum_names.h"

namespace muon {

// Muon+ (stateless): rescale rows and/or columns of U to unit norm, or all of U to a fixed norm.
enum class PostNorm {
  none,
  row,        // each row ← row / √(Σ row² + eps)
  col,        // each column ← column / √(Σ column² + eps)
  row_col,    // rows, then columns (Muon+'s default mode)
  col_row,    // columns, then rows
  frobenius,  // U ← U·√min(rows, cols) / ‖U‖_F (nanochat's variant); a zero U stays zero
};

template <>
struct EnumNames<PostNorm> {
  static constexpr const char* noun = "muon_plus mode";
  static constexpr const char* plural = "modes";
  static constexpr std::array<std::pair<PostNorm, const char*>, 6> table{
      {{PostNorm::none, "none"},
       {PostNorm::row, "row"},
       {PostNorm::col, "col"},
       {PostNorm::row_col, "row_col"},
       {PostNorm::col_row, "col_row"},
       {PostNorm::frobenius, "frobenius"}}};
};
inline std::string to_string(PostNorm mode) {
  return enum_name(mode);
}
inline PostNorm post_norm_from_string(const std::string& name) {
  return enum_from_name<PostNorm>(name);
}

at::Tensor post_normalize(const at::Tensor& U, PostNorm mode, double eps = 1e-8);

// NorMuon (arXiv 2510.05491; nanochat/flaxchat): a per-row or per-column second-moment estimate
// of U that evens out the update's row (or column) norms.
enum class NorMuonAxis {
  automatic,  // per row when rows ≥ cols, else per column
  row,        // statistic per row: mean over columns, shape (..., rows, 1)
  col,        // statistic per column: mean over rows, shape (..., 1, cols)
};

template <>
struct EnumNames<NorMuonAxis> {
  static constexpr const char* noun = "NorMuon axis";
  static constexpr const char* plural = "axes";
  static constexpr std::array<std::pair<NorMuonAxis, const char*>, 3> table{
      {{NorMuonAxis::automatic, "auto"}, {NorMuonAxis::row, "row"}, {NorMuonAxis::col, "col"}}};
};
inline std::string to_string(NorMuonAxis axis) {
  return enum_name(axis);
}
inline NorMuonAxis normuon_axis_from_string(const std::string& name) {
  return enum_from_name<NorMuonAxis>(name);
}

// The statistic's shape for U of `sizes` under `axis`.
std::vector<int64_t> normuon_state_shape(at::IntArrayRef sizes, NorMuonAxis axis);

// v = mean(U², axis); S ← lerp(S, v, 1 − beta2) in place; U' = U·rsqrt(max(S, 1e-10)), then
// rescaled per matrix to ‖U‖_F (a zero U stays zero). Returns U'.
at::Tensor normuon_scale(const at::Tensor& U, at::Tensor& second_moment, double beta2,
                         NorMuonAxis axis);

}  // namespace muon
