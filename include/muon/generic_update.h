// Device-generic forms of the kernels in muon/fused_update.h: the same updates written as ATen
// operations, so they run on any device LibTorch has (CUDA, MPS, XPU, ...) and, when asked, on
// CPU. Each operation rounds once, in the fused kernels' order, so on CPU these give the fused
// kernels' bits (bf16 state included: muon/stochastic_rounding.h's hash in integer ATen ops).
// Parameters may be strided; state tensors are contiguous, on the parameter's device.
//
// The Adam-family forms are multi-tensor: entries of one device, parameter dtype and state dtype
// share ATen's _foreach_* operations, a bounded number of elements at a time.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "muon/fused_update.h"

namespace muon {

// One tensor of an Adam-family update: what fused_adam_step takes.
struct AdamTensors {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
  AdamStepScalars scalars;
};

// fused_adam_step for every entry (their hyperparameters may differ only in step and seeds).
void generic_adam_step(const std::vector<AdamTensors>& entries);

// fused_lamb_step for every entry (fp32/fp64 state), each with its own trust ratio, computed on
// the device without a host round trip.
void generic_lamb_step(const std::vector<AdamTensors>& entries, double weight_decay);

// fused_lion_step; `exp_avg` may be bf16.
void generic_lion_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                       const LionStepScalars& k);

// fused_momentum: `direction` (the compute dtype) receives Q; `buffer` may be bf16.
void generic_momentum(const at::Tensor& grad, at::Tensor& buffer, at::Tensor& direction,
                      const MomentumScalars& k);

// fused_apply_update: W ← W·decay − scale·U (cautious decay and the cautious mask as there).
void generic_apply_update(at::Tensor& param, const at::Tensor& update, double decay, double scale,
                          bool cautious = false, const at::Tensor* mask_grad = nullptr);

}  // namespace muon
