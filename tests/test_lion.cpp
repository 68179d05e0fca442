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

// Every parameter and state tensor of two runs, bit for bit.
void run_both_paths(at::ScalarType param_dtype, at::ScalarType state_dtype) {
  SCOPED_TRACE(c10::toString(param_dtype) + std::string(" / ") + c10::toString(state_dtype));
  auto gen = seeded(12);
  auto fused = shapes_of_every_kind(gen, param_dtype);
  std::vector<at::Tensor> generic;
  for (const auto& p : fused) generic.push_back(p.detach().clone().requires_grad_(true));
  const auto options = LionOptions(1e-2).weight_decay(0.1).state_dtype(state_dtype);
  Lion a(fused, LionOptions(options).fused(true));
  Lion b(generic, LionOptions(options).fused(false));
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < fused.size(); ++i) {
      const auto g = at::randn(fused[i].sizes(), gen).to(param_dtype);
      fused[i].mutable_grad() = g;
      generic[i].mutable_grad() = g.clone();
    }
    a.step();
    b.step();
  }
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(at::equal(fused[i], generic[i])) << "parameter " << i;
    const auto state_a = read_param_state(a, fused[i]).value();
    const auto state_b = read_param_state(b, generic[i]).value();
    for (const auto& [name, t] : state_a.tensors) {
      EXPECT_TRUE(at::equal(t, state_b.tensors.at(name))) << "state " << i << " " << name;
    }
  }
}

TEST(Lion, FusedKernelAndGenericFormGiveTheSameBits) {
  run_both_paths(at::kFloat, at::kFloat);
  run_both_paths(at::kFloat, at::kBFloat16);
  run_both_paths(at::kBFloat16, at::kFloat);
  run_both_paths(at::kDouble, at::kFloat);
  run_both_paths(at::kFloat, at::kChar);
  run_both_paths(at::kBFloat16, at::kChar);
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

TEST(Lion, CheckpointResumesAsIfUninterrupted) {
  auto gen = seeded(14);
  auto W = at::randn({8, 5}, gen).requires_grad_(true);
  auto v = at::randn({5}, gen).requires_grad_(true);
  auto W2 = W.detach().clone().requires_grad_(true);
  auto v2 = v.detach().clone().requires_grad_(true);
  const auto options = LionOptions(1e-2).weight_decay(0.1).state_dtype(at::kBFloat16);
  Lion straight({W, v}, options);
  Lion first({W2, v2}, options);
  std::vector<std::vector<at::Tensor>> grads;
  for (int step = 0; step < 6; ++step)
    grads.push_back({at::randn({8, 5}, gen), at::randn({5}, gen)});
  for (int step = 0; step < 3; ++step) {
    W.mutable_grad() = grads[step][0], v.mutable_grad() = grads[step][1];
    W2.mutable_grad() = grads[step][0], v2.mutable_grad() = grads[step][1];
    straight.step();
    first.step();
  }
  std::stringstream saved;
  torch::save(first, saved);
  Lion resumed({W2, v2}, options);
  torch::load(resumed, saved);
  for (int step = 3; step < 6; ++step) {
    W.mutable_grad() = grads[step][0], v.mutable_grad() = grads[step][1];
    W2.mutable_grad() = grads[step][0], v2.mutable_grad() = grads[step][1];
    straight.step();
    resumed.step();
  }
  EXPECT_TRUE(at::equal(W, W2));
  EXPECT_TRUE(at::equal(v, v2));
}

TEST(Lion, RejectsBadOptionsAndGradientsNamingThemAndChangingNothing) {
  auto W = at::randn({4, 3}).requires_grad_(true);
  expect_error<Error>([&] { Lion({W}, LionOptions(-1.0)); }, {"Lion: lr must be >= 0, got -1"});
  expect_error<Error>(
      [&] {
        Lion({W}, LionOptions().betas({1.0, 0.99}));
      },
      {"Lion: betas[0] must be in [0, 1), got 1"});
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

TEST(Lion, RunsAsAGroupOfTheHybridAsOnItsOwn) {
  cli::Gpt model(golden::tiny_gpt());
  HybridOptions options;
  HybridOptimizer hybrid(route(*model), options);
  auto gen = seeded(15);
  auto extra = at::randn({6, 4}, gen).requires_grad_(true);  // a matrix: Lion takes any tensor
  auto alone = extra.detach().clone().requires_grad_(true);
  const auto lion = LionOptions(1e-2).weight_decay(0.2).state_dtype(at::kBFloat16);
  hybrid.add_param_group({{extra}, std::make_unique<LionOptions>(lion)});
  Lion reference({alone}, lion);
  for (int step = 0; step < 4; ++step) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::zeros_like(p);
    const auto g = at::randn({6, 4}, gen);
    extra.mutable_grad() = g;
    alone.mutable_grad() = g.clone();
    hybrid.step();
    reference.step();
  }
  EXPECT_TRUE(at::equal(extra, alone));  // the first Lion parameter of each: the same seeds
  const auto& group = hybrid.param_groups().back();
  EXPECT_STREQ(algorithm_name(group.options()), "lion");
  EXPECT_EQ(hybrid.role_of(extra), Role::others);  // the elementwise role
}

}  // namespace
}  // namespace muon
