// muon compare: the same model, data and seed under several optimizer configurations.
#include <algorithm>
#include <csignal>
#include <iostream>
#include <sstream>

#include "commands/command.h"
#include "demo/examples.h"
#include "training/compare.h"

namespace muon::cli {

namespace {

// "adamw, dew, ...": the example configurations built into the program.
std::string example_names() {
  std::string names;
  for (const auto& [name, text] : cli::builtin_examples()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

class Compare : public Command {
 public:
  explicit Compare(CLI::App& program)
      : Command(program.add_subcommand(
            "compare",
            "Train the same model, data and seed under several optimizer configs; print "
            "validation loss at equal steps and steps to a target loss; write compare.csv "
            "and compare.svg.")) {
    auto& cmd = *app_;
    config_.out_dir = "runs/compare";
    cmd.add_option("--optimizers", list_,
                   "comma-separated names of the examples (examples/NAME.yaml here, else the "
                   "copy built into muon: " + example_names() +
                       ") or paths to YAML configs; the first is the baseline")
        ->capture_default_str();
    cmd.add_option("--target", options_.target,
                   "validation loss to count steps to (default: the baseline's final)")
        ->check(cli::positive_number());
    add_count(cmd, "--steps", config_.steps, "optimizer updates");
    add_count(cmd, "--seed", config_.seed, "seed", 0);
    cmd.add_option("--out", config_.out_dir, "output directory")->capture_default_str();
    cmd.add_option("--data", config_.data.source, "\"kjv\" or a text file")->capture_default_str();
    add_count(cmd, "--batch-size", config_.batch_size, "sequences per step");
    eval_every_ = cmd.add_option("--eval-every", config_.eval_every,
                                 "steps between evaluations (default: steps / 10)")
                      ->check(cli::whole_number(1));
    cmd.add_flag("--tune-lr", tune_lr_,
                 "train each optimizer at every rate of --lr-grid and compare the best of each");
    cmd.add_option("--lr-grid", lr_grid_, "rate multipliers of --tune-lr")
        ->check(cli::positive_number())
        ->capture_default_str();
    add_count(cmd, "--log-every", config_.log_every, "steps between progress lines");
    add_model_options(cmd, config_.model);
  }

  int run(const std::vector<std::string>&) override {
    std::vector<cli::CompareEntry> entries;
    std::stringstream names(list_);
    std::string name;
    while (std::getline(names, name, ',')) entries.push_back(cli::compare_entry(name));
    if (eval_every_->count() == 0) {  // at least ten points per curve
      config_.eval_every = std::max<int64_t>(1, config_.steps / 10);
      config_.log_every = std::min(config_.log_every, config_.eval_every);
    }
    if (tune_lr_) options_.lr_grid = lr_grid_;
    config_.handle_signals = true;
    const auto result = cli::compare(config_, entries, options_, std::cout);
    return result.interrupted_by != 0 ? 128 + SIGINT : 0;
  }

 private:
  cli::TrainConfig config_;
  std::string list_ = "adamw,muon";
  cli::CompareOptions options_;
  bool tune_lr_ = false;
  std::vector<double> lr_grid_{0.25, 0.5, 1, 2, 4};
  CLI::Option* eval_every_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> compare_command(CLI::App& program) {
  return std::make_unique<Compare>(program);
}

}  // namespace muon::cli
