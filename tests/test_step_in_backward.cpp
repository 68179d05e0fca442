// The step inside backward (muon/step_in_backward.h): the bits of the ordinary step for every
// algorithm, gradient accumulation, released gradients, and the refusals.
#include "muon/step_in_backward.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <string>
#include <vector>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/adam.h"
#include "muon/config.h"
#include "muon/lion.h"
#include "muon/muon.h"

namespace muon {
namespace {

using testing::expect_error;

cli::Gpt tiny_gpt(uint64_t seed) {
  at::manual_seed(seed);
  cli::GptConfig c;
  c.n_layers = 2;
  c.d_model = 64;  // matrices of 4096+ elements: int8 state quantizes them
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return cli::Gpt(c);
}

// The loss of micro-batch `micro` of step `step`: a batch that depends on both only.
at::Tensor loss_of(cli::Gpt& model, int64_t step, int64_t micro = 0) {
  auto gen = testing::seeded(1000 + static_cast<uint64_t>(step * 10 + micro));
  const auto tokens = at::randint(0, 32, {4, 8}, gen, at::kLong);
  return model->loss(tokens, tokens.roll(1, 1));
}

void expect_same_weights(cli::Gpt& a, cli::Gpt& b) {
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  for (const auto& item : pa) {
    EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
  }
}

const char* const kConfigs[] = {
    "optimizer:\n  name: muon\n  nonfinite: ignore\n"
    "  schedule: {name: cosine, warmup_steps: 2}\n",
    "optimizer:\n  name: muon\n  nonfinite: ignore\n  state_dtype: int8\n",
    "optimizer:\n  name: muon\n  nonfinite: ignore\n  others: lion\n  state_dtype: int8\n",
    "optimizer:\n  name: muon\n  nonfinite: ignore\n  others: adam\n  state_dtype: bfloat16\n"
    "  normuon: true\n",
    "optimizer:\n  name: dion\n  nonfinite: ignore\n  others: lamb\n",
};

// 20 steps (each of `micro` backward passes) of the demo GPT, ordinary and inside backward: the
// same parameters, bit for bit, for every algorithm and state dtype.
TEST(StepInBackward, GivesTheBitsOfTheOrdinaryStepForEveryAlgorithm) {
  const int64_t steps = 20;
  for (const auto* yaml : kConfigs) {
    for (const int64_t micro : {1, 2}) {
      SCOPED_TRACE(std::string(yaml) + " micro-batches " + std::to_string(micro));
      const auto config = OptimConfig::from_yaml(yaml);
      auto ordinary = tiny_gpt(3), inside = tiny_gpt(3);
      auto ordinary_opt = build_optimizer(*ordinary, config, steps);
      auto inside_opt = build_optimizer(*inside, config, steps);
      StepInBackward in_backward(*inside_opt, micro);
      for (int64_t s = 0; s < steps; ++s) {
        ordinary_opt->zero_grad();
        for (int64_t m = 0; m < micro; ++m) loss_of(ordinary, s, m).backward();
        ordinary_opt->step();
        for (int64_t m = 0; m < micro; ++m) loss_of(inside, s, m).backward();
        for (const auto& p : inside->parameters()) {
          ASSERT_FALSE(p.grad().defined()) << "a gradient is still held after step " << s;
        }
      }
      expect_same_weights(ordinary, inside);
      EXPECT_EQ(in_backward.steps(), steps);
      EXPECT_EQ(inside_opt->step_count(), ordinary_opt->step_count());
    }
  }
}

// Two layers, the second used only by the first of two micro-batches: its gradient comes in the
// pass before the step's and is stepped at the end of the step's pass. The standalone owners, on
// both kernel paths (the fused CPU kernels and the ATen form), fp32 and int8 state.
TEST(StepInBackward, StandaloneOptimizersAndGradientsOfEarlierPassesOnly) {
  for (const auto& fused : testing::kernel_paths()) {
    for (const auto state : {at::kFloat, at::kChar}) {
      for (const bool matrices : {false, true}) {
        SCOPED_TRACE(std::string(matrices ? "muon::Muon, " : "muon::AdamW, ") +
                     testing::path_name(fused) + (state == at::kChar ? ", int8" : ", fp32"));
        const auto make = [&](std::vector<torch::nn::Linear>& layers) {
          at::manual_seed(5);
          layers = {torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false)),
                    torch::nn::Linear(torch::nn::LinearOptions(64, 64).bias(false))};
          std::vector<at::Tensor> params{layers[0]->weight, layers[1]->weight};
          return matrices ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Muon>(
                                params, MuonOptions(0.02).fused(fused).state_dtype(state)))
                          : std::make_unique<AdamW>(
                                params, AdamWOptions(0.01).fused(fused).state_dtype(state));
        };
        const auto pass = [](std::vector<torch::nn::Linear>& layers, int64_t step,
                             int64_t micro) {
          auto gen = testing::seeded(static_cast<uint64_t>(step * 2 + micro));
          auto y = layers[0]->forward(at::randn({4, 64}, gen));
          if (micro == 0) y = layers[1]->forward(y);
          y.square().mean().backward();
        };
        std::vector<torch::nn::Linear> ordinary, inside;
        auto ordinary_opt = make(ordinary);
        auto inside_opt = make(inside);
        StepInBackward in_backward(*inside_opt, 2);
        for (int64_t s = 0; s < 5; ++s) {
          ordinary_opt->zero_grad();
          pass(ordinary, s, 0);
          pass(ordinary, s, 1);
          ordinary_opt->step();
          pass(inside, s, 0);
          ASSERT_TRUE(inside[1]->weight.grad().defined());  // the first pass only adds up
          pass(inside, s, 1);
          ASSERT_FALSE(inside[1]->weight.grad().defined());
        }
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_TRUE(at::equal(ordinary[i]->weight, inside[i]->weight)) << i;
        }
      }
    }
  }
}

