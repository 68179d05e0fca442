// The hybrid optimizer's plan: its options checked, and the options of each of its groups made
// from the partition's algorithms and the group's spec (muon/hybrid.h).
#include "hybrid_plan.h"

#include <algorithm>
#include <cmath>

#include "muon/algorithms.h"
#include "muon/error.h"

namespace muon::detail {

using torch::optim::OptimizerOptions;

std::vector<ParamGroupSpec> groups_or_default(const HybridOptions& options) {
  if (!options.groups.empty()) return options.groups;
  return {ParamGroupSpec{"default", {"*"}}};
}

namespace {

// One half of the partition (`field` names it in messages): valid options of an algorithm of
// `kind`; `otherwise` says what is wrong with one of the other kind.
void check_half(const char* field, const OptimizerOptions& options, ParamKind kind,
                const char* otherwise) {
  with_context(field, [&] {
    const auto& algorithm = algorithm_row(options);
    algorithm.validate(options);
    check(algorithm.kind == kind, "'", algorithm.name, "' ", otherwise, algorithm_names_text(kind));
  });
}

}  // namespace

void check_hybrid_options(const HybridOptions& options) {
  check(static_cast<bool>(options.others),
        "HybridOptions::others is empty; the parameters outside the matrices slot need one of ",
        algorithm_names_text(ParamKind::any));
  if (options.matrices) {
    check_half("HybridOptions::matrices", *options.matrices, ParamKind::matrices,
               "does not update matrices as matrices; the routed matrices need one of ");
  }
  check_half("HybridOptions::others", *options.others, ParamKind::any,
             "updates matrices only; the other parameters need one of ");
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

std::unique_ptr<OptimizerOptions> others_group_options(const OptimizerOptions& others,
                                                       const ParamGroupSpec& spec, double lr,
                                                       double weight_decay) {
  const auto& algorithm = algorithm_row(others);
  auto options = others.clone();
  auto values = algorithm.settings(*options);
  values["lr"] = lr;
  values["weight_decay"] = weight_decay;
  auto set = [&](const char* key, const char* setting, double value) {
    check(values.count(setting) != 0, "param group '", spec.name, "': ", key, " is set, but ",
          algorithm.name, " (the algorithm of its non-Muon parameters) has no ", key);
    values[setting] = value;
  };
  if (spec.betas) {
    set("betas", "beta1", std::get<0>(*spec.betas));
    set("betas", "beta2", std::get<1>(*spec.betas));
  }
  if (spec.eps) set("eps", "eps", *spec.eps);
  algorithm.set_settings(*options, values);
  return options;
}

std::unique_ptr<OptimizerOptions> matrices_group_options(const OptimizerOptions& matrices,
                                                         const ParamGroupSpec& spec, double lr,
                                                         double weight_decay, int64_t heads) {
  return visit_algorithm(matrices, [&](const auto& typed) -> std::unique_ptr<OptimizerOptions> {
    using Options = std::decay_t<decltype(typed)>;
    const char* name = Algorithm<Options>::name;
    auto options = std::make_unique<Options>(typed);
    auto values = settings_of(*options);
    values["lr"] = lr;
    values["weight_decay"] = weight_decay;
    set_settings_of(*options, values);
    const auto set = [&](const char* key, const auto& value) {
      check(set_option_of(*options, key, value), "param group '", spec.name, "': ", key,
            " is set, but ", name, " (the algorithm of its matrices) has no ", key);
    };
    if (spec.momentum) set("momentum", *spec.momentum);
    if (spec.num_heads) set("num_heads", std::optional<int64_t>(spec.num_heads));
    if (spec.split_sizes) set("split_sizes", std::optional<std::vector<int64_t>>(spec.split_sizes));
    if (heads > 0) {
      check(set_option_of(*options, "num_heads", std::optional<int64_t>(heads)), "routing split ",
            "the heads of a matrix of param group '", spec.name, "', but ", name,
            " (the algorithm of its matrices) updates whole matrices; set routing.split_heads "
            "false");
    }
    return options;
  });
}

}  // namespace muon::detail
