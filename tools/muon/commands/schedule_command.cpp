// muon schedule: the multipliers a configuration's schedules give, step by step.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands/command.h"
#include "muon/algorithms.h"
#include "training/metrics.h"
#include "training/plot.h"
#include "training/train.h"

namespace muon::cli {

namespace {

// One row per `every` steps: the multipliers the hybrid optimizer would apply; with `svg_path`,
// every step's also drawn there.
void print_schedule(const OptimConfig& c, int64_t steps, int64_t every,
                    const std::string& svg_path) {
  const auto& h = c.hybrid;
  if (h.schedule) h.schedule->check(steps);
  // The matrices' base rate and momentum (Muon's, Dion's); under name adamw AdamW's rate and no
  // momentum.
  const double peak = (h.matrices ? *h.matrices : *h.others).get_lr();
  const double base_momentum =
      h.matrices ? group_settings(*h.matrices).at("momentum") : std::nan("");
  const auto lr = [&](int64_t t) {
    return h.schedule ? h.schedule->multiplier(t, steps, peak) : 1.0;
  };
  const auto momentum = [&](int64_t t) {
    return h.momentum_schedule ? h.momentum_schedule->value(t, steps) : base_momentum;
  };
  const auto wd = [&](int64_t t) {
    return h.weight_decay_schedule ? h.weight_decay_schedule->multiplier(t, steps) : 1.0;
  };
  if (!svg_path.empty()) {
    cli::Series lrs{"lr multiplier", {}}, momenta{"momentum", {}}, wds{"wd multiplier", {}};
    for (int64_t t = 0; t < steps; ++t) {
      const auto x = static_cast<double>(t);
      lrs.points.emplace_back(x, lr(t));
      momenta.points.emplace_back(x, momentum(t));
      wds.points.emplace_back(x, wd(t));
    }
    std::vector<cli::Series> curves{lrs, wds};
    if (h.matrices) curves.insert(curves.begin() + 1, momenta);  // (no NaN curve under adamw)
    cli::write_atomically(svg_path, cli::svg_line_chart(curves, "schedules", "step", "value"));
  }
  std::printf("%8s  %12s  %10s  %10s\n", "step", "lr_multiplier", "momentum", "wd_multiplier");
  for (int64_t t = 0; t < steps; t += every) {
    char momentum_text[32] = "-";  // no momentum column under adamw: nothing runs Muon
    if (h.matrices) std::snprintf(momentum_text, sizeof momentum_text, "%.4f", momentum(t));
    std::printf("%8lld  %12.6f  %10s  %10.4f\n", static_cast<long long>(t), lr(t), momentum_text,
                wd(t));
  }
}

class Schedule : public Command {
 public:
  explicit Schedule(CLI::App& program)
      : Command(program.add_subcommand(
            "schedule",
            "Print the learning-rate multiplier, Muon momentum and weight-decay multiplier a "
            "config's schedules give at each step.")) {
    auto& cmd = *app_;
    cmd.add_option("--config", config_path_,
                   "YAML config: an optimizer config or a whole run, as muon train reads it")
        ->required()
        ->check(CLI::ExistingFile);
    steps_option_ =
        cmd.add_option("--steps", steps_,
                       "the run's length (default: the config's train.steps, else muon train's 400)")
            ->check(cli::whole_number(1));
    add_count(cmd, "--every", every_, "print every N steps (0: about 20 rows)", 0);
    cmd.add_option("--svg", svg_, "also plot the curves into this SVG file");
  }

  // The optimizer `muon train --config` would run, with the run's length unless given.
  int run(const std::vector<std::string>&) override {
    const auto run = cli::train_config_from_yaml_file(config_path_);
    const int64_t steps = steps_option_->count() > 0 ? steps_ : run.steps;
    print_schedule(run.optimizer, steps, every_ > 0 ? every_ : std::max<int64_t>(1, steps / 20),
                   svg_);
    return 0;
  }

 private:
  std::string config_path_, svg_;
  int64_t steps_ = 0, every_ = 0;
  CLI::Option* steps_option_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> schedule_command(CLI::App& program) {
  return std::make_unique<Schedule>(program);
}

}  // namespace muon::cli
