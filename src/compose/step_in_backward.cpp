// muon/step_in_backward.h: the hooks and the passes they see.
#include "muon/step_in_backward.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <chrono>
#include <string>
#include <vector>

#include "muon/algorithm.h"
#include "muon/compat.h"
#include "muon/error.h"

namespace muon {

// What the hooks share: they hold it (a hook may run after StepInBackward is gone, until removed).
struct StepInBackward::Hooks {
  Hooks(ParameterSteps& optimizer, int64_t every, std::function<void()> before,
        std::function<void()> after, std::vector<at::Tensor> params)
      : optimizer(optimizer),
        every(every),
        before(std::move(before)),
        after(std::move(after)),
        params(std::move(params)) {}

  ParameterSteps& optimizer;
  int64_t every;
  std::function<void()> before, after;
  std::vector<at::Tensor> params;  // the hooked parameters
  // Each parameter's gradient accumulator — the autograd node that adds a pass's gradient into
  // .grad — and its hook's key there. Held: a parameter keeps only a weak pointer to it, and our
  // hook lives as long as the node does.
  std::vector<compat::GradAccumulator> accumulators;
  std::vector<uintptr_t> keys;
  bool removed = false;

  int64_t passes = 0, steps = 0;
  double seconds = 0;
  bool in_pass = false, stepping = false;  // a pass has begun; it is a step's (the every-th)
  uint64_t pass_token = 0;                 // tells the current pass's end from a failed one's

  // Parameter i's gradient of this pass has just been added to its .grad. `self` points here.
  void accumulated(size_t i, const std::weak_ptr<Hooks>& self) {
    if (removed) return;
    try {
      if (!in_pass) begin_pass(self);
      if (stepping) timed([&] { step(i); });
    } catch (...) {  // the pass fails; the next one starts afresh
      in_pass = false;
      throw;
    }
  }

  void begin_pass(const std::weak_ptr<Hooks>& self) {
    in_pass = true;
    stepping = (passes + 1) % every == 0;
    const auto token = ++pass_token;
    if (stepping) {
      timed([&] {
        if (before) before();
        optimizer.begin_parameter_steps();
      });
    }
    torch::autograd::Engine::get_default_engine().queue_callback([self, token] {
      if (auto hooks = self.lock()) hooks->end_pass(token);
    });
  }

  void end_pass(uint64_t token) {
    if (removed || !in_pass || token != pass_token) return;
    in_pass = false;
    ++passes;
    if (!stepping) return;
    timed([&] {
      // Gradients of earlier passes only, or of a parameter whose accumulator autograd replaced
      // (its dtype or device changed under it): updated here, not lost.
      for (size_t i = 0; i < params.size(); ++i) step(i);
      optimizer.end_parameter_steps();
      if (after) after();
    });
    ++steps;
  }

  // The step spends the gradient (it may be the step's scratch) and releases it.
  void step(size_t i) {
    auto& p = params[i];
    if (!p.grad().defined()) return;
    optimizer.step_parameter(p);
    p.mutable_grad().reset();
  }

  template <class F>
  void timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

StepInBackward::StepInBackward(torch::optim::Optimizer& optimizer, int64_t every,
                               std::function<void()> before, std::function<void()> after) {
  auto* steps = dynamic_cast<ParameterSteps*>(&optimizer);
  check(steps != nullptr,
        "the step inside backward needs one of muon-cpp's optimizers (muon::Muon, muon::AdamW, "
        "muon::HybridOptimizer, ...), which can update one parameter at a time");
  check(every >= 1, "the step inside backward: every must be a whole number >= 1 (backward "
        "passes per step), got ", every);
  std::vector<at::Tensor> params;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      const auto& p = groups[g].params()[i];
      if (!p.requires_grad()) continue;
      check(p.is_leaf(), "the step inside backward: parameter ", i, " of param group ", g,
            " (shape ", p.sizes(), ") is not a leaf tensor but the result of an operation; its "
            "gradient is never stored in .grad to be updated from: optimize leaf tensors");
      params.push_back(p);
    }
  }
  hooks_ = std::make_shared<Hooks>(*steps, every, std::move(before), std::move(after),
                                   std::move(params));
  // The accumulators hold their hooks and the hooks a weak pointer: no cycle through them, and a
  // hook or a pass's end that runs after this object is gone does nothing. A hook after the
  // accumulator (not one on the gradient, before it) sees .grad complete, with every pass's
  // gradient added, and only the gradient being added is alive besides; nor does it run for
  // torch.autograd.grad(), which leaves .grad alone.
  std::weak_ptr<Hooks> weak = hooks_;
  for (size_t i = 0; i < hooks_->params.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(hooks_->params[i]);
    hooks_->keys.push_back(accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              if (auto hooks = weak.lock()) hooks->accumulated(i, weak);
              return outputs;
            })));
    hooks_->accumulators.push_back(std::move(accumulator));
  }
}

StepInBackward::~StepInBackward() {
  remove();
}

void StepInBackward::remove() {
  if (hooks_ == nullptr || hooks_->removed) return;
  hooks_->removed = true;
  for (size_t i = 0; i < hooks_->accumulators.size(); ++i) {
    hooks_->accumulators[i]->del_post_hook(hooks_->keys[i]);
  }
  hooks_->accumulators.clear();
}

int64_t StepInBackward::steps() const {
  return hooks_->steps;
}

double StepInBackward::seconds() const {
  return hooks_->seconds;
}

}  // namespace muon
