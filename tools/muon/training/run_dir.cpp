// The run directory of muon train: which files make a run, what its checkpoint says of it, and
// whether --out may receive one.
#include <filesystem>

#include "muon/checkpoint.h"
#include "muon/error.h"
#include "muon/internal/yaml_section.h"
#include "training/train.h"

namespace muon::cli {

namespace fs = std::filesystem;

namespace {

// Files of a run; a directory holding any is a run that only --resume (or overwrite) may touch.
constexpr const char* kRunFiles[] = {"checkpoint.pt", "metrics.csv", "metrics.jsonl",
                                     "config.yaml",   "routing.txt", "loss.svg"};

bool holds_a_run(const fs::path& dir) {
  for (const char* name : kRunFiles) {
    if (fs::exists(dir / name)) return true;
  }
  return false;
}

}  // namespace

void clear_run_files(const std::string& dir) {
  for (const char* name : kRunFiles) fs::remove(fs::path(dir) / name);
}

void TrainResult::take_rows(std::vector<MetricsRow> all) {
  rows = std::move(all);
  for (const auto& row : rows) {
    if (row.step == 0 && row.val_loss) initial_val_loss = *row.val_loss;
    if (row.val_loss) final_val_loss = *row.val_loss;
  }
}

TrainResult finished_run(const std::string& dir) {
  const auto stored = read_stored_run(dir);
  TrainResult result;
  result.steps_done = stored.step;
  result.take_rows(MetricsLog(dir, fs::path(dir), stored.step).rows());
  return result;
}

StoredRun read_stored_run(const std::string& dir) {
  const auto path = (fs::path(dir) / "checkpoint.pt").string();
  std::error_code error;
  check(fs::exists(path, error) || !holds_a_run(dir), "train: '", dir,
        "' holds a run that stopped before its first checkpoint (no checkpoint.pt), so it cannot "
        "be continued; start it again with --overwrite --out ", dir);
  const auto info = read_checkpoint_info(path);
  return with_context(path, [&] {
    YAML::Node root;
    try {
      root = YAML::Load(info.config_yaml);
    } catch (const YAML::Exception& e) {
      throw Error(std::string("its run config is not YAML (") + e.what() + ")");
    }
    check(root.IsMap() && root["progress"] && root["model"],
          "it does not describe its run (written by an older muon train?); start a new run");
    StoredRun stored;
    stored.step = info.step_count;
    detail::Section progress(root["progress"], "progress");
    stored.window_loss = progress.number("window_loss").value_or(0.0);
    stored.window_steps = progress.integer("window_steps").value_or(0);
    stored.elapsed_s = progress.number("elapsed_s").value_or(0.0);
    progress.finish();
    root.remove("progress");
    stored.config = stored_train_config_from_yaml(YAML::Dump(root));
    return stored;
  });
}

void check_out_dir(const TrainConfig& config) {
  const fs::path out(config.out_dir);
  std::error_code error;
  check(!fs::exists(out, error) || fs::is_directory(out, error), "train: --out '", config.out_dir,
        "' exists and is not a directory");
  const bool same_run = !config.resume_dir.empty() && fs::exists(out, error) &&
                        fs::equivalent(out, config.resume_dir, error);
  if (same_run || config.overwrite || !holds_a_run(out)) return;
  check(!fs::exists(out / "checkpoint.pt", error), "train: '", config.out_dir,
        "' holds a run already; continue it with --resume ", config.out_dir,
        ", choose another --out, or pass --overwrite to replace it");
  throw Error("train: '" + config.out_dir +
              "' holds a run that stopped before its first checkpoint, so it cannot be "
              "continued; pass --overwrite to start it again there, or choose another --out");
}

}  // namespace muon::cli
