#include "compare.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "muon/error.h"
#include "plot.h"

namespace muon::demo {

CompareEntry compare_entry(const std::string& spec) {
  namespace fs = std::filesystem;
  if (fs::exists(spec)) return {fs::path(spec).stem().string(), spec};
  const auto example = fs::path("examples") / (spec + ".yaml");
  check(fs::exists(example), "compare: '", spec, "' is neither a config file nor examples/", spec,
        ".yaml (run from the repository root, or give paths)");
  return {spec, example.string()};
}

CompareResult compare(const TrainConfig& base, const std::vector<CompareEntry>& entries,
                      std::optional<double> target, std::ostream& log) {
  check(!entries.empty(), "compare: give at least one optimizer");
  CompareResult result;
  for (const auto& entry : entries) {
    auto config = base;
    config.optimizer_config = OptimConfig::from_yaml_file(entry.config);
    config.out_dir = (std::filesystem::path(base.out_dir) / entry.name).string();
    log << "=== " << entry.name << " (" << entry.config << ")\n";
    result.runs.emplace_back(entry.name, train(config, log));
  }
  result.target = target.value_or(result.runs.front().second.final_val_loss);

  std::ostringstream csv;
  csv << "optimizer,step,val_loss\n";
  std::vector<Series> curves;
  for (const auto& [name, run] : result.runs) {
    Series curve{name, {}};
    std::optional<int64_t> reached;
    for (const auto& row : run.rows) {
      if (!row.val_loss) continue;
      csv << name << ',' << row.step << ',' << *row.val_loss << '\n';
      curve.points.emplace_back(static_cast<double>(row.step), *row.val_loss);
      if (!reached && *row.val_loss <= result.target) reached = row.step;
    }
    result.steps_to_target.push_back(reached);
    curves.push_back(std::move(curve));
  }
  std::ofstream(std::filesystem::path(base.out_dir) / "compare.csv") << csv.str();
  std::ofstream(std::filesystem::path(base.out_dir) / "compare.svg") << svg_line_chart(
      curves, "validation loss, same model, data and seed", "step", "validation loss (nats/byte)");

  // Validation loss at (up to) four equal steps, then the steps each run took to the target.
  const auto& first = result.runs.front();
  std::vector<int64_t> evaluated;
  for (const auto& row : first.second.rows) {
    if (row.val_loss) evaluated.push_back(row.step);
  }
  std::vector<int64_t> shown;
  for (size_t q = 1; q <= 4 && !evaluated.empty(); ++q) {
    const auto step = evaluated[(q * evaluated.size() + 3) / 4 - 1];  // the ⌈q·n/4⌉-th
    if (shown.empty() || shown.back() != step) shown.push_back(step);
  }
  auto loss_at = [](const TrainResult& run, int64_t step) -> std::string {
    for (const auto& row : run.rows) {
      if (row.step == step && row.val_loss) return std::to_string(*row.val_loss).substr(0, 6);
    }
    return "-";
  };
  char line[256];
  log << "\n| optimizer |";
  for (const auto step : shown) log << " val @" << step << " |";
  std::snprintf(line, sizeof line, " steps to %.4f | ratio to %s |\n", result.target,
                first.first.c_str());
  log << line << "|---|";
  for (size_t i = 0; i < shown.size(); ++i) log << "---|";
  log << "---|---|\n";
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const auto& reached = result.steps_to_target[i];
    const auto& base_reached = result.steps_to_target.front();
    std::string steps = reached ? std::to_string(*reached) : "not reached";
    std::string ratio =
        (reached && base_reached)
            ? std::to_string(static_cast<double>(*reached) / static_cast<double>(*base_reached))
                  .substr(0, 4)
            : "-";
    log << "| " << result.runs[i].first << " |";
    for (const auto step : shown) log << ' ' << loss_at(result.runs[i].second, step) << " |";
    log << ' ' << steps << " | " << ratio << " |\n";
  }
  log << "\nwrote " << (std::filesystem::path(base.out_dir) / "compare.csv").string()
      << ", compare.svg\n";
  return result;
}

}  // namespace muon::demo
