// HybridOptimizer: groups, clipping and the non-finite policy (docs/design.md: "Parameter groups",
// "Clipping and non-finite gradients", "Hybrid optimizer").
#include "muon/hybrid.h"

#include <gtest/gtest.h>
#include <torch/optim/schedulers/step_lr.h>

#include <cmath>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/lion.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using testing::expect_error;

cli::GptConfig tiny(bool tied = true) {
  cli::GptConfig c;
  c.n_layers = 1;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  c.tie_embeddings = tied;
  return c;
}

void set_gradients(torch::nn::Module& model, uint64_t seed) {
  auto gen = testing::seeded(seed);
  for (auto& p : model.parameters()) p.mutable_grad() = at::randn(p.sizes(), gen);
}

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < from.parameters().size(); ++i) {
    to.parameters()[i].copy_(from.parameters()[i]);
  }
}

std::vector<at::Tensor> snapshot(torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

const ParameterReport& row_of(const HybridOptimizer& opt, const std::string& name) {
  for (const auto& r : opt.report()) {
    if (r.name == name) return r;
  }
  throw std::runtime_error("no report row " + name);
}

// The hybrid against the same steps by hand: the matrices' own optimizer (`matrices`: Muon unless
// the options say), the others' own optimizer (`others`) with
// decay on the embedding and none on the norm weights (the hybrid's no-decay group). Returns the
// hybrid, for its report.
template <class Options, class Matrices>
std::unique_ptr<HybridOptimizer> expect_by_hand(const HybridOptions& options, const Options& others,
                                                const Matrices& matrices) {
  at::manual_seed(0);
  cli::Gpt ours(tiny());
  cli::Gpt theirs(tiny());
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < ours->parameters().size(); ++i) {
      theirs->parameters()[i].copy_(ours->parameters()[i]);
    }
  }
  auto hybrid = std::make_unique<HybridOptimizer>(route(*ours), options);
  const auto routes = route(*theirs);
  OwnerOf<Matrices> muon(tensors_with_role(routes, Role::matrices), matrices);
  std::vector<at::Tensor> decayed, not_decayed;
  for (const auto& r : routes) {
    if (r.role == Role::others) (is_no_decay(r) ? not_decayed : decayed).push_back(r.tensor);
  }
  EXPECT_EQ(decayed.size(), 1u);      // wte
  EXPECT_EQ(not_decayed.size(), 3u);  // two block norms and the final norm
  auto no_decay = others;
  no_decay.weight_decay(0);
  OwnerOf<Options> by_hand(
      {torch::optim::OptimizerParamGroup(decayed),
       torch::optim::OptimizerParamGroup(not_decayed, std::make_unique<Options>(no_decay))},
      others);
  for (uint64_t step = 0; step < 3; ++step) {
    set_gradients(*ours, step);
    set_gradients(*theirs, step);
    hybrid->step();
    muon.step();
    by_hand.step();
  }
  for (size_t i = 0; i < ours->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(ours->parameters()[i], theirs->parameters()[i])) << i;
  }
  return hybrid;
}
template <class Options>
std::unique_ptr<HybridOptimizer> expect_by_hand(const HybridOptions& options,
                                                const Options& others) {
  return expect_by_hand(options, others, options.matrices.get<MuonOptions>());
}

TEST(Hybrid, StepEqualsBothBranchesByHand) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    const auto adamw = AdamWOptions(0.01).weight_decay(0.05).fused(fused);
    expect_by_hand(HybridOptions{MuonOptions(0.03).weight_decay(0.1).fused(fused), adamw}, adamw);
  }
}

// The partition's other half on another registered algorithm.
template <class Options>
void expect_others_run(const Options& others) {
  SCOPED_TRACE(Algorithm<Options>::name);
  HybridOptions options{MuonOptions(0.03).weight_decay(0.1)};
  options.others = others;
  const auto hybrid = expect_by_hand(options, others);
  EXPECT_EQ(row_of(*hybrid, "wte.weight").algorithm, Algorithm<Options>::name);
  EXPECT_EQ(row_of(*hybrid, "blocks.0.attn.q_proj.weight").algorithm, "muon");
  EXPECT_NE(hybrid->report_text().find(Algorithm<Options>::name), std::string::npos);
}

TEST(Hybrid, OthersRunAnyElementwiseAlgorithm) {
  expect_others_run(LionOptions(1e-3).weight_decay(0.05).betas({0.9, 0.95}));
  expect_others_run(AdamOptions(1e-2).weight_decay(0.05));
  expect_others_run(LambOptions(1e-2).weight_decay(0.05));
}

