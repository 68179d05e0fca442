// Internal to the composition layer: the checks and group options HybridOptimizer's plan is made
// of (src/compose/hybrid_plan.cpp).
#pragma once

#include <memory>
#include <vector>

#include "muon/hybrid.h"

namespace muon::detail {

// The configured parameter groups, or one catch-all group "default".
std::vector<ParamGroupSpec> groups_or_default(const HybridOptions& options);

// Throws muon::Error for any option that does not depend on the parameters.
void check_hybrid_options(const HybridOptions& options);

// The options of a group of the other parameters: the hybrid's, with the group's rate, decay and
// any betas or eps of its spec — refused where the algorithm has no such setting.
std::unique_ptr<torch::optim::OptimizerOptions> others_group_options(
    const torch::optim::OptimizerOptions& others, const ParamGroupSpec& spec, double lr,
    double weight_decay);

// The options of a group of routed matrices: the hybrid's, with the group's rate, decay and
// momentum, and the rows split into heads (the group's num_heads or split_sizes, else routing's
// `heads`) — refused where the algorithm has no such setting.
std::unique_ptr<torch::optim::OptimizerOptions> matrices_group_options(
    const torch::optim::OptimizerOptions& matrices, const ParamGroupSpec& spec, double lr,
    double weight_decay, int64_t heads);

}  // namespace muon::detail
