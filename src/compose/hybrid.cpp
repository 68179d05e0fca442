#include "muon/hybrid.h"

#include <torch/csrc/autograd/grad_mode.h>

#include "muon/error.h"

namespace muon {

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 MuonOptions muon_options,
                                 AdamWOptions adamw_options) {
  const auto matrices = tensors_with_role(routes, Role::muon);
  const auto others = tensors_with_role(routes, Role::adamw);
  if (!matrices.empty()) muon_ = std::make_unique<Muon>(matrices, muon_options);
  if (!others.empty()) adamw_ = std::make_unique<AdamW>(others, adamw_options);
  for (auto* branch : branches()) {
    std::vector<double> lrs;
    for (const auto& group : branch->param_groups()) lrs.push_back(group.options().get_lr());
    base_lrs_.push_back(std::move(lrs));
  }
}

std::vector<torch::optim::Optimizer*> HybridOptimizer::branches() {
  std::vector<torch::optim::Optimizer*> out;
  if (muon_) out.push_back(muon_.get());
  if (adamw_) out.push_back(adamw_.get());
  return out;
}

at::Tensor HybridOptimizer::step(torch::optim::Optimizer::LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Each branch checks its own parameters before changing any; a sparse gradient is the one
  // failure AdamW could meet after Muon stepped, so rule it out first: no half-done step.
  for (auto* branch : branches()) {
    for (const auto& group : branch->param_groups()) {
      for (const auto& p : group.params()) {
        check(!(p.grad().defined() && p.grad().is_sparse()),
              "HybridOptimizer: sparse gradients are not supported (parameter of shape ",
              p.sizes(), ")");
      }
    }
  }
  for (auto* branch : branches()) branch->step();
  return loss;
}

void HybridOptimizer::zero_grad() {
  for (auto* branch : branches()) branch->zero_grad();
}

void HybridOptimizer::set_lr_multiplier(double multiplier) {
  const auto all = branches();
  for (size_t b = 0; b < all.size(); ++b) {
    auto& groups = all[b]->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].options().set_lr(base_lrs_[b][g] * multiplier);
    }
  }
}

}  // namespace muon
