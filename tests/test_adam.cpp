// The Adam family against libtorch's optimizers and straightforward references written here.
#include "muon/adam.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "helpers.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/stochastic_rounding.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// Leaf parameters of many shapes, including a 0-d scalar, empty tensors and non-contiguous views.
std::vector<at::Tensor> assorted_parameters(at::Generator& gen) {
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{
           {}, {0}, {7}, {3, 5}, {64, 33}, {4, 0, 3}, {2, 3, 4, 5}, {70000}}) {
    out.push_back(at::randn(shape, gen));
  }
  out.push_back(at::randn({6, 9}, gen).t());                 // transposed
  out.push_back(at::randn({10, 8}, gen).slice(1, 0, 8, 2));  // strided columns
  for (auto& p : out) p.requires_grad_(true);
  return out;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    // Same strides as the original, so libtorch's side sees the same layout.
    auto copy = at::empty_strided(p.sizes(), p.strides(), p.options());
    copy.copy_(p.detach());
    out.push_back(copy.requires_grad_(true));
  }
  return out;
}

void set_same_gradients(std::vector<at::Tensor>& a, std::vector<at::Tensor>& b,
                        at::Generator& gen) {
  for (size_t i = 0; i < a.size(); ++i) {
    const auto g = at::randn(a[i].sizes(), gen);
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

void expect_close(const std::vector<at::Tensor>& ours, const std::vector<at::Tensor>& ref,
                  double tolerance) {
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_LE(testing::max_rel_diff(ours[i].detach(), ref[i].detach()), tolerance)
        << "parameter " << i << " of shape " << ours[i].sizes();
  }
}

TEST(AdamW, EqualsLibtorchAdamWOver200Steps) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(1);
    auto ours = assorted_parameters(gen);
    auto theirs = clones(ours);
    AdamW opt(ours, AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1).fused(fused));
    torch::optim::AdamW ref(
        theirs, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    for (int step = 0; step < 200; ++step) {
      set_same_gradients(ours, theirs, gen);
      opt.step();
      ref.step();
    }
    expect_close(ours, theirs, 1e-6);
    EXPECT_FALSE(ours[8].is_contiguous());  // still a view with its own strides
  }
}

TEST(Adam, CoupledWeightDecayEqualsLibtorchAdam) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(2);
    auto ours = assorted_parameters(gen);
    auto theirs = clones(ours);
    Adam opt(ours, AdamOptions(3e-3).weight_decay(0.05).fused(fused));
    torch::optim::Adam ref(theirs, torch::optim::AdamOptions(3e-3).weight_decay(0.05));
    for (int step = 0; step < 200; ++step) {
      set_same_gradients(ours, theirs, gen);
      opt.step();
      ref.step();
    }
    expect_close(ours, theirs, 1e-6);
  }
}

// Each weight-decay method as libtorch's optimizers express it: decoupled is AdamW's own, l2 is
// Adam's, independent W·(1 − λ) is AdamW at λ/lr, palm W·(1 − lr²·λ) is AdamW at lr·λ — whichever
// class (AdamW or Adam) carries the method.
template <class Ours>
void expect_method_matches_libtorch(WeightDecayMethod method, std::optional<bool> fused) {
  const double lr = 2e-2, wd = 0.2;
  auto gen = seeded(40 + static_cast<int>(method));
  auto ours = assorted_parameters(gen);
  auto theirs = clones(ours);
  Ours opt(ours,
           typename Ours::Options(lr).weight_decay(wd).weight_decay_method(method).fused(fused));
  std::unique_ptr<torch::optim::Optimizer> ref;
  if (method == WeightDecayMethod::l2) {
    ref = std::make_unique<torch::optim::Adam>(theirs, torch::optim::AdamOptions(lr).weight_decay(wd));
  } else {
    const double as_adamw = method == WeightDecayMethod::decoupled     ? wd
                            : method == WeightDecayMethod::independent ? wd / lr
                                                                       : wd * lr;
    ref = std::make_unique<torch::optim::AdamW>(
        theirs, torch::optim::AdamWOptions(lr).weight_decay(as_adamw));
  }
  for (int step = 0; step < 50; ++step) {
    set_same_gradients(ours, theirs, gen);
    opt.step();
    ref->step();
  }
  expect_close(ours, theirs, 1e-5);
}

