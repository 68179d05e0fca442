// HybridOptimizer (muon/hybrid.h): building it from a model or named parameters, its plan of which
// algorithm steps each parameter, and re-planning when the parameters change (param_groups swapped,
// a process group set). Its step is hybrid_step.cpp; the plan's checks hybrid_plan.cpp. Over 400
// lines on purpose: every way of changing the held parameters goes through make_plan here, and
// reads best beside it.
#include "muon/hybrid.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "data_parallel.h"
#include "hybrid_plan.h"
#include "muon/algorithms.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/param_state.h"
#include "table.h"

namespace muon {

using torch::optim::OptimizerOptions;

// The groups the hybrid optimizer is built from, decided before its base class exists.
struct HybridOptimizer::Plan {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<ParameterReport> report;
  std::vector<std::pair<at::Tensor, std::vector<int64_t>>> views;  // Muon views to declare
  std::map<const void*, std::string> names;
  std::vector<std::optional<LrSchedule>> group_schedules;
};

using detail::check_hybrid_options;
using detail::groups_or_default;
using detail::matrices_group_options;
using detail::others_group_options;

namespace {

HybridOptions with_algorithms(MuonOptions muon, AdamWOptions adamw) {
  HybridOptions options;
  options.muon = std::move(muon);
  options.adamw = std::move(adamw);
  return options;
}

}  // namespace

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 MuonOptions muon_options, AdamWOptions adamw_options)
    : HybridOptimizer(routes, with_algorithms(std::move(muon_options), std::move(adamw_options))) {}

// Decides the libtorch param groups — one per (parameter group, role, decayed or not) — before
// the base class exists, checking the options on the way.
HybridOptimizer::Plan HybridOptimizer::make_plan(const std::vector<RoutedParameter>& routes,
                                                 const HybridOptions& options) {
  check_hybrid_options(options);
  const auto specs = groups_or_default(options);
  check_groups(specs);
  const auto& others = options.others_options();
  // (group, decayed or not, role, routing's head split) → hybrid group index, in order of first
  // appearance.
  std::map<std::tuple<size_t, bool, Role, int64_t>, size_t> index;
  Plan plan;
  for (const auto& r : routes) {
    const Role role = (options.all_adamw && r.role == Role::muon) ? Role::adamw : r.role;
    const auto& algorithm = role == Role::muon ? options.matrices_options() : others;
    ParameterReport row{r.name,
                        r.tensor.sizes().vec(),
                        r.tensor.scalar_type(),
                        role,
                        role != r.role ? "optimizer adamw: every trainable parameter in "
                                         "AdamW"
                                       : r.reason,
                        role == Role::frozen ? "" : algorithm_name(algorithm),
                        "",
                        0,
                        0};
    if (role == Role::frozen) {
      plan.report.push_back(row);
      continue;
    }
    const size_t g = group_of(specs, r.name);
    const auto& spec = specs[g];
    const double base_lr = algorithm.get_lr();
    const double base_wd = group_settings(algorithm).at("weight_decay");
    row.group = spec.name;
    row.lr = spec.lr ? *spec.lr : base_lr * spec.lr_multiplier;
    row.weight_decay = spec.weight_decay ? *spec.weight_decay : is_no_decay(r) ? 0.0 : base_wd;
    // Parameters whose settings differ (no-decay defaults, a head split routing found where the
    // group sets no split of its own) get their own libtorch group.
    const bool group_splits = spec.num_heads || spec.split_sizes;
    const int64_t heads = role == Role::muon && !group_splits ? r.num_heads.value_or(0) : 0;
    const auto key = std::make_tuple(g, row.weight_decay != base_wd, role, heads);
    auto [it, fresh] = index.emplace(key, plan.groups.size());
    if (fresh) {
      std::unique_ptr<torch::optim::OptimizerOptions> group_options;
      if (role == Role::muon) {
        group_options = matrices_group_options(algorithm, spec, row.lr, row.weight_decay, heads);
      } else {
        group_options = others_group_options(others, spec, row.lr, row.weight_decay);
      }
      plan.groups.emplace_back(std::vector<at::Tensor>{}, std::move(group_options));
      plan.group_schedules.push_back(spec.schedule);
    }
    plan.groups[it->second].params().push_back(r.tensor);
    plan.names[r.tensor.unsafeGetTensorImpl()] = r.name;
    if (role == Role::muon && !r.view.empty()) plan.views.emplace_back(r.tensor, r.view);
    plan.report.push_back(row);
  }
  return plan;
}

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 const HybridOptions& options)
    : HybridOptimizer(make_plan(routes, options), options) {}

