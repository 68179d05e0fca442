#include "muon/muon.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "muon/compat.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/stochastic_rounding.h"
#include "in_place.h"

namespace muon {

double shape_factor(AdjustLr mode, int64_t rows, int64_t cols) {
  const auto r = static_cast<double>(rows);
  const auto c = static_cast<double>(cols);
  switch (mode) {
    case AdjustLr::original:
      return std::sqrt(std::max(1.0, r / c));
    case AdjustLr::match_rms_adamw:
      return 0.2 * std::sqrt(std::max(r, c));
    case AdjustLr::spectral:
      return std::sqrt(r / c);
    case AdjustLr::none:
      return 1.0;
  }
  throw Error("unknown adjust_lr mode");
}

std::string to_string(MomentumForm form) {
  return form == MomentumForm::ema ? "ema" : "sum";
}

std::string to_string(AdjustLr mode) {
  switch (mode) {
    case AdjustLr::original:
      return "original";
    case AdjustLr::match_rms_adamw:
      return "match_rms_adamw";
    case AdjustLr::spectral:
      return "spectral";
    case AdjustLr::none:
      return "none";
  }
  return "?";
}

void check_options(const MuonOptions& o) {
  check(std::isfinite(o.lr()) && o.lr() >= 0, "Muon: lr must be >= 0, got ", o.lr());
  check(o.momentum() >= 0 && o.momentum() < 1, "Muon: momentum must be in [0, 1), got ",
        o.momentum());
  check(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0,
        "Muon: weight_decay must be >= 0, got ", o.weight_decay());
  check(o.state_dtype() == at::kFloat || o.state_dtype() == at::kBFloat16, "Muon: state_dtype ",
        o.state_dtype(), " is not supported; use Float (full precision) or BFloat16");
  check_options(OrthogonalizeOptions()
                    .steps(o.ns_steps())
                    .coefficients(o.coefficients())
                    .dtype(o.ns_dtype()));
}

void check_muon_param(const at::Tensor& p, const std::string& name) {
  check(!p.is_complex(), "Muon: ", name, " is complex (", p.scalar_type(),
        "); Muon supports real floating-point matrices only");
  check(p.is_floating_point(), "Muon: ", name, " has dtype ", p.scalar_type(),
        "; Muon needs a floating-point matrix (float32, float64, bfloat16 or float16)");
  check(p.dim() == 2, "Muon: ", name, " has shape ", p.sizes(),
        "; Muon optimizes 2-D matrices (out, in) only — give vectors, scalars and other ranks to "
        "AdamW");
}

namespace {

std::string param_label(size_t group, size_t index) {
  return detail::concat("parameter ", index, " of param group ", group);
}

// Momentum accumulates in fp32 whatever the parameter dtype (fp64 stays fp64).
at::ScalarType state_dtype(const at::Tensor& p) {
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Updates the momentum buffer and returns the direction Q to orthogonalize. On CPU one fused pass
// (any buffer dtype); elsewhere the same formulas as ATen ops on a full-precision buffer.
at::Tensor momentum_direction(const at::Tensor& grad, at::Tensor& B, const MuonOptions& o,
                              uint32_t seed) {
  const double beta = o.momentum();
  const bool ema = o.momentum_form() == MomentumForm::ema;
  if (grad.device().is_cpu()) {
    auto Q = at::empty(grad.sizes(), grad.options().dtype(state_dtype(grad)));
    fused_momentum(grad.contiguous(), B, Q, {beta, ema, o.nesterov(), seed});
    return Q;
  }
  const auto g = grad.to(B.scalar_type());
  if (ema) {
    B.mul_(beta).add_(g, 1.0 - beta);
    return o.nesterov() ? at::add(g.mul(1.0 - beta), B, beta) : B;
  }
  B.mul_(beta).add_(g);
  return o.nesterov() ? at::add(g, B, beta) : B;
}

// W ← W·(1 − lr·λ) − lr·factor·U, computed in U's dtype and rounded once into W.
void apply_update(at::Tensor& p, const at::Tensor& U, double lr, double factor,
                  double weight_decay) {
  const double decay = 1.0 - lr * weight_decay;
  if (p.device().is_cpu()) {
    detail::update_in_place(
        p, [&](at::Tensor& dense) { fused_apply_update(dense, U.contiguous(), decay, lr * factor); });
    return;
  }
  auto w = p.to(U.scalar_type());
  w.mul_(decay).add_(U, -lr * factor);
  p.copy_(w);
}

}  // namespace

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<MuonOptions>(defaults)) {
  check_options(defaults);
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    check_options(static_cast<const MuonOptions&>(param_groups_[gi].options()));
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) check_muon_param(params[i], param_label(gi, i));
  }
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

void Muon::check_before_step() const {
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    check_options(static_cast<const MuonOptions&>(param_groups_[gi].options()));
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (!p.grad().defined()) continue;
      check(!p.grad().is_sparse(), "Muon does not support sparse gradients (", param_label(gi, i),
            ")");
      check_muon_param(p, param_label(gi, i));
      const auto& o = static_cast<const MuonOptions&>(param_groups_[gi].options());
      check(p.device().is_cpu() || o.state_dtype() == at::kFloat, "Muon: ", param_label(gi, i),
            " is on ", p.device(), "; bfloat16 momentum is implemented for CPU tensors only");
    }
  }
}

MuonParamState& Muon::state_of(const at::Tensor& p, at::ScalarType storage) {
  auto& slot = state_[compat::param_state_key(p)];
  if (!slot) {
    auto state = std::make_unique<MuonParamState>();
    const auto dtype = storage == at::kBFloat16 ? at::kBFloat16 : state_dtype(p);
    state->momentum_buffer(at::zeros(p.sizes(), p.options().dtype(dtype)));
    slot = std::move(state);
  }
  return static_cast<MuonParamState&>(*slot);
}

at::Tensor Muon::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_before_step();
  int64_t index = 0;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const MuonOptions&>(group.options());
    const auto ns = OrthogonalizeOptions()
                        .steps(o.ns_steps())
                        .coefficients(o.coefficients())
                        .dtype(o.ns_dtype());
    for (auto& p : group.params()) {
      const int64_t tensor_index = index++;  // part of the momentum's rounding seed
      if (!p.grad().defined()) continue;
      auto& state = state_of(p, o.state_dtype());
      const uint32_t seed = sr::tensor_salt(sr::step_seed(state.step()), tensor_index);
      const auto Q = momentum_direction(p.grad(), state.momentum_buffer(), o, seed);
      apply_update(p, orthogonalize(Q, ns), o.lr(),
                   shape_factor(o.adjust_lr(), p.size(0), p.size(1)), o.weight_decay());
      state.step(state.step() + 1);
    }
  }
  return loss;
}

}  // namespace muon
