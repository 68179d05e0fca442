// `muon compare`: the same model, data and seed trained under several optimizer configs.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "train.h"

namespace muon::demo {

struct CompareEntry {
  std::string name;    // shown in tables and the plot
  std::string config;  // YAML file of the optimizer config
};

struct CompareResult {
  std::vector<std::pair<std::string, TrainResult>> runs;
  double target = 0;                                    // the validation loss steps are counted to
  std::vector<std::optional<int64_t>> steps_to_target;  // per run: first evaluation at or below
};

// Resolves "name" to examples/name.yaml (relative to the working directory) or a path to a file.
CompareEntry compare_entry(const std::string& spec);

// Trains `base` once per entry (into base.out_dir/<name>), then writes compare.csv and
// compare.svg into base.out_dir and prints a table. `target` defaults to the first entry's final
// validation loss.
CompareResult compare(const TrainConfig& base, const std::vector<CompareEntry>& entries,
                      std::optional<double> target, std::ostream& log);

}  // namespace muon::demo