HybridOptimizer::HybridOptimizer(Plan plan, const HybridOptions& options)
    : Optimizer(plan.groups, options.others_options().clone()),
      options_(options),
      report_(std::move(plan.report)),
      names_(std::move(plan.names)) {
  compat::keep_group_options(param_groups_, 0, plan.groups);
  for (size_t g = 0; g < param_groups_.size(); ++g) adopt_group(g, plan.group_schedules[g]);
  for (auto& [tensor, view] : plan.views) {
    check_matrix_view(tensor, view, "routing");
    views_[tensor.unsafeGetTensorImpl()] = std::move(view);
  }
  warn_when_muon_gets_nothing();
}

// A hybrid whose matrices' algorithm (Muon, Dion) gets no parameter is a routing surprise more
// often than a choice (a CNN's rank-4 kernels under higher_rank 'adamw'): said on stderr, as the
// library's other warnings.
void HybridOptimizer::warn_when_muon_gets_nothing() const {
  if (options_.all_adamw) return;
  const ParameterReport* higher_rank = nullptr;
  bool trainable = false;
  for (const auto& r : report_) {
    if (r.role == Role::muon) return;
    trainable = trainable || r.role != Role::frozen;
    if (r.role == Role::adamw && r.shape.size() > 2 && higher_rank == nullptr) higher_rank = &r;
  }
  if (!trainable) return;
  std::cerr << "muon: warning: no parameter is routed to "
            << algorithm_title(algorithm_name(options_.matrices_options()))
            << "; every trainable one goes to " << algorithm_name(options_.others_options());
  if (higher_rank != nullptr) {
    std::cerr << " (" << higher_rank->name << " " << at::IntArrayRef(higher_rank->shape)
              << " and any other tensor of rank > 2 under routing higher_rank 'adamw'; "
                 "higher_rank 'flatten' trains each as an (out, rest) matrix)";
  }
  std::cerr << ". report_text() gives each parameter's reason.\n";
}

Role HybridOptimizer::role_of_group(size_t g) const {
  return algorithm_kind(param_groups_[g].options()) == ParamKind::matrices ? Role::muon
                                                                           : Role::adamw;
}

void HybridOptimizer::check_group(size_t g, const std::string& who) const {
  const auto& group = param_groups_[g];
  with_context(detail::concat(who, ": param group ", g),
               [&] { check_group_options(group.options()); });
  const bool matrices = algorithm_kind(group.options()) == ParamKind::matrices;
  const auto title = algorithm_title(algorithm_name(group.options()));
  for (size_t i = 0; i < group.params().size(); ++i) {
    const auto& p = group.params()[i];
    const auto where = detail::concat("parameter ", i, " of param group ", g);
    if (matrices) check_muon_param(p, where, title.c_str());
    for (size_t other = 0; other < param_groups_.size(); ++other) {
      for (size_t j = 0; j < param_groups_[other].params().size(); ++j) {
        check((other == g && j == i) || !param_groups_[other].params()[j].is_same(p), who, ": ",
              where, " is also parameter ", j, " of param group ", other,
              "; a parameter belongs to one group");
      }
    }
  }
}

// Records what the schedules, reports and checkpoints need of group g.
void HybridOptimizer::adopt_group(size_t g, std::optional<LrSchedule> schedule) {
  const auto role = role_of_group(g);
  const auto& o = param_groups_[g].options();
  const auto now = settings_of(g);
  base_.push_back({now.lr, now.weight_decay, now.momentum, std::move(schedule), now});
  const double wd = now.weight_decay;
  const auto& params = param_groups_[g].params();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto* impl = params[i].unsafeGetTensorImpl();
    roles_[impl] = role;
    groups_[impl] = g;
    if (names_.count(impl) != 0) continue;  // named by routing
    const auto name = detail::concat("param_groups.", g, ".", i);
    names_[impl] = name;
    report_.push_back({name, params[i].sizes().vec(), params[i].scalar_type(), role,
                       "added with add_param_group", algorithm_name(o), name, o.get_lr(), wd});
  }
}

// Groups torch::optim::Optimizer::add_param_group added behind our back.
void HybridOptimizer::adopt_added_groups(const char* who) {
  check(!partition_ || base_.size() == param_groups_.size(), who,
        ": a parameter group was added after set_partition, whose owners cover only the groups "
        "before it; add every group before set_partition");
  for (size_t g = base_.size(); g < param_groups_.size(); ++g) {
    check_group(g, who);
    adopt_group(g, std::nullopt);
  }
}

