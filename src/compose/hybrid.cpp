#include "muon/hybrid.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <sstream>

#include "data_parallel.h"
#include "muon/compat.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "table.h"

namespace muon {

// The groups the hybrid optimizer is built from, decided before its base class exists.
struct HybridOptimizer::Plan {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<Role> group_roles;
  std::vector<ParameterReport> report;
  std::vector<std::pair<at::Tensor, std::vector<int64_t>>> views;  // Muon views to declare
  std::map<const void*, std::string> names;
  std::map<const void*, Role> roles;
  std::vector<std::optional<LrSchedule>> group_schedules;
};

namespace {

// The values of 0-d tensors on any devices, in order, with one transfer per device.
std::vector<double> host_values(const std::vector<at::Tensor>& scalars) {
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < scalars.size(); ++i) by_device[scalars[i].device().str()].push_back(i);
  std::vector<double> out(scalars.size());
  for (const auto& [device, indices] : by_device) {
    std::vector<at::Tensor> same;
    for (const size_t i : indices) same.push_back(scalars[i]);
    const auto host = at::stack(same).to(at::kCPU, at::kDouble);
    const auto values = host.accessor<double, 1>();
    for (size_t j = 0; j < indices.size(); ++j) out[indices[j]] = values[static_cast<int64_t>(j)];
  }
  return out;
}

std::vector<ParamGroupSpec> groups_or_default(const HybridOptions& options) {
  if (!options.groups.empty()) return options.groups;
  return {ParamGroupSpec{"default", {"*"}}};
}

// Every option that does not depend on the parameters.
void check_hybrid_options(const HybridOptions& options) {
  check_options(options.muon);
  if (options.qk_clip_tau) {
    check(std::isfinite(*options.qk_clip_tau) && *options.qk_clip_tau > 0,
          "qk_clip: tau must be > 0, got ", *options.qk_clip_tau);
  }
  const bool scheduled =
      options.schedule || options.momentum_schedule || options.weight_decay_schedule;
  check(!scheduled || options.total_steps > 0,
        "schedules need total_steps > 0 (the run's length), got ", options.total_steps);
  if (options.schedule) options.schedule->check(options.total_steps);
  if (options.momentum_schedule) options.momentum_schedule->check();
  for (const auto& g : options.groups) {
    if (g.schedule) g.schedule->check(std::max<int64_t>(options.total_steps, 1));
  }
  if (options.max_grad_norm) {
    check(std::isfinite(*options.max_grad_norm) && *options.max_grad_norm > 0,
          "max_grad_norm must be > 0, got ", *options.max_grad_norm);
  }
}

}  // namespace

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 MuonOptions muon_options, AdamWOptions adamw_options)
    : HybridOptimizer(routes, HybridOptions{std::move(muon_options), std::move(adamw_options)}) {}

