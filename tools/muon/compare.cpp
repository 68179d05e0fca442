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

  const auto& first = result.runs.front();
  char line[256];
  std::snprintf(line, sizeof line,
                "\n| optimizer | final val loss | steps to %.4f | ratio to %s |\n", result.target,
                first.first.c_str());
  log << line << "|---|---|---|---|\n";
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const auto& reached = result.steps_to_target[i];
    const auto& base_reached = result.steps_to_target.front();
    std::string steps = reached ? std::to_string(*reached) : "not reached";
    std::string ratio =
        (reached && base_reached)
            ? std::to_string(static_cast<double>(*reached) / static_cast<double>(*base_reached))
                  .substr(0, 4)
            : "-";
    std::snprintf(line, sizeof line, "| %s | %.4f | %s | %s |\n", result.runs[i].first.c_str(),
                  result.runs[i].second.final_val_loss, steps.c_str(), ratio.c_str());
    log << line;
  }
  log << "\nwrote " << (std::filesystem::path(base.out_dir) / "compare.csv").string()
      << ", compare.svg\n";
  return result;
}

}  // namespace muon::demo
