// Lion against a straightforward reference written here, its kernels against each other, its
// state through checkpoints and the hybrid.
#include "muon/lion.h"

#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "demo/gpt.h"
#include "golden/scenarios.h"
#include "helpers.h"
#include "muon/algorithms.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/param_state.h"
#include "muon/stochastic_rounding.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// The paper's update (arXiv 2302.06675, Algorithm 2) in float64, one tensor at a time.
struct ReferenceLion {
  double lr, beta1, beta2, weight_decay;
  std::vector<at::Tensor> m;

  void step(std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
    if (m.empty()) {
      for (const auto& p : params) m.push_back(at::zeros(p.sizes(), at::kDouble));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = grads[i].to(at::kDouble);
      const auto c = m[i] * beta1 + g * (1 - beta1);
      params[i] = params[i] * (1 - lr * weight_decay) - lr * at::sign(c);
      m[i] = m[i] * beta2 + g * (1 - beta2);
    }
  }
};

std::vector<at::Tensor> shapes_of_every_kind(at::Generator& gen, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{}, {0}, {7}, {3, 5}, {64, 33}, {70000}}) {
    out.push_back(at::randn(shape, gen).to(dtype));
  }
  out.push_back(at::randn({6, 9}, gen).to(dtype).t());  // transposed: not contiguous
  // Large enough for int8 state: rows of 1000 (blocks 256, 256, 256, 232), transposed.
  out.push_back(at::randn({1000, 9}, gen).to(dtype).t());
  for (auto& p : out) p.requires_grad_(true);
  return out;
}

TEST(Lion, EqualsThePapersUpdateOverTenSteps) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(11);
    auto params = shapes_of_every_kind(gen, at::kDouble);
    std::vector<at::Tensor> ref;
    for (const auto& p : params) ref.push_back(p.detach().clone());
    Lion opt(params, LionOptions(3e-3).betas({0.9, 0.99}).weight_decay(0.5).fused(fused));
    ReferenceLion reference{3e-3, 0.9, 0.99, 0.5, {}};
    for (int step = 0; step < 10; ++step) {
      std::vector<at::Tensor> grads;
      for (auto& p : params) {
        grads.push_back(at::randn(p.sizes(), gen).to(at::kDouble));
        p.mutable_grad() = grads.back();
      }
      opt.step();
      reference.step(ref, grads);
      for (size_t i = 0; i < params.size(); ++i) {
        // Same operations in float64; only the order of the decay and the sign's subtraction
        // may round differently: a few ulps.
        EXPECT_TRUE(at::allclose(params[i].detach(), ref[i], 1e-14, 1e-14)) << "tensor " << i;
      }
    }
    const auto& state =
        static_cast<const LionParamState&>(*opt.state().at(compat::param_state_key(params[3])));
    EXPECT_EQ(state.step(), 10);
    EXPECT_TRUE(at::allclose(state.exp_avg(), reference.m[3], 1e-14, 1e-14));
  }
}

TEST(Lion, DefaultsAreLionPytorchs) {
  const LionOptions o;
  EXPECT_EQ(o.lr(), 1e-4);
  EXPECT_EQ(o.betas(), Betas(0.9, 0.99));
  EXPECT_EQ(o.weight_decay(), 0.0);
}

uint16_t bits_at(const at::Tensor& bf16, int64_t i) {
  return reinterpret_cast<const uint16_t*>(bf16.data_ptr())[i];
}

TEST(Lion, Bf16StateHoldsTheStochasticRoundingOfTheFp32Momentum) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(13);
    auto A = at::randn({100}, gen).requires_grad_(true);
    auto B = at::randn({3, 50}, gen).requires_grad_(true);
    Lion opt({A, B}, LionOptions(1e-3).state_dtype(at::kBFloat16).fused(fused));
    A.mutable_grad() = at::randn({100}, gen);
    const auto gB = at::randn({3, 50}, gen);
    B.mutable_grad() = gB;
    opt.step();
    // From zero state m = 0·β2 + (1−β2)·g exactly; tensor B is index 1, step count 0.
    const uint32_t salt = sr::tensor_salt(sr::step_seed(0), 1);
    const auto m = gB.reshape({-1}) * static_cast<float>(1 - 0.99);
    const auto& state =
        static_cast<const LionParamState&>(*opt.state().at(compat::param_state_key(B)));
    ASSERT_EQ(state.exp_avg().scalar_type(), at::kBFloat16);
    for (int64_t i = 0; i < 150; ++i) {
      EXPECT_EQ(bits_at(state.exp_avg(), i), sr::round_bits(m[i].item<float>(), salt, i)) << i;
    }
  }
}

// Options out of range, resuming, the fused kernel against the ATen form and Lion as a group of
// the hybrid: test_conformance.cpp, for every algorithm.
TEST(Lion, RejectsBadOptionsAndGradientsNamingThemAndChangingNothing) {
  auto W = at::randn({4, 3}).requires_grad_(true);
  expect_error<Error>([&] { Lion({W}, LionOptions().state_dtype(at::kHalf)); },
                      {"Lion: state_dtype Half is not supported", "float32 (full precision), bfloat16 (stochastic rounding) or int8"});
  Lion opt({W}, LionOptions(0.1));
  const auto before = W.detach().clone();
  W.mutable_grad() = at::randn({3, 4});
  expect_error<Error>([&] { opt.step(); },
                      {"Lion: parameter 0 of param group 0 has a gradient of shape [3, 4]"});
  EXPECT_TRUE(at::equal(W, before));
  EXPECT_TRUE(opt.state().empty());
}

}  // namespace
}  // namespace muon
