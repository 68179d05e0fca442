// The `muon` command line: train the demo GPT, show how a model is routed.
#include <ATen/Parallel.h>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include <fstream>

#include "bench.h"
#include "compare.h"
#include "plot.h"
#include "launch.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/routing.h"
#include "train.h"

namespace {

void add_model_options(CLI::App& cmd, muon::demo::GptConfig& model) {
  cmd.add_option("--layers", model.n_layers, "transformer blocks")->capture_default_str();
  cmd.add_option("--d-model", model.d_model, "model width")->capture_default_str();
  cmd.add_option("--heads", model.n_heads, "query heads")->capture_default_str();
  cmd.add_option("--kv-heads", model.n_kv_heads, "key/value heads (grouped-query attention)")
      ->capture_default_str();
  cmd.add_option("--seq-len", model.seq_len, "context length in bytes")->capture_default_str();
}

// One row per `every` steps: the multipliers the hybrid optimizer would apply.
void print_schedule(const muon::OptimConfig& c, int64_t steps, int64_t every,
                    const std::string& svg_path) {
  const auto& h = c.hybrid;
  if (h.schedule) h.schedule->check(steps);
  if (!svg_path.empty()) {
    muon::demo::Series lr{"lr multiplier", {}}, momentum{"momentum", {}}, wd{"wd multiplier", {}};
    for (int64_t t = 0; t < steps; ++t) {
      const auto x = static_cast<double>(t);
      lr.points.emplace_back(x, h.schedule ? h.schedule->multiplier(t, steps, h.muon.lr()) : 1.0);
      momentum.points.emplace_back(
          x, h.momentum_schedule ? h.momentum_schedule->value(t, steps) : h.muon.momentum());
      wd.points.emplace_back(
          x, h.weight_decay_schedule ? h.weight_decay_schedule->multiplier(t, steps) : 1.0);
    }
    std::ofstream(svg_path) << muon::demo::svg_line_chart({lr, momentum, wd}, "schedules", "step",
                                                          "value");
  }
  std::printf("%8s  %12s  %10s  %10s\n", "step", "lr_multiplier", "momentum", "wd_multiplier");
  for (int64_t t = 0; t < steps; t += every) {
    const double lr = h.schedule ? h.schedule->multiplier(t, steps, h.muon.lr()) : 1.0;
    const double momentum =
        h.momentum_schedule ? h.momentum_schedule->value(t, steps) : h.muon.momentum();
    const double wd = h.weight_decay_schedule ? h.weight_decay_schedule->multiplier(t, steps) : 1.0;
    std::printf("%8lld  %12.6f  %10.4f  %10.4f\n", static_cast<long long>(t), lr, momentum, wd);
  }
}

// This program's arguments without --nproc (the launched ranks must not launch again).
std::vector<std::string> without_nproc(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
    } else if (a.rfind("--nproc=", 0) != 0) {
      out.push_back(a);
    }
  }
  return out;
}