// The partition's matrices on Dion: its own optimizer by hand, the others AdamW or Lion.
TEST(Hybrid, MatricesRunDion) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    const auto dion = DionOptions(0.03).weight_decay(0.1).rank_fraction(0.5).fused(fused);
    HybridOptions options;
    options.matrices = dion;
    const auto adamw = AdamWOptions(0.01).weight_decay(0.05).fused(fused);
    options.others = adamw;
    const auto hybrid = expect_by_hand(options, adamw, dion);
    EXPECT_EQ(row_of(*hybrid, "blocks.0.attn.q_proj.weight").algorithm, "dion");
    options.others = LionOptions(1e-3);
    expect_by_hand(options, LionOptions(1e-3), dion);
  }
}

TEST(Hybrid, MatricesErrors) {
  cli::Gpt model(tiny());
  const auto routes = route(*model);
  HybridOptions options;
  options.matrices = AdamWOptions();
  expect_error<Error>([&] { HybridOptimizer(routes, options); },
                      {"HybridOptions::matrices: 'adamw' does not update matrices as matrices; the "
                       "routed matrices need one of muon, dion"});
  options.matrices = DionOptions().rank_fraction(2);
  expect_error<Error>([&] { HybridOptimizer(routes, options); },
                      {"HybridOptions::matrices: ", "rank_fraction must be in (0, 1]"});
  options.matrices = DionOptions();
  options.groups = {ParamGroupSpec{"all", {"*"}}};
  options.groups[0].num_heads = 2;
  expect_error<Error>([&] { HybridOptimizer(routes, options); },
                      {"param group 'all': num_heads is set, but dion (the algorithm of its "
                       "matrices) has no num_heads"});
  options.groups[0].num_heads.reset();
  options.groups[0].momentum = 0.8;  // a setting Dion has: its groups take it
  HybridOptimizer hybrid(routes, options);
  int dion_groups = 0;
  for (const auto& g : hybrid.param_groups()) {
    if (algorithm_name(g.options()) == std::string("dion")) {
      EXPECT_DOUBLE_EQ(group_settings(g.options()).at("momentum"), 0.8);
      ++dion_groups;
    }
  }
  EXPECT_GT(dion_groups, 0);
}

TEST(Hybrid, AlgorithmOptionsHoldTheirTypeByValue) {
  const LionOptions lion(2e-4);
  const torch::optim::OptimizerOptions& base = lion;
  AlgorithmOptions held = base;  // through a base reference: still Lion's
  EXPECT_STREQ(algorithm_name(*held), "lion");
  auto copy = held;
  copy->set_lr(1.0);
  EXPECT_DOUBLE_EQ(held->get_lr(), 2e-4);  // copies are deep
  EXPECT_FALSE(AlgorithmOptions());
  EXPECT_DOUBLE_EQ(held.get<LionOptions>().lr(), 2e-4);
  expect_error<Error>([&] { held.get<MuonOptions>(); },
                      {"AlgorithmOptions: holds lion, not muon's"});
  expect_error<Error>([] { AlgorithmOptions().get<AdamWOptions>(); },
                      {"AlgorithmOptions: holds no options, not adamw's"});
  // The two slots start as Muon's and AdamW's defaults.
  const HybridOptions defaults;
  EXPECT_DOUBLE_EQ(defaults.matrices.get<MuonOptions>().lr(), MuonOptions().lr());
  EXPECT_DOUBLE_EQ(defaults.others.get<AdamWOptions>().lr(), AdamWOptions().lr());
}

TEST(Hybrid, OthersErrors) {
  cli::Gpt model(tiny());
  const auto routes = route(*model);
  HybridOptions options;
  options.others = MuonOptions();
  expect_error<Error>(
      [&] { HybridOptimizer(routes, options); },
      {"HybridOptions::others: 'muon' updates matrices only; the other parameters need "
       "one of adamw, adam, lamb, lion"});
  options.others = LionOptions(-1.0);
  expect_error<Error>([&] { HybridOptimizer(routes, options); }, {"HybridOptions::others: ", "lr"});
  options.others = AlgorithmOptions();
  expect_error<Error>([&] { HybridOptimizer(routes, options); },
                      {"HybridOptions::others is empty; the parameters outside the matrices slot "
                       "need one of adamw, adam, lamb, lion"});
  options.others = LionOptions();
  options.groups = {ParamGroupSpec{"all", {"*"}}};
  options.groups[0].eps = 1e-6;
  expect_error<Error>([&] { HybridOptimizer(routes, options); },
                      {"param group 'all': eps is set, but lion (the algorithm of its non-Muon "
                       "parameters) has no eps"});
  // Betas it has: the group's (β1, β2) reach its Lion groups.
  options.groups[0].eps.reset();
  options.groups[0].betas = Betas(0.8, 0.9);
  HybridOptimizer hybrid(routes, options);
  for (const auto& g : hybrid.param_groups()) {
    if (const auto* o = dynamic_cast<const LionOptions*>(&g.options())) {
      EXPECT_EQ(o->betas(), Betas(0.8, 0.9));
    }
  }
}

