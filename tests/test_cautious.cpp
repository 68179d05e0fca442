// The cautious wrapper and the fused cautious options (docs/design.md, "Cautious masking").
#include "muon/cautious.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "helpers.h"
#include "muon/adam.h"
#include "muon/hybrid.h"
#include "muon/muon.h"

namespace muon {
namespace {

TEST(Cautious, MaskRuleOnHandMadeCases) {
  // SGD with lr 1 and momentum: the step is −(g + momentum buffer), so its sign can disagree
  // with the current gradient.
  auto W = at::tensor({1.0f, 1.0f, 1.0f, 1.0f}).requires_grad_(true);
  torch::optim::SGD sgd({W}, torch::optim::SGDOptions(1.0).momentum(1.0));
  Cautious cautious(sgd);
  W.mutable_grad() = at::tensor({1.0f, -1.0f, 1.0f, 0.0f});
  cautious.step();  // buffer = g: every nonzero step agrees with g
  EXPECT_TRUE(at::allclose(W.detach(), at::tensor({0.0f, 2.0f, 0.0f, 1.0f})));
  W.mutable_grad() = at::tensor({-0.5f, 0.5f, 2.0f, 0.0f});
  // buffer = b + g = (0.5, −0.5, 3, 0); SGD's step −b: d = b; d·g = (−0.25, −0.25, 6, 0)
  cautious.step();
  EXPECT_TRUE(at::allclose(W.detach(), at::tensor({0.0f, 2.0f, -3.0f, 1.0f})))
      << W;  // only entry 2 (d·g > 0) moved; d·g = 0 (entry 3) is not strict
}

TEST(Cautious, RescaleUsesNumelOverKept) {
  auto W = at::zeros({4}).requires_grad_(true);
  torch::optim::SGD sgd({W}, torch::optim::SGDOptions(1.0).momentum(1.0));
  Cautious cautious(sgd, CautiousOptions{true});
  W.mutable_grad() = at::tensor({1.0f, 1.0f, 1.0f, 1.0f});
  cautious.step();                                           // all agree: scale 1
  W.mutable_grad() = at::tensor({-0.5f, 1.0f, 1.0f, 1.0f});  // buffer (0.5, 2, 2, 2)
  const auto before = W.detach().clone();
  cautious.step();
  // kept: entries 1..3 (3 of 4): change × 4/3
  const auto expected = before - at::tensor({0.0f, 2.0f, 2.0f, 2.0f}) * (4.0f / 3.0f);
  EXPECT_TRUE(at::allclose(W.detach(), expected));
}

// The wrapper around our optimizer equals the option that masks inside the fused pass.
template <class Opt, class Options>
void expect_wrapper_equals_native(Options options, std::vector<int64_t> shape) {
  auto gen = testing::seeded(3);
  auto A = at::randn(shape, gen).requires_grad_(true);
  auto B = A.detach().clone().requires_grad_(true);
  Opt wrapped({A}, options);
  Opt native({B}, options.cautious(true));
  Cautious cautious(wrapped);
  for (int step = 0; step < 4; ++step) {
    const auto g = at::randn(shape, gen);
    A.mutable_grad() = g.clone();
    B.mutable_grad() = g.clone();
    cautious.step();
    native.step();
  }
  EXPECT_TRUE(at::equal(A.detach(), B.detach()));
}

TEST(Cautious, ComposesWithOurAdamWAndMuonAndMatchesTheirFusedMask) {
  expect_wrapper_equals_native<AdamW>(AdamWOptions(1e-2).weight_decay(0.1), {40, 30});
  expect_wrapper_equals_native<Adam>(AdamOptions(1e-2).weight_decay(0.1), {7, 5});
  expect_wrapper_equals_native<Muon>(MuonOptions(0.02).weight_decay(0.1), {24, 16});
}

TEST(Cautious, KeepsNoStateAndWrapsTheHybrid) {
  auto W = at::randn({8, 8}).requires_grad_(true);
  auto v = at::randn({8}).requires_grad_(true);
  HybridOptimizer hybrid({{"w", W, Role::matrices, "", "", {}}, {"v", v, Role::others, "", "", {}}},
                         MuonOptions(), AdamWOptions());
  Cautious cautious(hybrid);
  W.mutable_grad() = at::randn({8, 8});
  v.mutable_grad() = at::randn({8});
  cautious.step();
  size_t muon = 0, adamw = 0;
  for (const auto& item : hybrid.state()) {
    muon += dynamic_cast<const MuonParamState*>(item.second.get()) != nullptr;
    adamw += dynamic_cast<const AdamParamState*>(item.second.get()) != nullptr;
  }
  EXPECT_EQ(muon, 1u);
  EXPECT_EQ(adamw, 1u);
  cautious.zero_grad();
  EXPECT_FALSE(W.grad().defined() && W.grad().abs().sum().item<double>() > 0);
}

}  // namespace
}  // namespace muon