// Decides the libtorch param groups — one per (parameter group, role, decayed or not) — before
// the base class exists, checking the options on the way.
HybridOptimizer::Plan HybridOptimizer::make_plan(const std::vector<RoutedParameter>& routes,
                                                 const HybridOptions& options) {
  check_hybrid_options(options);
  const auto specs = groups_or_default(options);
  check_groups(specs);
  // (group, role) → hybrid group index, in order of first appearance.
  std::map<std::pair<size_t, Role>, size_t> index;
  Plan plan;
  for (const auto& r : routes) {
    const Role role = (options.all_adamw && r.role == Role::muon) ? Role::adamw : r.role;
    ParameterReport row{r.name,
                        r.tensor.sizes().vec(),
                        r.tensor.scalar_type(),
                        role,
                        role != r.role ? "optimizer adamw: every trainable parameter in "
                                         "AdamW"
                                       : r.reason,
                        "",
                        0,
                        0};
    if (role == Role::frozen) {
      plan.report.push_back(row);
      continue;
    }
    const size_t g = group_of(specs, r.name);
    const auto& spec = specs[g];
    const double base_lr = role == Role::muon ? options.muon.lr() : options.adamw.lr();
    const double base_wd =
        role == Role::muon ? options.muon.weight_decay() : options.adamw.weight_decay();
    row.group = spec.name;
    row.lr = spec.lr ? *spec.lr : base_lr * spec.lr_multiplier;
    row.weight_decay = spec.weight_decay ? *spec.weight_decay : is_no_decay(r) ? 0.0 : base_wd;
    // Parameters whose settings differ (no-decay defaults) get their own libtorch group.
    const auto key = std::make_pair(g * 2 + (row.weight_decay != base_wd), role);
    auto [it, fresh] = index.emplace(key, plan.groups.size());
    if (fresh) {
      std::unique_ptr<torch::optim::OptimizerOptions> group_options;
      if (role == Role::muon) {
        auto o = options.muon;
        o.lr(row.lr).weight_decay(row.weight_decay);
        if (spec.momentum) o.momentum(*spec.momentum);
        group_options = std::make_unique<MuonOptions>(o);
      } else {
        auto o = options.adamw;
        o.lr(row.lr).weight_decay(row.weight_decay);
        if (spec.betas) o.betas(*spec.betas);
        if (spec.eps) o.eps(*spec.eps);
        group_options = std::make_unique<AdamWOptions>(o);
      }
      plan.groups.emplace_back(std::vector<at::Tensor>{}, std::move(group_options));
      plan.group_roles.push_back(role);
      plan.group_schedules.push_back(spec.schedule);
    }
    plan.groups[it->second].params().push_back(r.tensor);
    plan.names[r.tensor.unsafeGetTensorImpl()] = r.name;
    plan.roles[r.tensor.unsafeGetTensorImpl()] = role;
    if (role == Role::muon && !r.view.empty()) plan.views.emplace_back(r.tensor, r.view);
    plan.report.push_back(row);
  }
  return plan;
}

HybridOptimizer::HybridOptimizer(const std::vector<RoutedParameter>& routes,
                                 const HybridOptions& options)
    : HybridOptimizer(make_plan(routes, options), options) {}

HybridOptimizer::HybridOptimizer(Plan plan, const HybridOptions& options)
    : Optimizer(std::move(plan.groups), std::make_unique<AdamWOptions>(options.adamw)),
      options_(options),
      report_(std::move(plan.report)),
      names_(std::move(plan.names)),
      roles_(std::move(plan.roles)) {
  // The branches get copies of the groups of their role; sync_branch_options() keeps their
  // options equal to ours, so a scheduler acting on this optimizer drives them.
  std::vector<torch::optim::OptimizerParamGroup> muon_groups, adamw_groups;
  for (size_t i = 0; i < param_groups_.size(); ++i) {
    auto& target = plan.group_roles[i] == Role::muon ? muon_groups : adamw_groups;
    target.emplace_back(param_groups_[i].params(), param_groups_[i].options().clone());
  }
  if (!muon_groups.empty()) muon_ = std::make_unique<Muon>(std::move(muon_groups), options.muon);
  if (!adamw_groups.empty()) {
    adamw_ = std::make_unique<AdamW>(std::move(adamw_groups), options.adamw);
  }
  size_t next_muon = 0, next_adamw = 0;
  for (size_t i = 0; i < param_groups_.size(); ++i) {
    if (plan.group_roles[i] == Role::muon) {
      branch_group_.emplace_back(muon_.get(), next_muon++);
    } else {
      branch_group_.emplace_back(adamw_.get(), next_adamw++);
    }
    const auto& o = param_groups_[i].options();
    const auto* muon_options = dynamic_cast<const MuonOptions*>(&o);
    const auto* adamw_options = dynamic_cast<const AdamWOptions*>(&o);
    base_.push_back({o.get_lr(),
                     muon_options ? muon_options->weight_decay() : adamw_options->weight_decay(),
                     muon_options ? muon_options->momentum() : 0.0, plan.group_schedules[i]});
  }
  for (const auto& [tensor, view] : plan.views) muon_->set_matrix_view(tensor, view);
}