TEST(StepInBackward, RemoveLeavesGradientsForStep) {
  auto model = tiny_gpt(4);
  auto opt = build_optimizer(*model, OptimConfig::from_yaml("optimizer: {nonfinite: ignore}\n"), 4);
  StepInBackward in_backward(*opt);
  loss_of(model, 0).backward();
  in_backward.remove();
  const auto before = model->parameters().front().clone();
  loss_of(model, 1).backward();
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_TRUE(at::equal(before, model->parameters().front()));
  EXPECT_EQ(in_backward.steps(), 1);
}

// When a parameter's gradient arrives, every other parameter's is already stepped and released:
// no two sit in .grad together (the whole point: at most one gradient held). A hook on each
// parameter's incoming gradient, registered first (it runs before accumulation and before any
// hook of the step's), counts the others that are held.
TEST(StepInBackward, NoOtherGradientIsHeldWhenOneArrives) {
  auto model = tiny_gpt(7);
  auto opt = build_optimizer(*model, OptimConfig::from_yaml("optimizer: {nonfinite: ignore}\n"), 4);
  const auto params = model->parameters();
  int64_t arrivals = 0, held = 0;
  for (auto& p : params) {
    p.register_hook([&](const at::Tensor&) {
      ++arrivals;
      for (const auto& q : params) held += q.grad().defined() ? 1 : 0;
    });
  }
  StepInBackward in_backward(*opt);
  for (int64_t s = 0; s < 2; ++s) loss_of(model, s).backward();
  EXPECT_EQ(arrivals, 2 * static_cast<int64_t>(params.size()));
  EXPECT_EQ(held, 0);
  EXPECT_EQ(in_backward.steps(), 2);
}

// torch::autograd::grad() returns gradients without adding them to .grad: no step, nothing held.
TEST(StepInBackward, AutogradGradLeavesParametersAlone) {
  auto model = tiny_gpt(8);
  auto opt = build_optimizer(*model, OptimConfig::from_yaml("optimizer: {nonfinite: ignore}\n"), 4);
  StepInBackward in_backward(*opt);
  const auto params = model->parameters();
  const auto before = params.front().clone();
  const auto grads = torch::autograd::grad({loss_of(model, 0)}, params);
  EXPECT_TRUE(grads.front().defined());
  EXPECT_TRUE(at::equal(before, params.front()));
  for (const auto& p : params) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(in_backward.steps(), 0);
  loss_of(model, 1).backward();  // and the next backward pass steps as usual
  EXPECT_FALSE(at::equal(before, params.front()));
  EXPECT_EQ(in_backward.steps(), 1);
}

// What needs every gradient before the first update is refused at the pass's first gradient,
// before any parameter changes; the next pass is refused the same way.
TEST(StepInBackward, RefusesWhatNeedsEveryGradientNamingTheSetting) {
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"optimizer: {nonfinite: ignore, grad_clip: 1.0}\n",
       {"global-norm clipping (grad_clip 1)", "remove grad_clip"}},
      {"optimizer: {}\n", {"nonfinite: skip", "set nonfinite: ignore"}},
      {"optimizer: {nonfinite: error}\n", {"nonfinite: error", "set nonfinite: ignore"}},
  };
  for (const auto& [yaml, fragments] : cases) {
    SCOPED_TRACE(yaml);
    auto model = tiny_gpt(6);
    auto opt = build_optimizer(*model, OptimConfig::from_yaml(yaml), 4);
    const auto before = model->parameters().front().clone();
    StepInBackward in_backward(*opt);
    for (int pass = 0; pass < 2; ++pass) {
      expect_error([&] { loss_of(model, pass).backward(); },
                   {"the step inside backward", fragments[0], fragments[1]});
    }
    EXPECT_TRUE(at::equal(before, model->parameters().front()));
    EXPECT_EQ(in_backward.steps(), 0);
  }
}

TEST(StepInBackward, RefusesOtherOptimizersNonLeafParametersAndBadEvery) {
  auto w = at::randn({8, 8}).requires_grad_();
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
  expect_error([&] { StepInBackward in_backward(sgd); },
               {"needs one of muon-cpp's optimizers", "one parameter at a time"});
  AdamW adamw({w}, AdamWOptions(0.01));
  adamw.param_groups()[0].params()[0] = w * 2;  // LibTorch refuses one only when it is added
  expect_error([&] { StepInBackward in_backward(adamw); },
               {"parameter 0 of param group 0 (shape [8, 8]) is not a leaf tensor",
                "optimize leaf tensors"});
  AdamW good({w}, AdamWOptions(0.01));
  expect_error([&] { StepInBackward in_backward(good, 0); },
               {"every must be a whole number >= 1", "got 0"});
}

}  // namespace
}  // namespace muon
