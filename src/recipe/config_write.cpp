// Writing an OptimConfig back as YAML (the resolved settings a run uses), and build_optimizer.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>

#include "muon/config.h"
#include "muon/internal/config_sections.h"
#include "muon/internal/schema_yaml.h"

namespace muon {

std::string OptimConfig::to_yaml() const {
  const auto& h = hybrid;
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::BeginMap << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << name;
  // Each algorithm's options in full (Muon's and the routing only where a parameter can be Muon's),
  // the hybrid's own keys and the groups, by their schema names.
  detail::emit_hybrid(out, h);
  if (h.qk_clip_tau) {
    out << YAML::Key << "qk_clip" << YAML::Value << YAML::BeginMap << YAML::Key << "tau"
        << YAML::Value << detail::shortest_text(*h.qk_clip_tau) << YAML::EndMap;
  }
  if (h.matrices) {
    out << YAML::Key << "routing" << YAML::Value << YAML::BeginMap << YAML::Key << "muon"
        << YAML::Value << YAML::Flow << routing.muon_patterns << YAML::Key << "adamw" << YAML::Value
        << YAML::Flow << routing.adamw_patterns << YAML::Key << "higher_rank" << YAML::Value
        << to_string(routing.higher_rank) << YAML::Key << "split_heads" << YAML::Value
        << routing.split_heads << YAML::Key << "names" << YAML::Value << routing.use_names
        << YAML::Key << "outputs" << YAML::Value << YAML::Flow << routing.output_names
        << YAML::EndMap;
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void OptimConfig::check_steps(int64_t total_steps) const {
  const bool scheduled =
      hybrid.schedule || hybrid.momentum_schedule || hybrid.weight_decay_schedule ||
      std::any_of(hybrid.groups.begin(), hybrid.groups.end(),
                  [](const ParamGroupSpec& g) { return g.schedule.has_value(); });
  check(total_steps > 0 || (total_steps == 0 && !scheduled), "total_steps must be > 0",
        scheduled ? " (the run's length, which the configuration's schedules need: pass the number "
                    "of steps the run takes)"
                  : ", or 0 when unknown (a configuration without schedules)",
        ", got ", total_steps);
  if (hybrid.schedule) {
    with_context("optimizer.schedule", [&] { hybrid.schedule->check(total_steps); });
  }
  for (size_t i = 0; i < hybrid.groups.size(); ++i) {
    if (!hybrid.groups[i].schedule) continue;
    with_context("optimizer.param_groups[" + std::to_string(i) + "].schedule",
                 [&] { hybrid.groups[i].schedule->check(total_steps); });
  }
  if (hybrid.momentum_schedule) {
    with_context("optimizer.momentum_schedule", [&] { hybrid.momentum_schedule->check(); });
  }
}

std::unique_ptr<HybridOptimizer> build_optimizer(const std::vector<NamedParameter>& parameters,
                                                 const OptimConfig& config, int64_t total_steps) {
  return build_optimizer(route(parameters, config.routing), config, total_steps);
}

std::unique_ptr<HybridOptimizer> build_optimizer(const std::vector<RoutedParameter>& routes,
                                                 const OptimConfig& config, int64_t total_steps) {
  config.check_steps(total_steps);
  auto options = config.hybrid;
  options.total_steps = total_steps;
  return std::make_unique<HybridOptimizer>(routes, options);
}

std::unique_ptr<HybridOptimizer> build_optimizer(const torch::nn::Module& model,
                                                 const OptimConfig& config, int64_t total_steps) {
  return build_optimizer(named_parameters_of(model), config, total_steps);
}

}  // namespace muon