void HybridOptimizer::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  adopt_added_groups("HybridOptimizer::add_param_group");
  check(!partition_,
        "HybridOptimizer::add_param_group: set_partition's owners cover only the groups before "
        "it; add every group before set_partition");
  Optimizer::add_param_group(group);
  compat::keep_group_options(param_groups_, param_groups_.size() - 1, {group});
  try {
    check_group(param_groups_.size() - 1, "HybridOptimizer::add_param_group");
  } catch (...) {
    param_groups_.pop_back();
    throw;
  }
  adopt_group(param_groups_.size() - 1, std::nullopt);
}

// The configured group (the report's) of group g's parameters, if it has any yet.
std::optional<std::string> HybridOptimizer::configured_group(size_t g) const {
  for (const auto& p : param_groups_[g].params()) {
    const auto name = names_.find(p.unsafeGetTensorImpl());
    if (name == names_.end()) continue;
    for (const auto& r : report_) {
      if (r.name == name->second) return r.group;
    }
  }
  return std::nullopt;
}

// Whether group g's algorithm takes `p` as its parameter i (orthogonalized in `view`): what its
// step checks of a parameter, and of the gradient when there is one.
void HybridOptimizer::check_new_param(size_t g, size_t i, const at::Tensor& p,
                                      const std::vector<int64_t>& view) const {
  const auto where = detail::concat("parameter ", i, " of param group ", g);
  visit_algorithm(param_groups_[g].options(), [&](const auto& o) {
    using Entry = Algorithm<std::decay_t<decltype(o)>>;
    if constexpr (Entry::kind == ParamKind::matrices) {
      check_muon_param(p, where, algorithm_title(Entry::name).c_str());
      if (!p.grad().defined()) return;
    }
    check_item(p, p.grad(), o, view, where);
  });
}

// Drops what this optimizer keeps of `param`: its state, name, role, group and view (its report
// row stays for replace_params to pass on or drop).
void HybridOptimizer::forget(const at::Tensor& param) {
  const auto* impl = param.unsafeGetTensorImpl();
  state_.erase(compat::param_state_key(param));
  names_.erase(impl);
  roles_.erase(impl);
  groups_.erase(impl);
  views_.erase(impl);
}

void HybridOptimizer::replace_params(const std::vector<std::vector<at::Tensor>>& params) {
  const char* who = "HybridOptimizer: param_groups changed";
  adopt_added_groups("HybridOptimizer::replace_params");
  check(params.size() == param_groups_.size(), who, ": ", params.size(), " parameter lists for ",
        param_groups_.size(), " param groups");
  check(parallel_ == nullptr && !partition_, who,
        ", but this optimizer trains on several ranks, whose owners were planned over the "
        "parameters as they were; build it again over the new parameters");
  // A tensor stays when it is in the same group as before; any other is new there (a tensor
  // moved to another group starts afresh), and one that left makes room for a new one at its
  // index, which takes its place.
  std::vector<std::set<const void*>> listed(params.size());
  std::set<const void*> anywhere;
  for (size_t g = 0; g < params.size(); ++g) {
    for (size_t i = 0; i < params[g].size(); ++i) {
      const auto* impl = params[g][i].unsafeGetTensorImpl();
      check(anywhere.insert(impl).second, who, ": parameter ", i, " of param group ", g,
            " is listed twice; a parameter belongs to one group, once");
      listed[g].insert(impl);
    }
  }
  const auto stays = [&](const at::Tensor& p, size_t g) {
    const auto it = groups_.find(p.unsafeGetTensorImpl());
    return it != groups_.end() && it->second == g && listed[g].count(it->first) != 0;
  };
  struct Arrival {
    size_t g, i;
    const at::Tensor* replaces;  // the tensor that left from index i, or null
  };
  std::vector<Arrival> arrivals;
  for (size_t g = 0; g < params.size(); ++g) {
    const auto& old = param_groups_[g].params();
    for (size_t i = 0; i < params[g].size(); ++i) {
      const auto& p = params[g][i];
      if (stays(p, g)) continue;
      const bool replaces = i < old.size() && !stays(old[i], g);
      const bool same_shape = replaces && old[i].sizes() == p.sizes();
      check_new_param(g, i, p, same_shape ? matrix_view(old[i]) : p.sizes().vec());
      arrivals.push_back({g, i, replaces ? &old[i] : nullptr});
    }
  }
  // Checked: from here nothing throws but allocation. A stand-in takes the name, report row and
  // (for the same shape) view of the tensor it replaces.
  std::map<const void*, std::pair<std::string, std::optional<std::vector<int64_t>>>> left;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const auto& p : param_groups_[g].params()) {
      if (stays(p, g)) continue;
      const auto* impl = p.unsafeGetTensorImpl();
      const auto view = views_.find(impl);
      left[impl] = {names_.at(impl),
                    view == views_.end() ? std::nullopt : std::optional(view->second)};
      forget(p);
    }
  }
  std::set<std::string> names;  // taken: the trainable tensors' and the frozen ones'
  for (const auto& [impl, name] : names_) names.insert(name);
  for (const auto& row : report_) {
    if (row.role == Role::frozen) names.insert(row.name);
  }
  for (const auto& a : arrivals) {
    const auto& p = params[a.g][a.i];
    const auto* impl = p.unsafeGetTensorImpl();
    std::string name;
    if (a.replaces != nullptr) {
      const auto& [previous, view] = left.at(a.replaces->unsafeGetTensorImpl());
      name = previous;
      if (view && a.replaces->sizes() == p.sizes()) views_[impl] = *view;
    } else {
      const auto& o = param_groups_[a.g].options();
      name = detail::concat("param_groups.", a.g, ".", a.i);
      for (int k = 1; names.count(name) != 0; ++k) {
        name = detail::concat("param_groups.", a.g, ".", a.i, ".", k);
      }
      report_.push_back({name,
                         {},
                         p.scalar_type(),
                         role_of_group(a.g),
                         "put into param_groups after construction",
                         algorithm_name(o),
                         configured_group(a.g).value_or(name),
                         o.get_lr(),
                         group_settings(o).at("weight_decay")});
    }
    for (auto& row : report_) {
      if (row.name != name) continue;
      row.shape = p.sizes().vec();
      row.dtype = p.scalar_type();
    }
    names.insert(name);
    names_[impl] = name;
    roles_[impl] = role_of_group(a.g);
    groups_[impl] = a.g;
  }
  report_.erase(std::remove_if(report_.begin(), report_.end(),
                               [&](const ParameterReport& r) {
                                 return r.role != Role::frozen && names.count(r.name) == 0;
                               }),
                report_.end());
  for (size_t g = 0; g < param_groups_.size(); ++g) param_groups_[g].params() = params[g];
}

