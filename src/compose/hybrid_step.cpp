// HybridOptimizer::step and data parallelism: checks, the global gradient norm and clipping, the
// update rules over every group, QK-clip.
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <set>

#include "data_parallel.h"
#include "muon/algorithms.h"
#include "muon/compat.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/reduction.h"

namespace muon {
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

}  // namespace

void HybridOptimizer::check_step() const {
  // Without the logits QK-clip would silently do nothing.
  check(!options_.qk_clip_tau || qk_source_ != nullptr, "HybridOptimizer: QK-clip (tau ",
        options_.qk_clip_tau.value_or(0),
        ") needs the model's attention logits: call "
        "set_qk_clip_source(model) before step() (Python: optimizer.set_qk_clip_source(model)), or "
        "remove qk_clip (optimizer muonclip sets it)");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& group = param_groups_[g];
    visit_algorithm(group.options(), [&](const auto& o) {
      Algorithm<std::decay_t<decltype(o)>>::validate(o);
      for (size_t i = 0; i < group.params().size(); ++i) {
        const auto& p = group.params()[i];
        if (!p.grad().defined()) continue;
        check_item(p, p.grad(), o, matrix_view(p),
                   detail::concat("parameter ", i, " of param group ", g));
      }
    });
  }
}

// The caller's gradients, or on N ranks the averages of those this rank owns.
HybridOptimizer::Gradients HybridOptimizer::gradients() const {
  if (parallel_ != nullptr) return parallel_->average_gradients();
  Gradients grads;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) grads[p.unsafeGetTensorImpl()] = p.grad();
    }
  }
  return grads;
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

bool HybridOptimizer::clip_gradients(Gradients& grads) {
  stats_.clip_factor = 1;
  stats_.skipped = false;
  const bool ignore = options_.nonfinite == NonfinitePolicy::ignore;
  if (ignore && !options_.max_grad_norm) {  // nothing reads the norm: no pass over the gradients
    stats_.grad_norm = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  // Each gradient's norm in fp64 on its device, fetched once per device, summed in group order.
  std::vector<at::Tensor> norms;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto it = grads.find(p.unsafeGetTensorImpl());
      if (it != grads.end()) {
        norms.push_back(vector_norm(it->second, {}, false, at::kDouble));
      }
    }
  }
  double sum = 0;
  for (const double n : host_values(norms)) sum += n * n;
  if (auto* ranks = reducer()) {  // each rank holds the gradients it owns
    auto total = at::full({1}, sum, at::kDouble);
    ranks->all_reduce(total, ReduceOp::sum);
    sum = total.item<double>();
  }
  stats_.grad_norm = std::sqrt(sum);
  if (!std::isfinite(stats_.grad_norm) && ignore) return true;  // unclipped, as it came
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
    // The caller's .grad stays as it is: clipped copies (averages on N ranks are ours already).
    for (auto& [param, grad] : grads) {
      grad = parallel_ != nullptr ? grad.mul_(stats_.clip_factor) : grad * stats_.clip_factor;
    }
  }
  return true;
}

std::map<const void*, ParamPlace> HybridOptimizer::seed_places() const {
  std::map<const void*, ParamPlace> places;
  std::map<std::string, int64_t> next_index;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    const std::string algorithm = algorithm_name(param_groups_[g].options());
    for (size_t i = 0; i < params.size(); ++i) {
      places[params[i].unsafeGetTensorImpl()] = {g, i, next_index[algorithm]++};
    }
  }
  return places;
}

// Runs the rules over every parameter with a gradient in `grads` (only those in `only`, if given).
void HybridOptimizer::update(const Gradients& grads, const std::vector<at::Tensor>* only) {
  std::set<const void*> selected;
  if (only != nullptr) {
    for (const auto& p : *only) selected.insert(p.unsafeGetTensorImpl());
  }
  const auto places = seed_places();
  MatrixItemLists matrix_items;  // Muon's orthogonalized together across groups
  for (auto& group : param_groups_) {
    visit_algorithm(group.options(), [&](const auto& o) {
      using Options = std::decay_t<decltype(o)>;
      using Entry = Algorithm<Options>;
      std::vector<ItemOf<Options>> items;
      for (auto& p : group.params()) {
        const auto* impl = p.unsafeGetTensorImpl();
        const auto grad = grads.find(impl);
        if (grad == grads.end() || (only != nullptr && selected.count(impl) == 0)) continue;
        const int64_t position = places.at(impl).position;
        auto& slot = state_[compat::param_state_key(p)];
        if constexpr (Entry::kind == ParamKind::matrices) {
          auto view = matrix_view(p);
          auto& state = make_state(slot, p, o, view);
          matrix_items.of<Options>().push_back(
              {p, grad->second, &state, &o, std::move(view), position});
        } else {
          items.push_back({p, grad->second, &make_state(slot, p, o, p.sizes()), position});
        }
      }
      if constexpr (Entry::kind != ParamKind::matrices) {
        if (!items.empty()) Entry::update(o, items);
      }
    });
  }
  matrix_items.update(scratch_);
}