TEST(AdamFamily, WeightDecayMethodsEqualLibtorchForms) {
  for (const auto& fused : testing::kernel_paths()) {
    for (auto method : {WeightDecayMethod::decoupled, WeightDecayMethod::independent,
                        WeightDecayMethod::l2, WeightDecayMethod::palm}) {
      SCOPED_TRACE(testing::path_name(fused) + " " + to_string(method));
      expect_method_matches_libtorch<AdamW>(method, fused);
      expect_method_matches_libtorch<Adam>(method, fused);
    }
  }
  EXPECT_EQ(AdamWOptions().weight_decay_method(), WeightDecayMethod::decoupled);
  EXPECT_EQ(AdamOptions().weight_decay_method(), WeightDecayMethod::l2);
  auto W = at::ones({2}).requires_grad_(true);
  expect_error<Error>(
      [&] { Lamb({W}, LambOptions().weight_decay_method(WeightDecayMethod::palm)); },
      {"Lamb: weight_decay_method palm is not supported", "decoupled"});
}

// optax's NAdam and LAMB, step by step in double precision.
struct ReferenceAdam {
  double lr, b1, b2, eps, wd;
  bool nesterov, lamb, decoupled;
  at::Tensor m, v;
  int64_t t = 0;

  void step(at::Tensor& w, at::Tensor g) {
    g = g.to(at::kDouble);
    if (!m.defined()) {
      m = at::zeros_like(g);
      v = at::zeros_like(g);
    }
    ++t;
    if (decoupled) w = w * (1 - lr * wd);
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, t);
    const double bc2 = 1 - std::pow(b2, t);
    const auto m_hat = nesterov ? b1 * m / (1 - std::pow(b1, t + 1)) + (1 - b1) * g / bc1 : m / bc1;
    auto r = m_hat / (at::sqrt(v / bc2) + eps);
    if (!lamb) {
      w = w - lr * r;
      return;
    }
    r = r + wd * w;
    const double wn = w.norm().item<double>();
    const double rn = r.norm().item<double>();
    const double trust = (wn > 0 && rn > 0) ? wn / rn : 1.0;
    w = w - lr * trust * r;
  }
};

TEST(NAdam, EqualsReferenceForAdamAndAdamW) {
  for (const auto& fused : testing::kernel_paths()) {
    for (bool decoupled : {false, true}) {
      SCOPED_TRACE(testing::path_name(fused));
      auto gen = seeded(3);
      auto W = at::randn({17, 9}, gen).requires_grad_(true);
      auto W_ref = W.detach().to(at::kDouble);
      std::unique_ptr<torch::optim::Optimizer> opt;
      if (decoupled) {
        opt = std::make_unique<AdamW>(
            std::vector<at::Tensor>{W},
            AdamWOptions(1e-2).nesterov(true).weight_decay(0.1).fused(fused));
      } else {
        opt = std::make_unique<Adam>(std::vector<at::Tensor>{W},
                                     AdamOptions(1e-2).nesterov(true).fused(fused));
      }
      ReferenceAdam ref{1e-2, 0.9, 0.999, 1e-8, decoupled ? 0.1 : 0.0, true, false, decoupled};
      for (int step = 0; step < 50; ++step) {
        const auto g = at::randn({17, 9}, gen);
        W.mutable_grad() = g;
        opt->step();
        ref.step(W_ref, g);
      }
      EXPECT_LT(testing::max_rel_diff(W.detach(), W_ref), 1e-5);
      // NAdam differs from plain Adam: the test would notice a missing Nesterov term.
      ReferenceAdam plain{1e-2, 0.9, 0.999, 1e-8, decoupled ? 0.1 : 0.0, false, false, decoupled};
      auto W_plain = W_ref.clone();
      plain.step(W_plain, at::ones({17, 9}));
      ReferenceAdam nesterov{1e-2, 0.9, 0.999, 1e-8, decoupled ? 0.1 : 0.0, true, false, decoupled};
      auto W_nesterov = W_ref.clone();
      nesterov.step(W_nesterov, at::ones({17, 9}));
      EXPECT_GT((W_plain - W_nesterov).abs().max().item<double>(), 1e-4);
    }
  }
}