void HybridOptimizer::set_matrix_view(const at::Tensor& param, std::vector<int64_t> view) {
  const char* who = "HybridOptimizer::set_matrix_view";
  const auto it = groups_.find(param.unsafeGetTensorImpl());
  check(it != groups_.end() && role_of_group(it->second) == Role::muon, who,
        ": the tensor of shape ", param.sizes(),
        " is not a parameter of one of this optimizer's matrices groups");
  check_matrix_view(param, view, who);
  check(state_.count(compat::param_state_key(param)) == 0 || matrix_view(param) == view, who,
        ": the parameter already has state for view ", at::IntArrayRef(matrix_view(param)),
        "; set views before its first update");
  views_[param.unsafeGetTensorImpl()] = std::move(view);
}

HybridOptimizer::Settings HybridOptimizer::settings_of(size_t g) const {
  const auto values = group_settings(param_groups_[g].options());
  const auto momentum = values.find("momentum");  // Muon's; 0 for the others
  return {values.at("lr"), values.at("weight_decay"),
          momentum != values.end() ? momentum->second : 0.0};
}

// Each group's settings that a schedule drives are the schedule's alone: one changed since the
// schedules last set it (by a torch lr scheduler, set_lr, a param_groups dict) is refused, never
// silently replaced. The others are the caller's to change between steps.
void HybridOptimizer::apply_schedules() {
  const auto& o = options_;
  const int64_t total = std::max<int64_t>(o.total_steps, 1);
  const double wd =
      o.weight_decay_schedule ? o.weight_decay_schedule->multiplier(step_count_, total) : 1.0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& base = base_[g];
    const auto& schedule = base.schedule ? base.schedule : o.schedule;
    const bool muon = role_of_group(g) == Role::muon;
    const auto now = settings_of(g);
    const struct {
      bool driven;
      const char* name;
      double now, set;
      const char* by;
    } keys[] = {{schedule.has_value(), "lr", now.lr, base.last.lr, "schedule"},
                {o.weight_decay_schedule.has_value(), "weight_decay", now.weight_decay,
                 base.last.weight_decay, "weight_decay_schedule"},
                {o.momentum_schedule && muon, "momentum", now.momentum, base.last.momentum,
                 "momentum_schedule"}};
    for (const auto& key : keys) {
      check(!key.driven || key.now == key.set, "HybridOptimizer: param group ", g, " (",
            to_string(role_of_group(g)), "): ", key.name, " was changed to ", key.now,
            " outside the optimizer (a torch lr scheduler, set_lr, param_groups?), but the ",
            key.by, " of its configuration sets it at every step (", key.set,
            " last); remove that schedule to set ", key.name, " yourself, or leave it to it");
    }
    auto& options = param_groups_[g].options();
    if (schedule) options.set_lr(base.lr * schedule->multiplier(step_count_, total, base.lr));
    auto values = group_settings(options);
    if (o.weight_decay_schedule) values["weight_decay"] = base.weight_decay * wd;
    if (o.momentum_schedule && muon)
      values["momentum"] = o.momentum_schedule->value(step_count_, total);
    set_group_settings(options, values);
    base_[g].last = settings_of(g);
  }
}