void HybridOptimizer::apply_schedules() {
  const auto& o = options_;
  if (!o.schedule && !o.momentum_schedule && !o.weight_decay_schedule) {
    bool any = false;
    for (const auto& b : base_) any = any || b.schedule.has_value();
    if (!any) return;
  }
  const int64_t total = std::max<int64_t>(o.total_steps, 1);
  const double wd =
      o.weight_decay_schedule ? o.weight_decay_schedule->multiplier(step_count_, total) : 1.0;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& base = base_[g];
    const auto& schedule = base.schedule ? base.schedule : o.schedule;
    const double lr =
        base.lr * (schedule ? schedule->multiplier(step_count_, total, base.lr) : 1.0);
    auto& options = param_groups_[g].options();
    options.set_lr(lr);
    if (auto* m = dynamic_cast<MuonOptions*>(&options)) {
      m->weight_decay(base.weight_decay * wd);
      if (o.momentum_schedule) m->momentum(o.momentum_schedule->value(step_count_, total));
    } else if (auto* a = dynamic_cast<AdamWOptions*>(&options)) {
      a->weight_decay(base.weight_decay * wd);
    }
  }
}

void HybridOptimizer::sync_branch_options() {
  for (size_t i = 0; i < param_groups_.size(); ++i) {
    auto& [branch, index] = branch_group_[i];
    branch->param_groups()[index].set_options(param_groups_[i].options().clone());
  }
}

std::string HybridOptimizer::first_nonfinite_gradient() const {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      if (p.grad().defined() && !at::isfinite(p.grad()).all().item<bool>()) {
        return names_.at(p.unsafeGetTensorImpl());
      }
    }
  }
  return "?";
}

bool HybridOptimizer::clip_gradients() {
  // Each gradient's norm in fp64 on its device, fetched once per device, summed in order.
  std::vector<at::Tensor> norms;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) {
        norms.push_back(at::linalg_vector_norm(p.grad(), 2, {}, false, at::kDouble));
      }
    }
  }
  double sum = 0;
  for (const double n : host_values(norms)) sum += n * n;
  if (parallel_ != nullptr) {  // each rank holds the gradients it owns
    auto total = at::full({1}, sum, at::kDouble);
    parallel_->communicator().all_reduce(total, ReduceOp::sum);
    sum = total.item<double>();
  }
  stats_.grad_norm = std::sqrt(sum);
  stats_.clip_factor = 1;
  stats_.skipped = false;
  if (!std::isfinite(stats_.grad_norm)) {
    if (options_.nonfinite == NonfinitePolicy::error) {
      throw Error(detail::concat("non-finite gradient norm (", stats_.grad_norm, "): parameter '",
                                 first_nonfinite_gradient(),
                                 "' has NaN or Inf gradients; nothing was changed (nonfinite: "
                                 "error; `skip` drops such steps instead)"));
    }
    stats_.skipped = true;
    ++stats_.skipped_steps;
    std::cerr << "muon: skipped a step: the gradient norm is " << stats_.grad_norm
              << " (nonfinite policy: skip; " << stats_.skipped_steps << " skipped so far)\n";
    return false;
  }
  if (options_.max_grad_norm && stats_.grad_norm > *options_.max_grad_norm) {
    stats_.clip_factor = *options_.max_grad_norm / stats_.grad_norm;
    for (auto& group : param_groups_) {
      for (auto& p : group.params()) {
        if (p.grad().defined()) p.mutable_grad().mul_(stats_.clip_factor);
      }
    }
  }
  return true;
}

