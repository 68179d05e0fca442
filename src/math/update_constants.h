// Internal to the math layer: the per-update constants of the Adam family and of Lion, computed
// once in double and rounded into the arithmetic type C, shared by the fused CPU kernels and their
// device-generic ATen forms so that both multiply by the same numbers.
#pragma once

#include <cmath>
#include <cstdint>

#include "muon/fused_update.h"

namespace muon::detail {

template <class C>
struct AdamConstants {
  C decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_sqrt_bc2, eps, step_size, coef_m,
      coef_g;
  uint32_t seed_m, seed_v;
};

template <class C>
AdamConstants<C> adam_constants(const AdamStepScalars& s) {
  const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
  const double bc1_next = 1.0 - std::pow(s.beta1, static_cast<double>(s.step + 1));
  AdamConstants<C> k{};
  k.decay = static_cast<C>(1.0 - s.decay_fraction);
  k.l2 = static_cast<C>(s.l2_weight_decay);
  k.beta1 = static_cast<C>(s.beta1);
  k.one_minus_beta1 = static_cast<C>(1.0 - s.beta1);
  k.beta2 = static_cast<C>(s.beta2);
  k.one_minus_beta2 = static_cast<C>(1.0 - s.beta2);
  // torch divides by the scalar √(1−β2ᵗ) as a multiplication by its reciprocal in the tensor dtype.
  k.inv_sqrt_bc2 = static_cast<C>(1) / static_cast<C>(std::sqrt(bc2));
  k.eps = static_cast<C>(s.eps);
  if (s.nesterov) {  // optax's NAdam: β1·m/(1−β1ᵗ⁺¹) + (1−β1)·g/(1−β1ᵗ)
    k.step_size = static_cast<C>(s.lr);
    k.coef_m = static_cast<C>(s.beta1 / bc1_next);
    k.coef_g = static_cast<C>((1.0 - s.beta1) / bc1);
  } else {
    k.step_size = static_cast<C>(s.lr / bc1);
    k.coef_m = 1;
    k.coef_g = 0;
  }
  k.seed_m = s.seed_exp_avg;
  k.seed_v = s.seed_exp_avg_sq;
  return k;
}

// LAMB's 1/(1−β1ᵗ), rounded into C.
template <class C>
C lamb_inv_bc1(const AdamStepScalars& s) {
  return static_cast<C>(1.0 / (1.0 - std::pow(s.beta1, static_cast<double>(s.step))));
}

// Lion's: W·decay − lr·sign(β1·m + (1−β1)·g), m ← β2·m + (1−β2)·g.
template <class C>
struct LionConstants {
  C lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  uint32_t seed;
};

template <class C>
LionConstants<C> lion_constants(const LionStepScalars& s) {
  return {static_cast<C>(s.lr),
          static_cast<C>(1.0 - s.decay_fraction),
          static_cast<C>(s.beta1),
          static_cast<C>(1.0 - s.beta1),
          static_cast<C>(s.beta2),
          static_cast<C>(1.0 - s.beta2),
          s.seed};
}

}  // namespace muon::detail
