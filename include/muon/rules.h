// The update rules are their registry entries' update() (muon/algorithm.h): Muon's (with NorMuon
// and Muon+) and Dion's over lists of (parameter, gradient, state, options, view), the elementwise
// rules (the Adam family, LAMB, Lion) over one group's (parameter, gradient, state). They hold no groups
// and no torch::optim machinery; the optimizers (muon::Muon, muon::AdamW, ..., the hybrid) own
// groups and state and hand the rules what to update — on N ranks, only what a rank owns.
//
// Each rule runs the fused CPU kernels (muon/fused_update.h) on CPU tensors and their
// device-generic ATen form (muon/generic_update.h) elsewhere, as the options' `fused` says.
// Rules read the gradient they are given, never `.grad`. The formulas are in docs/design.md.
//
// The cautious mask (option `cautious`) is the same rule as muon::Cautious without rescaling,
// applied inside the update pass.
#pragma once

#include <ATen/core/grad_mode.h>

#include <memory>
#include <string>
#include <vector>

#include "muon/adam.h"
#include "muon/dion.h"
#include "muon/dtypes.h"
#include "muon/muon.h"

namespace muon {

// ---- Muon ------------------------------------------------------------------------------------

// The orthogonalization settings of `options` for a rows × cols matrix: gram_coefficients (one
// iteration per row) when set and the matrix is not square, coefficients and ns_steps otherwise
// (torch.optim.Muon's Gram schedule); fused: false makes `automatic` mean plain.
OrthogonalizeOptions orthogonalize_options(const MuonOptions& options, int64_t rows, int64_t cols);

// ---- For the optimizers that own groups and state -------------------------------------------

// Runs a step's closure (if any) once with gradients enabled, as torch.optim does, and returns
// its loss (undefined without a closure).
inline at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

// The name a rule's messages use: "AdamW", "Adam" or "Lamb".
const char* rule_name(AdamRule rule);

}  // namespace muon