std::pair<std::vector<QkClipTarget>, std::map<std::string, at::Tensor>>
HybridOptimizer::qk_clip_inputs() {
  if (!options_.qk_clip_tau || qk_source_ == nullptr) return {};
  auto targets = qk_source_->qk_clip_targets();
  auto logits = qk_source_->qk_max_logits();
  if (auto* ranks = reducer()) {  // the largest logit seen by any rank
    for (auto& [layer, layer_logits] : logits) {
      auto reduced = layer_logits.to(at::kFloat).contiguous().clone();
      ranks->all_reduce(reduced, ReduceOp::max);
      layer_logits = reduced;
    }
  }
  check_qk_clip(targets, logits, *options_.qk_clip_tau);
  return {std::move(targets), std::move(logits)};
}

void HybridOptimizer::apply_qk_clip(const std::vector<QkClipTarget>& targets,
                                    const std::map<std::string, at::Tensor>& logits) {
  stats_.qk_clip.clear();
  if (!options_.qk_clip_tau || qk_source_ == nullptr) return;
  stats_.qk_clip = qk_clip(held_qk_targets(targets), logits, *options_.qk_clip_tau);
}

at::Tensor HybridOptimizer::step(LossClosure closure) {
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  adopt_added_groups("HybridOptimizer::step");
  apply_schedules();
  check_step();
  const auto [qk_targets, qk_logits] = qk_clip_inputs();
  stats_.qk_clip.clear();
  auto grads = gradients();
  if (!clip_gradients(grads)) return loss;
  if (parallel_ == nullptr) {
    update(grads, nullptr);
  } else {
    parallel_->update_and_gather(
        [&](const std::vector<at::Tensor>& owned) { update(grads, &owned); });
  }
  apply_qk_clip(qk_targets, qk_logits);
  ++step_count_;
  return loss;
}

void HybridOptimizer::begin_parameter_steps() {
  const char* why = "needs every gradient before the first update, and here each parameter is "
                    "updated as its gradient arrives";
  check(!options_.max_grad_norm, "the step inside backward: global-norm clipping (grad_clip ",
        options_.max_grad_norm.value_or(0), ") ", why,
        "; remove grad_clip, or step after backward (optimizer.step())");
  check(options_.nonfinite == NonfinitePolicy::ignore, "the step inside backward: nonfinite: ",
        enum_name(options_.nonfinite), " judges the whole step by the global gradient norm, which ",
        why, "; set nonfinite: ignore (each parameter steps as torch.optim does), or step after "
        "backward");
  check(parallel_ == nullptr && !partition_, "the step inside backward runs in one process: on several "
        "ranks the gradients are averaged across ranks before any update (docs/algorithms.md, "
        "\"The step inside backward\"); step after backward there");
  adopt_added_groups("the step inside backward");
  apply_schedules();
  for (const auto& group : param_groups_) check_group_options(group.options());
  qk_clip_inputs();  // refused now, before any parameter changes
  stats_ = StepStats{std::numeric_limits<double>::quiet_NaN(), 1, false, stats_.skipped_steps, {}};
  places_ = seed_places();
}

void HybridOptimizer::step_parameter(const at::Tensor& param) {
  at::NoGradGuard no_grad;
  const auto& place = place_of(places_, param, "the step inside backward");
  auto& group = param_groups_[place.group];
  auto& p = group.params()[place.index];
  visit_algorithm(group.options(), [&](const auto& o) {
    using Options = std::decay_t<decltype(o)>;
    using Entry = Algorithm<Options>;
    auto view = Entry::kind == ParamKind::matrices ? matrix_view(p) : p.sizes().vec();
    check_item(p, p.grad(), o, view, place.label());
    auto& state = make_state(state_[compat::param_state_key(p)], p, o, view);
    if constexpr (Entry::kind == ParamKind::matrices) {
      MatrixItemLists items;
      items.of<Options>().push_back(
          {p, p.grad(), &state, &o, std::move(view), place.position, /*grad_spent=*/true});
      items.update(scratch_);
    } else {
      Entry::update(o, {{p, p.grad(), &state, place.position}});
    }
  });
}

