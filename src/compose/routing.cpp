#include "muon/routing.h"

#include "muon/error.h"
#include "table.h"

#include <torch/nn/module.h>

#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <unordered_set>

namespace muon {

void RoutingRules::tag_parameter(const at::Tensor& param, Role role) {
  tags[param.unsafeGetTensorImpl()] = role;
}

void RoutingRules::tag_module(const torch::nn::Module& module, Role role) {
  for (const auto& p : module.parameters(/*recurse=*/true)) tag_parameter(p, role);
}

void RoutingRules::declare_axes(const std::string& name, std::vector<std::string> names) {
  axes[name] = std::move(names);
}

std::vector<NamedParameter> named_parameters_of(const torch::nn::Module& model) {
  std::vector<NamedParameter> out;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    const auto& prefix = item.key();
    const auto& module = item.value();
    for (const auto& param : module->named_parameters(/*recurse=*/false)) {
      out.push_back({prefix.empty() ? param.key() : prefix + "." + param.key(), param.value(),
                     module->name()});
    }
  }
  return out;
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Name parts that mark a layer mapping into or out of a discrete space: Speedtronic's list, then
// common names of output layers and positional tables.
const std::array<const char*, 22> kInputOutputNames = {"embed",         "embedding",
                                                       "wte",           "wpe",
                                                       "lm_head",       "classifier",
                                                       "output",        "output_proj",
                                                       "score",         "score_proj",
                                                       "head",          "value_embeds",
                                                       "out",           "logits",
                                                       "fc_out",        "unembed",
                                                       "readout",       "pos",
                                                       "pos_emb",       "pos_embed",
                                                       "pos_embedding", "position_embeddings"};

std::string input_output_part(const std::string& name) {
  std::stringstream parts(lower(name));
  std::string part;
  while (std::getline(parts, part, '.')) {
    for (const char* marker : kInputOutputNames) {
      if (part == marker) return part;
    }
  }
  return "";
}

struct Decision {
  Role role;
  std::string reason;
  std::vector<int64_t> view;  // Muon's view when not the tensor's own shape
  std::optional<int64_t> num_heads = std::nullopt;
};

bool is_head_axis(const std::string& a) {
  return a == "heads" || a == "head_dim" || a == "kv";
}
bool is_selection_axis(const std::string& a) {
  return a == "vocab" || a == "output";
}

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// Dew's rules on declared logical axes (docs/design.md §Routing, rule 4).
Decision decide_declared(const NamedParameter& p, const std::vector<std::string>& axes,
                         bool split_heads) {
  const auto& t = p.tensor;
  check(static_cast<int64_t>(axes.size()) == t.dim(), "routing: parameter '", p.name,
        "' has shape ", t.sizes(), " but ", axes.size(), " declared axes (", join(axes, ", "), ")");
  const auto described = "declared axes (" + join(axes, ", ") + ")";
  if (t.dim() < 2) return {Role::adamw, "rank-" + std::to_string(t.dim()) + " tensor", {}};
  for (const auto& a : axes) {
    if (is_selection_axis(a)) return {Role::adamw, described + ": selection axis '" + a + "'", {}};
  }
  if (axes.back() == "exp") return {Role::adamw, described + ": a router (last axis 'exp')", {}};
  // Leading `exp` axes are the batch; the rest must form exactly two sides.
  std::vector<int64_t> view;
  size_t i = 0;
  for (; i < axes.size() && axes[i] == "exp"; ++i) view.push_back(t.size(static_cast<int64_t>(i)));
  std::vector<std::vector<std::string>> sides;
  std::vector<int64_t> sizes;
  int64_t last_size = 0;  // the size of the rows side's last axis
  for (; i < axes.size(); ++i) {
    check(axes[i] != "exp", "routing: parameter '", p.name, "' with ", described,
          " has the batch axis 'exp' after a matrix axis; declare expert axes first");
    const bool merge = !sides.empty() && is_head_axis(axes[i]) && is_head_axis(sides.back().back());
    if (merge) {
      sides.back().push_back(axes[i]);
      sizes.back() *= t.size(static_cast<int64_t>(i));
    } else {
      sides.push_back({axes[i]});
      sizes.push_back(t.size(static_cast<int64_t>(i)));
    }
    if (sides.size() == 1) last_size = t.size(static_cast<int64_t>(i));
  }
  if (sides.size() != 2) {
    std::vector<std::string> described_sides;
    for (const auto& side : sides) described_sides.push_back("(" + join(side, ", ") + ")");
    throw Error("routing: parameter '" + p.name + "' with " + described + " has " +
                std::to_string(sides.size()) + " matrix sides " + join(described_sides, " ") +
                "; Muon needs exactly two (out side, in side) after leading 'exp' axes — adjacent "
                "head axes merge into one side");
  }
  view.push_back(sizes[0]);
  view.push_back(sizes[1]);
  auto reason =
      described + ": matrix (" + join(sides[0], ", ") + ") x (" + join(sides[1], ", ") + ")";
  const bool heads = split_heads && sides[0].size() > 1 && sides[0].back() == "head_dim";
  if (!heads) return {Role::muon, reason, view};
  const int64_t count = sizes[0] / last_size;
  return {Role::muon, reason + ", " + std::to_string(count) + " heads orthogonalized alone", view,
          count};
}

// Speedtronic's heuristics (docs/design.md §Routing, rule 5) with the higher_rank policy.
Decision decide_heuristic(const NamedParameter& p, const RoutingRules& rules) {
  const auto& t = p.tensor;
  if (!t.is_floating_point()) {
    return {Role::adamw,
            "dtype " + std::string(c10::toString(t.scalar_type())) + " is not floating-point",
            {}};
  }
  if (t.dim() < 2) return {Role::adamw, "rank-" + std::to_string(t.dim()) + " tensor", {}};
  if (rules.use_names && ends_with(p.name, "bias")) return {Role::adamw, "a bias", {}};
  const auto type = lower(p.module_type);
  if (type.find("embedding") != std::string::npos) {
    return {Role::adamw, "owned by an embedding module (" + p.module_type + ")", {}};
  }
  if (type.find("norm") != std::string::npos) {
    return {Role::adamw, "owned by a norm module (" + p.module_type + ")", {}};
  }
  const auto part = rules.use_names ? input_output_part(p.name) : "";
  if (!part.empty()) {
    return {Role::adamw, "name part '" + part + "' marks an input/output layer", {}};
  }
  if (t.dim() > 2) {
    const auto rank = "rank-" + std::to_string(t.dim()) + " tensor";
    switch (rules.higher_rank) {
      case HigherRankPolicy::adamw:
        return {
            Role::adamw, rank + " without declared matrix axes (higher_rank policy 'adamw')", {}};
      case HigherRankPolicy::flatten: {
        const std::vector<int64_t> view{t.size(0), t.numel() / t.size(0)};
        std::ostringstream out;
        out << rank << " flattened to " << at::IntArrayRef(view)
            << " (higher_rank policy 'flatten')";
        return {Role::muon, out.str(), view};
      }
      case HigherRankPolicy::error:
        throw Error("routing: parameter '" + p.name + "' is a " + rank + " of shape " +
                    detail::concat(t.sizes()) +
                    " without declared matrix axes (higher_rank policy 'error'); declare its axes, "
                    "or use higher_rank 'flatten' or 'adamw'");
    }
  }
  if (!rules.use_names)
    return {Role::muon, "2-D matrix (routed by shape: given without a name)", {}};
  return {Role::muon, "hidden 2-D matrix", {}};
}

bool is_child_index(const std::string& name) {  // "2.weight": a parameter of a Sequential's child
  const auto dot = name.find('.');
  return dot != std::string::npos && dot > 0 && name.find_first_not_of("0123456789") == dot;
}

// The model's last matrix, when the heuristics made it a hidden one although nothing was seen to
// map into or out of the model: in a sequential model (every name starts with a child index) it
// produces the output, so it goes to AdamW; elsewhere the report says the role is a guess.
void review_last_matrix(std::vector<RoutedParameter>& routes) {
  RoutedParameter* last = nullptr;
  bool io_seen = false, sequential = !routes.empty();
  for (auto& r : routes) {
    if (r.role == Role::frozen) continue;
    if (r.tensor.dim() >= 2 && r.tensor.is_floating_point()) last = &r;
    io_seen = io_seen || r.reason.rfind("name part", 0) == 0 ||
              r.reason.rfind("owned by an embedding", 0) == 0;
    sequential = sequential && is_child_index(r.name);
  }
  if (last == nullptr || io_seen || last->reason != "hidden 2-D matrix") return;
  if (sequential) {
    last->role = Role::adamw;
    last->reason = "the last layer of a sequential model (it produces the output)";
  } else {
    last->reason +=
        " (a guess: the model's last matrix; if it produces the output, route it to AdamW with "
        "routing.adamw or a tag)";
  }
}

// An explicit override, if any applies (docs/design.md §Routing, rule 3).
std::optional<Decision> decide_override(const NamedParameter& p, const RoutingRules& rules) {
  std::optional<Role> role;
  std::string why;
  const auto tag = rules.tags.find(p.tensor.unsafeGetTensorImpl());
  if (tag != rules.tags.end()) {
    role = tag->second;
    why = "tagged '" + to_string(*role) + "' in code";
  } else {
    for (const auto& [patterns, r, key] :
         {std::tuple{&rules.muon_patterns, Role::muon, "routing.muon"},
          std::tuple{&rules.adamw_patterns, Role::adamw, "routing.adamw"}}) {
      for (const auto& pattern : *patterns) {
        if (!role && fnmatch(pattern.c_str(), p.name.c_str(), 0) == 0) {
          role = r;
          why = std::string(key) + " pattern '" + pattern + "'";
        }
      }
    }
  }
  if (!role) return std::nullopt;
  if (*role != Role::muon) return Decision{*role, why, {}};
  const auto declared = rules.axes.find(p.name);
  if (declared != rules.axes.end()) {
    auto d = decide_declared(p, declared->second, rules.split_heads);
    check(d.role == Role::muon, "routing: parameter '", p.name, "' is overridden to muon (", why,
          ") but its ", d.reason, " cannot be orthogonalized");
    return Decision{Role::muon, why + "; " + d.reason, d.view, d.num_heads};
  }
  check(p.tensor.is_floating_point() && !p.tensor.is_complex() && p.tensor.dim() == 2,
        "routing: parameter '", p.name, "' of shape ", p.tensor.sizes(), " and dtype ",
        p.tensor.scalar_type(), " is overridden to muon (", why,
        ") but Muon needs a floating-point 2-D matrix or declared matrix axes");
  return Decision{Role::muon, why, {}};
}

}  // namespace

