// The definitions of MatrixOptimizer (muon/algorithm.h), included by each matrices rule's source,
// which instantiates its owner: `template class MatrixOptimizer<MuonOptions>;`.
#pragma once

#include <torch/csrc/autograd/grad_mode.h>

#include <string>

#include "muon/algorithms.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/param_state.h"

namespace muon {

namespace detail {

// The algorithm's name as its messages write it: "Muon", "Dion".
template <class Options>
std::string title() {
  return algorithm_title(Algorithm<Options>::name);
}

inline std::string param_label(size_t group, size_t index) {
  return concat("parameter ", index, " of param group ", group);
}

}  // namespace detail

template <class Options>
MatrixOptimizer<Options>::MatrixOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults)
    : Optimizer(param_groups, std::make_unique<Options>(defaults)) {
  compat::keep_group_options(param_groups_, 0, param_groups);
  Algorithm<Options>::validate(defaults);
  const auto who = detail::title<Options>();
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    Algorithm<Options>::validate(static_cast<const Options&>(param_groups_[gi].options()));
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      check_muon_param(params[i], detail::param_label(gi, i), who.c_str());
    }
  }
}

template <class Options>
MatrixOptimizer<Options>::MatrixOptimizer(std::vector<at::Tensor> params, Options defaults)
    : MatrixOptimizer(std::vector<torch::optim::OptimizerParamGroup>{
                          torch::optim::OptimizerParamGroup(std::move(params))},
                      std::move(defaults)) {}

template <class Options>
void MatrixOptimizer<Options>::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  Optimizer::add_param_group(group);
  compat::keep_group_options(param_groups_, param_groups_.size() - 1, {group});
}

template <class Options>
void MatrixOptimizer<Options>::set_matrix_view(const at::Tensor& param,
                                               std::vector<int64_t> view) {
  const auto who = detail::title<Options>() + "::set_matrix_view";
  bool known = false;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) known = known || p.is_same(param);
  }
  check(known, who, ": the tensor of shape ", param.sizes(), " is not a parameter of this optimizer");
  check_matrix_view(param, view, who);
  check(state_.count(compat::param_state_key(param)) == 0 || matrix_view(param) == view, who,
        ": the parameter already has state for view ", at::IntArrayRef(matrix_view(param)),
        "; set views before the first step");
  views_[param.unsafeGetTensorImpl()] = std::move(view);
}

template <class Options>
std::vector<int64_t> MatrixOptimizer<Options>::matrix_view(const at::Tensor& param) const {
  const auto it = views_.find(param.unsafeGetTensorImpl());
  return it != views_.end() ? it->second : param.sizes().vec();
}

template <class Options>
void MatrixOptimizer<Options>::check_step() const {
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& o = static_cast<const Options&>(param_groups_[gi].options());
    Algorithm<Options>::validate(o);
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (p.grad().defined()) {
        Algorithm<Options>::check_item(p, p.grad(), o, matrix_view(p), detail::param_label(gi, i));
      }
    }
  }
}

template <class Options>
at::Tensor MatrixOptimizer<Options>::step(LossClosure closure) {
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  check_step();
  std::vector<ItemOf<Options>> items;
  int64_t index = 0;  // the tensor's position in the optimizer: part of its seeds
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      const int64_t position = index++;
      if (!p.grad().defined()) continue;
      auto view = matrix_view(p);
      auto& state = make_state(state_[compat::param_state_key(p)], p, o, view);
      items.push_back({p, p.grad(), &state, &o, std::move(view), position});
    }
  }
  update_matrices<Options>(items, scratch_);
  return loss;
}

template <class Options>
void MatrixOptimizer<Options>::begin_parameter_steps() {
  places_ = checked_places(param_groups_);
}

template <class Options>
void MatrixOptimizer<Options>::step_parameter(const at::Tensor& param) {
  at::NoGradGuard no_grad;
  const auto& place = place_of(places_, param, Algorithm<Options>::name);
  auto& group = param_groups_[place.group];
  const auto& o = static_cast<const Options&>(group.options());
  auto& p = group.params()[place.index];
  auto view = matrix_view(p);
  Algorithm<Options>::check_item(p, p.grad(), o, view,
                                 place.label());
  auto& state = make_state(state_[compat::param_state_key(p)], p, o, view);
  update_matrices<Options>(
      {{p, p.grad(), &state, &o, std::move(view), place.position, /*grad_spent=*/true}}, scratch_);
}

template <class Options>
void MatrixOptimizer<Options>::save(torch::serialize::OutputArchive& archive) const {
  save_optimizer_state(*this, archive);
}

template <class Options>
void MatrixOptimizer<Options>::load(torch::serialize::InputArchive& archive) {
  load_optimizer_state(*this, archive);
}

}  // namespace muon
