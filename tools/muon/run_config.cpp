// A whole run in one YAML file: `model`, `data` and `train` sections beside the optimizer config.
#include <fstream>
#include <sstream>

#include "recipe/schema_yaml.h"
#include "train.h"

namespace muon::demo {

namespace {

void read_model(detail::Section s, GptConfig& m) {
  detail::read_fields(s, m);  // every field of the model's schema (gpt.h)
  s.finish();
  with_context(s.path(), [&] { m.check(); });
}

void read_train(detail::Section s, TrainConfig& c) {
  s.read_positive("steps", c.steps);
  s.read_positive("batch_size", c.batch_size);
  s.read_positive("log_every", c.log_every);
  s.read_positive("eval_every", c.eval_every);
  s.read_positive("eval_batches", c.eval_batches);
  if (const auto v = s.integer("checkpoint_every")) {
    check(*v >= 0, s.key_path("checkpoint_every"), " must be >= 0, got ", *v);
    c.checkpoint_every = *v;
  }
  if (const auto v = s.integer("seed")) c.seed = static_cast<uint64_t>(*v);
  if (const auto v = s.integer("sample_bytes")) c.sample_bytes = *v;
  if (const auto v = s.text("sample_prompt")) c.sample_prompt = *v;
  s.finish();
}

}  // namespace

TrainConfig train_config_from_yaml(const std::string& text, TrainConfig config) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error("config: invalid YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  check(root.IsMap(), "config: expected a mapping at the top");
  if (root["model"]) read_model(detail::Section(root["model"], "model"), config.model);
  if (root["data"]) {
    detail::Section s(root["data"], "data");
    if (const auto v = s.text("source")) config.data = *v;
    if (const auto v = s.number("val_fraction")) {
      check(*v > 0 && *v < 1, s.key_path("val_fraction"), " must be in (0, 1), got ", *v);
      config.val_fraction = *v;
    }
    s.finish();
  }
  if (root["train"]) read_train(detail::Section(root["train"], "train"), config);
  // Everything else is the optimizer's: its own reader checks it (and rejects unknown keys).
  for (const char* section : {"model", "data", "train"}) root.remove(section);
  config.optimizer_config = OptimConfig::from_yaml(YAML::Dump(root));
  return config;
}

TrainConfig train_config_from_yaml_file(const std::string& path, TrainConfig defaults) {
  std::ifstream file(path);
  check(file.good(), "config: cannot read '", path, "'");
  std::ostringstream text;
  text << file.rdbuf();
  return with_context(path,
                      [&] { return train_config_from_yaml(text.str(), std::move(defaults)); });
}

}  // namespace muon::demo
