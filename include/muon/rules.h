// The Muon update rule (with NorMuon, Muon+ and Dion) as a function of an explicit list of
// (parameter, gradient, state, options); the elementwise rules (the Adam family, LAMB, ...) are
// their registry entries' update() (muon/algorithm.h). They hold no groups
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
#include "muon/dtypes.h"
#include "muon/muon.h"

namespace muon {

// ---- Muon -------------------------------------------------------------------------------------

// One parameter of a Muon update.
struct MuonItem {
  at::Tensor param;       // updated in place
  at::Tensor grad;        // the parameter's shape
  MuonParamState* state;  // from muon_state()
  const MuonOptions* options;
  std::vector<int64_t> view;  // the (batch..., rows, cols) view it is orthogonalized in
  int64_t index;              // its position among the owner's Muon parameters: seeds bf16 rounding
};

// Throws muon::Error, naming `where` (e.g. "parameter 2 of param group 0"), unless `param` with
// gradient `grad` can take a Muon update under `options` in `view` — before anything changes.
void check_muon_item(const at::Tensor& param, const at::Tensor& grad, const MuonOptions& options,
                     const std::vector<int64_t>& view, const std::string& where);

// The state in `slot`, created (zeros) on first use; NorMuon's statistic is added when NorMuon is
// switched on later.
MuonParamState& muon_state(std::unique_ptr<torch::optim::OptimizerParamState>& slot,
                           const at::Tensor& param, const MuonOptions& options,
                           const std::vector<int64_t>& view);

// One Muon step of every item (checked by check_muon_item): matrices of one shape, dtype, device
// and orthogonalization setting are orthogonalized together in one batched call; items whose
// options set `dion` take Dion's update instead, matrix by matrix.
void muon_update(const std::vector<MuonItem>& items, MuonWorkspaces& workspaces);

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
