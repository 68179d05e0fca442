// Single-pass elementwise optimizer kernels (CPU): each reads parameter, gradient and state once
// and writes parameter and state once, multi-threaded and vectorized, with no full-size
// temporaries. Parameters may be float32, float64, bfloat16 or float16 (gradients of the same
// dtype); state float32 (float64 for float64 parameters) or bfloat16, written back with
// stochastic rounding (muon/stochastic_rounding.h), or 8-bit (QuantizedState overloads: each
// block decoded, updated in fp32 as fp32 state is, and coded again, muon/quantize.h). Arithmetic runs in float32 (float64 for
// float64 parameters) and is rounded once into the parameter's dtype.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace muon {

// A state tensor stored 8-bit (muon/quantize.h): codes (uint8, contiguous, the parameter's shape)
// and one fp32 absmax per block (q8::absmax_shape). Parameters must not be float64.
struct QuantizedState {
  at::Tensor codes, absmax;
};

// Scalars of one Adam-family update of one tensor.
struct AdamStepScalars {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double decay_fraction = 0;   // W ← W·(1 − decay_fraction) before the step (AdamW: lr·λ)
  double l2_weight_decay = 0;  // g ← g + λ·W before the moments (Adam)
  bool nesterov = false;       // NAdam as optax forms it
  bool cautious = false;       // keep W_old where (W_old − W_new)·g ≤ 0 (cautious optimizer)
  int64_t step = 1;            // t, counting this update (1 on the first)
  uint32_t seed_exp_avg = 0;   // stochastic-rounding seeds, used with bf16 state
  uint32_t seed_exp_avg_sq = 0;
};

// One AdamW/Adam/NAdam update (torch.optim.AdamW's and optax's formulas), t = k.step:
//   g ← g + λ_L2·W;  W ← W·(1 − decay_fraction);
//   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
//   W ← W − lr·m̂ / (√v / √(1−β2ᵗ) + eps),
// with m̂ = m/(1−β1ᵗ), or for NAdam m̂ = β1·m/(1−β1ᵗ⁺¹) + (1−β1)·g/(1−β1ᵗ).
// All tensors must be contiguous with the same number of elements.
void fused_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     at::Tensor& exp_avg_sq, const AdamStepScalars& k);
// The same with 8-bit moments: exp_avg in the signed map, exp_avg_sq in the unsigned one.
void fused_adam_step(at::Tensor& param, const at::Tensor& grad, QuantizedState& exp_avg,
                     QuantizedState& exp_avg_sq, const AdamStepScalars& k);

// LAMB (You et al., arXiv 1904.00962) for one tensor, in two passes over fp32 state: the first
// updates the moments and sums ‖W‖² and ‖r‖² of r = m̂/(√v̂ + eps) + λ·W, the second applies
// W ← W − lr·(‖W‖/‖r‖)·r (trust ratio 1 when either norm is 0). Returns the trust ratio.
double fused_lamb_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                       at::Tensor& exp_avg_sq, const AdamStepScalars& k, double weight_decay);

// Scalars of one Lion update of one tensor.
struct LionStepScalars {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double decay_fraction = 0;  // W ← W·(1 − decay_fraction) before the step (lr·λ)
  uint32_t seed = 0;          // stochastic-rounding seed of bf16 state
};

// One Lion update (Chen et al., arXiv 2302.06675), in this order and rounding:
//   c ← β1·m + (1−β1)·g;  W ← W·(1 − decay_fraction) − lr·sign(c);  m ← β2·m + (1−β2)·g.
// All tensors must be contiguous with the same number of elements.
void fused_lion_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     const LionStepScalars& k);
void fused_lion_step(at::Tensor& param, const at::Tensor& grad, QuantizedState& exp_avg,
                     const LionStepScalars& k);

// Muon's momentum: B ← β·B + (1−β)·g (ema) or β·B + g (sum), and the direction to orthogonalize
// written to `direction` (float32/float64): Q = lerp(g, B, β) (ema) or g + β·B (sum) with
// Nesterov, else Q = B. `buffer` may be bf16 (rounded with `seed`). `direction` may be `grad`
// itself: each element is read before it is written.
struct MomentumScalars {
  double beta = 0.95;
  bool ema = true;
  bool nesterov = true;
  uint32_t seed = 0;
};
void fused_momentum(const at::Tensor& grad, at::Tensor& buffer, at::Tensor& direction,
                    const MomentumScalars& k);
void fused_momentum(const at::Tensor& grad, QuantizedState& buffer, at::Tensor& direction,
                    const MomentumScalars& k);

// W ← W·decay − scale·U in one pass (U float32/float64, W any supported dtype). With `cautious`
// the decay applies only where U·W ≥ 0 (cautious weight decay). With `mask_grad` (the gradient,
// contiguous, W's dtype) entries where (W_old − W_new)·g ≤ 0 keep W_old (cautious optimizer).
void fused_apply_update(at::Tensor& param, const at::Tensor& update, double decay, double scale,
                        bool cautious = false, const at::Tensor* mask_grad = nullptr);

}  // namespace muon
