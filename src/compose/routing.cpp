// muon::route (muon/routing.h): each parameter's role — Muon's matrices, the others, frozen — from
// what the tensor and its module are, then where it sits, then names (docs/algorithms.md
// §Routing). Over 400 lines on purpose: the rules are one ordered list, read top to bottom.
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
  bool end_layer = false;  // maps into or out of the model: an embedding or an output layer
  bool guessed = false;    // rests on the name alone (RoutedParameter::guessed)
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
  if (t.dim() < 2) return {Role::others, "rank-" + std::to_string(t.dim()) + " tensor", {}};
  for (const auto& a : axes) {
    if (is_selection_axis(a)) return {Role::others, described + ": selection axis '" + a + "'", {}};
  }
  if (axes.back() == "exp") return {Role::others, described + ": a router (last axis 'exp')", {}};
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
  if (!heads) return {Role::matrices, reason, view};
  const int64_t count = sizes[0] / last_size;
  return {Role::matrices, reason + ", " + std::to_string(count) + " heads orthogonalized alone",
          view, count};
}

bool is_number(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

std::vector<std::string> name_parts(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream in(name);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

// The numbered child a name passes through on its way to a module inside it — "blocks.3" of
// "blocks.3.mlp.out.weight", "h.0" of GPT-2's "transformer.h.0.attn.c_attn.weight" — or "". A
// list of single layers ("layers.2.weight") has no module inside its children: no block.
std::string repeated_block(const std::string& name) {
  const auto parts = name_parts(name);
  for (size_t i = 0; i + 2 < parts.size(); ++i) {
    if (is_number(parts[i])) {
      std::vector<std::string> prefix(parts.begin(), parts.begin() + static_cast<long>(i) + 1);
      return join(prefix, ".");
    }
  }
  return "";
}

bool is_child_index(const std::string& name) {  // "2.weight": a parameter of a Sequential's child
  const auto parts = name_parts(name);
  return parts.size() >= 2 && is_number(parts[0]);
}

bool is_embedding(const NamedParameter& p) {
  return lower(p.module_type).find("embedding") != std::string::npos;
}

bool is_trainable_matrix(const at::Tensor& t) {
  return t.requires_grad() && t.is_floating_point() && t.dim() >= 2;
}

// What the model's structure shows about the layers that map into and out of it, read from every
// parameter before any is decided (docs/design.md §Routing, rule 5).
struct Structure {
  std::map<const void*, std::string> embedding_of;  // a tensor an embedding module owns → its name
  std::vector<std::pair<int64_t, std::string>> vocabularies;  // each embedding's rows and name
  std::unordered_set<std::string> outputs;                   // routing.outputs
  const void* sequential_output = nullptr;  // a sequential model's last layer's matrix

  Structure(const std::vector<NamedParameter>& parameters, const RoutingRules& rules)
      : outputs(rules.output_names.begin(), rules.output_names.end()) {
    bool sequential = !parameters.empty();
    const NamedParameter* last = nullptr;
    for (const auto& p : parameters) {
      if (is_embedding(p) && p.tensor.dim() == 2) {
        embedding_of.emplace(p.tensor.unsafeGetTensorImpl(), p.name);
        vocabularies.emplace_back(p.tensor.size(0), p.name);
      }
      sequential = sequential && is_child_index(p.name);
      if (is_trainable_matrix(p.tensor)) last = &p;
    }
    // Its last child's own matrix ("3.weight"); a block's inner matrix ("2.mlp.proj.weight") is not
    // known to produce the output.
    if (sequential && last != nullptr && name_parts(last->name).size() == 2 && !is_embedding(*last)) {
      sequential_output = last->tensor.unsafeGetTensorImpl();
    }
  }

  // Why `p`, a trainable floating matrix outside every repeated block, maps out of the model, or
  // nothing: tied to an embedding, named in routing.outputs, as many rows as an embedding has
  // (the head over its vocabulary), or a sequential model's last layer.
  std::optional<std::string> output_layer(const NamedParameter& p) const {
    const auto tied = embedding_of.find(p.tensor.unsafeGetTensorImpl());
    if (tied != embedding_of.end()) return "tied to the embedding '" + tied->second + "'";
    if (outputs.count(p.name) > 0) return std::string("produces the model's output (routing.outputs)");
    for (const auto& [rows, name] : vocabularies) {
      if (p.tensor.dim() == 2 && p.tensor.size(0) == rows) {
        return "an output head: its " + std::to_string(rows) + " rows match the embedding '" +
               name + "'";
      }
    }
    if (p.tensor.unsafeGetTensorImpl() == sequential_output) {
      return std::string("the last layer of a sequential model (it produces the output)");
    }
    return std::nullopt;
  }
};

Decision end_layer(std::string reason) {
  Decision d{Role::others, std::move(reason), {}};
  d.end_layer = true;
  return d;
}

Decision higher_rank_decision(const NamedParameter& p, HigherRankPolicy policy) {
  const auto& t = p.tensor;
  const auto rank = "rank-" + std::to_string(t.dim()) + " tensor";
  switch (policy) {
    case HigherRankPolicy::adamw:
      return {
          Role::others, rank + " without declared matrix axes (higher_rank policy 'adamw')", {}};
    case HigherRankPolicy::flatten: {
      const std::vector<int64_t> view{t.size(0), t.numel() / t.size(0)};
      std::ostringstream out;
      out << rank << " flattened to " << at::IntArrayRef(view) << " (higher_rank policy 'flatten')";
      return {Role::matrices, out.str(), view};
    }
    case HigherRankPolicy::error:
      break;
  }
  throw Error("routing: parameter '" + p.name + "' is a " + rank + " of shape " +
              detail::concat(t.sizes()) +
              " without declared matrix axes (higher_rank policy 'error'); declare its axes, or "
              "use higher_rank 'flatten' or 'adamw'");
}

// The heuristics (docs/design.md §Routing, rule 5): what the tensor and its module are first, then
// where it sits in the model — inside a repeated block it is hidden, outside one the structure
// may show it maps out of the model — and only then its name.
Decision decide_heuristic(const NamedParameter& p, const RoutingRules& rules,
                          const Structure& structure) {
  const auto& t = p.tensor;
  if (!t.is_floating_point()) {
    return {Role::others,
            "dtype " + std::string(c10::toString(t.scalar_type())) + " is not floating-point",
            {}};
  }
  if (t.dim() < 2) return {Role::others, "rank-" + std::to_string(t.dim()) + " tensor", {}};
  if (!rules.use_names) {
    if (t.dim() > 2) return higher_rank_decision(p, rules.higher_rank);
    return {Role::matrices, "2-D matrix (routed by shape: given without a name)", {}};
  }
  if (ends_with(p.name, "bias")) return {Role::others, "a bias", {}};
  const auto type = lower(p.module_type);
  if (type.find("embedding") != std::string::npos) {
    return end_layer("owned by an embedding module (" + p.module_type + ")");
  }
  if (type.find("norm") != std::string::npos) {
    return {Role::others, "owned by a norm module (" + p.module_type + ")", {}};
  }
  const auto block = repeated_block(p.name);
  if (block.empty()) {
    if (auto output = structure.output_layer(p)) return end_layer(*output);
  }
  const auto part = input_output_part(p.name);
  if (block.empty() && !part.empty()) {
    auto d = end_layer("name part '" + part + "' marks an input/output layer");
    // Only where the name changed the outcome: a rank > 2 tensor goes to AdamW by default anyway.
    d.guessed = t.dim() == 2 || rules.higher_rank != HigherRankPolicy::adamw;
    return d;
  }
  if (t.dim() > 2) return higher_rank_decision(p, rules.higher_rank);
  return {Role::matrices, "hidden 2-D matrix", {}};
}

// The model's last matrix, when nothing was seen to map into or out of the model (no embedding,
// no output layer by structure or name) and it became a hidden one outside every repeated block:
// its role is a guess, said in its reason and in the routing warning.
void mark_guessed_last_matrix(std::vector<RoutedParameter>& routes) {
  RoutedParameter* last = nullptr;
  for (auto& r : routes) {
    if (r.role != Role::frozen && is_trainable_matrix(r.tensor)) last = &r;
  }
  if (last == nullptr || last->reason != "hidden 2-D matrix" || !repeated_block(last->name).empty()) {
    return;
  }
  last->reason +=
      " (a guess: the model's last matrix; if it produces the output, route it to AdamW with "
      "routing.adamw or a tag)";
  last->guessed = true;
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
         {std::tuple{&rules.muon_patterns, Role::matrices, "routing.muon"},
          std::tuple{&rules.adamw_patterns, Role::others, "routing.adamw"}}) {
      for (const auto& pattern : *patterns) {
        if (!role && fnmatch(pattern.c_str(), p.name.c_str(), 0) == 0) {
          role = r;
          why = std::string(key) + " pattern '" + pattern + "'";
        }
      }
    }
  }
  if (!role) return std::nullopt;
  if (*role != Role::matrices) return Decision{*role, why, {}};
  const auto declared = rules.axes.find(p.name);
  if (declared != rules.axes.end()) {
    auto d = decide_declared(p, declared->second, rules.split_heads);
    check(d.role == Role::matrices, "routing: parameter '", p.name, "' is overridden to muon (",
          why, ") but its ", d.reason, " cannot be orthogonalized");
    return Decision{Role::matrices, why + "; " + d.reason, d.view, d.num_heads};
  }
  check(p.tensor.is_floating_point() && !p.tensor.is_complex() && p.tensor.dim() == 2,
        "routing: parameter '", p.name, "' of shape ", p.tensor.sizes(), " and dtype ",
        p.tensor.scalar_type(), " is overridden to muon (", why,
        ") but Muon needs a floating-point 2-D matrix or declared matrix axes");
  return Decision{Role::matrices, why, {}};
}

}  // namespace

