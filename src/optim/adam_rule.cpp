// The Adam-family and LAMB update rules (docs/design.md, "Adam family" and "LAMB") and their
// owners, muon::AdamW, muon::Adam and muon::Lamb.
#include <cmath>
#include <string>

#include "muon/adam.h"

#include "elementwise_optimizer.h"
#include "in_place.h"
#include "master_weights.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/generic_update.h"
#include "muon/stochastic_rounding.h"
#include "state_precision.h"

namespace muon {
namespace {

// The name a rule's messages use: "AdamW", "Adam" or "Lamb".
const char* rule_name(AdamRule rule) {
  for (const auto& [r, name] : EnumNames<AdamRule>::table) {
    if (r == rule) return name;
  }
  return "?";
}

}  // namespace

template <AdamRule R>
void Algorithm<AdamFamilyOptions<R>>::validate(const Options& o) {
  const char* name = rule_name(R);
  check_ranges(name, o);
  if constexpr (R == AdamRule::lamb) {
    check(o.state_dtype() == at::kFloat, "Lamb: state_dtype ",
          state_dtype_name(o.state_dtype()),
          " is not supported; LAMB keeps float32 state (bfloat16 and int8 state are available for "
          "Adam, AdamW, Lion and Muon)");
    check(!o.nesterov(),
          "Lamb: nesterov is not supported; LAMB's trust ratio is defined for the "
          "Adam direction (use Adam or AdamW with nesterov for NAdam)");
    check(!o.cautious(),
          "Lamb: cautious is not supported; the trust ratio rescales the whole "
          "update (wrap the optimizer in muon::Cautious to mask after the step)");
    check(o.weight_decay_method() == WeightDecayMethod::decoupled, "Lamb: weight_decay_method ",
          to_string(o.weight_decay_method()),
          " is not supported; LAMB's decay is part of the direction its trust ratio scales "
          "(decoupled is the only method)");
  } else {
    detail::check_state_dtype(name, o.state_dtype());
  }
}

template <AdamRule R>
void Algorithm<AdamFamilyOptions<R>>::check_item(const at::Tensor& p, const at::Tensor& grad,
                                                 const Options& o, const std::string& where) {
  detail::check_elementwise_item(rule_name(R), p, grad, o.fused(), where);
  detail::check_state_for(rule_name(R), p, o.state_dtype(), where);
}

namespace {

template <AdamRule R>
AdamStepScalars scalars_of(const AdamFamilyOptions<R>& o, const RuleItem<AdamParamState>& item) {
  const uint32_t salt = sr::tensor_salt(sr::step_seed(item.state->step()), item.index);
  AdamStepScalars s;
  s.lr = o.lr();
  s.beta1 = std::get<0>(o.betas());
  s.beta2 = std::get<1>(o.betas());
  s.eps = o.eps();
  s.decay_fraction = decay_fraction(o.weight_decay_method(), o.lr(), o.weight_decay());
  s.l2_weight_decay = l2_coefficient(o.weight_decay_method(), o.weight_decay());
  s.nesterov = o.nesterov();
  s.cautious = o.cautious();
  s.step = item.state->step() + 1;
  s.seed_exp_avg = salt;
  s.seed_exp_avg_sq = sr::second_moment_salt(salt);
  return s;
}

// AdamW, Adam or NAdam with 8-bit moments (LAMB keeps float32 state).
void update_quantized(at::Tensor& param, const at::Tensor& grad, AdamParamState& state,
                      const AdamStepScalars& s, const std::optional<bool>& fused) {
  QuantizedState m{state.exp_avg_codes(), state.exp_avg_absmax()};
  QuantizedState v{state.exp_avg_sq_codes(), state.exp_avg_sq_absmax()};
  if (!detail::runs_fused(fused, param)) {
    detail::on_dequantized<2>({&m, &v}, {q8::CodeMap::signed_e4m3, q8::CodeMap::unsigned_e5m3},
                              [&](std::array<at::Tensor, 2>& moments) {
                                generic_adam_step({{param, grad, moments[0], moments[1], s}});
                              });
    return;
  }
  const auto dense_grad = grad.contiguous();
  detail::update_in_place(
      param, [&](at::Tensor& dense) { fused_adam_step(dense, dense_grad, m, v, s); });
}

template <AdamRule R>
void update_items(const AdamFamilyOptions<R>& o,
                  const std::vector<RuleItem<AdamParamState>>& items) {
  std::vector<AdamTensors> generic;  // parameters for the device-generic form, in one call
  for (const auto& item : items) {
    const auto s = scalars_of(o, item);
    auto& state = *item.state;
    state.step(s.step);
    auto param = item.param;
    if (state.exp_avg_codes().defined()) {
      update_quantized(param, item.grad, state, s, o.fused());
      continue;
    }
    if (!detail::runs_fused(o.fused(), param)) {
      generic.push_back({param, item.grad, state.exp_avg(), state.exp_avg_sq(), s});
      continue;
    }
    const auto grad = item.grad.contiguous();
    detail::update_in_place(param, [&](at::Tensor& dense) {
      if constexpr (R == AdamRule::lamb) {
        fused_lamb_step(dense, grad, state.exp_avg(), state.exp_avg_sq(), s, o.weight_decay());
      } else {
        fused_adam_step(dense, grad, state.exp_avg(), state.exp_avg_sq(), s);
      }
    });
  }
  if constexpr (R == AdamRule::lamb) {
    generic_lamb_step(generic, o.weight_decay());
  } else {
    generic_adam_step(generic);
  }
}

}  // namespace

template <AdamRule R>
void Algorithm<AdamFamilyOptions<R>>::update(const Options& o,
                                            const std::vector<RuleItem<State>>& items) {
  detail::with_tracked_mantissas(o, items,
                                 [&](const std::vector<RuleItem<State>>& work) { update_items(o, work); });
}

template struct Algorithm<AdamWOptions>;
template struct Algorithm<AdamOptions>;
template struct Algorithm<LambOptions>;
template class ElementwiseOptimizer<AdamWOptions>;
template class ElementwiseOptimizer<AdamOptions>;
template class ElementwiseOptimizer<LambOptions>;

}  // namespace muon
