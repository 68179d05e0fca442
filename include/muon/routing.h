// Routing: which parameter each algorithm optimizes (docs/design.md §Routing), with a reason for
// every decision.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

#include "muon/enum_names.h"

namespace muon {

// The hybrid's two slots name the roles (muon/hybrid.h, HybridOptions).
enum class Role {
  matrices,  // a hidden matrix: the matrices slot's algorithm (Muon, Dion) orthogonalizes it
  others,    // everything else that trains: the others slot's algorithm (AdamW, Lion, ...)
  frozen,    // requires_grad == false: in no optimizer
  // Their names before the slots, kept for code written then.
  muon [[deprecated("Role::matrices")]] = matrices,
  adamw [[deprecated("Role::others")]] = others,
};

template <>
struct EnumNames<Role> {
  static constexpr const char* noun = "optimizer role";
  static constexpr const char* plural = "roles";
  static constexpr std::array<std::pair<Role, const char*>, 3> table{
      {{Role::matrices, "matrices"}, {Role::others, "others"}, {Role::frozen, "frozen"}}};
};
inline std::string to_string(Role role) {
  return enum_name(role);
}
// The current names only: readers of earlier files rewrite "muon" and "adamw" first
// (current_role_name).
inline Role role_from_string(const std::string& name) {
  return enum_from_name<Role>(name);
}
// A role as files of earlier versions name it ("muon", "adamw"), in its current name; any other
// name unchanged.
inline std::string current_role_name(const std::string& name) {
  return name == "muon" ? "matrices" : name == "adamw" ? "others" : name;
}

// What to do with an undeclared floating tensor of rank > 2 (a conv kernel, say).
enum class HigherRankPolicy {
  adamw,    // AdamW, with a reason saying so (default)
  flatten,  // Muon on the (out, ∏rest) view, conv style
  error,    // refuse: the matrix axes cannot be guessed
};
template <>
struct EnumNames<HigherRankPolicy> {
  static constexpr const char* noun = "higher_rank policy";
  static constexpr const char* plural = "policies";
  static constexpr std::array<std::pair<HigherRankPolicy, const char*>, 3> table{
      {{HigherRankPolicy::adamw, "adamw"},
       {HigherRankPolicy::flatten, "flatten"},
       {HigherRankPolicy::error, "error"}}};
};
inline std::string to_string(HigherRankPolicy policy) {
  return enum_name(policy);
}
inline HigherRankPolicy higher_rank_policy_from_string(const std::string& name) {
  return enum_from_name<HigherRankPolicy>(name);
}

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
  // With RoutingRules::split_heads: the heads its declared rows side splits into, each
  // orthogonalized alone (Muon's num_heads).
  std::optional<int64_t> num_heads;
  // The role rests on a name alone (an input/output name part outside every repeated block) or on
  // a guess (the last matrix of a model whose ends nothing showed), not on the model's structure:
  // routing_warning lists it.
  bool guessed = false;
};

// Biases and norm weights: no weight decay unless their parameter group sets one
// (docs/design.md §Parameter groups).
bool is_no_decay(const RoutedParameter& p);

// Every parameter of `model` in registration order, with its owning module's type name.
std::vector<NamedParameter> named_parameters_of(const torch::nn::Module& model);

// Everything beyond the heuristics that steers routing (docs/design.md §Routing, rules 3–4).
struct RoutingRules {
  std::vector<std::string> muon_patterns;   // fnmatch over names: force Muon (config routing.muon)
  std::vector<std::string> adamw_patterns;  // force AdamW (config routing.adamw)
  HigherRankPolicy higher_rank = HigherRankPolicy::adamw;

  // C++ tags, the equivalent of a per-module role attribute; they win over patterns.
  void tag_parameter(const at::Tensor& param, Role role);
  void tag_module(const torch::nn::Module& module, Role role);  // every parameter below it

  // Dew's logical axes for a parameter, one name per dim in storage order: head axes {heads,
  // head_dim, kv} merge when adjacent, the batch axis `exp` must lead, selection axes {vocab,
  // output} mean AdamW. The rest must form exactly two sides: (out side, in side) → Muon's view.
  void declare_axes(const std::string& name, std::vector<std::string> axes);
  // Orthogonalize each head of a declared rows side that ends in `head_dim` — (heads, head_dim),
  // (kv, heads, head_dim) — alone, as Muon's num_heads (dion's per-head orthogonalization); off:
  // the side's rows form one matrix. Head axes on the columns side always stay merged.
  bool split_heads = false;
  // Whether names count: false routes by rank and dtype alone — no bias, input/output-name or
  // last-layer rules — for parameters given without names (Python's plain tensors and groups).
  bool use_names = true;
  // Names of the parameters known to produce the model's output (routing.outputs; Python's
  // example_inputs= finds them by a traced forward): AdamW as output layers.
  std::vector<std::string> output_names;

  std::map<const void*, Role> tags;
  std::map<std::string, std::vector<std::string>> axes;
};

// Routes each distinct tensor once, under the first name it appears with (tied weights are
// optimized once). Rules, in order (docs/design.md §Routing): frozen (requires_grad false); an
// explicit override (tag, then muon_patterns, then adamw_patterns — Muon only for floating
// matrices or declared axes); declared axes; then the heuristics: rank < 2, non-floating or a bias
// → AdamW; owning module type containing "embedding" or "norm" → AdamW; a matrix inside a
// repeated block (blocks.N.…, layers.N.…, h.N.…) is hidden whatever its name; outside one, an
// output layer the structure shows → AdamW (tied to an embedding, in output_names, as many rows
// as an embedding, a sequential model's last layer); then a name part naming an input/output
// layer (embed, wte, lm_head, head, ...) → AdamW; rank > 2 → the higher_rank policy; any other
// floating 2-D tensor → Muon. Without use_names the rules that read names are left out. Roles
// that rest on a name or a guess are marked `guessed` and listed in one warning (TORCH_WARN).
std::vector<RoutedParameter> route(const std::vector<NamedParameter>& parameters,
                                   const RoutingRules& rules = {});
std::vector<RoutedParameter> route(const torch::nn::Module& model, const RoutingRules& rules = {});

// The warning a build gives for the routes marked `guessed`, each with its role and reason, and
// how to pin them; "" when none is.
std::string routing_warning(const std::vector<RoutedParameter>& routes);

// The tensors routed to `role`, in order.
std::vector<at::Tensor> tensors_with_role(const std::vector<RoutedParameter>& routes, Role role);

// An aligned text table: name, shape, dtype, role, reason; then a count per role.
std::string format_routing_report(const std::vector<RoutedParameter>& routes);

}  // namespace muon
