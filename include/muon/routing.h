// Routing: which parameter each algorithm optimizes (SPEC §4), with a reason for every decision.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace muon {

enum class Role {
  muon,    // a hidden matrix, orthogonalized
  adamw,   // everything else that trains
  frozen,  // requires_grad == false: in no optimizer
};

std::string to_string(Role role);

// A parameter as routing sees it: its dotted name, the tensor, and the type name of the module that
// owns it (empty when unknown, e.g. for a bare list of named tensors).
struct NamedParameter {
  std::string name;
  at::Tensor tensor;
  std::string module_type;
};

struct RoutedParameter {
  std::string name;
  at::Tensor tensor;
  Role role;
  std::string reason;  // human-readable, e.g. "name part 'lm_head' marks an input/output layer"
  std::string module_type;
  std::vector<int64_t> view;  // Muon's (batch..., rows, cols) view; empty: the tensor's shape
};

// Biases and norm weights: no weight decay unless their parameter group sets one (SPEC §3).
bool is_no_decay(const RoutedParameter& p);

// Every parameter of `model` in registration order, with its owning module's type name.
std::vector<NamedParameter> named_parameters_of(const torch::nn::Module& model);

// Routes each distinct tensor once, under the first name it appears with (tied weights are
// optimized once). Rules, in order: frozen; rank < 2, non-floating or a bias → AdamW; owning module
// type containing "embedding" or "norm" → AdamW; a name part naming an input/output layer (embed,
// wte, lm_head, head, ...) → AdamW; rank > 2 → AdamW (higher_rank policy "adamw"); any other
// floating 2-D tensor → Muon. (Speedtronic's heuristics.)
std::vector<RoutedParameter> route(const std::vector<NamedParameter>& parameters);
std::vector<RoutedParameter> route(const torch::nn::Module& model);

// The tensors routed to `role`, in order.
std::vector<at::Tensor> tensors_with_role(const std::vector<RoutedParameter>& routes, Role role);

// An aligned text table: name, shape, dtype, role, reason; then a count per role.
std::string format_routing_report(const std::vector<RoutedParameter>& routes);

}  // namespace muon
