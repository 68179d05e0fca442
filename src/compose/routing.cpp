#include "muon/routing.h"

#include "table.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <sstream>
#include <unordered_set>

namespace muon {

std::string to_string(Role role) {
  switch (role) {
    case Role::muon:
      return "muon";
    case Role::adamw:
      return "adamw";
    case Role::frozen:
      return "frozen";
  }
  return "?";
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

// Name parts that mark a layer mapping into or out of a discrete space (Speedtronic's list).
const std::array<const char*, 12> kInputOutputNames = {
    "embed",  "embedding",   "wte",   "wpe",        "lm_head", "classifier",
    "output", "output_proj", "score", "score_proj", "head",    "value_embeds"};

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

std::pair<Role, std::string> decide(const NamedParameter& p) {
  const auto& t = p.tensor;
  if (!t.requires_grad()) return {Role::frozen, "requires_grad is false"};
  if (!t.is_floating_point()) {
    return {Role::adamw,
            "dtype " + std::string(c10::toString(t.scalar_type())) + " is not floating-point"};
  }
  if (t.dim() < 2) return {Role::adamw, "rank-" + std::to_string(t.dim()) + " tensor"};
  if (ends_with(p.name, "bias")) return {Role::adamw, "a bias"};
  const auto type = lower(p.module_type);
  if (type.find("embedding") != std::string::npos) {
    return {Role::adamw, "owned by an embedding module (" + p.module_type + ")"};
  }
  if (type.find("norm") != std::string::npos) {
    return {Role::adamw, "owned by a norm module (" + p.module_type + ")"};
  }
  const auto part = input_output_part(p.name);
  if (!part.empty()) return {Role::adamw, "name part '" + part + "' marks an input/output layer"};
  if (t.dim() > 2) {
    return {Role::adamw, "rank-" + std::to_string(t.dim()) +
                             " tensor without declared matrix axes (higher_rank policy 'adamw')"};
  }
  return {Role::muon, "hidden 2-D matrix"};
}

}  // namespace

std::vector<RoutedParameter> route(const std::vector<NamedParameter>& parameters) {
  std::vector<RoutedParameter> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : parameters) {
    if (!seen.insert(p.tensor.unsafeGetTensorImpl()).second) continue;  // tied: first name wins
    auto [role, reason] = decide(p);
    out.push_back({p.name, p.tensor, role, std::move(reason), p.module_type, {}});
  }
  return out;
}

bool is_no_decay(const RoutedParameter& p) {
  const auto type = lower(p.module_type);
  const auto name = lower(p.name);
  return ends_with(name, "bias") || ends_with(name, ".scale") ||
         type.find("norm") != std::string::npos ||
         (p.tensor.dim() == 1 && name.find("norm") != std::string::npos);
}

std::vector<RoutedParameter> route(const torch::nn::Module& model) {
  return route(named_parameters_of(model));
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
    rows.push_back({r.name, shape.str(), c10::toString(r.tensor.scalar_type()), to_string(r.role),
                    r.reason});
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