TEST(Hybrid, RoutedHeadSplitsOrthogonalizeEachHeadAlone) {
  // Two (heads, head_dim, embed) projections: one routed with its heads, one in a group that sets
  // num_heads itself (the group's setting wins); each equals muon::Muon with that num_heads.
  auto gen = testing::seeded(4);
  const auto q0 = at::randn({4, 8, 16}, gen), k0 = at::randn({4, 8, 16}, gen);
  auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
  RoutingRules rules;
  rules.split_heads = true;
  rules.declare_axes("q", {"heads", "head_dim", "embed"});
  rules.declare_axes("k", {"heads", "head_dim", "embed"});
  const auto routes = route(std::vector<NamedParameter>{{"q", q, ""}, {"k", k, ""}}, rules);
  HybridOptions options{MuonOptions(0.05), AdamWOptions()};
  options.groups = {ParamGroupSpec{"k", {"k"}}, ParamGroupSpec{"rest", {"*"}}};
  options.groups[0].num_heads = 2;
  HybridOptimizer hybrid(routes, options);
  EXPECT_EQ(hybrid.param_groups().size(), 2u);
  auto q_ref = q0.clone().view({32, 16}), k_ref = k0.clone().view({32, 16});
  Muon q_muon({q_ref}, MuonOptions(0.05).num_heads(4));
  Muon k_muon({k_ref}, MuonOptions(0.05).num_heads(2));
  for (int step = 0; step < 2; ++step) {
    const auto gq = at::randn({4, 8, 16}, gen), gk = at::randn({4, 8, 16}, gen);
    q.mutable_grad() = gq;
    k.mutable_grad() = gk;
    q_ref.mutable_grad() = gq.view({32, 16});
    k_ref.mutable_grad() = gk.view({32, 16});
    hybrid.step();
    q_muon.step();
    k_muon.step();
  }
  EXPECT_TRUE(at::equal(q.detach().view({32, 16}), q_ref));
  EXPECT_TRUE(at::equal(k.detach().view({32, 16}), k_ref));
}

TEST(Hybrid, ClosureRunsOnceAndSchedulersReachEveryGroup) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), MuonOptions(0.02), AdamWOptions(0.004));
  ASSERT_EQ(opt.param_groups().size(), 3u);  // muon; adamw with decay; adamw without
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
  std::vector<double> initial;
  for (const auto& g : opt.param_groups()) initial.push_back(g.options().get_lr());
  torch::optim::StepLR schedule(opt, /*step_size=*/1, /*gamma=*/0.5);
  schedule.step();
  schedule.step();  // libtorch's StepLR acts from its second call
  for (size_t i = 0; i < initial.size(); ++i) {
    EXPECT_DOUBLE_EQ(opt.param_groups()[i].options().get_lr(), initial[i] * 0.5) << i;
  }
  set_gradients(*model, 1);
  opt.step();  // the groups run with the scheduled rates
  for (const auto& g : opt.param_groups()) {
    const bool muon = dynamic_cast<const MuonOptions*>(&g.options()) != nullptr;
    EXPECT_DOUBLE_EQ(g.options().get_lr(), muon ? 0.01 : 0.002);
  }
  opt.set_lr_multiplier(0.25);  // relative to the construction-time rates
  for (size_t i = 0; i < initial.size(); ++i) {
    EXPECT_DOUBLE_EQ(opt.param_groups()[i].options().get_lr(), initial[i] * 0.25) << i;
  }
}

