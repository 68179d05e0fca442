// The definitions of ElementwiseOptimizer (muon/algorithm.h), included by each elementwise rule's
// source, which instantiates its owner: `template class ElementwiseOptimizer<AdamWOptions>;`.
#pragma once

#include <torch/csrc/autograd/grad_mode.h>

#include "muon/algorithm.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {

template <class Options>
ElementwiseOptimizer<Options>::ElementwiseOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults)
    : Optimizer(groups, std::make_unique<Options>(defaults)) {
  compat::keep_group_options(param_groups_, 0, groups);
  Algorithm<Options>::validate(defaults);
  check_step();
}

template <class Options>
ElementwiseOptimizer<Options>::ElementwiseOptimizer(std::vector<at::Tensor> params,
                                                    Options defaults)
    : ElementwiseOptimizer(
          std::vector<torch::optim::OptimizerParamGroup>{
              torch::optim::OptimizerParamGroup(std::move(params))},
          std::move(defaults)) {}

template <class Options>
void ElementwiseOptimizer<Options>::add_param_group(
    const torch::optim::OptimizerParamGroup& group) {
  Optimizer::add_param_group(group);
  compat::keep_group_options(param_groups_, param_groups_.size() - 1, {group});
}

// Every group's options and every parameter, before any of them changes.
template <class Options>
void ElementwiseOptimizer<Options>::check_step() const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& o = static_cast<const Options&>(param_groups_[g].options());
    Algorithm<Options>::validate(o);
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      Algorithm<Options>::check_item(params[i], params[i].grad(), o,
                                     detail::concat("parameter ", i, " of param group ", g));
    }
  }
}

template <class Options>
at::Tensor ElementwiseOptimizer<Options>::step(LossClosure closure) {
  using Rule = Algorithm<Options>;
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  check_step();
  int64_t index = 0;  // the tensor's position in the optimizer: part of its rounding seed
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    std::vector<ItemOf<Options>> items;
    for (auto& p : group.params()) {
      const int64_t position = index++;
      if (!p.grad().defined()) continue;
      auto& state = make_state(state_[compat::param_state_key(p)], p, o, p.sizes());
      items.push_back({p, p.grad(), &state, position});
    }
    Rule::update(o, items);
  }
  return loss;
}

template <class Options>
void ElementwiseOptimizer<Options>::begin_parameter_steps() {
  places_ = checked_places(param_groups_);
}

template <class Options>
void ElementwiseOptimizer<Options>::step_parameter(const at::Tensor& param) {
  at::NoGradGuard no_grad;
  const auto& place = place_of(places_, param, Algorithm<Options>::name);
  auto& group = param_groups_[place.group];
  const auto& o = static_cast<const Options&>(group.options());
  auto& p = group.params()[place.index];
  Algorithm<Options>::check_item(p, p.grad(), o, place.label());
  auto& state = make_state(state_[compat::param_state_key(p)], p, o, p.sizes());
  Algorithm<Options>::update(o, {{p, p.grad(), &state, place.position}});
}

template <class Options>
void ElementwiseOptimizer<Options>::save(torch::serialize::OutputArchive& archive) const {
  save_optimizer_state(*this, archive);
}

template <class Options>
void ElementwiseOptimizer<Options>::load(torch::serialize::InputArchive& archive) {
  load_optimizer_state(*this, archive);
}

}  // namespace muon
