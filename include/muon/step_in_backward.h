// The step inside backward (docs/algorithms.md, "The step inside backward"): each parameter of an
// optimizer is updated as soon as its gradient of a backward pass is complete, and its gradient
// released, so that the model's whole set of gradients never exists at once — the memory of
// PyTorch's "fusing the optimizer step into the backward pass" and torchtune's optimizer_in_bwd,
// for muon-cpp's optimizers, with the bits of their ordinary step().
//
//   muon::StepInBackward in_backward(optimizer);  // hooks every parameter
//   for (...) { model->loss(x, y).backward(); }    // updates happen inside; no step(), no zero_grad()
//
// How: a hook after each parameter's gradient accumulator (the autograd node that adds a pass's
// gradient into .grad) updates that parameter and releases its gradient at once, so that no two
// parameters' gradients sit in .grad together — on every LibTorch (1.13 has no hook on the tensor after
// accumulation; the node's hook is the one DDP's reducer uses). The update may use the gradient
// as its scratch: it is spent. The optimizer's begin_parameter_steps() runs at the pass's first
// gradient and end_parameter_steps() at its end (muon/algorithm.h, ParameterSteps).
//
// With every = k (gradient accumulation) only every k-th backward pass updates; the passes
// between add their gradients into .grad as usual, and a parameter whose gradient came only in
// those passes is updated at the end of the k-th.
//
// Refused, naming the setting: an optimizer that is not one of muon-cpp's, a parameter that is
// not a leaf tensor, and at the first pass what the optimizer cannot do one parameter at a time
// (HybridOptimizer::begin_parameter_steps: global-norm clipping, the nonfinite policies skip and
// error, several ranks). An error inside a pass propagates out of backward(); parameters updated
// before it keep their update.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>

namespace muon {

class StepInBackward {
 public:
  // Hooks every parameter of `optimizer` that requires a gradient. `before` and `after` (optional)
  // run around each step's updates: at the step's first gradient, before the optimizer begins,
  // and at the pass's end, after it ends (the Python module pushes and reads param_groups there).
  // The optimizer must outlive this object. Its step() would update the parameters again: leave it
  // out while hooked (zero_grad() is harmless: the gradients are gone).
  explicit StepInBackward(torch::optim::Optimizer& optimizer, int64_t every = 1,
                          std::function<void()> before = nullptr,
                          std::function<void()> after = nullptr);
  ~StepInBackward();  // remove()
  StepInBackward(const StepInBackward&) = delete;
  StepInBackward& operator=(const StepInBackward&) = delete;

  // Takes the hooks off: backward passes leave their gradients in .grad again, for step().
  void remove();

  int64_t steps() const;     // steps done inside backward so far
  double seconds() const;    // time spent in them (updates, not the backward pass)

 private:
  struct Hooks;
  std::shared_ptr<Hooks> hooks_;
};

}  // namespace muon
