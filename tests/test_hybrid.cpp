// HybridOptimizer: one step equals stepping a muon::Muon and a muon::AdamW by hand.
#include "muon/hybrid.h"

#include <gtest/gtest.h>

#include "gpt.h"
#include "helpers.h"
#include "muon/error.h"

namespace muon {
namespace {

demo::GptConfig tiny() {
  demo::GptConfig c;
  c.n_layers = 1;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

void set_gradients(torch::nn::Module& model, uint64_t seed) {
  auto gen = testing::seeded(seed);
  for (auto& p : model.parameters()) p.mutable_grad() = at::randn(p.sizes(), gen);
}

TEST(Hybrid, StepEqualsBothBranchesByHand) {
  at::manual_seed(0);
  demo::Gpt ours(tiny());
  demo::Gpt theirs(tiny());
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < ours->parameters().size(); ++i) {
      theirs->parameters()[i].copy_(ours->parameters()[i]);
    }
  }
  const auto muon_options = MuonOptions(0.03).weight_decay(0.1);
  const auto adamw_options = AdamWOptions(0.01).weight_decay(0.05);
  HybridOptimizer hybrid(route(*ours), muon_options, adamw_options);
  const auto routes = route(*theirs);
  Muon muon(tensors_with_role(routes, Role::muon), muon_options);
  AdamW adamw(tensors_with_role(routes, Role::adamw), adamw_options);
  for (uint64_t step = 0; step < 3; ++step) {
    set_gradients(*ours, step);
    set_gradients(*theirs, step);
    hybrid.step();
    muon.step();
    adamw.step();
  }
  for (size_t i = 0; i < ours->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(ours->parameters()[i], theirs->parameters()[i])) << i;
  }
}

TEST(Hybrid, ClosureRunsOnceAndLrMultiplierScalesEveryGroup) {
  demo::Gpt model(tiny());
  HybridOptimizer opt(route(*model), MuonOptions(0.02), AdamWOptions(0.004));
  int calls = 0;
  auto tokens = at::zeros({2, 8}, at::kLong);
  opt.step([&] {
    ++calls;
    opt.zero_grad();
    auto loss = model->loss(tokens, tokens);
    loss.backward();
    return loss;
  });
  EXPECT_EQ(calls, 1);
  opt.set_lr_multiplier(0.5);
  EXPECT_DOUBLE_EQ(opt.muon()->param_groups()[0].options().get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(opt.adamw()->param_groups()[0].options().get_lr(), 0.002);
  opt.set_lr_multiplier(1.0);  // relative to the construction-time rates, not compounding
  EXPECT_DOUBLE_EQ(opt.muon()->param_groups()[0].options().get_lr(), 0.02);
}

TEST(Hybrid, FrozenParametersNeverMoveAndSparseGradientsChangeNothing) {
  demo::Gpt model(tiny());
  model->norm->weight.set_requires_grad(false);
  HybridOptimizer opt(route(*model), MuonOptions(), AdamWOptions());
  set_gradients(*model, 1);
  const auto before = model->norm->weight.detach().clone();
  opt.step();
  EXPECT_TRUE(at::equal(model->norm->weight, before));

  std::vector<at::Tensor> snapshot;
  for (const auto& p : model->parameters()) snapshot.push_back(p.detach().clone());
  set_gradients(*model, 2);
  model->blocks[0]->as<demo::BlockImpl>()->attn_norm->weight.mutable_grad() =
      at::ones({16}).to_sparse();
  testing::expect_error<Error>([&] { opt.step(); }, {"sparse gradients"});
  for (size_t i = 0; i < snapshot.size(); ++i) {
    EXPECT_TRUE(at::equal(model->parameters()[i], snapshot[i])) << i;
  }
}

}  // namespace
}  // namespace muon
