// muon::HybridOptimizer — Muon for the matrices routing picks, AdamW for every other trainable
// parameter, stepped together (SPEC §10, first version).
#pragma once

#include <memory>
#include <vector>

#include "muon/adam.h"
#include "muon/muon.h"
#include "muon/routing.h"

namespace muon {

class HybridOptimizer {
 public:
  // Frozen parameters go to neither optimizer. A branch with no parameters is not created.
  HybridOptimizer(const std::vector<RoutedParameter>& routes, MuonOptions muon_options,
                  AdamWOptions adamw_options);

  // Calls `closure` (if any) exactly once, then steps Muon and AdamW. Gradients are checked for
  // both branches before either changes anything.
  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr);
  void zero_grad();

  // Sets every group's lr to its construction-time lr × multiplier (drives schedules).
  void set_lr_multiplier(double multiplier);

  Muon* muon() { return muon_.get(); }                   // null without Muon parameters
  AdamW* adamw() { return adamw_.get(); }  // null without AdamW parameters

 private:
  std::vector<torch::optim::Optimizer*> branches();

  std::unique_ptr<Muon> muon_;
  std::unique_ptr<AdamW> adamw_;
  std::vector<std::vector<double>> base_lrs_;  // per branch, per group
};

}  // namespace muon
