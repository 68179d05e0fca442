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
  options.matrices = muon;
  options.others = adamw;
  return options;
}

// One half of the partition (the matrices' or the others'): its options, algorithm and base rates,
// looked up once per plan.
struct Half {
  const torch::optim::OptimizerOptions& options;
  const AlgorithmRow& algorithm;
  double lr, weight_decay;
};
Half half_of(const torch::optim::OptimizerOptions& options) {
  const auto& algorithm = algorithm_row(options);
  return {options, algorithm, options.get_lr(), algorithm.settings(options).at("weight_decay")};
}

// Routing's reason for a matrix trained by the others' algorithm when the matrices slot is empty.
std::string every_parameter_in(const AlgorithmRow& others) {
  return std::string("no matrices algorithm: every trainable parameter runs ") + others.name;
}

// The role of a group running `algorithm`: matrices algorithms hold the routed matrices.
Role role_of_algorithm(const AlgorithmRow& algorithm) {
  return algorithm.kind == ParamKind::matrices ? Role::matrices : Role::others;
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
  const auto others = half_of(*options.others);
  // No matrices slot: the routed matrices train with the others.
  const auto matrices = options.matrices ? half_of(*options.matrices) : others;
  // (group, decayed or not, role, routing's head split) → hybrid group index, in order of first
  // appearance.
  std::map<std::tuple<size_t, bool, Role, int64_t>, size_t> index;
  Plan plan;
  for (const auto& r : routes) {
    const Role role = (!options.matrices && r.role == Role::matrices) ? Role::others : r.role;
    const Half& h = role == Role::matrices ? matrices : others;
    ParameterReport row{r.name,
                        r.tensor.sizes().vec(),
                        r.tensor.scalar_type(),
                        role,
                        role != r.role ? every_parameter_in(others.algorithm) : r.reason,
                        role == Role::frozen ? "" : h.algorithm.name,
                        "",
                        0,
                        0};
    if (role == Role::frozen) {
      plan.report.push_back(row);
      continue;
    }
    const size_t g = group_of(specs, r.name);
    const auto& spec = specs[g];
    row.group = spec.name;
    row.lr = spec.lr ? *spec.lr : h.lr * spec.lr_multiplier;
    row.weight_decay = spec.weight_decay ? *spec.weight_decay
                       : is_no_decay(r)  ? 0.0
                                         : h.weight_decay;
    // Parameters whose settings differ (no-decay defaults, a head split routing found where the
    // group sets no split of its own) get their own libtorch group.
    const bool group_splits = spec.num_heads || spec.split_sizes;
    const int64_t heads = role == Role::matrices && !group_splits ? r.num_heads.value_or(0) : 0;
    const auto key = std::make_tuple(g, row.weight_decay != h.weight_decay, role, heads);
    auto [it, fresh] = index.emplace(key, plan.groups.size());
    if (fresh) {
      plan.groups.emplace_back(
          std::vector<at::Tensor>{},
          role == Role::matrices
              ? matrices_group_options(h.options, spec, row.lr, row.weight_decay, heads)
              : others_group_options(h.options, spec, row.lr, row.weight_decay));
      plan.group_schedules.push_back(spec.schedule);
    }
    plan.groups[it->second].params().push_back(r.tensor);
    plan.names[r.tensor.unsafeGetTensorImpl()] = r.name;
    if (role == Role::matrices && !r.view.empty()) plan.views.emplace_back(r.tensor, r.view);
    plan.report.push_back(row);
  }
  return plan;
}

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 const HybridOptions& options)
    : HybridOptimizer(make_plan(routes, options), options) {}

HybridOptimizer::HybridOptimizer(Plan plan, const HybridOptions& options)
    : Optimizer(plan.groups, options.others->clone()),
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
  if (!options_.matrices) return;
  const ParameterReport* higher_rank = nullptr;
  bool trainable = false;
  for (const auto& r : report_) {
    if (r.role == Role::matrices) return;
    trainable = trainable || r.role != Role::frozen;
    if (r.role == Role::others && r.shape.size() > 2 && higher_rank == nullptr) higher_rank = &r;
  }
  if (!trainable) return;
  std::cerr << "muon: warning: no parameter is routed to "
            << algorithm_title(algorithm_name(*options_.matrices))
            << "; every trainable one goes to " << algorithm_name(*options_.others);
  if (higher_rank != nullptr) {
    std::cerr << " (" << higher_rank->name << " " << at::IntArrayRef(higher_rank->shape)
              << " and any other tensor of rank > 2 under routing higher_rank 'adamw'; "
                 "higher_rank 'flatten' trains each as an (out, rest) matrix)";
  }
  std::cerr << ". report_text() gives each parameter's reason.\n";
}

