// The optimizers own their groups and state: torch::save / torch::load round-trip the hybrid and
// the standalone optimizers, add_param_group works or refuses as documented in muon/hybrid.h.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <filesystem>
#include <functional>
#include <map>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using testing::expect_error;

cli::GptConfig tiny() {
  cli::GptConfig c;
  c.n_layers = 1;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

void set_gradients(const std::vector<at::Tensor>& params, uint64_t seed) {
  auto gen = testing::seeded(seed);
  for (auto p : params) p.mutable_grad() = at::randn(p.sizes(), gen);
}

void copy_values(const std::vector<at::Tensor>& from, const std::vector<at::Tensor>& to) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("muon_ownership_" + name)).string();
}

// Every state tensor and step of `opt`, by parameter position.
std::map<std::string, at::Tensor> state_of(const torch::optim::Optimizer& opt) {
  std::map<std::string, at::Tensor> out;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto entry = read_param_state(opt, params[i]);
      if (!entry) continue;
      const auto key = std::to_string(g) + "/" + std::to_string(i) + "/";
      out[key + "step"] = at::tensor(entry->step);
      for (const auto& [name, t] : entry->tensors) out[key + name] = t.clone();
    }
  }
  return out;
}

void expect_same_state(const torch::optim::Optimizer& a, const torch::optim::Optimizer& b) {
  const auto sa = state_of(a), sb = state_of(b);
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [key, t] : sa) {
    ASSERT_EQ(sb.count(key), 1u) << key;
    EXPECT_TRUE(at::equal(t, sb.at(key))) << key;
  }
}

// Steps `first` twice, saves it, loads the file into `second` (built over a copy of the
// parameters), then steps both twice more: every value, state tensor and counter equal.
template <class Make>
// `scheduled`: a schedule sets lr at every step (so it is not changed by hand here; the restored
// lr is then the schedule's value after two steps, not the constructed one).
void expect_round_trip(Make make, const std::string& name, bool scheduled = false) {
  cli::Gpt model_a(tiny()), model_b(tiny());
  copy_values(model_a->parameters(), model_b->parameters());
  auto a = make(*model_a);
  auto b = make(*model_b);
  for (uint64_t s = 0; s < 2; ++s) {
    set_gradients(model_a->parameters(), s);
    a->step();
  }
  if (!scheduled) {
    a->param_groups()[0].options().set_lr(a->param_groups()[0].options().get_lr() * 0.5);
  }
  const auto path = temp_path(name);
  torch::save(*a, path);
  copy_values(model_a->parameters(), model_b->parameters());
  torch::load(*b, path);
  std::filesystem::remove(path);
  expect_same_state(*a, *b);
  EXPECT_EQ(b->param_groups()[0].options().get_lr(), a->param_groups()[0].options().get_lr());
  for (uint64_t s = 2; s < 4; ++s) {
    set_gradients(model_a->parameters(), s);
    set_gradients(model_b->parameters(), s);
    a->step();
    b->step();
  }
  const auto pa = model_a->parameters(), pb = model_b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i], pb[i])) << name << " " << i;
  expect_same_state(*a, *b);
}

TEST(Ownership, TorchSaveAndLoadRoundTripTheHybrid) {
  HybridOptions options;
  options.matrices = MuonOptions(0.02).normuon(NorMuonOptions{}).state_dtype(at::kBFloat16);
  options.others = AdamWOptions(3e-3).state_dtype(at::kBFloat16);
  LrSchedule schedule;
  schedule.kind = ScheduleKind::cosine;
  schedule.warmup_steps = 1;
  schedule.end_value = 0.1;
  options.schedule = schedule;
  options.total_steps = 10;
  expect_round_trip(
      [&](cli::GptImpl& model) { return std::make_unique<HybridOptimizer>(route(model), options); },
      "hybrid", /*scheduled=*/true);
  // The counters travel too: the schedules continue from the saved step.
  cli::Gpt model(tiny());
  HybridOptimizer a(route(*model), options), b(route(*model), options);
  set_gradients(model->parameters(), 0);
  a.step();
  a.step();
  const auto path = temp_path("counters");
  torch::save(a, path);
  torch::load(b, path);
  std::filesystem::remove(path);
  EXPECT_EQ(b.step_count(), 2);
}

TEST(Ownership, TorchSaveAndLoadRoundTripTheStandaloneOptimizers) {
  const auto matrices = [](cli::GptImpl& model) {
    std::vector<at::Tensor> out;
    for (const auto& p : model.parameters()) {
      if (p.dim() == 2) out.push_back(p);
    }
    return out;
  };
  expect_round_trip(
      [&](cli::GptImpl& model) {
        return std::make_unique<Muon>(matrices(model), MuonOptions(0.02).normuon(NorMuonOptions{}));
      },
      "muon");
  expect_round_trip(
      [](cli::GptImpl& model) {
        return std::make_unique<AdamW>(model.parameters(),
                                       AdamWOptions(1e-3).state_dtype(at::kBFloat16));
      },
      "adamw");
  expect_round_trip(
      [](cli::GptImpl& model) {
        return std::make_unique<Lamb>(model.parameters(), LambOptions(1e-3).weight_decay(0.01));
      },
      "lamb");
}