std::vector<RoutedParameter> route(const std::vector<NamedParameter>& parameters,
                                   const RoutingRules& rules) {
  const Structure structure(parameters, rules);
  std::vector<RoutedParameter> out;
  std::unordered_set<const void*> seen;
  bool ends_seen = false;
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
      d = decide_heuristic(p, rules, structure);
    }
    ends_seen = ends_seen || d.end_layer;
    out.push_back({p.name, p.tensor, d.role, std::move(d.reason), p.module_type, std::move(d.view),
                   d.num_heads, d.guessed});
  }
  if (rules.use_names && !ends_seen) mark_guessed_last_matrix(out);
  if (const auto warning = routing_warning(out); !warning.empty()) TORCH_WARN(warning);
  return out;
}

std::string routing_warning(const std::vector<RoutedParameter>& routes) {
  std::vector<std::string> listed;
  for (const auto& r : routes) {
    if (r.guessed) listed.push_back("'" + r.name + "' → " + to_string(r.role) + " (" + r.reason + ")");
  }
  if (listed.empty()) return "";
  return "routing: " + std::to_string(listed.size()) +
         (listed.size() == 1 ? " parameter's role rests" : " parameters' roles rest") +
         " on a name or a guess, not on the model's structure: " + join(listed, "; ") +
         ". If one is wrong, route it with a routing.adamw or routing.muon pattern (or a tag in "
         "C++); from Python, example_inputs= finds the output layer by a traced forward";
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
