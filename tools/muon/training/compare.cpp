#include "training/compare.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "demo/examples.h"
#include "muon/error.h"
#include "muon/internal/number_text.h"
#include "muon/internal/read_file.h"
#include "training/plot.h"

namespace muon::cli {

namespace fs = std::filesystem;

CompareEntry compare_entry(const std::string& spec) {
  if (fs::exists(spec)) {
    return {fs::path(spec).stem().string(), spec, detail::read_file(spec, "compare")};
  }
  // examples/NAME.yaml here (a repository's, maybe edited), else the copy built into muon.
  const auto example = fs::path("examples") / (spec + ".yaml");
  if (fs::exists(example)) return {spec, example.string(), detail::read_file(example, "compare")};
  std::string names;
  for (const auto& [name, text] : builtin_examples()) {
    if (name == spec) return {spec, "built-in examples/" + spec + ".yaml", text};
    names += (names.empty() ? "" : ", ") + name;
  }
  throw Error("compare: '" + spec + "' is neither a config file nor an example; the examples " +
              "are " + names);
}

namespace {

// Every rate of `config` × m: the base rates of both algorithms (the matrices' and the others')
// and the
// groups' absolute ones.
OptimConfig scaled(OptimConfig config, double m) {
  auto& h = config.hybrid;
  if (h.matrices) h.matrices->set_lr(h.matrices->get_lr() * m);
  h.others->set_lr(h.others->get_lr() * m);
  for (auto& g : h.groups) {
    if (g.lr) *g.lr *= m;
  }
  return config;
}

// Trains `config` into its out_dir unless that directory already holds this run: a finished one
// is kept (its results read back), an interrupted one continues from its checkpoint. Anything else
// there (another config, another length, no checkpoint) is replaced.
TrainResult train_or_reuse(TrainConfig config, std::ostream& log) {
  const auto dir = config.out_dir;
  std::optional<StoredRun> stored;
  if (fs::exists(fs::path(dir) / "checkpoint.pt")) {
    try {
      stored = read_stored_run(dir);
    } catch (const std::exception&) {  // unreadable or from an older version: train afresh
    }
  }
  // (On this one process: a run that records its ranks equals one that leaves them to the launch.)
  if (stored && split_batch(stored->config, 1).to_yaml() == split_batch(config, 1).to_yaml()) {
    if (stored->step >= config.steps) {
      log << "kept the finished run in " << dir << "\n";
      return finished_run(dir);
    }
    log << "continuing the run in " << dir << " from step " << stored->step << "\n";
    config.resume_dir = dir;
  }
  return train(config, log);
}

// The report of the runs so far: compare.csv, compare.svg and the table on `log`.
void report(const TrainConfig& base, CompareResult& result, std::ostream& log);

}  // namespace

CompareResult compare(const TrainConfig& base, const std::vector<CompareEntry>& entries,
                      const CompareOptions& options, std::ostream& log) {
  check(!entries.empty(), "compare: give at least one optimizer");
  // Every config is read and checked against the run's length before anything trains.
  std::vector<OptimConfig> configs;
  for (const auto& entry : entries) {
    configs.push_back(with_context(entry.config, [&] {
      auto c = OptimConfig::from_yaml(entry.text);
      c.check_steps(base.steps);
      return c;
    }));
  }
  const auto grid = options.lr_grid.empty() ? std::vector<double>{1.0} : options.lr_grid;
  CompareResult result;
  try {
    for (size_t i = 0; i < entries.size(); ++i) {
      CompareRun best{entries[i].name, 1.0, {}, {}};
      for (const double m : grid) {
        auto config = base;
        config.optimizer = scaled(configs[i], m);
        config.overwrite = true;  // compare owns its directory
        config.out_dir = (fs::path(base.out_dir) / entries[i].name).string();
        if (grid.size() > 1) config.out_dir += "/lr" + detail::shortest_text(m);
        log << "=== " << entries[i].name << " (" << entries[i].config << ")"
            << (grid.size() > 1 ? ", rates x" + detail::shortest_text(m) : "") << "\n";
        auto run = train_or_reuse(config, log);
        if (run.interrupted_by != 0) {
          log << "compare: interrupted; the same command continues it (finished runs are kept, "
                 "the interrupted one resumes from its checkpoint)\n";
          result.interrupted_by = run.interrupted_by;
          return result;
        }
        best.sweep.emplace_back(m, run.final_val_loss);
        if (best.sweep.size() == 1 || run.final_val_loss < best.result.final_val_loss) {
          best.lr_multiplier = m;
          best.result = std::move(run);
        }
      }
      result.runs.push_back(std::move(best));
    }
  } catch (const std::exception&) {
    if (!result.runs.empty()) {
      log << "\na run failed; the report of the " << result.runs.size() << " finished:\n";
      result.target = options.target.value_or(result.runs.front().result.final_val_loss);
      report(base, result, log);
    }
    throw;
  }
  result.target = options.target.value_or(result.runs.front().result.final_val_loss);
  report(base, result, log);
  return result;
}

namespace {

// A warning when a run's best rate is the smallest or largest of its grid: the optimum may lie
// beyond it, so the comparison is not yet at the tuned rate.
std::string edge_note(const CompareRun& run) {
  if (run.sweep.size() < 2) return "";
  double lowest = run.sweep.front().first, highest = lowest;
  for (const auto& [m, loss] : run.sweep) {
    lowest = std::min(lowest, m);
    highest = std::max(highest, m);
  }
  if (run.lr_multiplier != lowest && run.lr_multiplier != highest) return "";
  const bool low = run.lr_multiplier == lowest;
  return "note: " + run.name + "'s best rate ×" + detail::shortest_text(run.lr_multiplier) +
         " is the " + (low ? "smallest" : "largest") + " of --lr-grid; a " +
         (low ? "lower" : "higher") + " one may be better\n";
}

void report(const TrainConfig& base, CompareResult& result, std::ostream& log) {
  std::ostringstream csv;
  csv << "optimizer,lr_multiplier,step,val_loss\n";
  std::vector<Series> curves;
  result.steps_to_target.clear();
  for (const auto& run : result.runs) {
    Series curve{run.name, {}};
    std::optional<int64_t> reached;
    for (const auto& row : run.result.rows) {
      if (!row.val_loss) continue;
      csv << run.name << ',' << run.lr_multiplier << ',' << row.step << ',' << *row.val_loss
          << '\n';
      curve.points.emplace_back(static_cast<double>(row.step), *row.val_loss);
      if (!reached && *row.val_loss <= result.target) reached = row.step;
    }
    result.steps_to_target.push_back(reached);
    curves.push_back(std::move(curve));
  }
  std::ofstream(fs::path(base.out_dir) / "compare.csv") << csv.str();
  std::ofstream(fs::path(base.out_dir) / "compare.svg") << svg_line_chart(
      curves, "validation loss, same model, data and seed", "step", "validation loss (nats/byte)");

  // Validation loss at (up to) four equal steps, then the steps each run took to the target.
  const auto& first = result.runs.front();
  std::vector<int64_t> evaluated;
  for (const auto& row : first.result.rows) {
    if (row.val_loss && row.step > 0) evaluated.push_back(row.step);
  }
  std::vector<int64_t> shown;
  for (size_t q = 1; q <= 4 && !evaluated.empty(); ++q) {
    const auto step = evaluated[(q * evaluated.size() + 3) / 4 - 1];  // the ⌈q·n/4⌉-th
    if (shown.empty() || shown.back() != step) shown.push_back(step);
  }
  // Rounded to `decimals` places (as the header's target is), never cut.
  const auto fixed = [](double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return std::string(text);
  };
  auto loss_at = [&](const TrainResult& run, int64_t step) -> std::string {
    for (const auto& row : run.rows) {
      if (row.step == step && row.val_loss) return fixed(*row.val_loss, 4);
    }
    return "-";
  };
  const bool tuned = first.sweep.size() > 1;
  char line[256];
  log << "\n| optimizer |" << (tuned ? " best lr × |" : "");
  for (const auto step : shown) log << " val @" << step << " |";
  std::snprintf(line, sizeof line, " steps to %.4f | ratio to %s |\n", result.target,
                first.name.c_str());
  log << line << "|---|" << (tuned ? "---|" : "");
  for (size_t i = 0; i < shown.size(); ++i) log << "---|";
  log << "---|---|\n";
  for (size_t i = 0; i < result.runs.size(); ++i) {
    const auto& reached = result.steps_to_target[i];
    const auto& base_reached = result.steps_to_target.front();
    std::string steps = reached ? std::to_string(*reached) : "not reached";
    std::string ratio =
        (reached && base_reached)
            ? fixed(static_cast<double>(*reached) / static_cast<double>(*base_reached), 2)
            : "-";
    log << "| " << result.runs[i].name << " |"
        << (tuned ? " " + detail::shortest_text(result.runs[i].lr_multiplier) + " |" : "");
    for (const auto step : shown) log << ' ' << loss_at(result.runs[i].result, step) << " |";
    log << ' ' << steps << " | " << ratio << " |\n";
  }
  if (tuned) {  // every rate's final loss, so the grid's edges can be seen
    log << "\n| optimizer |";
    for (const auto& [m, loss] : first.sweep) log << " lr ×" << detail::shortest_text(m) << " |";
    log << "\n|---|";
    for (size_t i = 0; i < first.sweep.size(); ++i) log << "---|";
    log << '\n';
    for (const auto& run : result.runs) {
      log << "| " << run.name << " |";
      for (const auto& [m, loss] : run.sweep) log << ' ' << fixed(loss, 4) << " |";
      log << '\n';
    }
    for (const auto& run : result.runs) log << edge_note(run);
  }
  log << "\nwrote " << (fs::path(base.out_dir) / "compare.csv").string() << ", compare.svg\n";
}

}  // namespace

}  // namespace muon::cli