TEST(Lamb, EqualsReferenceIncludingTrustRatio) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(4);
    auto W = at::randn({300, 200}, gen).requires_grad_(true);  // several kernel blocks
    auto W_ref = W.detach().to(at::kDouble);
    Lamb opt({W}, LambOptions(1e-2).weight_decay(0.01).fused(fused));
    ReferenceAdam ref{1e-2, 0.9, 0.999, 1e-6, 0.01, false, true, false};
    for (int step = 0; step < 30; ++step) {
      const auto g = at::randn({300, 200}, gen);
      W.mutable_grad() = g;
      opt.step();
      ref.step(W_ref, g);
    }
    EXPECT_LT(testing::max_rel_diff(W.detach(), W_ref), 1e-5);
    // A zero parameter has trust ratio 1: the step is lr·r.
    auto Z = at::zeros({4}).requires_grad_(true);
    Lamb zero({Z}, LambOptions(0.1).fused(fused));
    Z.mutable_grad() = at::ones({4});
    zero.step();
    // m̂ = 1, v̂ = 1: r = 1/(1 + 1e-6)
    EXPECT_NEAR(Z[0].item<double>(), -0.1 / (1 + 1e-6), 1e-7);
  }
}

TEST(AdamW, Bf16And16BitParametersFollowTheFp32Math) {
  for (const auto& fused : testing::kernel_paths()) {
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(testing::path_name(fused));
      auto gen = seeded(5);
      auto W = at::randn({40, 30}, gen).to(dtype).requires_grad_(true);
      auto W32 = W.detach().to(at::kFloat).requires_grad_(true);
      AdamW opt({W}, AdamWOptions(1e-2).fused(fused));
      torch::optim::AdamW ref({W32}, torch::optim::AdamWOptions(1e-2));
      for (int step = 0; step < 3; ++step) {
        const auto g = at::randn({40, 30}, gen).to(dtype);
        W.mutable_grad() = g;
        W32.mutable_grad() = g.to(at::kFloat);
        opt.step();
        ref.step();
        // One rounding per step into the parameter's dtype: ours is the fp32 result rounded.
        const double ulp = dtype == at::kBFloat16 ? std::pow(2.0, -8) : std::pow(2.0, -11);
        const auto diff = (W.detach().to(at::kFloat) - W32.detach()).abs();
        EXPECT_LE(diff.max().item<double>(), ulp * 4 * W32.abs().max().item<double>());
        W32.detach().copy_(W.detach().to(at::kFloat));
      }
      const auto& state = static_cast<const AdamParamState&>(*opt.state().begin()->second);
      EXPECT_EQ(state.exp_avg().scalar_type(), at::kFloat);
    }
  }
}

uint16_t bits_at(const at::Tensor& bf16, int64_t i) {
  return reinterpret_cast<const uint16_t*>(bf16.data_ptr())[i];
}

TEST(AdamW, Bf16StateHoldsTheSpecRoundingOfTheFp32Moments) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(6);
    auto A = at::randn({100}, gen).requires_grad_(true);
    auto B = at::randn({3, 50}, gen).requires_grad_(true);
    AdamW opt({A, B},
              AdamWOptions(1e-3).betas({0.9, 0.99}).state_dtype(at::kBFloat16).fused(fused));
    const auto gA = at::randn({100}, gen);
    const auto gB = at::randn({3, 50}, gen);
    A.mutable_grad() = gA;
    B.mutable_grad() = gB;
    opt.step();
    // From zero state the fp32 moments are (1−β1)·g and (1−β2)·g²; tensor B is index 1, count 0.
    const uint32_t salt = sr::tensor_salt(sr::step_seed(0), 1);
    const auto m = gB.reshape({-1}) * 0.1f;
    const auto& state =
        static_cast<const AdamParamState&>(*opt.state().at(compat::param_state_key(B)));
    ASSERT_EQ(state.exp_avg().scalar_type(), at::kBFloat16);
    for (int64_t i = 0; i < 150; ++i) {
      // Independent of the kernel's arithmetic order: 0·β + x·(1−β) = x·(1−β) exactly.
      EXPECT_EQ(bits_at(state.exp_avg(), i), sr::round_bits(m[i].item<float>(), salt, i)) << i;
      const float vi = static_cast<float>(1 - 0.99) * gB.reshape({-1})[i].item<float>() *
                       gB.reshape({-1})[i].item<float>();
      EXPECT_EQ(bits_at(state.exp_avg_sq(), i), sr::round_bits(vi, sr::second_moment_salt(salt), i))
          << i;
    }
  }
}