TEST(Hybrid, GroupsFirstMatchWinsAndTheReportShowsTheirSettings) {
  cli::Gpt model(tiny());
  HybridOptions options;
  options.matrices = MuonOptions(0.02).weight_decay(0.1);
  options.others = AdamWOptions(0.004).weight_decay(0.01);
  ParamGroupSpec attention{"attention", {"*.attn.*"}, 0.5};
  attention.momentum = 0.9;
  ParamGroupSpec norms{"norms", {"*norm*"}};
  norms.weight_decay = 0.3;  // a group may decay norm weights explicitly
  ParamGroupSpec rest{"rest", {"*"}};
  options.groups = {attention, norms, rest};
  HybridOptimizer opt(route(*model), options);
  const auto& q = row_of(opt, "blocks.0.attn.q_proj.weight");
  EXPECT_EQ(q.group, "attention");
  EXPECT_DOUBLE_EQ(q.lr, 0.01);
  EXPECT_DOUBLE_EQ(q.weight_decay, 0.1);
  const auto& norm = row_of(opt, "blocks.0.attn_norm.weight");
  EXPECT_EQ(norm.group, "norms");  // "*.attn.*" does not match "attn_norm"
  EXPECT_DOUBLE_EQ(norm.weight_decay, 0.3);
  EXPECT_DOUBLE_EQ(norm.lr, 0.004);
  const auto& wte = row_of(opt, "wte.weight");
  EXPECT_EQ(wte.group, "rest");
  EXPECT_DOUBLE_EQ(wte.weight_decay, 0.01);
  // The Muon group of "attention" carries its momentum.
  bool found = false;
  for (const auto& g : opt.param_groups()) {
    if (const auto* o = dynamic_cast<const MuonOptions*>(&g.options()); o && o->lr() == 0.01) {
      EXPECT_DOUBLE_EQ(o->momentum(), 0.9);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  const auto text = opt.report_text();
  EXPECT_NE(text.find("blocks.0.attn.q_proj.weight"), std::string::npos);
  EXPECT_NE(text.find("attention"), std::string::npos);
}

TEST(Hybrid, GroupErrors) {
  cli::Gpt model(tiny());
  const auto routes = route(*model);
  auto build = [&](std::vector<ParamGroupSpec> groups) {
    HybridOptions options;
    options.groups = std::move(groups);
    HybridOptimizer opt(routes, options);
  };
  expect_error<Error>(
      [&] {
        build({{"attention", {"*.attn.*"}}});
      },
      {"parameter 'wte.weight' matches no parameter group", "attention", "patterns: [\"*\"]"});
  expect_error<Error>([&] { build({{"a", {"*"}}, {"a", {"*"}}}); }, {"duplicate group name 'a'"});
  expect_error<Error>([&] { build({{"a", {}}}); }, {"param_groups[0] ('a')", "patterns is empty"});
  expect_error<Error>([&] { build({{"a", {"*"}, 0.0}}); }, {"lr_multiplier must be > 0", "got 0"});
  EXPECT_TRUE(pattern_matches("*", "blocks.0.attn.q_proj.weight"));  // * crosses dots
  EXPECT_FALSE(pattern_matches("*.Weight", "a.weight"));             // case-sensitive
}

TEST(Hybrid, MupAndNanochatPresets) {
  cli::Gpt model(tiny());
  HybridOptions options;
  options.matrices = MuonOptions(0.02);
  options.others = AdamWOptions(0.004).weight_decay(0.1);
  options.groups = mup_groups(4.0);
  HybridOptimizer mup(route(*model), options);
  EXPECT_EQ(row_of(mup, "norm.weight").group, "no_weight_decay");
  EXPECT_DOUBLE_EQ(row_of(mup, "norm.weight").weight_decay, 0.0);
  EXPECT_EQ(row_of(mup, "wte.weight").group, "normal");
  EXPECT_DOUBLE_EQ(row_of(mup, "wte.weight").lr, 0.004);
  EXPECT_EQ(row_of(mup, "blocks.0.mlp.up_proj.weight").group, "mup");
  EXPECT_DOUBLE_EQ(row_of(mup, "blocks.0.mlp.up_proj.weight").lr, 0.02 / 4);

  cli::Gpt untied(tiny(/*tied=*/false));
  NanochatSettings settings;
  settings.d_model = 3072;  // d = (3072/768)^-0.5 = 0.5
  const auto preset = nanochat_preset(settings);
  HybridOptions nano;
  nano.groups = preset.groups;
  nano.matrices = preset.muon;
  nano.others = preset.adamw;
  HybridOptimizer opt(route(*untied), nano);
  const auto& head = row_of(opt, "lm_head.weight");
  EXPECT_EQ(head.group, "lm_head");
  EXPECT_DOUBLE_EQ(head.lr, 0.008 * 0.5);
  EXPECT_DOUBLE_EQ(head.weight_decay, 0.01);
  const auto& wte = row_of(opt, "wte.weight");
  EXPECT_EQ(wte.group, "embeddings");
  EXPECT_DOUBLE_EQ(wte.lr, 0.3 * 0.5);
  EXPECT_DOUBLE_EQ(wte.weight_decay, 0.001);
  const auto& q = row_of(opt, "blocks.0.attn.q_proj.weight");
  EXPECT_EQ(q.group, "matrices");
  EXPECT_DOUBLE_EQ(q.lr, 0.02);
  EXPECT_DOUBLE_EQ(q.weight_decay, 0.28);
  for (const auto& g : opt.param_groups()) {
    if (const auto* o = dynamic_cast<const AdamWOptions*>(&g.options()); o && o->lr() == 0.004) {
      EXPECT_EQ(o->betas(), (Betas{0.8, 0.96}));
      EXPECT_DOUBLE_EQ(o->eps(), 1e-10);
    }
    if (const auto* o = dynamic_cast<const MuonOptions*>(&g.options())) {
      EXPECT_TRUE(o->normuon().has_value());
      EXPECT_DOUBLE_EQ(o->normuon()->beta2, 0.9);
      EXPECT_TRUE(o->cautious_weight_decay());
      EXPECT_EQ(o->coefficients().name, "polar_express");
    }
  }
}

TEST(Hybrid, ClippingEqualsAStraightforwardComputation) {
  cli::Gpt model(tiny());
  HybridOptions options;
  options.max_grad_norm = 1.0;
  HybridOptimizer opt(route(*model), options);
  set_gradients(*model, 3);
  double sum = 0;
  std::vector<at::Tensor> grads;
  for (const auto& r : route(*model)) {
    grads.push_back(r.tensor.grad().clone());
    sum += r.tensor.grad().to(at::kDouble).square().sum().item<double>();
  }
  const double norm = std::sqrt(sum);
  ASSERT_GT(norm, 1.0);
  std::map<std::string, at::Tensor> before;
  for (const auto& [name, p] : opt.named_trainable()) before[name] = p.detach().clone();
  opt.step();
  EXPECT_NEAR(opt.last_step().grad_norm, norm, 1e-9 * norm);
  EXPECT_NEAR(opt.last_step().clip_factor, 1.0 / norm, 1e-12);
  // The update used the clipped gradients (those of an unclipped optimizer given g / norm), and
  // .grad is the caller's own gradient still.
  cli::Gpt reference(tiny());
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, p] : opt.named_trainable()) {
      reference->named_parameters()[name].copy_(before.at(name));
    }
  }
  HybridOptimizer unclipped(route(*reference), HybridOptions{});
  size_t i = 0;
  for (const auto& r : route(*reference)) {
    r.tensor.mutable_grad() = grads[i++] * opt.last_step().clip_factor;
  }
  unclipped.step();
  i = 0;
  for (const auto& r : route(*model)) {
    EXPECT_TRUE(at::equal(r.tensor.grad(), grads[i++])) << r.name;
    EXPECT_TRUE(at::equal(r.tensor, reference->named_parameters()[r.name])) << r.name;
  }
  // Below the threshold nothing is scaled.
  set_gradients(*model, 4);
  for (auto& p : model->parameters()) p.mutable_grad().mul_(1e-4);
  opt.step();
  EXPECT_EQ(opt.last_step().clip_factor, 1.0);
}