at::Tensor HybridOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  apply_schedules();
  sync_branch_options();
  if (muon_) muon_->check_step();
  if (adamw_) adamw_->check_step();
  std::vector<QkClipTarget> qk_targets;
  std::map<std::string, at::Tensor> qk_logits;
  const bool clipping_qk = options_.qk_clip_tau && qk_source_ != nullptr;
  if (clipping_qk) {
    qk_targets = qk_source_->qk_clip_targets();
    qk_logits = qk_source_->qk_max_logits();
    if (parallel_ != nullptr) {  // the largest logit seen by any rank
      for (auto& [layer, logits] : qk_logits) {
        auto reduced = logits.to(at::kFloat).contiguous().clone();
        parallel_->communicator().all_reduce(reduced, ReduceOp::max);
        logits = reduced;
      }
    }
    check_qk_clip(qk_targets, qk_logits, *options_.qk_clip_tau);
  }
  stats_.qk_clip.clear();
  const auto update = [this] {
    if (muon_) muon_->step();
    if (adamw_) adamw_->step();
  };
  if (parallel_ == nullptr) {
    if (!clip_gradients()) return loss;
    update();
  } else {
    parallel_->average_gradients();
    try {
      const bool proceed = clip_gradients();
      if (proceed) parallel_->update_and_gather(update);
      parallel_->restore_gradients();
      if (!proceed) return loss;
    } catch (...) {
      parallel_->restore_gradients();
      throw;
    }
  }
  if (clipping_qk) stats_.qk_clip = qk_clip(qk_targets, qk_logits, *options_.qk_clip_tau);
  ++step_count_;
  return loss;
}

HybridOptimizer::~HybridOptimizer() = default;

void HybridOptimizer::set_communicator(std::shared_ptr<Communicator> communicator,
                                       int64_t bucket_numel) {
  check(communicator != nullptr, "set_communicator: the communicator is null");
  std::vector<detail::DataParallel::Param> params;
  for (const auto& [name, p] : named_trainable()) {
    const auto role = role_of(p);
    params.push_back(
        {p, role, role == Role::muon ? muon_->matrix_view(p) : std::vector<int64_t>{}});
  }
  auto parallel = communicator->world_size() > 1
                      ? std::make_unique<detail::DataParallel>(communicator, params, bucket_numel)
                      : nullptr;
  communicator_ = std::move(communicator);
  parallel_ = std::move(parallel);
  if (parallel_ == nullptr) return;
  parallel_->broadcast_parameters();
  // State of parameters another rank owns (e.g. loaded before) is not this rank's to keep.
  for (auto* branch : {static_cast<torch::optim::Optimizer*>(muon_.get()),
                       static_cast<torch::optim::Optimizer*>(adamw_.get())}) {
    if (branch == nullptr) continue;
    for (const auto& group : branch->param_groups()) {
      for (const auto& p : group.params()) {
        if (!owns(p)) branch->state().erase(compat::param_state_key(p));
      }
    }
  }
}

int HybridOptimizer::owner_of(const at::Tensor& param) const {
  return parallel_ == nullptr ? 0 : parallel_->owner(param);
}

bool HybridOptimizer::owns(const at::Tensor& param) const {
  return parallel_ == nullptr || parallel_->owns(param);
}

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

void HybridOptimizer::restore_counters(int64_t step_count, int64_t skipped_steps) {
  step_count_ = step_count;
  stats_.skipped_steps = skipped_steps;
}

void HybridOptimizer::reset_state() {
  if (muon_) muon_->state().clear();
  if (adamw_) adamw_->state().clear();
}

void HybridOptimizer::set_lr_multiplier(double multiplier) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].options().set_lr(base_[g].lr * multiplier);
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
    rows.push_back({r.name, shape.str(), c10::toString(r.dtype), to_string(r.role), r.group,
                    lr.str(), wd.str(), r.reason});
  }
  return detail::format_table({"name", "shape", "dtype", "role", "group", "lr", "wd", "reason"},
                              rows);
}

}  // namespace muon
