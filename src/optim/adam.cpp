#include "muon/adam.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <string>

#include "in_place.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/generic_update.h"
#include "muon/stochastic_rounding.h"

namespace muon {
namespace {

enum class Rule { adamw, adam, lamb };

const char* name_of(Rule rule) {
  switch (rule) {
    case Rule::adamw:
      return "AdamW";
    case Rule::adam:
      return "Adam";
    case Rule::lamb:
      return "Lamb";
  }
  return "?";
}

// The fields every member of the family reads, from whichever options type a group holds.
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool nesterov;
  at::ScalarType state_dtype;
  bool cautious;
  std::optional<bool> fused;
};

template <class Options>
Hyper hyper_of(const Options& o) {
  bool nesterov = false;
  bool cautious = false;
  if constexpr (!std::is_same_v<Options, LambOptions>) {
    nesterov = o.nesterov();
    cautious = o.cautious();
  }
  return {o.lr(),
          std::get<0>(o.betas()),
          std::get<1>(o.betas()),
          o.eps(),
          o.weight_decay(),
          nesterov,
          o.state_dtype(),
          cautious,
          o.fused()};
}

void check_hyper(const Hyper& h, Rule rule) {
  const char* name = name_of(rule);
  check(std::isfinite(h.lr) && h.lr >= 0, name, ": lr must be >= 0, got ", h.lr);
  check(h.beta1 >= 0 && h.beta1 < 1, name, ": betas[0] must be in [0, 1), got ", h.beta1);
  check(h.beta2 >= 0 && h.beta2 < 1, name, ": betas[1] must be in [0, 1), got ", h.beta2);
  check(std::isfinite(h.eps) && h.eps > 0, name, ": eps must be > 0, got ", h.eps);
  check(std::isfinite(h.weight_decay) && h.weight_decay >= 0, name,
        ": weight_decay must be >= 0, got ", h.weight_decay);
  if (rule == Rule::lamb) {
    check(h.state_dtype == at::kFloat, "Lamb: state_dtype ", h.state_dtype,
          " is not supported; LAMB keeps float32 state (bfloat16 state is available for Adam, "
          "AdamW and Muon)");
  } else {
    check(h.state_dtype == at::kFloat || h.state_dtype == at::kBFloat16, name, ": state_dtype ",
          h.state_dtype, " is not supported; use Float (full precision) or BFloat16");
  }
}

void check_param(const at::Tensor& p, const Hyper& h, const char* name, size_t group,
                 size_t index) {
  const auto where = detail::concat("parameter ", index, " of param group ", group);
  check(!p.is_complex(), name, ": ", where, " is complex (", p.scalar_type(),
        "); the Adam family here supports real floating-point parameters only");
  check(p.is_floating_point(), name, ": ", where, " has dtype ", p.scalar_type(),
        "; expected float32, float64, bfloat16 or float16");
  detail::check_kernels(h.fused, p, name, where);
  if (p.grad().defined()) {
    check(!p.grad().is_sparse(), name, " does not support sparse gradients (", where, ")");
    check(p.grad().sizes() == p.sizes(), name, ": ", where, " has a gradient of shape ",
          p.grad().sizes(), " for a parameter of shape ", p.sizes());
  }
}

// Every group's options and every parameter, before any of them changes.
template <class Options>
void check_all(const torch::optim::Optimizer& opt, Rule rule) {
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto h = hyper_of(static_cast<const Options&>(groups[g].options()));
    check_hyper(h, rule);
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) check_param(params[i], h, name_of(rule), g, i);
  }
}

AdamParamState& state_of(torch::optim::Optimizer& opt, const at::Tensor& p,
                         at::ScalarType state_dtype) {
  auto& slot = opt.state()[compat::param_state_key(p)];
  if (!slot) {
    const auto dtype = state_dtype == at::kBFloat16     ? at::kBFloat16
                       : p.scalar_type() == at::kDouble ? at::kDouble
                                                        : at::kFloat;
    auto state = std::make_unique<AdamParamState>();
    state->exp_avg(at::zeros(p.sizes(), p.options().dtype(dtype)));  // contiguous, whatever p is
    state->exp_avg_sq(at::zeros(p.sizes(), p.options().dtype(dtype)));
    slot = std::move(state);
  }
  return static_cast<AdamParamState&>(*slot);
}