HybridOptimizer::~HybridOptimizer() = default;

std::vector<std::pair<std::string, at::Tensor>> HybridOptimizer::named_trainable() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) out.emplace_back(names_.at(p.unsafeGetTensorImpl()), p);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

Role HybridOptimizer::role_of(const at::Tensor& param) const {
  const auto it = roles_.find(param.unsafeGetTensorImpl());
  return it == roles_.end() ? Role::frozen : it->second;
}

const char* HybridOptimizer::algorithm_of(const at::Tensor& param) const {
  const auto it = groups_.find(param.unsafeGetTensorImpl());
  return it == groups_.end() ? "" : algorithm_name(param_groups_[it->second].options());
}

void HybridOptimizer::restore_counters(int64_t step_count, int64_t skipped_steps) {
  step_count_ = step_count;
  stats_.skipped_steps = skipped_steps;
  for (size_t g = 0; g < base_.size(); ++g) base_[g].last = settings_of(g);
}

void HybridOptimizer::save(torch::serialize::OutputArchive& archive) const {
  save_optimizer_state(*this, archive);
  archive.write("hybrid/step_count", c10::IValue(step_count_));
  archive.write("hybrid/skipped_steps", c10::IValue(stats_.skipped_steps));
}

void HybridOptimizer::load(torch::serialize::InputArchive& archive) {
  adopt_added_groups("HybridOptimizer::load");
  c10::IValue steps, skipped;
  check(archive.try_read("hybrid/step_count", steps) &&
            archive.try_read("hybrid/skipped_steps", skipped),
        "optimizer archive: no step counters; it was not written by a HybridOptimizer");
  load_optimizer_state(*this, archive);
  restore_counters(steps.toInt(), skipped.toInt());
  for (const auto& group : param_groups_) {  // on N ranks each keeps the state it owns
    for (const auto& p : group.params()) {
      if (!owns(p)) state_.erase(compat::param_state_key(p));
    }
  }
}

void HybridOptimizer::reset_state() {
  state_.clear();
}

void HybridOptimizer::init_state() {
  adopt_added_groups("HybridOptimizer::init_state");
  for (auto& group : param_groups_) {
    visit_algorithm(group.options(), [&](const auto& o) {
      for (const auto& p : group.params()) {
        if (owns(p)) make_state(state_[compat::param_state_key(p)], p, o, matrix_view(p));
      }
    });
  }
}

std::vector<int64_t> HybridOptimizer::matrix_view(const at::Tensor& param) const {
  const auto it = views_.find(param.unsafeGetTensorImpl());
  return it != views_.end() ? it->second : param.sizes().vec();
}

void HybridOptimizer::set_lr_multiplier(double multiplier) {
  adopt_added_groups("HybridOptimizer::set_lr_multiplier");
  for (size_t g = 0; g < base_.size(); ++g) {
    check(!base_[g].schedule && !options_.schedule,
          "HybridOptimizer::set_lr_multiplier: param "
          "group ",
          g,
          " has a learning-rate schedule, which sets lr at every step; remove it to "
          "drive lr yourself");
  }
  for (size_t g = 0; g < base_.size(); ++g) {
    param_groups_[g].options().set_lr(base_[g].lr * multiplier);
    base_[g].last.lr = base_[g].lr * multiplier;
  }
}

std::string HybridOptimizer::report_text() const {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : report_) {
    std::ostringstream shape, lr, wd;
    shape << at::IntArrayRef(r.shape);
    if (r.role != Role::frozen) {
      lr << r.lr;
      wd << r.weight_decay;
    }
    rows.push_back({r.name, shape.str(), c10::toString(r.dtype),
                    r.role == Role::frozen ? "frozen" : r.algorithm, r.group, lr.str(), wd.str(),
                    r.reason});
  }
  return detail::format_table(
      {"name", "shape", "dtype", "algorithm", "group", "lr", "wd", "reason"}, rows);
}

}  // namespace muon