void HybridOptimizer::end_parameter_steps() {
  at::NoGradGuard no_grad;
  const auto [qk_targets, qk_logits] = qk_clip_inputs();
  apply_qk_clip(qk_targets, qk_logits);
  ++step_count_;
}

Communicator* HybridOptimizer::reducer() const {
  if (parallel_ != nullptr) return &parallel_->communicator();
  return partition_ ? communicator_.get() : nullptr;
}

// `targets` with the weights another rank holds (set_partition) left undefined: QK-clip leaves
// them to their owner.
std::vector<QkClipTarget> HybridOptimizer::held_qk_targets(
    std::vector<QkClipTarget> targets) const {
  if (!partition_) return targets;
  for (auto& t : targets) {
    if (!owns(t.q_weight)) t.q_weight = at::Tensor();
    if (!owns(t.k_weight)) t.k_weight = at::Tensor();
  }
  return targets;
}

void HybridOptimizer::set_communicator(std::shared_ptr<Communicator> communicator,
                                       int64_t bucket_numel) {
  check(communicator != nullptr, "set_communicator: the communicator is null");
  check(!partition_, "set_communicator: this optimizer's ranks were set by set_partition");
  adopt_added_groups("HybridOptimizer::set_communicator");
  std::vector<detail::DataParallel::Param> params;
  for (const auto& [name, p] : named_trainable()) {
    const auto role = role_of(p);
    params.push_back({p, role, role == Role::matrices ? matrix_view(p) : std::vector<int64_t>{}});
  }
  auto parallel = communicator->world_size() > 1
                      ? std::make_unique<detail::DataParallel>(communicator, params, bucket_numel)
                      : nullptr;
  communicator_ = std::move(communicator);
  parallel_ = std::move(parallel);
  if (parallel_ == nullptr) return;
  parallel_->broadcast_parameters();
  drop_state_of_others();
}

void HybridOptimizer::set_partition(std::shared_ptr<Communicator> communicator,
                                    const std::vector<std::pair<at::Tensor, int>>& owners) {
  check(communicator != nullptr, "set_partition: the communicator is null");
  check(communicator_ == nullptr, "set_partition: this optimizer's ranks are set already");
  adopt_added_groups("HybridOptimizer::set_partition");
  std::map<const void*, int> owner;
  for (const auto& [p, rank] : owners) {
    const auto* impl = p.unsafeGetTensorImpl();
    check(names_.count(impl) != 0 && role_of(p) != Role::frozen,
          "set_partition: an owned tensor (shape ", p.sizes(),
          ") is not one of this optimizer's trainable parameters");
    check(rank >= 0 && rank < communicator->world_size(), "set_partition: parameter '",
          names_.at(impl), "' has owner ", rank, ", not a rank of [0, ", communicator->world_size(),
          ")");
    owner[impl] = rank;
  }
  for (const auto& [name, p] : named_trainable()) {
    check(owner.count(p.unsafeGetTensorImpl()) != 0, "set_partition: parameter '", name,
          "' has no owner; give every trainable parameter's");
  }
  communicator_ = std::move(communicator);
  partition_ = std::move(owner);
  drop_state_of_others();
}

// State of parameters another rank owns (e.g. loaded before) is not this rank's to keep.
void HybridOptimizer::drop_state_of_others() {
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      if (!owns(p)) state_.erase(compat::param_state_key(p));
    }
  }
}

int HybridOptimizer::owner_of(const at::Tensor& param) const {
  if (partition_) {
    const auto it = partition_->find(param.unsafeGetTensorImpl());
    return it == partition_->end() ? -1 : it->second;
  }
  return parallel_ == nullptr ? 0 : parallel_->owner(param);
}

bool HybridOptimizer::owns(const at::Tensor& param) const {
  if (partition_) return owner_of(param) == communicator_->rank();
  return parallel_ == nullptr || parallel_->owns(param);
}

}  // namespace muon