Role HybridOptimizer::role_of_group(size_t g) const {
  return role_of_algorithm(algorithm_row(param_groups_[g].options()));
}

void HybridOptimizer::check_group(size_t g, const std::string& who) const {
  const auto& group = param_groups_[g];
  const auto& algorithm = *with_context(detail::concat(who, ": param group ", g), [&] {
    const auto* row = &algorithm_row(group.options());
    row->validate(group.options());
    return row;
  });
  const bool matrices = algorithm.kind == ParamKind::matrices;
  const auto& title = algorithm.title;
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
  const auto& o = param_groups_[g].options();
  const auto& algorithm = algorithm_row(o);
  const auto role = role_of_algorithm(algorithm);
  const auto now = scheduled(algorithm.settings(o));
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
                       "added with add_param_group", algorithm.name, name, o.get_lr(), wd});
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
  const auto staying = tensors_staying(params, who);
  const auto arrivals = check_arrivals(params, staying);
  // Checked: from here nothing throws but allocation.
  const auto left = forget_leavers(staying);
  std::set<std::string> names;  // taken: the trainable tensors' and the frozen ones'
  for (const auto& [impl, name] : names_) names.insert(name);
  for (const auto& row : report_) {
    if (row.role == Role::frozen) names.insert(row.name);
  }
  for (const auto& a : arrivals) welcome(a, params[a.g][a.i], left, names);
  report_.erase(std::remove_if(report_.begin(), report_.end(),
                               [&](const ParameterReport& r) {
                                 return r.role != Role::frozen && names.count(r.name) == 0;
                               }),
                report_.end());
  for (size_t g = 0; g < param_groups_.size(); ++g) param_groups_[g].params() = params[g];
}

// A tensor stays when it is listed in the group it is in now; any other listed tensor is new
// there (one moved to another group starts afresh). Refuses a tensor listed twice.
std::set<const void*> HybridOptimizer::tensors_staying(
    const std::vector<std::vector<at::Tensor>>& params, const char* who) const {
  std::set<const void*> anywhere, staying;
  for (size_t g = 0; g < params.size(); ++g) {
    for (size_t i = 0; i < params[g].size(); ++i) {
      const auto* impl = params[g][i].unsafeGetTensorImpl();
      check(anywhere.insert(impl).second, who, ": parameter ", i, " of param group ", g,
            " is listed twice; a parameter belongs to one group, once");
      const auto now = groups_.find(impl);
      if (now != groups_.end() && now->second == g) staying.insert(impl);
    }
  }
  return staying;
}

// The new tensors, each checked as its group's algorithm checks a parameter; one at the index of a
// tensor that left replaces it (and is checked in its view when it has its shape).
std::vector<HybridOptimizer::Arrival> HybridOptimizer::check_arrivals(
    const std::vector<std::vector<at::Tensor>>& params,
    const std::set<const void*>& staying) const {
  const auto stays = [&](const at::Tensor& p) { return staying.count(p.unsafeGetTensorImpl()) != 0; };
  std::vector<Arrival> arrivals;
  for (size_t g = 0; g < params.size(); ++g) {
    const auto& old = param_groups_[g].params();
    for (size_t i = 0; i < params[g].size(); ++i) {
      const auto& p = params[g][i];
      if (stays(p)) continue;
      const bool replaces = i < old.size() && !stays(old[i]);
      const bool same_shape = replaces && old[i].sizes() == p.sizes();
      check_new_param(g, i, p, same_shape ? matrix_view(old[i]) : p.sizes().vec());
      arrivals.push_back({g, i, replaces ? &old[i] : nullptr});
    }
  }
  return arrivals;
}

// Forgets every held tensor that does not stay, returning the name and view (if any) of each.
std::map<const void*, HybridOptimizer::Leaver> HybridOptimizer::forget_leavers(
    const std::set<const void*>& staying) {
  std::map<const void*, Leaver> left;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto* impl = p.unsafeGetTensorImpl();
      if (staying.count(impl) != 0) continue;
      const auto view = views_.find(impl);
      left[impl] = {names_.at(impl),
                    view == views_.end() ? std::nullopt : std::optional(view->second)};
      forget(p);
    }
  }
  return left;
}

