// The Lion update rule (docs/algorithms.md, "Lion") and its owner, muon::Lion: the fused CPU kernel
// (fused_lion_step) on CPU tensors, and on other devices its device-generic form
// (generic_lion_step), the kernel's operations in the kernel's order: on CPU the same bits.
#include "muon/lion.h"

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

using Item = ItemOf<LionOptions>;

void update_items(const LionOptions& o, const std::vector<Item>& items) {
  for (const auto& item : items) {
    auto& state = *item.state;
    LionStepScalars k;
    k.seed = sr::tensor_salt(sr::step_seed(state.step()), item.index);
    state.step(state.step() + 1);
    k.lr = o.lr();
    k.beta1 = std::get<0>(o.betas());
    k.beta2 = std::get<1>(o.betas());
    k.decay_fraction = o.lr() * o.weight_decay();
    auto param = item.param;
    const bool fused = detail::runs_fused(o.fused(), param);
    if (state.exp_avg_codes().defined()) {
      QuantizedState m{state.exp_avg_codes(), state.exp_avg_absmax()};
      if (!fused) {
        detail::on_dequantized<1>({&m}, {q8::CodeMap::signed_e4m3},
                                  [&](std::array<at::Tensor, 1>& values) {
                                    generic_lion_step(param, item.grad, values[0], k);
                                  });
        continue;
      }
      const auto grad = item.grad.contiguous();
      detail::update_in_place(param,
                              [&](at::Tensor& dense) { fused_lion_step(dense, grad, m, k); });
      continue;
    }
    if (!fused) {
      generic_lion_step(param, item.grad, state.exp_avg(), k);
      continue;
    }
    const auto grad = item.grad.contiguous();
    detail::update_in_place(
        param, [&](at::Tensor& dense) { fused_lion_step(dense, grad, state.exp_avg(), k); });
  }
}

}  // namespace

void Algorithm<LionOptions>::validate(const LionOptions& o) {
  check_ranges("Lion", o);
  detail::check_state_dtype("Lion", o.state_dtype());
}

void Algorithm<LionOptions>::check_item(const at::Tensor& p, const at::Tensor& grad,
                                        const LionOptions& o, const std::string& where) {
  detail::check_elementwise_item("Lion", p, grad, o.fused(), where);
  detail::check_state_for("Lion", p, o.state_dtype(), where);
}

void Algorithm<LionOptions>::update(const LionOptions& o, const std::vector<Item>& items) {
  detail::with_tracked_mantissas(o, items,
                                 [&](const std::vector<Item>& work) { update_items(o, work); });
}

template class ElementwiseOptimizer<LionOptions>;

}  // namespace muon