TEST(Hybrid, NanGradientUnderSkipLeavesEveryParameterAndStateBitIdentical) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), HybridOptions{});
  set_gradients(*model, 5);
  opt.step();  // creates state
  const auto params = snapshot(*model);
  std::vector<at::Tensor> state;
  for (const auto& item : opt.state()) {
    if (const auto* m = dynamic_cast<const MuonParamState*>(item.second.get())) {
      state.push_back(m->momentum_buffer().clone());
    } else if (const auto* a = dynamic_cast<const AdamParamState*>(item.second.get())) {
      state.push_back(a->exp_avg().clone());
      state.push_back(a->exp_avg_sq().clone());
    }
  }
  set_gradients(*model, 6);
  model->blocks[0]->as<cli::BlockImpl>()->mlp->up_proj->weight.mutable_grad()[0][0] = std::nanf("");
  opt.step();
  EXPECT_TRUE(opt.last_step().skipped);
  EXPECT_EQ(opt.last_step().skipped_steps, 1);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(model->parameters()[i], params[i])) << i;
  }
  size_t k = 0;
  for (const auto& item : opt.state()) {
    if (const auto* m = dynamic_cast<const MuonParamState*>(item.second.get())) {
      EXPECT_TRUE(at::equal(m->momentum_buffer(), state[k++]));
      EXPECT_EQ(m->step(), 1);
    } else if (const auto* a = dynamic_cast<const AdamParamState*>(item.second.get())) {
      EXPECT_TRUE(at::equal(a->exp_avg(), state[k++]));
      EXPECT_TRUE(at::equal(a->exp_avg_sq(), state[k++]));
      EXPECT_EQ(a->step(), 1);
    }
  }
  // Under `error` the step throws, naming the parameter, and still changes nothing.
  HybridOptions strict;
  strict.nonfinite = NonfinitePolicy::error;
  HybridOptimizer failing(route(*model), strict);
  expect_error<Error>([&] { failing.step(); },
                      {"non-finite gradient norm", "'blocks.0.mlp.up_proj.weight'"});
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(model->parameters()[i], params[i])) << i;
  }
}

// How many parameters have state of type S.
template <class S>
size_t states_of(const torch::optim::Optimizer& opt) {
  size_t n = 0;
  for (const auto& item : opt.state()) n += dynamic_cast<const S*>(item.second.get()) != nullptr;
  return n;
}

TEST(Hybrid, SparseGradientChangesNothingAndResetStateClearsBothAlgorithms) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), MuonOptions(), AdamWOptions());
  set_gradients(*model, 1);
  opt.step();
  EXPECT_GT(states_of<MuonParamState>(opt), 0u);
  EXPECT_GT(states_of<AdamParamState>(opt), 0u);
  const auto params = snapshot(*model);
  set_gradients(*model, 2);
  model->blocks[0]->as<cli::BlockImpl>()->attn_norm->weight.mutable_grad() =
      at::ones({16}).to_sparse();
  expect_error<Error>([&] { opt.step(); }, {"does not support sparse gradients"});
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(model->parameters()[i], params[i])) << i;
  }
  opt.reset_state();
  EXPECT_TRUE(opt.state().empty());
}

