// The cautious wrapper (docs/design.md §Cautious masking; Liang et al., "Cautious Optimizers",
// arXiv 2411.16085): after any optimizer's step, keep each entry's change only where it agrees in
// sign with the gradient.
//
//   torch::optim::SGD sgd(params, 0.1);
//   muon::Cautious cautious(sgd);
//   cautious.step();   // d = W_old − W_new; keep where d·g > 0, else restore W_old
//
// It adds no state: checkpoints and zero_grad are the base optimizer's. muon::Muon, muon::AdamW
// and muon::Adam do the same inside their fused pass with `.cautious(true)`, without a snapshot.
#pragma once

#include <torch/optim/optimizer.h>

namespace muon {

struct CautiousOptions {
  // The paper's rescaling: the kept change × numel / (number kept), per tensor.
  bool rescale = false;
};

class Cautious {
 public:
  explicit Cautious(torch::optim::Optimizer& base, CautiousOptions options = {});

  // Calls `closure` (if any) once, snapshots parameters, steps the base optimizer, then masks.
  // Decoupled decay is part of the observed change.
  at::Tensor step(const torch::optim::Optimizer::LossClosure& closure = nullptr);
  void zero_grad() { base_.zero_grad(); }
  torch::optim::Optimizer& base() { return base_; }

 private:
  torch::optim::Optimizer& base_;
  CautiousOptions options_;
};

}  // namespace muon
