// Writing an OptimConfig back as YAML (the resolved settings a run uses), and build_optimizer.
#include <yaml-cpp/yaml.h>

#include <string>

#include "config_sections.h"
#include "muon/config.h"

namespace muon {
namespace {

void emit_schedule(YAML::Emitter& out, const LrSchedule& s) {
  out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << to_string(s.kind);
  out << YAML::Key << "warmup_steps" << YAML::Value << s.warmup_steps;
  switch (s.kind) {
    case ScheduleKind::cosine:
      if (s.decay_steps) out << YAML::Key << "decay_steps" << YAML::Value << *s.decay_steps;
      out << YAML::Key << "init_value" << YAML::Value << s.init_value << YAML::Key << "end_value"
          << YAML::Value << s.end_value << YAML::Key << "exponent" << YAML::Value << s.exponent;
      break;
    case ScheduleKind::linear:
      if (s.decay_start) out << YAML::Key << "decay_start" << YAML::Value << *s.decay_start;
      if (s.decay_steps) out << YAML::Key << "decay_steps" << YAML::Value << *s.decay_steps;
      out << YAML::Key << "end_value" << YAML::Value << s.end_value;
      break;
    case ScheduleKind::power:
      out << YAML::Key << "a" << YAML::Value << s.power_a << YAML::Key << "b" << YAML::Value
          << s.power_b << YAML::Key << "c" << YAML::Value << s.power_c;
      if (s.tail_start) {
        out << YAML::Key << "tail" << YAML::Value << YAML::BeginMap << YAML::Key << "start"
            << YAML::Value << *s.tail_start;
        if (s.tail_steps) out << YAML::Key << "steps" << YAML::Value << *s.tail_steps;
        out << YAML::Key << "end" << YAML::Value << s.end_value << YAML::EndMap;
      }
      break;
    case ScheduleKind::warmdown:
      out << YAML::Key << "warmdown_ratio" << YAML::Value << s.warmdown_ratio << YAML::Key
          << "final_lr_frac" << YAML::Value << s.final_lr_frac << YAML::Key << "shape"
          << YAML::Value << (s.cosine_shape ? "cosine" : "linear");
      break;
    case ScheduleKind::one_cycle:
      out << YAML::Key << "pct_start" << YAML::Value << s.pct_start << YAML::Key << "div_factor"
          << YAML::Value << s.div_factor << YAML::Key << "final_div_factor" << YAML::Value
          << s.final_div_factor;
      break;
    case ScheduleKind::exponential:
      out << YAML::Key << "decay_rate" << YAML::Value << s.decay_rate << YAML::Key
          << "transition_steps" << YAML::Value << s.transition_steps;
      break;
    case ScheduleKind::constant:
      break;
  }
  out << YAML::EndMap;
}

}  // namespace

std::string OptimConfig::to_yaml() const {
  const auto& h = hybrid;
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << name;
  // Each algorithm's options in full, by their schema names.
  detail::emit_option_sections(out, h);
  out << YAML::Key << "grad_clip" << YAML::Value;
  if (h.max_grad_norm) {
    out << *h.max_grad_norm;
  } else {
    out << YAML::Null;
  }
  out << YAML::Key << "nonfinite" << YAML::Value << enum_name(h.nonfinite);
  if (h.qk_clip_tau) {
    out << YAML::Key << "qk_clip" << YAML::Value << YAML::BeginMap << YAML::Key << "tau"
        << YAML::Value << *h.qk_clip_tau << YAML::EndMap;
  }
  if (h.schedule) {
    out << YAML::Key << "schedule" << YAML::Value;
    emit_schedule(out, *h.schedule);
  }
  if (h.momentum_schedule) {
    const auto& m = *h.momentum_schedule;
    out << YAML::Key << "momentum_schedule" << YAML::Value << YAML::BeginMap << YAML::Key << "start"
        << YAML::Value << m.start << YAML::Key << "target" << YAML::Value << m.target << YAML::Key
        << "steps" << YAML::Value << m.steps << YAML::Key << "cool_down" << YAML::Value
        << m.cool_down << YAML::Key << "warmdown_ratio" << YAML::Value << m.warmdown_ratio
        << YAML::EndMap;
  }
  if (h.weight_decay_schedule) {
    out << YAML::Key << "weight_decay_schedule" << YAML::Value
        << (h.weight_decay_schedule->cosine ? "cosine" : "constant");
  }
  if (!h.groups.empty()) {
    out << YAML::Key << "param_groups" << YAML::Value << YAML::BeginSeq;
    for (const auto& g : h.groups) {
      out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << g.name << YAML::Key
          << "patterns" << YAML::Value << YAML::Flow << g.patterns << YAML::Key << "lr_multiplier"
          << YAML::Value << g.lr_multiplier;
      if (g.lr) out << YAML::Key << "lr" << YAML::Value << *g.lr;
      if (g.weight_decay) out << YAML::Key << "weight_decay" << YAML::Value << *g.weight_decay;
      if (g.betas) {
        out << YAML::Key << "betas" << YAML::Value << YAML::Flow << YAML::BeginSeq
            << std::get<0>(*g.betas) << std::get<1>(*g.betas) << YAML::EndSeq;
      }
      if (g.eps) out << YAML::Key << "eps" << YAML::Value << *g.eps;
      if (g.momentum) out << YAML::Key << "momentum" << YAML::Value << *g.momentum;
      if (g.schedule) {
        out << YAML::Key << "schedule" << YAML::Value;
        emit_schedule(out, *g.schedule);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  out << YAML::Key << "routing" << YAML::Value << YAML::BeginMap << YAML::Key << "muon"
      << YAML::Value << YAML::Flow << routing.muon_patterns << YAML::Key << "adamw" << YAML::Value
      << YAML::Flow << routing.adamw_patterns << YAML::Key << "higher_rank" << YAML::Value
      << to_string(routing.higher_rank) << YAML::EndMap;
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::unique_ptr<HybridOptimizer> build_optimizer(const std::vector<NamedParameter>& parameters,
                                                 const OptimConfig& config, int64_t total_steps) {
  check(total_steps > 0, "build_optimizer: total_steps must be > 0, got ", total_steps);
  auto options = config.hybrid;
  options.total_steps = total_steps;
  return std::make_unique<HybridOptimizer>(route(parameters, config.routing), options);
}

std::unique_ptr<HybridOptimizer> build_optimizer(const torch::nn::Module& model,
                                                 const OptimConfig& config, int64_t total_steps) {
  return build_optimizer(named_parameters_of(model), config, total_steps);
}

}  // namespace muon