TEST(Ownership, LoadingAMismatchedArchiveChangesNothing) {
  cli::Gpt model(tiny());
  HybridOptimizer saved(route(*model), HybridOptions{});
  set_gradients(model->parameters(), 0);
  saved.step();
  const auto path = temp_path("mismatch");
  torch::save(saved, path);

  // Another model: the groups have other sizes.
  auto other_config = tiny();
  other_config.n_layers = 2;
  cli::Gpt other(other_config);
  HybridOptimizer target(route(*other), HybridOptions{});
  set_gradients(other->parameters(), 1);
  target.step();
  const auto before = state_of(target);
  const double lr = target.param_groups()[0].options().get_lr();
  expect_error<Error>([&] { torch::load(target, path); }, {"optimizer archive: param group"});
  EXPECT_EQ(target.step_count(), 1);
  EXPECT_EQ(target.param_groups()[0].options().get_lr(), lr);
  const auto after = state_of(target);
  ASSERT_EQ(before.size(), after.size());
  for (const auto& [key, t] : before) EXPECT_TRUE(at::equal(t, after.at(key))) << key;

  // A standalone optimizer's archive has no hybrid counters; libtorch's own has no format mark.
  AdamW adamw(model->parameters());
  torch::save(adamw, path);
  expect_error<Error>([&] { torch::load(saved, path); }, {"no step counters"});
  torch::optim::SGD sgd(model->parameters(), 0.1);
  torch::save(sgd, path);
  expect_error<Error>([&] { torch::load(adamw, path); },
                      {"not written by a muon-cpp optimizer's save()"});
  std::filesystem::remove(path);
}

TEST(Ownership, AddParamGroupRunsTheAlgorithmItsOptionsName) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), HybridOptions{});
  const auto groups = opt.param_groups().size();
  auto matrix = at::randn({8, 4}).requires_grad_(true);
  auto vector = at::randn({4}).requires_grad_(true);
  opt.add_param_group({{matrix}, std::make_unique<MuonOptions>(MuonOptions(0.05))});
  opt.add_param_group({{vector}});  // no options: the hybrid's AdamW settings
  ASSERT_EQ(opt.param_groups().size(), groups + 2);
  EXPECT_EQ(opt.role_of(matrix), Role::matrices);
  EXPECT_EQ(opt.role_of(vector), Role::others);

  // The same updates as the standalone optimizers give.
  auto matrix_ref = matrix.detach().clone().requires_grad_(true);
  auto vector_ref = vector.detach().clone().requires_grad_(true);
  Muon muon({matrix_ref}, MuonOptions(0.05));
  AdamW adamw({vector_ref}, AdamWOptions());
  for (uint64_t s = 0; s < 3; ++s) {
    set_gradients(model->parameters(), s);
    set_gradients({matrix, vector}, 100 + s);
    set_gradients({matrix_ref, vector_ref}, 100 + s);
    opt.step();
    muon.step();
    adamw.step();
  }
  EXPECT_TRUE(at::equal(matrix, matrix_ref));
  EXPECT_TRUE(at::equal(vector, vector_ref));
  const auto names = opt.named_trainable();
  const auto named = [&](const std::string& name) {
    for (const auto& [n, p] : names) {
      if (n == name) return p;
    }
    return at::Tensor();
  };
  EXPECT_TRUE(named(detail::concat("param_groups.", groups, ".0")).is_same(matrix));
  EXPECT_TRUE(named(detail::concat("param_groups.", groups + 1, ".0")).is_same(vector));
}

TEST(Ownership, AddParamGroupRefusesWhatTheHybridCannotRun) {
  cli::Gpt model(tiny());
  HybridOptimizer opt(route(*model), HybridOptions{});
  const auto groups = opt.param_groups().size();
  auto vector = at::randn({4}).requires_grad_(true);
  expect_error<Error>(
      [&] {
        opt.add_param_group({{vector}, std::make_unique<torch::optim::SGDOptions>(0.1)});
      },
      {"param group " + std::to_string(groups), "options of another optimizer",
       "muon-cpp runs the algorithms muon, dion, adamw"});
  expect_error<Error>(
      [&] {
        opt.add_param_group({{vector}, std::make_unique<MuonOptions>()});
      },
      {"Muon optimizes matrices"});
  expect_error<Error>(
      [&] {
        opt.add_param_group({{vector}, std::make_unique<AdamWOptions>(-1.0)});
      },
      {"AdamW: lr must be >= 0"});
  const auto taken = model->parameters()[0];
  expect_error<Error>([&] { opt.add_param_group({{taken}}); },
                      {"is also parameter", "a parameter belongs to one group"});
  EXPECT_EQ(opt.param_groups().size(), groups);  // nothing was added

  // Added behind the hybrid's back (through the base class): where LibTorch keeps the group's
  // options (1.13, 2.6), the next step() refuses them and changes nothing; newer LibTorch gives
  // the group the hybrid's AdamW defaults instead (muon/compat.h), and it trains as AdamW.
  auto& base = static_cast<torch::optim::Optimizer&>(opt);
  base.add_param_group({{vector}, std::make_unique<torch::optim::SGDOptions>(0.1)});
  set_gradients(model->parameters(), 0);
  const auto before = model->parameters()[0].detach().clone();
  if (dynamic_cast<const torch::optim::SGDOptions*>(&opt.param_groups().back().options())) {
    expect_error<Error>([&] { opt.step(); }, {"HybridOptimizer::step", "options of another"});
    EXPECT_TRUE(at::equal(model->parameters()[0], before));
  } else {
    const auto& o = dynamic_cast<const AdamWOptions&>(opt.param_groups().back().options());
    EXPECT_EQ(o.lr(), AdamWOptions().lr());
    opt.step();
    EXPECT_EQ(opt.role_of(vector), Role::others);
  }
}

}  // namespace
}  // namespace muon
