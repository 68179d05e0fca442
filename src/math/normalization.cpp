#include "muon/normalization.h"

#include <cmath>

#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/reduction.h"

namespace muon {

namespace {

at::ScalarType float_type(const at::Tensor& t) {
  return full_precision(t.scalar_type());
}

// Divides each slice along `dim` (−1: rows, −2: columns) by √(Σ x² + eps).
at::Tensor unit_slices(const at::Tensor& U, int64_t dim, double eps) {
  return U * at::rsqrt(sum_of_squares(U, {dim}, /*keepdim=*/true, U.scalar_type()) + eps);
}

// ‖x‖_F per matrix, keeping dims for broadcasting.
at::Tensor matrix_norm(const at::Tensor& x) {
  return vector_norm(x, {-2, -1}, /*keepdim=*/true, x.scalar_type());
}

// reference·(target / current) per matrix, 0 where current is 0 (a zero matrix stays zero).
at::Tensor rescale(const at::Tensor& x, const at::Tensor& target, const at::Tensor& current) {
  const auto safe = at::where(current > 0, current, at::ones_like(current));
  return at::where(current > 0, x * (target / safe), at::zeros_like(x));
}

int64_t statistic_dim(at::IntArrayRef sizes, NorMuonAxis axis) {
  const auto rows = sizes[sizes.size() - 2];
  const auto cols = sizes[sizes.size() - 1];
  const bool per_row = axis == NorMuonAxis::row || (axis == NorMuonAxis::automatic && rows >= cols);
  return per_row ? -1 : -2;  // the dim averaged away
}

}  // namespace

at::Tensor post_normalize(const at::Tensor& U, PostNorm mode, double eps) {
  check(U.dim() >= 2, "post_normalize: expected (..., rows, cols), got shape ", U.sizes());
  check(eps > 0 && std::isfinite(eps), "muon_plus: eps must be > 0, got ", eps);
  const auto X = U.to(float_type(U));
  switch (mode) {
    case PostNorm::none:
      return X;
    case PostNorm::row:
      return unit_slices(X, -1, eps);
    case PostNorm::col:
      return unit_slices(X, -2, eps);
    case PostNorm::row_col:
      return unit_slices(unit_slices(X, -1, eps), -2, eps);
    case PostNorm::col_row:
      return unit_slices(unit_slices(X, -2, eps), -1, eps);
    case PostNorm::frobenius: {
      const double target = std::sqrt(static_cast<double>(std::min(U.size(-2), U.size(-1))));
      return rescale(X, at::full({}, target, X.options()), matrix_norm(X));
    }
  }
  throw Error("post_normalize: unknown mode");
}

std::vector<int64_t> normuon_state_shape(at::IntArrayRef sizes, NorMuonAxis axis) {
  std::vector<int64_t> shape(sizes.begin(), sizes.end());
  shape[shape.size() + statistic_dim(sizes, axis)] = 1;
  return shape;
}

at::Tensor normuon_scale(const at::Tensor& U, at::Tensor& second_moment, double beta2,
                         NorMuonAxis axis) {
  check(beta2 >= 0 && beta2 < 1, "normuon: beta2 must be in [0, 1), got ", beta2);
  const auto X = U.to(float_type(U));
  const auto dim = statistic_dim(X.sizes(), axis);
  check(second_moment.sizes() == at::IntArrayRef(normuon_state_shape(X.sizes(), axis)),
        "normuon: statistic of shape ", second_moment.sizes(), " does not fit an update of shape ",
        X.sizes());
  const auto mean = sum_of_squares(X, {dim}, /*keepdim=*/true, X.scalar_type()) / X.size(dim);
  second_moment.lerp_(mean, 1.0 - beta2);
  const auto scaled = X * at::rsqrt(at::clamp_min(second_moment, 1e-10));
  return rescale(scaled, matrix_norm(X), matrix_norm(scaled));
}

}  // namespace muon