template <class Options>
at::Tensor family_step(torch::optim::Optimizer& opt,
                       const torch::optim::Optimizer::LossClosure& closure, Rule rule) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_all<Options>(opt, rule);
  int64_t index = 0;  // the tensor's position in the optimizer: part of its rounding seed
  for (auto& group : opt.param_groups()) {
    const auto h = hyper_of(static_cast<const Options&>(group.options()));
    std::vector<AdamTensors> generic;  // parameters for the device-generic form, in one call
    for (auto& p : group.params()) {
      const int64_t tensor_index = index++;
      if (!p.grad().defined()) continue;
      auto& state = state_of(opt, p, h.state_dtype);
      const uint32_t salt = sr::tensor_salt(sr::step_seed(state.step()), tensor_index);
      AdamStepScalars s;
      s.lr = h.lr;
      s.beta1 = h.beta1;
      s.beta2 = h.beta2;
      s.eps = h.eps;
      s.decoupled_weight_decay = rule == Rule::adamw ? h.weight_decay : 0.0;
      s.l2_weight_decay = rule == Rule::adam ? h.weight_decay : 0.0;
      s.nesterov = h.nesterov;
      s.cautious = h.cautious;
      s.step = state.step() + 1;
      s.seed_exp_avg = salt;
      s.seed_exp_avg_sq = sr::second_moment_salt(salt);
      state.step(s.step);
      if (!detail::runs_fused(h.fused, p)) {
        generic.push_back({p, p.grad(), state.exp_avg(), state.exp_avg_sq(), s});
        continue;
      }
      const auto grad = p.grad().contiguous();
      detail::update_in_place(p, [&](at::Tensor& dense) {
        if (rule == Rule::lamb) {
          fused_lamb_step(dense, grad, state.exp_avg(), state.exp_avg_sq(), s, h.weight_decay);
        } else {
          fused_adam_step(dense, grad, state.exp_avg(), state.exp_avg_sq(), s);
        }
      });
    }
    if (rule == Rule::lamb) {
      generic_lamb_step(generic, h.weight_decay);
    } else {
      generic_adam_step(generic);
    }
  }
  return loss;
}

template <class Options>
void check_construction(const torch::optim::Optimizer& opt, const Options& defaults, Rule rule) {
  check_hyper(hyper_of(defaults), rule);
  check_all<Options>(opt, rule);
}

std::vector<torch::optim::OptimizerParamGroup> one_group(std::vector<at::Tensor> params) {
  return {torch::optim::OptimizerParamGroup(std::move(params))};
}

}  // namespace

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, AdamWOptions defaults)
    : Optimizer(std::move(groups), std::make_unique<AdamWOptions>(defaults)) {
  check_construction(*this, defaults, Rule::adamw);
}
AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions defaults)
    : AdamW(one_group(std::move(params)), std::move(defaults)) {}
void AdamW::check_step() const {
  check_all<AdamWOptions>(*this, Rule::adamw);
}
at::Tensor AdamW::step(LossClosure closure) {
  return family_step<AdamWOptions>(*this, closure, Rule::adamw);
}

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> groups, AdamOptions defaults)
    : Optimizer(std::move(groups), std::make_unique<AdamOptions>(defaults)) {
  check_construction(*this, defaults, Rule::adam);
}
Adam::Adam(std::vector<at::Tensor> params, AdamOptions defaults)
    : Adam(one_group(std::move(params)), std::move(defaults)) {}
void Adam::check_step() const {
  check_all<AdamOptions>(*this, Rule::adam);
}
at::Tensor Adam::step(LossClosure closure) {
  return family_step<AdamOptions>(*this, closure, Rule::adam);
}

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults)
    : Optimizer(std::move(groups), std::make_unique<LambOptions>(defaults)) {
  check_construction(*this, defaults, Rule::lamb);
}
Lamb::Lamb(std::vector<at::Tensor> params, LambOptions defaults)
    : Lamb(one_group(std::move(params)), std::move(defaults)) {}
void Lamb::check_step() const {
  check_all<LambOptions>(*this, Rule::lamb);
}
at::Tensor Lamb::step(LossClosure closure) {
  return family_step<LambOptions>(*this, closure, Rule::lamb);
}

}  // namespace muon
