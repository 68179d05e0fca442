// The Adam family as torch::optim::Optimizers, one template over the update rule
// (muon/rules.h): muon::AdamW (decoupled decay, exactly torch.optim.AdamW), muon::Adam (coupled
// L2 decay, torch style), NAdam through nesterov(true) on either (optax's form), and muon::Lamb.
// Each runs a fused single-pass kernel on CPU tensors and a device-generic ATen form elsewhere
// (docs/algorithms.md). state_dtype(at::kBFloat16) stores both moments in bf16 with stochastic
// rounding.
//
//   muon::AdamW opt(params, muon::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1)
//                               .state_dtype(at::kBFloat16));
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>
#include <tuple>
#include <vector>

#include "muon/algorithm.h"
#include "muon/enum_names.h"
#include "muon/option_schema.h"

namespace muon {

// AdamW and Adam differ only in their default weight_decay_method (decoupled, l2) and decay.
enum class AdamRule {
  adamw,  // W ← W·(1 − lr·weight_decay), then the Adam step
  adam,   // g ← g + weight_decay·W before the moments (coupled L2)
  lamb,   // the Adam direction plus weight_decay·W, scaled by the trust ratio ‖W‖/‖r‖
};

inline Betas default_betas() {
  return {0.9, 0.999};
}

// The defaults that differ between the members: torch's AdamW decays by 1e-2 (decoupled),
// torch's Adam couples its decay into the gradient (l2), LAMB's paper uses eps 1e-6.
template <AdamRule R>
struct AdamDefaults {
  static constexpr double weight_decay = R == AdamRule::adamw ? 1e-2 : 0.0;
  static constexpr WeightDecayMethod weight_decay_method =
      R == AdamRule::adam ? WeightDecayMethod::l2 : WeightDecayMethod::decoupled;
  static constexpr double eps = R == AdamRule::lamb ? 1e-6 : 1e-8;
};

// The options of one member of the family: the list MUON_ADAM_OPTIONS in muon/option_schema.h.
// The formulas are fused_adam_step's and fused_lamb_step's (muon/fused_update.h).
template <AdamRule R>
struct AdamFamilyOptions : public torch::optim::OptimizerCloneableOptions<AdamFamilyOptions<R>> {
  static constexpr AdamRule rule = R;
  AdamFamilyOptions() = default;
  AdamFamilyOptions(double lr) { this->lr_ = lr; }  // NOLINT: implicit, libtorch style
  MUON_ADAM_OPTIONS(MUON_OPTION_MEMBER)

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

template <>
struct EnumNames<AdamRule> {
  static constexpr const char* noun = "Adam-family rule";
  static constexpr const char* plural = "rules";
  static constexpr std::array<std::pair<AdamRule, const char*>, 3> table{
      {{AdamRule::adamw, "AdamW"}, {AdamRule::adam, "Adam"}, {AdamRule::lamb, "Lamb"}}};
};

// f(OptionInfo, value) for every option of `o`, in the schema's order.
template <AdamRule R, class F>
void visit_options(AdamFamilyOptions<R>& o, F&& f) {
  MUON_ADAM_OPTIONS(MUON_OPTION_VISIT)
}
template <AdamRule R, class F>
void visit_options(const AdamFamilyOptions<R>& o, F&& f) {
  MUON_ADAM_OPTIONS(MUON_OPTION_VISIT)
}

using AdamWOptions = AdamFamilyOptions<AdamRule::adamw>;
using AdamOptions = AdamFamilyOptions<AdamRule::adam>;
using LambOptions = AdamFamilyOptions<AdamRule::lamb>;

struct AdamParamState : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);     // state_dtype
  TORCH_ARG(at::Tensor, exp_avg_sq);  // state_dtype
  TORCH_ARG(at::Tensor, mantissa);    // mantissa_tracking of a bf16 parameter: int16 low halves
};

template <AdamRule R>
using AdamFamily = ElementwiseOptimizer<AdamFamilyOptions<R>>;
using AdamW = AdamFamily<AdamRule::adamw>;
using Adam = AdamFamily<AdamRule::adam>;
using Lamb = AdamFamily<AdamRule::lamb>;

// The registry's entry (muon/algorithm.h) of each member; the rule is src/optim/adam_rule.cpp.
template <AdamRule R>
struct Algorithm<AdamFamilyOptions<R>> {
  using Options = AdamFamilyOptions<R>;
  static constexpr const char* name = R == AdamRule::adamw  ? "adamw"
                                      : R == AdamRule::adam ? "adam"
                                                            : "lamb";
  static constexpr ParamKind kind = ParamKind::any;
  using State = AdamParamState;
  using Owner = AdamFamily<R>;
  using Item = RuleItem<State>;

  // LAMB: no nesterov, cautious or bf16 state.
  static void validate(const Options& options);
  static std::vector<StateSlot> state_slots(const Options& options, const at::Tensor& param,
                                            const std::vector<int64_t>& view);
  template <class F>
  static void visit_state(State& s, F&& f) {
    f("exp_avg", s.exp_avg());
    f("exp_avg_sq", s.exp_avg_sq());
    f("mantissa", s.mantissa());
  }
  static SettingValues settings(const Options& o) { return beta_settings<true>(o); }
  static void set_settings(Options& o, const SettingValues& v) { set_beta_settings<true>(o, v); }

  static State& make_state(std::unique_ptr<torch::optim::OptimizerParamState>& slot,
                           const at::Tensor& param, const Options& options);
  // Throws muon::Error, naming `where` (e.g. "parameter 2 of param group 0"), unless `param` with
  // gradient `grad` can take this update — before anything changes.
  static void check_item(const at::Tensor& param, const at::Tensor& grad, const Options& options,
                         const std::string& where);
  // One step of every item, all under `options` (one parameter group).
  static void update(const Options& options, const std::vector<Item>& items);
};

}  // namespace muon
