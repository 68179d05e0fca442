// The Adam family as torch::optim::Optimizers, one template over the update rule
// (src/optim/adam_rule.cpp): muon::AdamW (decoupled decay, exactly torch.optim.AdamW), muon::Adam (coupled
// L2 decay, torch style), NAdam through nesterov(true) on either (optax's form), and muon::Lamb.
// Each runs a fused single-pass kernel on CPU tensors and a device-generic ATen form elsewhere
// (docs/algorithms.md). state_dtype(at::kBFloat16) stores both moments in bf16 with stochastic
// rounding.
//
//   muon::AdamW opt(params, muon::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1)
//                               .state_dtype(at::kBFloat16));
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include "muon/algorithm.h"
#include "muon/dtypes.h"
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

// The family's settings; the defaults that differ between its members are AdamDefaults<R>'s.
// clang-format off
#define MUON_ADAM_OPTIONS(X)                                                                       \
  X(double, lr, 1e-3, nonnegative, "learning rate")                                                \
  X(Betas, betas, default_betas(), unit_interval, "(β1, β2) of the first and second moments")      \
  X(double, eps, AdamDefaults<R>::eps, positive, "added to the denominator")                      \
  X(double, weight_decay, AdamDefaults<R>::weight_decay, nonnegative,                              \
    "weight decay λ, applied as weight_decay_method says (LAMB: inside the trust ratio)")          \
  X(WeightDecayMethod, weight_decay_method, AdamDefaults<R>::weight_decay_method, any,             \
    "decoupled W·(1 − lr·λ) (AdamW's default), independent W·(1 − λ), l2 g + λ·W (Adam's "         \
    "default), palm W·(1 − lr²·λ); LAMB: decoupled only")                                          \
  X(bool, nesterov, false, any, "NAdam's look-ahead first moment (optax's form); not for LAMB")    \
  X(at::ScalarType, state_dtype, at::kFloat, any,                                                  \
    "moment storage: float32 (float64 for float64 parameters), bfloat16 or int8 (8-bit blocks, "   \
    "tensors of 4096+ elements in 2+ dims); LAMB: float32 only")                                   \
  X(bool, mantissa_tracking, false, any, MUON_MANTISSA_DOC)                                        \
  X(bool, cautious, false, any, MUON_CAUTIOUS_DOC "; not for LAMB")                               \
  X(std::optional<bool>, fused, std::nullopt, any, MUON_FUSED_DOC)
// clang-format on

// The options of one member of the family: the list MUON_ADAM_OPTIONS above.
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

// The Adam family's state per parameter (MUON_PARAM_STATE in muon/algorithm.h): the moments
// exp_avg and exp_avg_sq in state_dtype (full precision: fp32, fp64 for fp64 parameters; bf16) or,
// with int8 state where the tensor takes it, as codes and per-block absmax (muon/quantize.h: the
// signed map for exp_avg, the unsigned one for exp_avg_sq); mantissa with mantissa_tracking of a
// bf16 parameter (the low 16 bits of each fp32 weight, int16).
// clang-format off
#define MUON_ADAM_STATE(X)                                                                         \
  X(exp_avg, !quantized_state(p, o.state_dtype()), p.sizes(),                                     \
    state_storage_dtype(p.scalar_type(), o.state_dtype()), zeros)                                  \
  X(exp_avg_sq, !quantized_state(p, o.state_dtype()), p.sizes(),                                  \
    state_storage_dtype(p.scalar_type(), o.state_dtype()), zeros)                                  \
  X(exp_avg_codes, quantized_state(p, o.state_dtype()), p.sizes(), at::kByte, zeros)             \
  X(exp_avg_absmax, quantized_state(p, o.state_dtype()), q8::absmax_shape(p.sizes()), at::kFloat, \
    zeros)                                                                                         \
  X(exp_avg_sq_codes, quantized_state(p, o.state_dtype()), p.sizes(), at::kByte, zeros)          \
  X(exp_avg_sq_absmax, quantized_state(p, o.state_dtype()), q8::absmax_shape(p.sizes()),          \
    at::kFloat, zeros)                                                                             \
  X(mantissa, tracks_mantissa(o.mantissa_tracking(), p), p.sizes(), at::kShort, zeros)
// clang-format on
MUON_PARAM_STATE(AdamParamState, MUON_ADAM_STATE);

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
  static constexpr std::array settings{"lr", "weight_decay", "betas", "eps"};

  // LAMB: no nesterov, cautious or bf16 state.
  static void validate(const Options& options);
  // Throws muon::Error, naming `where` (e.g. "parameter 2 of param group 0"), unless `param` with
  // gradient `grad` can take this update — before anything changes.
  static void check_item(const at::Tensor& param, const at::Tensor& grad, const Options& options,
                         const std::string& where);
  // One step of every item, all under `options` (one parameter group).
  static void update(const Options& options, const std::vector<RuleItem<State>>& items);
};

}  // namespace muon