std::vector<RoutedParameter> route(const std::vector<NamedParameter>& parameters,
                                   const RoutingRules& rules) {
  std::vector<RoutedParameter> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : parameters) {
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) continue;  // tied: first name wins
    Decision d;
    if (!p.tensor.requires_grad()) {
      d = {Role::frozen, "requires_grad is false", {}};
    } else if (auto forced = decide_override(p, rules)) {
      d = *forced;
    } else if (const auto declared = rules.axes.find(p.name); declared != rules.axes.end()) {
      d = decide_declared(p, declared->second, rules.split_heads);
    } else {
      d = decide_heuristic(p, rules);
    }
    out.push_back({p.name, p.tensor, d.role, std::move(d.reason), p.module_type, std::move(d.view),
                   d.num_heads});
  }
  if (rules.use_names) review_last_matrix(out);
  return out;
}

bool is_no_decay(const RoutedParameter& p) {
  const auto type = lower(p.module_type);
  const auto name = lower(p.name);
  return ends_with(name, "bias") || ends_with(name, ".scale") ||
         type.find("norm") != std::string::npos ||
         (p.tensor.dim() == 1 && name.find("norm") != std::string::npos);
}

std::vector<RoutedParameter> route(const torch::nn::Module& model, const RoutingRules& rules) {
  return route(named_parameters_of(model), rules);
}

std::vector<at::Tensor> tensors_with_role(const std::vector<RoutedParameter>& routes, Role role) {
  std::vector<at::Tensor> out;
  for (const auto& r : routes) {
    if (r.role == role) out.push_back(r.tensor);
  }
  return out;
}

std::string format_routing_report(const std::vector<RoutedParameter>& routes) {
  std::vector<std::vector<std::string>> rows;
  std::map<std::string, std::pair<int64_t, int64_t>> totals;  // role → (tensors, elements)
  for (const auto& r : routes) {
    std::ostringstream shape;
    shape << r.tensor.sizes();
    rows.push_back(
        {r.name, shape.str(), c10::toString(r.tensor.scalar_type()), to_string(r.role), r.reason});
    auto& t = totals[to_string(r.role)];
    t.first += 1;
    t.second += r.tensor.numel();
  }
  std::ostringstream out;
  out << detail::format_table({"name", "shape", "dtype", "role", "reason"}, rows) << '\n';
  for (const auto& [role, t] : totals) {
    out << role << ": " << t.first << " tensors, " << t.second << " elements\n";
  }
  return out.str();
}

}  // namespace muon
