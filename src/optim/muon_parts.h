// Internal to the algorithms layer: the steps Muon and Dion share — the gradient their momentum
// accumulates and the end of every step — for the items of either (MatrixItem<Options, State>).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "in_place.h"
#include "muon/fused_update.h"
#include "muon/generic_update.h"
#include "muon/muon.h"
#include "muon/weight_decay.h"

namespace muon::detail {

// Throws muon::Error unless the matrices rule `who` ("Muon", "Dion") can update `p` with gradient
// `grad`: a dense gradient of p's shape, a real floating-point parameter of rank ≥ 2, kernels
// `fused` can run. `where` names the parameter.
inline void check_matrix_item(const char* who, const at::Tensor& p, const at::Tensor& grad,
                              const std::optional<bool>& fused, const std::string& where) {
  check(!grad.is_sparse(), who, " does not support sparse gradients (", where, ")");
  check_muon_param(p, where, who);
  check(grad.sizes() == p.sizes(), who, ": ", where, " has a gradient of shape ", grad.sizes(),
        " for a parameter of shape ", p.sizes());
  check_kernels(fused, p, who, where);
}

// The gradient the momentum accumulates: g, or g + λ·W under weight_decay_method l2.
template <class Options>
at::Tensor momentum_gradient(const at::Tensor& grad, const at::Tensor& p, const Options& o) {
  const double l2 = l2_coefficient(o.weight_decay_method(), o.weight_decay());
  return l2 == 0 ? grad : grad + l2 * p;
}

// The end of every Muon or Dion step, whatever made the direction U (Newton–Schulz or Dion's power
// iteration): W ← W·(1 − decay_fraction) − lr·factor·U (decay masked to U·W ≥ 0 with cautious
// weight decay), computed in U's dtype and rounded once into W — with `cautious`, entries where
// (W_old − W_new)·g ≤ 0 keep W_old — then the item's step is counted.
template <class Item>
void finish_step(const Item& item, const at::Tensor& U_view, double factor) {
  const auto& o = *item.options;
  auto p = item.param;
  const auto U = U_view.reshape(p.sizes());
  const double decay = 1.0 - decay_fraction(o.weight_decay_method(), o.lr(), o.weight_decay());
  const double scale = o.lr() * factor;
  const bool masked = o.cautious();
  if (runs_fused(o.fused(), p)) {
    const auto dense_grad = masked ? item.grad.contiguous() : at::Tensor();
    update_in_place(p, [&](at::Tensor& dense) {
      fused_apply_update(dense, U.contiguous(), decay, scale, o.cautious_weight_decay(),
                         masked ? &dense_grad : nullptr);
    });
  } else {
    generic_apply_update(p, U, decay, scale, o.cautious_weight_decay(),
                         masked ? &item.grad : nullptr);
  }
  item.state->step(item.state->step() + 1);
}

}  // namespace muon::detail