TEST(Hybrid, SchedulesDriveRatesMomentumAndDecayFromTheStepCount) {
  cli::Gpt model(tiny());
  HybridOptions options;
  options.matrices = MuonOptions(0.02).weight_decay(0.1);
  options.others = AdamWOptions(0.004).weight_decay(0.1);
  LrSchedule cosine;
  cosine.kind = ScheduleKind::cosine;
  cosine.warmup_steps = 2;
  options.schedule = cosine;
  const MomentumSchedule momentum{0.85, 0.95, 4};
  options.momentum_schedule = momentum;
  options.weight_decay_schedule = WeightDecaySchedule{true};
  options.total_steps = 10;
  ParamGroupSpec attention{"attention", {"*.attn.*"}};
  LrSchedule flat;  // constant: this group ignores the cosine
  attention.schedule = flat;
  options.groups = {attention, {"rest", {"*"}}};
  HybridOptimizer opt(route(*model), options);
  for (int64_t k = 0; k < 5; ++k) {
    set_gradients(*model, k);
    opt.step();
    EXPECT_EQ(opt.step_count(), k + 1);
    for (const auto& g : opt.param_groups()) {
      const auto* m = dynamic_cast<const MuonOptions*>(&g.options());
      const bool attention_group = m != nullptr && g.params().size() == 4;  // q, k, v, o
      const double peak = m != nullptr ? 0.02 : 0.004;
      const double expected = attention_group ? peak : peak * cosine.multiplier(k, 10);
      EXPECT_NEAR(g.options().get_lr(), expected, 1e-15) << k;
      if (m != nullptr) {
        EXPECT_NEAR(m->momentum(), momentum.value(k, 10), 1e-15);
        EXPECT_NEAR(m->weight_decay(), 0.1 * 0.5 * (1 + std::cos(M_PI * k / 10.0)), 1e-15);
      }
    }
  }
  // A skipped step does not advance the schedules.
  set_gradients(*model, 9);
  model->norm->weight.mutable_grad()[0] = std::nanf("");
  opt.step();
  EXPECT_EQ(opt.step_count(), 5);
  HybridOptions missing = options;
  missing.total_steps = 0;
  expect_error<Error>([&] { HybridOptimizer(route(*model), missing); },
                      {"schedules need total_steps > 0"});
}

TEST(Hybrid, WhatAScheduleSetsIsNotChangedBehindItsBackAndTheRestIsTheCallers) {
  cli::Gpt model(tiny());
  HybridOptions options;
  options.matrices = MuonOptions(0.02);
  options.others = AdamWOptions(0.004);
  LrSchedule cosine;
  cosine.kind = ScheduleKind::cosine;
  options.schedule = cosine;
  options.total_steps = 10;
  HybridOptimizer opt(route(*model), options);
  set_gradients(*model, 1);
  opt.step();
  torch::optim::StepLR external(opt, /*step_size=*/1, /*gamma=*/0.5);
  external.step();
  external.step();  // halves every lr behind the cosine's back
  const auto before = snapshot(*model);
  set_gradients(*model, 2);
  expect_error<Error>([&] { opt.step(); },
                      {"HybridOptimizer: param group 0 (adamw): lr was changed to 0.002",
                       " outside the optimizer (a torch lr scheduler, set_lr, param_groups?), but "
                       "the schedule of its configuration sets it at every step (",
                       "remove that schedule to set lr yourself, or leave it to it"});
  const auto after = snapshot(*model);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << i;
  expect_error<Error>([&] { opt.set_lr_multiplier(0.5); },
                      {"set_lr_multiplier: param group 0 has a learning-rate schedule"});

  // Only a momentum schedule: lr is the caller's, and a changed one is what the step uses.
  options.schedule.reset();
  options.momentum_schedule = MomentumSchedule{0.85, 0.95, 4};
  cli::Gpt other(tiny());
  HybridOptimizer mine(route(*other), options);
  for (auto& g : mine.param_groups()) g.options().set_lr(0.0);
  const auto still = snapshot(*other);
  set_gradients(*other, 3);
  mine.step();
  const auto moved = snapshot(*other);
  for (size_t i = 0; i < still.size(); ++i) EXPECT_TRUE(at::equal(still[i], moved[i])) << i;
  for (const auto& g : mine.param_groups()) EXPECT_EQ(g.options().get_lr(), 0.0);
  MuonOptions* muon = nullptr;
  for (auto& g : mine.param_groups()) {
    if (auto* m = dynamic_cast<MuonOptions*>(&g.options())) muon = m;
  }
  ASSERT_NE(muon, nullptr);
  muon->momentum(0.5);  // the momentum schedule's, now changed behind it
  expect_error<Error>([&] { mine.step(); }, {"momentum was changed to 0.5", "momentum_schedule"});
}

