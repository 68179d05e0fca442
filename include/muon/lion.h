// muon::Lion — the sign of an interpolated momentum (Chen et al., "Symbolic Discovery of
// Optimization Algorithms", arXiv 2302.06675), per step and parameter:
//   c ← β1·m + (1−β1)·g;  W ← W·(1 − lr·λ) − lr·sign(c);  m ← β2·m + (1−β2)·g.
// One state tensor (m), which state_dtype(at::kBFloat16) stores in bf16 with stochastic rounding,
// state_dtype(at::kChar) in 8-bit blocks (muon/quantize.h).
// The defaults are lion-pytorch's (lr 1e-4, betas (0.9, 0.99), weight decay 0); Lion wants a
// learning rate 3–10× smaller than AdamW's and a decay 3–10× larger (the paper, §5).
//
//   muon::Lion opt(params, muon::LionOptions(1e-4).weight_decay(1.0));
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "muon/algorithm.h"
#include "muon/dtypes.h"
#include "muon/option_schema.h"

namespace muon {

// clang-format off
#define MUON_LION_OPTIONS(X)                                                                       \
  X(double, lr, 1e-4, nonnegative, "learning rate: each entry moves by lr (the sign's size)")      \
  X(Betas, betas, Betas(0.9, 0.99), unit_interval,                                                 \
    "(β1, β2): β1 interpolates the update's momentum, β2 is the kept momentum's")                  \
  X(double, weight_decay, 0.0, nonnegative, "decoupled weight decay λ: W·(1 − lr·λ)")              \
  X(at::ScalarType, state_dtype, at::kFloat, any,                                                  \
    "momentum storage: float32 (float64 for float64 parameters), bfloat16 (stochastic rounding) "  \
    "or int8 (8-bit blocks, tensors of 4096+ elements in 2+ dims)")                                \
  X(bool, mantissa_tracking, false, any, MUON_MANTISSA_DOC)                                        \
  X(std::optional<bool>, fused, std::nullopt, any, MUON_FUSED_DOC)
// clang-format on

struct LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions() = default;
  LionOptions(double lr) { this->lr_ = lr; }  // NOLINT: implicit, libtorch style
  MUON_LION_OPTIONS(MUON_OPTION_MEMBER)

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

template <class F>
void visit_options(LionOptions& o, F&& f) {
  MUON_LION_OPTIONS(MUON_OPTION_VISIT)
}
template <class F>
void visit_options(const LionOptions& o, F&& f) {
  MUON_LION_OPTIONS(MUON_OPTION_VISIT)
}

// Lion's state per parameter (MUON_PARAM_STATE in muon/algorithm.h): the momentum exp_avg (m) in
// state_dtype (int8: exp_avg_codes and exp_avg_absmax, muon/quantize.h's signed map); mantissa with mantissa_tracking of a bf16 parameter (int16 low halves).
// clang-format off
#define MUON_LION_STATE(X)                                                                         \
  X(exp_avg, !quantized_state(p, o.state_dtype()), p.sizes(),                                     \
    state_storage_dtype(p.scalar_type(), o.state_dtype()), zeros)                                  \
  X(exp_avg_codes, quantized_state(p, o.state_dtype()), p.sizes(), at::kByte, zeros)             \
  X(exp_avg_absmax, quantized_state(p, o.state_dtype()), q8::absmax_shape(p.sizes()), at::kFloat, \
    zeros)                                                                                         \
  X(mantissa, tracks_mantissa(o.mantissa_tracking(), p), p.sizes(), at::kShort, zeros)
// clang-format on
MUON_PARAM_STATE(LionParamState, MUON_LION_STATE);

using Lion = ElementwiseOptimizer<LionOptions>;

// The registry's entry (muon/algorithm.h); the rule is src/optim/lion_rule.cpp.
template <>
struct Algorithm<LionOptions> {
  static constexpr const char* name = "lion";
  static constexpr ParamKind kind = ParamKind::any;
  using State = LionParamState;
  static constexpr std::array settings{"lr", "weight_decay", "betas"};

  static void validate(const LionOptions& options);
  static void check_item(const at::Tensor& param, const at::Tensor& grad,
                         const LionOptions& options, const std::string& where);
  static void update(const LionOptions& options, const std::vector<RuleItem<State>>& items);
};

}  // namespace muon