// Names, places and reports the new tensor `p`: a stand-in takes the name, report row and (for
// the same shape) view of the tensor it replaces; another gets "param_groups.<group>.<index>"
// (with a suffix where that name is taken). `names` holds the names taken.
void HybridOptimizer::welcome(const Arrival& a, const at::Tensor& p,
                              const std::map<const void*, Leaver>& left,
                              std::set<std::string>& names) {
  const auto* impl = p.unsafeGetTensorImpl();
  std::string name;
  if (a.replaces != nullptr) {
    const auto& previous = left.at(a.replaces->unsafeGetTensorImpl());
    name = previous.name;
    if (previous.view && a.replaces->sizes() == p.sizes()) views_[impl] = *previous.view;
  } else {
    const auto& o = param_groups_[a.g].options();
    const auto& algorithm = algorithm_row(o);
    name = detail::concat("param_groups.", a.g, ".", a.i);
    for (int k = 1; names.count(name) != 0; ++k) {
      name = detail::concat("param_groups.", a.g, ".", a.i, ".", k);
    }
    report_.push_back({name, {}, p.scalar_type(), role_of_algorithm(algorithm),
                       "put into param_groups after construction", algorithm.name,
                       configured_group(a.g).value_or(name), o.get_lr(),
                       algorithm.settings(o).at("weight_decay")});
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

void HybridOptimizer::set_matrix_view(const at::Tensor& param, std::vector<int64_t> view) {
  const char* who = "HybridOptimizer::set_matrix_view";
  const auto it = groups_.find(param.unsafeGetTensorImpl());
  check(it != groups_.end() && role_of_group(it->second) == Role::matrices, who,
        ": the tensor of shape ", param.sizes(),
        " is not a parameter of one of this optimizer's matrices groups");
  check_matrix_view(param, view, who);
  check(state_.count(compat::param_state_key(param)) == 0 || matrix_view(param) == view, who,
        ": the parameter already has state for view ", at::IntArrayRef(matrix_view(param)),
        "; set views before its first update");
  views_[param.unsafeGetTensorImpl()] = std::move(view);
}

HybridOptimizer::Settings HybridOptimizer::scheduled(const SettingValues& values) {
  const auto momentum = values.find("momentum");  // the matrices algorithms'; 0 for the others
  return {values.at("lr"), values.at("weight_decay"),
          momentum != values.end() ? momentum->second : 0.0};
}

HybridOptimizer::Settings HybridOptimizer::settings_now(size_t g) const {
  return scheduled(group_settings(param_groups_[g].options()));
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
    auto& options = param_groups_[g].options();
    const auto& algorithm = algorithm_row(options);
    const bool muon = algorithm.kind == ParamKind::matrices;
    const auto now = scheduled(algorithm.settings(options));
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
            algorithm.name, "): ", key.name, " was changed to ", key.now,
            " outside the optimizer (a torch lr scheduler, set_lr, param_groups?), but the ",
            key.by, " of its configuration sets it at every step (", key.set,
            " last); remove that schedule to set ", key.name, " yourself, or leave it to it");
    }
    if (schedule) options.set_lr(base.lr * schedule->multiplier(step_count_, total, base.lr));
    auto values = algorithm.settings(options);
    if (o.weight_decay_schedule) values["weight_decay"] = base.weight_decay * wd;
    if (o.momentum_schedule && muon)
      values["momentum"] = o.momentum_schedule->value(step_count_, total);
    algorithm.set_settings(options, values);
    base_[g].last = scheduled(values);
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
  for (size_t g = 0; g < base_.size(); ++g) base_[g].last = settings_now(g);
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
                    r.role == Role::frozen ? "-" : state_storage(r.name), r.reason});
  }
  return detail::format_table(
             {"name", "shape", "dtype", "algorithm", "group", "lr", "wd", "state", "reason"},
             rows) +
         cpu_bf16_note();
}

std::string HybridOptimizer::state_storage(const std::string& name) const {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto it = names_.find(p.unsafeGetTensorImpl());
      if (it != names_.end() && it->second == name) return state_storage_text(*this, p);
    }
  }
  return "";
}

// Where bf16 Newton–Schulz runs, for a Muon group that asks for it on CPU tensors: on the CPU's
// bf16 dot products, or their emulation (which is no mistake to be surprised by later).
std::string HybridOptimizer::cpu_bf16_note() const {
  for (const auto& group : param_groups_) {
    const auto* muon = dynamic_cast<const MuonOptions*>(&group.options());
    if (muon == nullptr || muon->ns_dtype() != at::kBFloat16) continue;
    for (const auto& p : group.params()) {
      if (p.device().is_cpu()) return "bf16 Newton–Schulz on the CPU: " + bf16_products() + "\n";
    }
  }
  return "";
}

}  // namespace muon
