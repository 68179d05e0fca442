// muon bench: orthogonalization, the Muon and AdamW steps and data parallelism against this
// machine's own rates, in one run.
#include <ATen/Parallel.h>

#include <algorithm>
#include <iostream>

#include "bench/bench.h"
#include "commands/command.h"
#include "system/launch.h"
#include "training/metrics.h"

namespace muon::cli {

namespace {

constexpr const char* kSections[] = {"orthogonalize", "muon", "load", "adamw", "distributed"};

class Bench : public Command {
 public:
  explicit Bench(CLI::App& program)
      : Command(program.add_subcommand(
            "bench",
            "Measure orthogonalization against this machine's GEMM rate, a whole Muon step "
            "against the same math in plain ATen, and AdamW against torch::optim::AdamW and "
            "the memory bandwidth — all in one run.")) {
    auto& cmd = *app_;
    cmd.add_option("--only", only_, "sections to run: orthogonalize, muon, load, adamw, distributed")
        ->check(CLI::IsMember(std::vector<std::string>(std::begin(kSections), std::end(kSections))));
    cmd.add_flag("--one-environment", one_environment_,
                 "skip the second run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset");
    cmd.add_option("--json", json_, "also write every figure to this JSON file");
    cmd.add_option("--reps", config_.reps, "timed repetitions per figure (the best counts)")
        ->check(cli::whole_number(1, 1000))
        ->capture_default_str();
    add_count(cmd, "--muon-layers", config_.muon_layers,
              "layers of the GPT-shaped Muon step (7 matrices each)");
    add_count(cmd, "--muon-width", config_.muon_width, "width of those matrices");
    add_count(cmd, "--adamw-layers", config_.adamw_layers,
              "layers of the GPT-shaped AdamW parameter set");
    add_count(cmd, "--adamw-width", config_.adamw_width, "its width");
    add_count(cmd, "--dist-layers", config_.dist_layers,
              "layers of the demo GPT stepped on 1 and 2 ranks");
    add_count(cmd, "--dist-width", config_.dist_width, "its width");
    add_threads(cmd, config_.threads,
                "threads of every library (LibTorch's intra-op pool, OpenBLAS; 0: one per core)");
  }

  int run(const std::vector<std::string>& args) override {
    if (config_.threads > 0) at::set_num_threads(config_.threads);
    if (!only_.empty()) {
      const auto wanted = [&](const char* s) {
        return std::find(only_.begin(), only_.end(), s) != only_.end();
      };
      config_.orthogonalize = wanted("orthogonalize");
      config_.muon_step = wanted("muon");
      config_.adamw = wanted("adamw");
      config_.distributed = wanted("distributed");
      config_.load = wanted("load");
    }
    const auto report = cli::run_bench(config_, std::cout);
    if (!json_.empty()) {
      cli::write_atomically(json_, report.to_json());
      std::cout << "\nwrote " << json_ << '\n';
    }
    if (report.openblas_env != "unset" && !one_environment_) {
      const auto unset = cli::rerun_with_openblas_unset(args);
      if (!unset.empty()) cli::compare_openblas_settings(report, unset, std::cout);
    }
    return 0;
  }

 private:
  cli::BenchConfig config_;
  std::vector<std::string> only_;
  bool one_environment_ = false;
  std::string json_;
};

}  // namespace

std::unique_ptr<Command> bench_command(CLI::App& program) {
  return std::make_unique<Bench>(program);
}

}  // namespace muon::cli