TEST(Hybrid, FrozenParametersNeverMoveAndNoMatricesSlotSendsEverythingToTheOthers) {
  cli::Gpt model(tiny());
  model->norm->weight.set_requires_grad(false);
  HybridOptions options;
  options.matrices = AlgorithmOptions();
  options.others = LionOptions(1e-3);
  HybridOptimizer opt(route(*model), options);
  for (const auto& g : opt.param_groups()) {  // no Muon group
    EXPECT_NE(dynamic_cast<const LionOptions*>(&g.options()), nullptr);
  }
  EXPECT_EQ(row_of(opt, "blocks.0.attn.q_proj.weight").role, Role::others);
  EXPECT_EQ(row_of(opt, "blocks.0.attn.q_proj.weight").reason,
            "no matrices algorithm: every trainable parameter runs lion");
  EXPECT_EQ(row_of(opt, "norm.weight").role, Role::frozen);
  set_gradients(*model, 1);
  const auto before = model->norm->weight.detach().clone();
  opt.step();
  EXPECT_TRUE(at::equal(model->norm->weight, before));
}

TEST(Hybrid, ReplacedParametersTakeTheirPlaceAndLeftOnesAreForgotten) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), HybridOptions{});
  set_gradients(*model, 1);
  opt.step();
  std::vector<std::vector<at::Tensor>> params;
  for (const auto& group : opt.param_groups()) params.push_back(group.params());
  size_t g = 0;  // a Muon group
  while (opt.role_of(params[g][0]) != Role::matrices) ++g;
  const auto old = params[g][0];
  const auto old_name = [&] {
    for (const auto& [n, p] : opt.named_trainable()) {
      if (p.is_same(old)) return n;
    }
    return std::string();
  }();
  auto stand_in = old.detach().clone().requires_grad_();
  auto appended = at::randn({6, 16}).requires_grad_();
  ASSERT_GE(params[g].size(), 3u);
  auto removed = params[g][1];
  params[g][0] = stand_in;
  params[g].erase(params[g].begin() + 1);  // the others move up an index and stay
  params[g].push_back(appended);
  // Refused, changing nothing: a vector in a Muon group, a tensor in two groups.
  auto bad = params;
  bad[g].push_back(at::zeros({5}).requires_grad_());
  expect_error<Error>(
      [&] { opt.replace_params(bad); },
      {"Muon: parameter ", " of param group " + std::to_string(g) + " has shape [5]"});
  bad = params;
  bad[g == 0 ? 1 : 0].push_back(stand_in);
  expect_error<Error>([&] { opt.replace_params(bad); },
                      {"is listed twice; a parameter belongs to one group, once"});
  EXPECT_TRUE(opt.param_groups()[g].params()[0].is_same(old));
  opt.replace_params(params);
  EXPECT_TRUE(opt.param_groups()[g].params()[0].is_same(stand_in));
  EXPECT_FALSE(read_param_state(opt, stand_in).has_value());
  EXPECT_EQ(opt.state().count(compat::param_state_key(old)), 0u);
  EXPECT_EQ(opt.state().count(compat::param_state_key(removed)), 0u);
  EXPECT_EQ(opt.role_of(old), Role::frozen);  // forgotten
  bool named = false, appended_named = false;
  for (const auto& [n, p] : opt.named_trainable()) {
    named = named || (n == old_name && p.is_same(stand_in));
    appended_named =
        appended_named || (p.is_same(appended) && n == "param_groups." + std::to_string(g) + "." +
                                                           std::to_string(params[g].size() - 1));
  }
  EXPECT_TRUE(named && appended_named);
  const auto& row = row_of(opt, old_name);
  EXPECT_EQ(row.role, Role::matrices);
  set_gradients(*model, 2);
  stand_in.mutable_grad() = at::ones_like(stand_in);
  appended.mutable_grad() = at::ones({6, 16});
  const auto before = stand_in.detach().clone();
  const auto removed_before = removed.detach().clone();
  opt.step();
  EXPECT_FALSE(at::equal(stand_in, before));
  EXPECT_TRUE(at::equal(removed, removed_before));  // it has a gradient, but left the group
  EXPECT_EQ(read_param_state(opt, appended)->step, 1);
  EXPECT_EQ(opt.report().size(), route(*model).size());  // one row in (appended), one out
}

