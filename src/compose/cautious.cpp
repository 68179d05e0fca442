#include "muon/cautious.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <vector>

#include "muon/algorithm.h"

namespace muon {

Cautious::Cautious(torch::optim::Optimizer& base, CautiousOptions options)
    : base_(base), options_(options) {}

at::Tensor Cautious::step(const torch::optim::Optimizer::LossClosure& closure) {
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> params, before, grads;
  for (auto& group : base_.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      params.push_back(p);
      before.push_back(p.detach().clone());
      grads.push_back(p.grad().clone());  // the base may modify gradients in place
    }
  }
  base_.step();
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    const auto change = before[i] - p;  // d = W_old − W_new
    const auto keep = (change * grads[i]) > 0;
    if (!options_.rescale) {
      p.copy_(at::where(keep, p.detach(), before[i]));
      continue;
    }
    const double kept = keep.sum().item<double>();
    const double scale = kept > 0 ? static_cast<double>(keep.numel()) / kept : 0.0;
    p.copy_(before[i] - change * keep.to(change.scalar_type()) * scale);
  }
  return loss;
}

}  // namespace muon
