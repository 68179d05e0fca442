// A whole run in one YAML file: `model`, `data` and `train` sections beside the optimizer config,
// read and written by their schemas (gpt.h, train.h).

#include <algorithm>
#include <string>

#include "muon/internal/read_file.h"
#include "muon/internal/schema_yaml.h"
#include "training/train.h"

namespace muon::cli {

namespace {

template <class S>
void read_section(const YAML::Node& root, const char* key, S& out) {
  if (!root[key]) return;
  detail::Section s(root[key], key);
  detail::read_fields(s, out);
  s.finish();
}

template <class S>
void emit_section(YAML::Emitter& out, const char* key, const S& fields) {
  out << YAML::Key << key << YAML::Value << YAML::Flow;
  detail::emit_fields(out, fields);
}

}  // namespace

OptimConfig demo_optimizer(const std::string& name, at::ScalarType state, double muon_lr,
                           double adamw_lr) {
  OptimConfig c;
  c.name = name;
  auto& h = c.hybrid;
  apply_optimizer_name(name, h);
  if (h.matrices) {
    auto matrices = group_settings(*h.matrices);  // Muon's, or Dion's from its preset
    matrices["lr"] = muon_lr;
    matrices["weight_decay"] = 0.0;
    set_group_settings(*h.matrices, matrices);
    check(set_option(*h.matrices, "state_dtype", state) || state == at::kFloat,
          "train: ", algorithm_name(*h.matrices),
          " keeps its momentum in float32; --state-dtype ", state_dtype_name(state),
          " stores the other tensors' state only with --optimizer muon or adamw");
  }
  h.others = AdamWOptions(adamw_lr).betas({0.9, 0.95}).weight_decay(0.0).state_dtype(state);
  LrSchedule s;
  s.kind = ScheduleKind::warmdown;
  s.warmup_steps = 20;
  s.warmdown_ratio = 0.4;
  s.final_lr_frac = 0.05;
  h.schedule = s;
  return c;
}

std::string TrainConfig::to_yaml() const {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::BeginMap;
  emit_section(out, "model", model);
  emit_section(out, "data", data);
  emit_section(out, "train", *this);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n" + optimizer.to_yaml();
}

namespace {

// Reads the run in `text` over `config`: each section it has replaces `config`'s keys.
// (Named configs throughout, no TrainConfig{} temporaries: for those GCC 12 warns, falsely, that
// a nested section's string may be used uninitialized.)
void read_run(const std::string& text, TrainConfig& config) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error("config: invalid YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  check(root.IsMap(), "config: expected a mapping at the top");
  read_section(root, "model", config.model);
  with_context("model", [&] { config.model.check(); });
  read_section(root, "data", config.data);
  read_section(root, "train", config);
  // Everything else is the optimizer's: its own reader checks it (and rejects unknown keys).
  for (const char* section : {"model", "data", "train"}) root.remove(section);
  if (root.size() > 0) config.optimizer = OptimConfig::from_yaml(YAML::Dump(root));
}

}  // namespace

TrainConfig train_config_from_yaml(const std::string& text) {
  TrainConfig config;
  read_run(text, config);
  return config;
}

TrainConfig train_config_from_yaml(const std::string& text, const TrainConfig& defaults) {
  auto config = defaults;
  read_run(text, config);
  return config;
}

std::string ranks_text(int64_t n) {
  return std::to_string(n) + (n == 1 ? " rank" : " ranks");
}

TrainConfig split_batch(TrainConfig run, int64_t world) {
  if (run.ranks == 0) run.ranks = world;
  const int64_t global = run.batch_size * run.ranks;
  if (global % world != 0) {
    std::string divisors;
    for (int64_t n = 1; n <= std::min<int64_t>(global, 256); ++n) {
      if (global % n == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(n);
    }
    throw Error("train: the run's global batch of " + std::to_string(global) + " sequences (" +
                std::to_string(run.batch_size) + " per rank × " + ranks_text(run.ranks) +
                ") does not divide among " + ranks_text(world) +
                "; run it on a number of ranks that divides it (--nproc " + divisors + ")");
  }
  run.batch_size = global / world;
  run.ranks = world;
  return run;
}

TrainConfig stored_train_config_from_yaml(const std::string& text) {
  auto root = YAML::Load(text);
  // Runs stored by earlier versions kept Muon's section and the routing under name adamw too,
  // where nothing reads them (and the reader refuses them now): dropped, so those runs resume.
  auto optimizer = root["optimizer"];
  if (optimizer.IsMap() && optimizer["name"].IsScalar() && optimizer["name"].Scalar() == "adamw") {
    optimizer.remove("muon");
    optimizer.remove("routing");
  }
  return train_config_from_yaml(YAML::Dump(root));
}

TrainConfig train_config_from_yaml_file(const std::string& path) {
  TrainConfig defaults;  // (not a TrainConfig{} temporary: see read_run)
  return train_config_from_yaml_file(path, defaults);
}

TrainConfig train_config_from_yaml_file(const std::string& path, const TrainConfig& defaults) {
  const auto text = detail::read_file(path, "config");
  return with_context(path, [&] { return train_config_from_yaml(text, defaults); });
}

}  // namespace muon::cli