TEST(Hybrid, IgnorePolicyStepsNonFiniteGradientsAsTorchDoes) {
  at::manual_seed(0);
  cli::Gpt ours(tiny()), theirs(tiny());
  copy_parameters(*ours, *theirs);
  HybridOptions ignore;
  ignore.nonfinite = NonfinitePolicy::ignore;
  HybridOptimizer a(route(*ours), ignore), b(route(*theirs), HybridOptions{});
  set_gradients(*ours, 3);
  set_gradients(*theirs, 3);
  a.step();
  b.step();
  for (size_t i = 0; i < ours->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(ours->parameters()[i], theirs->parameters()[i])) << i;
  }
  EXPECT_TRUE(std::isnan(a.last_step().grad_norm));  // not measured: nothing needs it
  auto& w = ours->blocks[0]->as<cli::BlockImpl>()->mlp->up_proj->weight;
  set_gradients(*ours, 4);
  w.mutable_grad()[0][0] = std::nanf("");
  a.step();
  EXPECT_FALSE(a.last_step().skipped);
  EXPECT_TRUE(at::isnan(w).any().item<bool>());  // stepped, as torch.optim would
  // With clipping the norm is measured; a non-finite one leaves the gradients unclipped.
  ignore.max_grad_norm = 1.0;
  HybridOptimizer clipped(route(*theirs), ignore);
  set_gradients(*theirs, 5);
  clipped.step();
  EXPECT_GT(clipped.last_step().grad_norm, 1.0);
  EXPECT_LT(clipped.last_step().clip_factor, 1.0);
}

TEST(Hybrid, MatrixViewsOfAddedGroupsAreOrthogonalizedInThatView) {
  // A (4, 2, 3, 3) kernel as a (4, 18) matrix, as Muon alone would orthogonalize that matrix.
  at::manual_seed(0);
  auto kernel = at::randn({4, 2, 3, 3}).requires_grad_();
  auto matrix = kernel.detach().reshape({4, 18}).clone().requires_grad_();
  kernel.mutable_grad() = at::randn({4, 2, 3, 3});
  matrix.mutable_grad() = kernel.grad().reshape({4, 18}).clone();
  HybridOptimizer opt(std::vector<RoutedParameter>{}, HybridOptions{});
  opt.add_param_group(
      torch::optim::OptimizerParamGroup({kernel}, std::make_unique<MuonOptions>(0.02)));
  opt.set_matrix_view(kernel, {4, 18});
  expect_error<Error>(
      [&] {
        opt.set_matrix_view(kernel, {4, 17});
      },
      {"view [4, 17] holds 68 elements"});
  expect_error<Error>(
      [&] {
        opt.set_matrix_view(matrix, {4, 18});
      },
      {"is not a parameter of one of this optimizer's matrices groups"});
  Muon alone({matrix}, MuonOptions(0.02));
  opt.step();
  alone.step();
  EXPECT_TRUE(at::allclose(kernel.detach().reshape({4, 18}), matrix.detach(), 1e-6, 1e-7));
  expect_error<Error>(
      [&] {
        opt.set_matrix_view(kernel, {12, 6});
      },
      {"already has state for view [4, 18]"});
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

// init_state makes, before any step, the state the first step would make (zeros, step 0), for
// Muon, Dion and AdamW; the steps after it are those without it, bit for bit.
TEST(Hybrid, InitStateMakesWhatTheFirstStepWould) {
  for (const bool dion : {false, true}) {
    at::manual_seed(0);
    cli::Gpt eager(tiny()), lazy(tiny());
    copy_parameters(*eager, *lazy);
    HybridOptions options;
    if (dion) options.matrices = DionOptions().rank_fraction(0.5);
    HybridOptimizer a(route(*eager), options), b(route(*lazy), options);
    a.init_state();
    for (const auto& [name, p] : a.named_trainable()) {
      const auto state = read_param_state(a, p);
      ASSERT_TRUE(state.has_value()) << name;
      EXPECT_EQ(state->step, 0) << name;
      for (const auto& [slot, t] : state->tensors) {
        EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name << " " << slot;
      }
    }
    for (uint64_t step = 0; step < 2; ++step) {
      set_gradients(*eager, step);
      set_gradients(*lazy, step);
      a.step();
      b.step();
    }
    for (size_t i = 0; i < eager->parameters().size(); ++i) {
      EXPECT_TRUE(at::equal(eager->parameters()[i], lazy->parameters()[i])) << dion << " " << i;
    }
  }
}

// A Muon group that asks for bf16 Newton–Schulz on CPU tensors: the report names where its
// products run (bf16 dot products, or their emulation); fp32 groups add nothing.
TEST(Hybrid, ReportNamesWhereCpuBf16NewtonSchulzRuns) {
  auto gen = testing::seeded(5);
  const std::vector<NamedParameter> named{
      {"blocks.0.w", at::randn({16, 8}, gen).requires_grad_(true), ""},
      {"blocks.0.norm.weight", at::randn({8}, gen).requires_grad_(true), ""}};
  const HybridOptimizer fp32(route(named), MuonOptions(0.02), AdamWOptions(1e-3));
  EXPECT_EQ(fp32.report_text().find("Newton–Schulz"), std::string::npos);
  const HybridOptimizer bf16(route(named), MuonOptions(0.02).ns_dtype(at::kBFloat16),
                             AdamWOptions(1e-3));
  const auto text = bf16.report_text();
  EXPECT_NE(text.find("bf16 Newton–Schulz on the CPU: " + bf16_products() + "\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace muon
