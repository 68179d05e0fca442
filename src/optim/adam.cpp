// The Adam-family optimizers: owners of groups and state that call adam_update().
#include "muon/adam.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "muon/compat.h"
#include "muon/error.h"
#include "muon/param_state.h"
#include "muon/rules.h"

namespace muon {
namespace {

std::vector<torch::optim::OptimizerParamGroup> one_group(std::vector<at::Tensor> params) {
  return {torch::optim::OptimizerParamGroup(std::move(params))};
}

}  // namespace

template <AdamRule R>
AdamFamily<R>::AdamFamily(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults)
    : Optimizer(groups, std::make_unique<Options>(defaults)) {
  compat::keep_group_options(param_groups_, 0, groups);
  check_adam_options(defaults);
  check_step();
}

template <AdamRule R>
void AdamFamily<R>::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  Optimizer::add_param_group(group);
  compat::keep_group_options(param_groups_, param_groups_.size() - 1, {group});
}

template <AdamRule R>
AdamFamily<R>::AdamFamily(std::vector<at::Tensor> params, Options defaults)
    : AdamFamily(one_group(std::move(params)), std::move(defaults)) {}

// Every group's options and every parameter, before any of them changes.
template <AdamRule R>
void AdamFamily<R>::check_step() const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& o = static_cast<const Options&>(param_groups_[g].options());
    check_adam_options(o);
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      check_adam_item(params[i], params[i].grad(), o,
                      detail::concat("parameter ", i, " of param group ", g));
    }
  }
}

template <AdamRule R>
at::Tensor AdamFamily<R>::step(LossClosure closure) {
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  check_step();
  int64_t index = 0;  // the tensor's position in the optimizer: part of its rounding seed
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<AdamItem> items;
    for (auto& p : group.params()) {
      const int64_t position = index++;
      if (!p.grad().defined()) continue;
      auto& state = adam_state(state_[compat::param_state_key(p)], p, o.state_dtype());
      items.push_back({p, p.grad(), &state, position});
    }
    adam_update(o, items);
  }
  return loss;
}

template <AdamRule R>
void AdamFamily<R>::save(torch::serialize::OutputArchive& archive) const {
  save_optimizer_state(*this, archive);
}

template <AdamRule R>
void AdamFamily<R>::load(torch::serialize::InputArchive& archive) {
  load_optimizer_state(*this, archive);
}

template class AdamFamily<AdamRule::adamw>;
template class AdamFamily<AdamRule::adam>;
template class AdamFamily<AdamRule::lamb>;

}  // namespace muon