// " (rank r of N)" under a data-parallel launch, else "".
std::string rank_label() {
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  if (rank == nullptr || world == nullptr) return "";
  return std::string(" (rank ") + rank + " of " + world + ")";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "muon — Muon + AdamW optimizers for LibTorch.\n"
      "Run `muon train` to train a small GPT on the King James Bible with the hybrid optimizer."};
  app.require_subcommand(1);

  muon::demo::TrainConfig config;
  int threads = 0;
  auto* train = app.add_subcommand(
      "train",
      "Train the demo GPT (byte-level, RoPE, GQA, SwiGLU) with Muon for hidden matrices "
      "and AdamW for the rest; prints progress and writes metrics.csv, routing.txt and "
      "config.txt into --out.");
  train->add_option("--steps", config.steps, "optimizer updates")->capture_default_str();
  train->add_option("--seed", config.seed, "seed for initialization and batches")
      ->capture_default_str();
  train->add_option("--out", config.out_dir, "output directory")->capture_default_str();
  train->add_option("--data", config.data, "\"kjv\" (Debian's bible-kjv) or a text file")
      ->capture_default_str();
  train->add_option("--batch-size", config.batch_size, "sequences per step")->capture_default_str();
  train
      ->add_option("--optimizer", config.optimizer,
                   "muon: Muon for hidden matrices + AdamW for the rest; adamw: AdamW for all")
      ->check(CLI::IsMember({"muon", "adamw"}))
      ->capture_default_str();
  std::string state_dtype = "float32";
  train
      ->add_option("--state-dtype", state_dtype,
                   "optimizer state storage: float32, or bfloat16 (stochastic rounding)")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  train->add_option("--muon-lr", config.muon_lr, "peak learning rate of the Muon matrices")
      ->capture_default_str();
  train->add_option("--adamw-lr", config.adamw_lr, "peak learning rate of the AdamW tensors")
      ->capture_default_str();
  train->add_option("--log-every", config.log_every, "steps between progress lines")
      ->capture_default_str();
  train->add_option("--eval-every", config.eval_every, "steps between validation evaluations")
      ->capture_default_str();
  train->add_option("--threads", threads, "intra-op threads (0: LibTorch's default)")
      ->capture_default_str();
  std::string config_path;
  bool print_config = false;
  train
      ->add_option("--config", config_path,
                   "YAML run config: optimizer (docs/config.md) and optional model, data and "
                   "train sections; its optimizer replaces --optimizer, --state-dtype, "
                   "--muon-lr and --adamw-lr, its sections override the other flags")
      ->check(CLI::ExistingFile);
  train
      ->add_option("--resume", config.resume_dir,
                   "continue from DIR/checkpoint.pt (weights, optimizer state, step)")
      ->check(CLI::ExistingDirectory);
  train
      ->add_option("--checkpoint-every", config.checkpoint_every,
                   "also write checkpoint.pt every N steps (0: at the end only)")
      ->capture_default_str();
  int nproc = 1;
  train->add_option("--nproc", nproc,
                    "data-parallel ranks to launch on this machine (loopback, Gloo); under an "
                    "external launcher set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT instead")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  double dist_timeout = 120;
  train->add_option("--dist-timeout", dist_timeout,
                    "seconds a rank waits for the others before failing")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  train->add_flag("--print-config", print_config,
                  "print the resolved optimizer config (defaults filled) and exit");
  add_model_options(*train, config.model);

  muon::demo::GptConfig route_model;
  bool untied = false;
  auto* route =
      app.add_subcommand("route",
                         "Print the routing report of the demo GPT: each parameter's shape, dtype, "
                         "optimizer (muon/adamw/frozen) and the reason.");
  route->add_flag("--untied", untied, "give the head its own weight instead of the embedding's");
  std::string route_config;
  route->add_option("--config", route_config, "YAML run config: its model and optimizer")
      ->check(CLI::ExistingFile);
  add_model_options(*route, route_model);

  muon::demo::TrainConfig compare_config;
  compare_config.out_dir = "runs/compare";
  std::string compare_list = "adamw,muon";
  std::optional<double> compare_target;
  auto* compare = app.add_subcommand(
      "compare",
      "Train the same model, data and seed under several optimizer configs; print "
      "validation loss at equal steps and steps to a target loss; write compare.csv "
      "and compare.svg.");
  compare
      ->add_option("--optimizers", compare_list,
                   "comma-separated names of examples/*.yaml (run from the repository root) "
                   "or paths to YAML configs; the first is the baseline")
      ->capture_default_str();
  compare->add_option("--target", compare_target,
                      "validation loss to count steps to (default: the baseline's final)");
  compare->add_option("--steps", compare_config.steps, "optimizer updates")->capture_default_str();
  compare->add_option("--seed", compare_config.seed, "seed")->capture_default_str();
  compare->add_option("--out", compare_config.out_dir, "output directory")->capture_default_str();
  compare->add_option("--data", compare_config.data, "\"kjv\" or a text file")
      ->capture_default_str();
  compare->add_option("--batch-size", compare_config.batch_size, "sequences per step")
      ->capture_default_str();
  compare->add_option("--eval-every", compare_config.eval_every, "steps between evaluations")
      ->capture_default_str();
  compare->add_option("--log-every", compare_config.log_every, "steps between progress lines")
      ->capture_default_str();
  add_model_options(*compare, compare_config.model);

  std::string schedule_config;
  int64_t schedule_steps = 1000;
  int64_t schedule_every = 0;
  auto* schedule = app.add_subcommand(
      "schedule",
      "Print the learning-rate multiplier, Muon momentum and weight-decay multiplier a "
      "config's schedules give at each step.");
  schedule->add_option("--config", schedule_config, "YAML optimizer config")
      ->required()
      ->check(CLI::ExistingFile);
  schedule->add_option("--steps", schedule_steps, "the run's length")->capture_default_str();
  schedule->add_option("--every", schedule_every, "print every N steps (0: about 20 rows)")
      ->capture_default_str();
  std::string schedule_svg;
  schedule->add_option("--svg", schedule_svg, "also plot the curves into this SVG file");

  muon::demo::BenchConfig bench_config;
  std::string bench_json;
  std::vector<std::string> bench_only;
  auto* bench = app.add_subcommand(
      "bench",
      "Measure orthogonalization against this machine's GEMM rate, a whole Muon step "
      "against the same math in plain ATen, and AdamW against torch::optim::AdamW and "
      "the memory bandwidth — all in one run.");
  bench->add_option("--only", bench_only,
                    "sections to run: orthogonalize, muon, load, adamw, distributed")
      ->check(CLI::IsMember({"orthogonalize", "muon", "load", "adamw", "distributed"}));
  bool bench_one_environment = false;
  bench->add_flag("--one-environment", bench_one_environment,
                  "skip the second run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset");
  bench->add_option("--json", bench_json, "also write every figure to this JSON file");
  bench->add_option("--reps", bench_config.reps, "timed repetitions per figure (the best counts)")
      ->capture_default_str();
  bench
      ->add_option("--muon-layers", bench_config.muon_layers,
                   "layers of the GPT-shaped Muon step (7 matrices each)")
      ->capture_default_str();
  bench->add_option("--muon-width", bench_config.muon_width, "width of those matrices")
      ->capture_default_str();
  bench
      ->add_option("--adamw-layers", bench_config.adamw_layers,
                   "layers of the GPT-shaped AdamW parameter set")
      ->capture_default_str();
  bench->add_option("--adamw-width", bench_config.adamw_width, "its width")->capture_default_str();
  bench->add_option("--dist-layers", bench_config.dist_layers,
                    "layers of the demo GPT stepped on 1 and 2 ranks")
      ->capture_default_str();
  bench->add_option("--dist-width", bench_config.dist_width, "its width")->capture_default_str();
  bench
      ->add_option("--threads", threads,
                   "threads of every library (LibTorch's intra-op pool, OpenBLAS; 0: one per core)")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (*train) {
      config.state_dtype = state_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
      if (!config_path.empty()) {
        config = muon::demo::train_config_from_yaml_file(config_path, config);
      }
      if (print_config) {
        std::cout
            << (config.optimizer_config ? *config.optimizer_config : muon::OptimConfig()).to_yaml();
        return 0;
      }
      config.progress_bar = isatty(STDOUT_FILENO) != 0;
      const auto timeout =
          std::chrono::milliseconds(static_cast<int64_t>(std::ceil(dist_timeout * 1000)));
      if (nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) {
        return muon::demo::launch_local_ranks(nproc, without_nproc(argc, argv), timeout);
      }
      muon::demo::train(config, std::cout, muon::Communicator::from_environment(timeout));
    } else if (*compare) {
      std::vector<muon::demo::CompareEntry> entries;
      std::stringstream names(compare_list);
      std::string name;
      while (std::getline(names, name, ',')) entries.push_back(muon::demo::compare_entry(name));
      muon::demo::compare(compare_config, entries, compare_target, std::cout);
    } else if (*schedule) {
      const auto c = muon::OptimConfig::from_yaml_file(schedule_config);
      print_schedule(
          c, schedule_steps,
          schedule_every > 0 ? schedule_every : std::max<int64_t>(1, schedule_steps / 20),
          schedule_svg);
    } else if (*bench) {
      if (!bench_only.empty()) {
        auto wanted = [&](const char* s) {
          return std::find(bench_only.begin(), bench_only.end(), s) != bench_only.end();
        };
        bench_config.orthogonalize = wanted("orthogonalize");
        bench_config.muon_step = wanted("muon");
        bench_config.adamw = wanted("adamw");
        bench_config.distributed = wanted("distributed");
        bench_config.load = wanted("load");
      }
      bench_config.threads = threads;
      const auto report = muon::demo::run_bench(bench_config, std::cout);
      if (!bench_json.empty()) {
        std::ofstream(bench_json) << report.to_json();
        std::cout << "\nwrote " << bench_json << '\n';
      }
      if (report.openblas_env != "unset" && !bench_one_environment) {
        const auto unset =
            muon::demo::rerun_with_openblas_unset(std::vector<std::string>(argv, argv + argc));
        if (!unset.empty()) muon::demo::compare_openblas_settings(report, unset, std::cout);
      }
    } else if (*route) {
      route_model.tie_embeddings = !untied;
      muon::demo::TrainConfig run;
      run.model = route_model;
      if (!route_config.empty()) run = muon::demo::train_config_from_yaml_file(route_config, run);
      muon::demo::Gpt model(run.model);
      const auto optimizer =
          run.optimizer_config
              ? muon::build_optimizer(*model, *run.optimizer_config, run.steps)
              : std::make_unique<muon::HybridOptimizer>(muon::route(*model), hybrid_options(run));
      std::cout << optimizer->report_text();
    }
  } catch (const muon::Error& e) {
    std::cerr << "error" << rank_label() << ": " << e.what() << '\n';
    return 2;
  } catch (const muon::DistributedError& e) {
    std::cerr << "error" << rank_label() << ": " << e.what() << '\n';
    return 3;
  }
  return 0;
}
