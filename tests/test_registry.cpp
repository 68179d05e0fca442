// The registry of algorithms and what every entry's two lists give (docs/design.md, "Adding an
// algorithm"): the settings by name against each options type's own getters, and the state made on
// first use and the slots checkpoints check against what each algorithm keeps, written out here.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "helpers.h"
#include "muon/algorithms.h"
#include "muon/error.h"

namespace muon {
namespace {

using testing::expect_error;

TEST(Registry, VisitsEachAlgorithmOnceAndRefusesOthers) {
  EXPECT_EQ(algorithm_names_text(), "muon, dion, adamw, adam, lamb, lion");
  int count = 0;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    const Options options;
    EXPECT_STREQ(algorithm_name(options), Algorithm<Options>::name);
    EXPECT_EQ(algorithm_kind(options), Algorithm<Options>::kind);
    ++count;
  });
  EXPECT_EQ(count, 6);
  EXPECT_EQ(algorithm_kind(MuonOptions()), ParamKind::matrices);
  EXPECT_EQ(algorithm_kind(DionOptions()), ParamKind::matrices);
  EXPECT_EQ(algorithm_kind(LionOptions()), ParamKind::any);
  struct Other : torch::optim::OptimizerCloneableOptions<Other> {};
  expect_error<Error>([] { check_group_options(Other()); },
                      {"options of another optimizer", "muon, dion, adamw, adam, lamb, lion"});
}

// The settings each algorithm's getters say it has, with values distinct from one another.
SettingValues by_getters(const MuonOptions& o) {
  return {{"lr", o.lr()}, {"weight_decay", o.weight_decay()}, {"momentum", o.momentum()}};
}
SettingValues by_getters(const DionOptions& o) {
  return {{"lr", o.lr()}, {"weight_decay", o.weight_decay()}, {"momentum", o.momentum()}};
}
template <AdamRule R>
SettingValues by_getters(const AdamFamilyOptions<R>& o) {
  return {{"lr", o.lr()},
          {"weight_decay", o.weight_decay()},
          {"beta1", std::get<0>(o.betas())},
          {"beta2", std::get<1>(o.betas())},
          {"eps", o.eps()}};
}
SettingValues by_getters(const LionOptions& o) {
  return {{"lr", o.lr()},
          {"weight_decay", o.weight_decay()},
          {"beta1", std::get<0>(o.betas())},
          {"beta2", std::get<1>(o.betas())}};
}

TEST(Registry, SettingsAreTheListedOptionsByName) {
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    SCOPED_TRACE(Algorithm<Options>::name);
    Options o;
    EXPECT_EQ(settings_of(o), by_getters(o));
    EXPECT_EQ(group_settings(o), by_getters(o));  // through the dispatch
    auto changed = by_getters(o);
    double value = 0.125;
    for (auto& [name, v] : changed) v = (value += 0.0625);  // each its own, all in range
    set_group_settings(o, changed);
    EXPECT_EQ(by_getters(o), changed);
    // Nothing but the settings moved: every other number keeps its default.
    const Options defaults;
    visit_options(o, [&](const OptionInfo& info, const auto& field) {
      visit_options(defaults, [&](const OptionInfo& other, const auto& default_value) {
        if constexpr (std::is_same_v<std::decay_t<decltype(field)>, double> &&
                      std::is_same_v<std::decay_t<decltype(default_value)>, double>) {
          if (std::string(info.name) == other.name && changed.count(info.name) == 0) {
            EXPECT_EQ(field, default_value) << info.name;
          }
        }
      });
    });
  });
}

TEST(Registry, OneRowPerAlgorithmFoundByOptionsOrName) {
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    using Entry = Algorithm<Options>;
    SCOPED_TRACE(Entry::name);
    const Options options;
    const auto& row = algorithm_row(options);
    EXPECT_EQ(&row, &algorithm_row(Entry::name));  // one row, however found
    EXPECT_EQ(&row, &algorithm_row(Entry::name, Entry::kind));
    EXPECT_STREQ(row.name, Entry::name);
    EXPECT_EQ(row.title, algorithm_title(Entry::name));
    EXPECT_EQ(row.kind, Entry::kind);
    EXPECT_EQ(row.settings(options), by_getters(options));
    const auto defaults = row.defaults();
    EXPECT_NE(dynamic_cast<Options*>(defaults.get()), nullptr);
    Options bad;
    bad.lr(-1.0);
    expect_error<Error>([&] { row.validate(bad); }, {"lr"});
  });
  EXPECT_EQ(algorithm_row(LionOptions()).title, "Lion");
  expect_error<Error>([] { algorithm_row("lion", ParamKind::matrices, "optimizer.matrices"); },
                      {"optimizer.matrices: 'lion' is not an algorithm that can run here",
                       "valid are muon, dion"});
  expect_error<Error>([] { algorithm_row("sgd"); }, {"'sgd'", "muon, dion, adamw, adam, lamb, lion"});
}

