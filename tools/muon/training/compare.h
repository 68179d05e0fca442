// `muon compare`: the same model, data and seed trained under several optimizer configs, each
// optionally at a grid of learning rates (its best counts).
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "training/train.h"

namespace muon::cli {

struct CompareEntry {
  std::string name;    // shown in tables and the plot
  std::string config;  // where the optimizer config came from (a path), for the reports
  std::string text;    // the optimizer config, YAML
};

struct CompareOptions {
  std::optional<double> target;  // validation loss to count steps to (default: the baseline's)
  // Learning-rate multipliers tried per optimizer (every base rate and group rate scaled); the
  // one with the lowest final validation loss is compared. Empty: each config's own rates only.
  std::vector<double> lr_grid;
};

struct CompareRun {
  std::string name;
  double lr_multiplier = 1;                      // the winner of the grid (1 without one)
  TrainResult result;                            // of that rate
  std::vector<std::pair<double, double>> sweep;  // (multiplier, final validation loss)
};

struct CompareResult {
  std::vector<CompareRun> runs;
  double target = 0;                                    // the validation loss steps are counted to
  std::vector<std::optional<int64_t>> steps_to_target;  // per run: first evaluation at or below
  int interrupted_by = 0;  // the signal that stopped a run (0: none; then nothing is reported)
};

// Resolves "name" to examples/name.yaml (relative to the working directory) or a path to a file.
CompareEntry compare_entry(const std::string& spec);

// Reads every entry's config and checks it against base.steps (errors name the file and key),
// then trains `base` once per entry and rate (into base.out_dir/<name>[/lr<multiplier>]) and
// writes compare.csv and compare.svg into base.out_dir and prints a table. A run that fails
// leaves the ones before it and their report in place. A run directory that already holds the
// same run (its checkpoint's config equal to the one it would train) is not trained again: a
// finished run is read back, an interrupted one resumes, so the same command continues a compare
// that was stopped. With base.handle_signals, SIGINT/SIGTERM stop the current run as in `muon
// train` (checkpointed) and the compare returns with interrupted_by set.
CompareResult compare(const TrainConfig& base, const std::vector<CompareEntry>& entries,
                      const CompareOptions& options, std::ostream& log);

}  // namespace muon::cli
