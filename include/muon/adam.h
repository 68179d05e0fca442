// The Adam family as torch::optim::Optimizers with fused single-pass CPU steps and a
// device-generic ATen form for every other device (docs/algorithms.md):
// muon::AdamW (decoupled decay, exactly torch.optim.AdamW), muon::Adam (coupled L2 decay, torch
// style), NAdam through nesterov(true) on either (optax's form), and muon::Lamb.
// state_dtype(at::kBFloat16) stores both moments in bf16 with stochastic rounding.
//
//   muon::AdamW opt(params, muon::AdamWOptions(3e-4).betas({0.9, 0.95}).weight_decay(0.1)
//                               .state_dtype(at::kBFloat16));
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>
#include <tuple>
#include <vector>

namespace muon {

using Betas = std::tuple<double, double>;

// Options shared by the Adam family's update (see fused_adam_step for the formulas).
#define MUON_ADAM_FAMILY_OPTIONS(Options, default_weight_decay)                                     \
  Options(double lr = 1e-3) : lr_(lr) {} /* NOLINT: implicit, libtorch style */                     \
  TORCH_ARG(double, lr) = 1e-3;                                                                     \
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);                                            \
  TORCH_ARG(double, eps) = 1e-8;                                                                    \
  TORCH_ARG(double, weight_decay) = default_weight_decay;                                           \
  /* NAdam (optax): β1·m/(1−β1ᵗ⁺¹) + (1−β1)·g/(1−β1ᵗ) replaces m/(1−β1ᵗ) */ \
  TORCH_ARG(bool, nesterov) = false;                                                                \
  /* at::kFloat (full precision; fp64 for fp64 parameters) or at::kBFloat16 */                      \
  TORCH_ARG(at::ScalarType, state_dtype) = at::kFloat;                                              \
  /* cautious optimizer: keep entries where (W_old − W_new)·g > 0, inside the pass */            \
  TORCH_ARG(bool, cautious) = false;                                                                \
  /* kernels: unset = fused on CPU tensors, the ATen form elsewhere; true / false force one */      \
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;                                             \
                                                                                                    \
 public:                                                                                            \
  double get_lr() const override {                                                                  \
    return lr();                                                                                    \
  }                                                                                                 \
  void set_lr(const double lr) override {                                                           \
    this->lr(lr);                                                                                   \
  }

// AdamW: W ← W·(1 − lr·weight_decay), then the Adam step. Default weight decay 1e-2 (torch's).
struct AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  MUON_ADAM_FAMILY_OPTIONS(AdamWOptions, 1e-2)
};

// Adam: g ← g + weight_decay·W before the moments (coupled L2, torch.optim.Adam). Default 0.
struct AdamOptions : public torch::optim::OptimizerCloneableOptions<AdamOptions> {
  MUON_ADAM_FAMILY_OPTIONS(AdamOptions, 0.0)
};

#undef MUON_ADAM_FAMILY_OPTIONS

// LAMB: the Adam direction plus weight_decay·W, scaled by the trust ratio ‖W‖/‖r‖.
struct LambOptions : public torch::optim::OptimizerCloneableOptions<LambOptions> {
  LambOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, libtorch style
  TORCH_ARG(double, lr) = 1e-3;
  TORCH_ARG(Betas, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0.0;
  // Only at::kFloat: an error names the optimizers that store bf16 state.
  TORCH_ARG(at::ScalarType, state_dtype) = at::kFloat;
  // Kernels: unset = fused on CPU tensors, the device-generic ATen form elsewhere.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdamParamState : public torch::optim::OptimizerCloneableParamState<AdamParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(at::Tensor, exp_avg);     // state_dtype
  TORCH_ARG(at::Tensor, exp_avg_sq);  // state_dtype
};

class AdamW : public torch::optim::Optimizer {
 public:
  explicit AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, AdamWOptions defaults = {});
  explicit AdamW(std::vector<at::Tensor> params, AdamWOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;
  // Throws muon::Error for whatever would stop step(), changing nothing.
  void check_step() const;
};

class Adam : public torch::optim::Optimizer {
 public:
  explicit Adam(std::vector<torch::optim::OptimizerParamGroup> groups, AdamOptions defaults = {});
  explicit Adam(std::vector<at::Tensor> params, AdamOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;
  // Throws muon::Error for whatever would stop step(), changing nothing.
  void check_step() const;
};

class Lamb : public torch::optim::Optimizer {
 public:
  explicit Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults = {});
  explicit Lamb(std::vector<at::Tensor> params, LambOptions defaults = {});
  at::Tensor step(LossClosure closure = nullptr) override;
  // Throws muon::Error for whatever would stop step(), changing nothing.
  void check_step() const;
};

}  // namespace muon