// name → (shape, dtype) of the tensors a state holds.
using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, at::ScalarType>>;

template <class Options>
Tensors made(const Options& o, const at::Tensor& p, const std::vector<int64_t>& view) {
  std::unique_ptr<torch::optim::OptimizerParamState> slot;
  auto& state = make_state(slot, p, o, view);
  Tensors out;
  Algorithm<Options>::State::visit(state, [&](const char* name, at::Tensor& t) {
    if (t.defined()) out[name] = {t.sizes().vec(), t.scalar_type()};
  });
  return out;
}

template <class Options>
Tensors slots(const Options& o, const at::Tensor& p, const std::vector<int64_t>& view) {
  Tensors out;
  for (const auto& s : state_slots(o, p, view)) out[s.name] = {s.shape, s.dtype};
  return out;
}

TEST(Registry, StateIsMadeAndCheckedFromOneList) {
  const auto fp32 = at::zeros({6, 4});
  const auto bf16 = at::zeros({6, 4}, at::kBFloat16);
  const std::vector<int64_t> view{6, 4};
  const Tensors adam{{"exp_avg", {{6, 4}, at::kFloat}}, {"exp_avg_sq", {{6, 4}, at::kFloat}}};
  EXPECT_EQ(made(AdamWOptions(), fp32, view), adam);
  EXPECT_EQ(slots(AdamWOptions(), fp32, view), adam);
  const Tensors adam_bf16{{"exp_avg", {{6, 4}, at::kBFloat16}},
                          {"exp_avg_sq", {{6, 4}, at::kBFloat16}},
                          {"mantissa", {{6, 4}, at::kShort}}};
  const auto tracked = AdamWOptions().state_dtype(at::kBFloat16).mantissa_tracking(true);
  EXPECT_EQ(made(tracked, bf16, view), adam_bf16);
  EXPECT_EQ(slots(tracked, bf16, view), adam_bf16);
  EXPECT_EQ(slots(tracked, fp32, view).count("mantissa"), 0u);  // fp32 weights: no mantissa

  const Tensors lion{{"exp_avg", {{6, 4}, at::kDouble}}};
  EXPECT_EQ(made(LionOptions(), fp32.to(at::kDouble), view), lion);

  // Dion's Q is drawn by its first update: a slot, not made with the state.
  const auto dion = DionOptions().rank_fraction(0.5);
  EXPECT_EQ(made(dion, fp32, view), (Tensors{{"momentum_buffer", {{6, 4}, at::kFloat}}}));
  EXPECT_EQ(slots(dion, fp32, view),
            (Tensors{{"momentum_buffer", {{6, 4}, at::kFloat}},
                     {"dion_q", {dion_q_shape(dion, view), at::kFloat}}}));

  // Muon in a (batch, rows, cols) view; NorMuon's statistic when NorMuon is on.
  const auto experts = at::zeros({2, 6, 4});
  const std::vector<int64_t> expert_view{2, 6, 4};
  const auto normuon = MuonOptions().normuon(NorMuonOptions{});
  const auto statistic = normuon_state_shape(expert_view, NorMuonAxis::automatic);
  const Tensors muon{{"momentum_buffer", {{2, 6, 4}, at::kFloat}},
                     {"normuon_second_moment", {statistic, at::kFloat}}};
  EXPECT_EQ(made(normuon, experts, expert_view), muon);
  EXPECT_EQ(slots(normuon, experts, expert_view), muon);
}

TEST(Registry, AStateTensorSwitchedOnBetweenStepsIsMadeThen) {
  const auto p = at::zeros({6, 4});
  std::unique_ptr<torch::optim::OptimizerParamState> slot;
  auto& state = make_state(slot, p, MuonOptions(), {6, 4});
  state.momentum_buffer().fill_(3.0);  // what a first step left
  EXPECT_FALSE(state.normuon_second_moment().defined());
  auto& again = make_state(slot, p, MuonOptions().normuon(NorMuonOptions{}), {6, 4});
  EXPECT_EQ(&again, &state);
  EXPECT_TRUE(at::equal(again.momentum_buffer(), at::full({6, 4}, 3.0)));  // kept
  ASSERT_TRUE(again.normuon_second_moment().defined());
  EXPECT_EQ(again.normuon_second_moment().sizes().vec(),
            normuon_state_shape({6, 4}, NorMuonAxis::automatic));
  EXPECT_EQ(again.normuon_second_moment().count_nonzero().item<int64_t>(), 0);  // starts at 0
}

}  // namespace
}  // namespace muon
