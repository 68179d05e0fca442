// Shared test helpers: random matrices with chosen singular values, and error-message matching.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace muon::testing {

inline at::Generator seeded(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

// Orthonormal n×k columns (QR of a Gaussian matrix), float64.
inline at::Tensor orthonormal_columns(int64_t n, int64_t k, at::Generator& gen) {
  const auto g = at::normal(0.0, 1.0, {n, k}, gen, at::TensorOptions().dtype(at::kDouble));
  return std::get<0>(at::linalg_qr(g));
}

// A rows×cols matrix U·diag(s)·Vᵀ whose singular values are log-uniform in [lowest, 1].
inline at::Tensor with_singular_values(int64_t rows, int64_t cols, double lowest,
                                       at::ScalarType dtype, at::Generator& gen) {
  const auto k = std::min(rows, cols);
  const auto U = orthonormal_columns(rows, k, gen);
  const auto V = orthonormal_columns(cols, k, gen);
  const auto s = at::exp(at::empty({k}, at::kDouble).uniform_(std::log(lowest), 0.0, gen));
  return at::matmul(U * s, V.t()).to(dtype);
}

// The two implementations of every update, as the `fused` option picks them: the fused CPU kernels
// (unset, on CPU tensors) and the device-generic ATen form that other devices run (false).
// Reference tests run through both.
inline std::vector<std::optional<bool>> kernel_paths() {
  return {std::nullopt, false};
}
inline std::string path_name(const std::optional<bool>& fused) {
  return fused.value_or(true) ? "fused CPU kernels" : "generic ATen form";
}

// Runs `fn`, expecting an exception of type E whose message contains every fragment.
template <class E = std::exception>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const E& e) {
    const std::string message = e.what();
    for (const auto& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message \"" << message << "\" lacks \"" << fragment << "\"";
    }
    return;
  }
  ADD_FAILURE() << "expected an exception";
}

// Largest |a − b| relative to the largest |b| (0 for two empty tensors).
inline double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  if (b.numel() == 0) return 0.0;
  const auto a64 = a.to(at::kDouble);
  const auto b64 = b.to(at::kDouble);
  const double scale = std::max(b64.abs().max().item<double>(), 1e-300);
  return (a64 - b64).abs().max().item<double>() / scale;
}

}  // namespace muon::testing
