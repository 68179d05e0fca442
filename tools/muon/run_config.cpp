// A whole run in one YAML file: `model`, `data` and `train` sections beside the optimizer config,
// read and written by their schemas (gpt.h, train.h).

#include "muon/internal/read_file.h"
#include "muon/internal/schema_yaml.h"
#include "train.h"

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
  auto matrices = group_settings(h.matrices_options());  // Muon's, or Dion's from its preset
  matrices["lr"] = muon_lr;
  matrices["weight_decay"] = 0.0;
  set_group_settings(h.matrices_options(), matrices);
  check(set_option(h.matrices_options(), "state_dtype", state) || state == at::kFloat, "train: ",
        algorithm_name(h.matrices_options()), " keeps its momentum in float32; --state-dtype "
        "bfloat16 stores the other tensors' state only with --optimizer muon or adamw");
  h.adamw.lr(adamw_lr).betas({0.9, 0.95}).weight_decay(0.0).state_dtype(state);
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

TrainConfig train_config_from_yaml(const std::string& text, TrainConfig config) {
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
  return config;
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

TrainConfig train_config_from_yaml_file(const std::string& path, TrainConfig defaults) {
  const auto text = detail::read_file(path, "config");
  return with_context(path, [&] { return train_config_from_yaml(text, std::move(defaults)); });
}

}  // namespace muon::cli