TEST(AdamW, Bf16SecondMomentKeepsSmallIncrementsThatRoundToNearestLoses) {
  // v starts at 1 and receives (1−β2)·(g² − v) ≈ 1e-3 per step: a quarter of bf16's spacing at 1.
  const int64_t n = 4096;
  const double beta2 = 0.999;
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto W = at::zeros({n}).requires_grad_(true);
    AdamW opt({W}, AdamWOptions(0.0)
                       .betas({0.9, beta2})
                       .weight_decay(0)
                       .state_dtype(at::kBFloat16)
                       .fused(fused));
    W.mutable_grad() = at::zeros({n});
    opt.step();  // creates the state
    auto& state = static_cast<AdamParamState&>(*opt.state().begin()->second);
    state.exp_avg_sq().fill_(1.0);
    const auto g = at::full({n}, std::sqrt(2.0f));
    auto v32 = at::ones({n});
    auto v_nearest = at::ones({n}, at::kBFloat16);
    for (int step = 0; step < 1000; ++step) {
      W.mutable_grad() = g;
      opt.step();
      v32 = v32 * static_cast<float>(beta2) + static_cast<float>(1 - beta2) * g * g;
      v_nearest = (v_nearest.to(at::kFloat) * static_cast<float>(beta2) +
                   static_cast<float>(1 - beta2) * g * g)
                      .to(at::kBFloat16);
    }
    const double fp32 = v32.mean().item<double>();  // 2 − 0.999¹⁰⁰⁰ ≈ 1.632
    EXPECT_NEAR(fp32, 2 - std::pow(beta2, 1000), 1e-3);
    const double stochastic = state.exp_avg_sq().to(at::kFloat).mean().item<double>();
    const double nearest = v_nearest.to(at::kFloat).mean().item<double>();
    EXPECT_LT(std::abs(stochastic / fp32 - 1), 0.01) << stochastic << " vs " << fp32;
    EXPECT_GT(std::abs(nearest / fp32 - 1), 0.3) << "round-to-nearest stalls at " << nearest;
  }
}

// Options out of range: test_conformance.cpp, for every algorithm. The family's own rules here.
TEST(AdamFamily, RejectsBadOptionsNamingThem) {
  auto W = at::ones({2}).requires_grad_(true);
  expect_error<Error>([&] { AdamW({W}, AdamWOptions().state_dtype(at::kHalf)); },
                      {"state_dtype Half", "use float32 (full precision), bfloat16 (stochastic rounding) or int8"});
  expect_error<Error>([&] { Lamb({W}, LambOptions().state_dtype(at::kBFloat16)); },
                      {"Lamb: state_dtype bfloat16", "Adam, AdamW, Lion and Muon"});
  expect_error<Error>([&] { AdamW({at::ones({2}, at::kComplexFloat).requires_grad_(true)}); },
                      {"complex"});
}

TEST(AdamFamily, BadGradientChangesNothing) {
  auto gen = seeded(8);
  auto A = at::randn({3, 3}, gen).requires_grad_(true);
  auto B = at::randn({3, 3}, gen).requires_grad_(true);
  const auto A0 = A.detach().clone();
  AdamW opt({A, B});
  A.mutable_grad() = at::ones({3, 3});
  B.mutable_grad() = at::eye(3).to_sparse();
  expect_error<Error>([&] { opt.step(); },
                      {"AdamW does not support sparse gradients", "parameter 1 of param group 0"});
  EXPECT_TRUE(at::equal(A.detach(), A0));
  EXPECT_TRUE(opt.state().empty());
  // A changed hyperparameter is checked before the step too.
  B.mutable_grad() = at::ones({3, 3});
  static_cast<AdamWOptions&>(opt.param_groups()[0].options()).eps(-1);
  expect_error<Error>([&] { opt.step(); }, {"eps must be > 0"});
  EXPECT_TRUE(at::equal(A.detach(), A0));
}

TEST(AdamFamily, ClosureRunsOnceAndSchedulersReachTheRate) {
  auto W = at::ones({3}).requires_grad_(true);
  AdamW opt({W}, AdamWOptions(0.1));
  int calls = 0;
  opt.step([&] {
    ++calls;
    opt.zero_grad();
    auto loss = W.sum();
    loss.backward();
    return loss;
  });
  EXPECT_EQ(calls, 1);
  opt.param_groups()[0].options().set_lr(0.05);
  EXPECT_DOUBLE_EQ(static_cast<AdamWOptions&>(opt.param_groups()[0].options()).lr(), 0.05);
}

}  // namespace
}  // namespace muon
