// muon::Muon — orthogonalized momentum for matrix parameters (SPEC §2), a torch::optim::Optimizer.
//
//   auto opt = muon::Muon(params, muon::MuonOptions(0.02).momentum(0.95).weight_decay(0.01));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <vector>

#include "muon/orthogonalize.h"

namespace muon {

// How the momentum buffer accumulates gradients.
enum class MomentumForm {
  ema,  // B ← β·B + (1−β)·g; Nesterov Q = lerp(g, B, β)  (Keller Jordan, torch.optim.Muon)
  sum,  // B ← β·B + g;       Nesterov Q = g + β·B        (Moonlight, Dion)
};

// Per-matrix learning-rate factor from the matrix shape.
enum class AdjustLr {
  original,         // √max(1, rows/cols)      (Keller Jordan)
  match_rms_adamw,  // 0.2·√max(rows, cols)    (Moonlight, Kimi K2: update RMS matches AdamW's)
  spectral,         // √(rows/cols)
  none,             // 1
};

// The factor `mode` gives a (rows × cols) matrix; rows = out features, cols = in features.
double shape_factor(AdjustLr mode, int64_t rows, int64_t cols);

std::string to_string(MomentumForm form);
std::string to_string(AdjustLr mode);

struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 0.02) : lr_(lr) {}  // NOLINT(google-explicit-constructor): libtorch style
  TORCH_ARG(double, lr) = 0.02;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(MomentumForm, momentum_form) = MomentumForm::ema;
  // Decoupled: W ← W·(1 − lr·weight_decay), with lr excluding the shape factor.
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(int64_t, ns_steps) = 5;
  TORCH_ARG(CoefficientTable, coefficients) = CoefficientTable::quintic();
  TORCH_ARG(AdjustLr, adjust_lr) = AdjustLr::original;
  // Orthogonalization dtype; unset picks per device (see OrthogonalizeOptions::dtype).
  TORCH_ARG(std::optional<at::ScalarType>, ns_dtype) = std::nullopt;
  // Momentum storage: at::kFloat (fp64 for fp64 parameters) or at::kBFloat16 (stochastic
  // rounding, CPU).
  TORCH_ARG(at::ScalarType, state_dtype) = at::kFloat;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(int64_t, step) = 0;
  // fp32 (fp64 for fp64 parameters) whatever the parameter dtype, or bf16 by state_dtype.
  TORCH_ARG(at::Tensor, momentum_buffer);
};

class Muon : public torch::optim::Optimizer {
 public:
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<at::Tensor> params, MuonOptions defaults = {});

  // Calls `closure` (if any) once with gradients enabled, then updates every parameter that has a
  // gradient. Everything is validated before the first parameter changes.
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  void check_before_step() const;
  MuonParamState& state_of(const at::Tensor& p, at::ScalarType state_dtype);
};

// Throws muon::Error unless `options` are valid (lr ≥ 0, momentum in [0, 1), weight_decay ≥ 0,
// ns_steps ≥ 1, a usable coefficient table, state_dtype Float or BFloat16).
void check_options(const MuonOptions& options);

// Throws muon::Error unless `p` can be optimized by Muon: a real floating-point matrix.
// `name` is used in the message.
void check_muon_param(const at::Tensor& p, const std::string& name = "parameter");

}  // namespace muon
