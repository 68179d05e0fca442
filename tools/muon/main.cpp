// The `muon` command line: train the demo GPT, show how a model is routed.
#include <ATen/Parallel.h>

#include <unistd.h>

#include <csignal>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>

#include "bench.h"
#include "compare.h"
#include "examples.h"
#include "launch.h"
#include "memory.h"
#include "metrics.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/routing.h"
#include "plot.h"
#include "run_flags.h"
#include "train.h"

namespace {

using muon::demo::number_in;
using muon::demo::positive_number;
using muon::demo::whole_number;

// An option holding a whole number in [least, 2^53].
template <class T>
CLI::Option* add_count(CLI::App& cmd, const char* name, T& value, const char* help,
                       int64_t least = 1) {
  return cmd.add_option(name, value, help)->check(whole_number(least))->capture_default_str();
}

// "adamw, dew, ...": the example configurations built into the program.
std::string example_names() {
  std::string names;
  for (const auto& [name, text] : muon::demo::builtin_examples()) {
    names += (names.empty() ? "" : ", ") + name;
  }
  return names;
}

void add_model_options(CLI::App& cmd, muon::demo::GptConfig& model) {
  add_count(cmd, "--layers", model.n_layers, "transformer blocks");
  add_count(cmd, "--d-model", model.d_model, "model width");
  add_count(cmd, "--heads", model.n_heads, "query heads");
  add_count(cmd, "--kv-heads", model.n_kv_heads, "key/value heads (grouped-query attention)");
  add_count(cmd, "--seq-len", model.seq_len, "context length in bytes");
}

// The threads option of train and bench (0: one per core).
CLI::Option* add_threads(CLI::App& cmd, int& threads, const char* help) {
  return cmd.add_option("--threads", threads, help)
      ->check(whole_number(0, 1024))
      ->capture_default_str();
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
    muon::demo::write_atomically(
        svg_path, muon::demo::svg_line_chart({lr, momentum, wd}, "schedules", "step", "value"));
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

// Every exception a command can end with, as one line on stderr and an exit status: 2 for input
// the checks refused, 3 for a failed data-parallel collective, 1 for anything else — an error a
// check should have caught first, reported all the same rather than ending by a signal.
int report_failure(const std::exception_ptr& failure) {
  const auto say = [](const std::string& what, int status) {
    std::cerr << "error" << rank_label() << ": " << what << '\n';
    return status;
  };
  try {
    std::rethrow_exception(failure);
  } catch (const muon::Error& e) {
    return say(e.what(), 2);
  } catch (const muon::DistributedError& e) {
    return say(e.what(), 3);
  } catch (const std::bad_alloc&) {
    return say("out of memory (the sizes given passed the estimate of what this machine holds, "
               "but an allocation failed); make the run smaller",
               1);
  } catch (const c10::Error& e) {
    return say(e.what_without_backtrace(), 1);
  } catch (const std::exception& e) {
    return say(e.what(), 1);
  } catch (...) {
    return say("an unknown exception", 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "muon — Muon + AdamW optimizers for LibTorch.\n"
      "Run `muon train` to train a small GPT on the King James Bible with the hybrid optimizer."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "muon " MUON_VERSION);

  muon::demo::ParsedFlags parsed;
  muon::demo::TrainConfig invocation;
  int threads = 0;
  auto* train = app.add_subcommand(
      "train",
      "Train the demo GPT (byte-level, RoPE, GQA, SwiGLU) with Muon for hidden matrices and AdamW "
      "for the rest. Prints progress; writes into --out: config.yaml (the run, readable by "
      "--config), routing.txt, metrics.csv and metrics.jsonl (a row per log interval, appended as "
      "logged), loss.svg (redrawn at each evaluation) and checkpoint.pt (at the end, every "
      "--checkpoint-every steps and on Ctrl-C). Ctrl-C or SIGTERM: the current step finishes, a "
      "checkpoint is written and the resume command printed; a second one exits at once.");
  const auto run_flags = muon::demo::add_run_flags(*train, parsed);
  auto* out_option =
      train->add_option("--out", invocation.out_dir, "output directory (with --resume: that one)")
          ->capture_default_str();
  add_threads(*train, threads, "intra-op threads (0: LibTorch's default)");
  std::string config_path;
  bool print_config = false;
  train
      ->add_option("--config", config_path,
                   "YAML run config: the optimizer (docs/config.md) and optional model, data and "
                   "train sections; flags given beside it override it")
      ->check(CLI::ExistingFile);
  train
      ->add_option("--resume", invocation.resume_dir,
                   "continue the run in DIR from its checkpoint: its config is the run's; "
                   "--steps, --log-every, --eval-every, --eval-batches and --checkpoint-every may "
                   "change, any other flag must agree with it")
      ->check(CLI::ExistingDirectory);
  train->add_flag("--overwrite", invocation.overwrite, "replace a run already in --out");
  int nproc = 1;
  train
      ->add_option("--nproc", nproc,
                   "data-parallel ranks to launch on this machine (loopback, Gloo); under an "
                   "external launcher set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT instead")
      ->check(whole_number(1, 256))
      ->capture_default_str();
  double dist_timeout = 120;
  train
      ->add_option("--dist-timeout", dist_timeout,
                   "seconds a rank waits for the others before failing")
      ->check(number_in(0.001, 86400))
      ->capture_default_str();
  train->add_flag("--print-config", print_config,
                  "print the run config (the YAML the run stores as config.yaml) and exit");

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
  muon::demo::CompareOptions compare_options;
  bool tune_lr = false;
  std::vector<double> lr_grid{0.25, 0.5, 1, 2, 4};
  auto* compare = app.add_subcommand(
      "compare",
      "Train the same model, data and seed under several optimizer configs; print "
      "validation loss at equal steps and steps to a target loss; write compare.csv "
      "and compare.svg.");
  compare
      ->add_option("--optimizers", compare_list,
                   "comma-separated names of the examples (examples/NAME.yaml here, else the "
                   "copy built into muon: " + example_names() +
                       ") or paths to YAML configs; the first is the baseline")
      ->capture_default_str();
  compare
      ->add_option("--target", compare_options.target,
                   "validation loss to count steps to (default: the baseline's final)")
      ->check(positive_number());
  add_count(*compare, "--steps", compare_config.steps, "optimizer updates");
  add_count(*compare, "--seed", compare_config.seed, "seed", 0);
  compare->add_option("--out", compare_config.out_dir, "output directory")->capture_default_str();
  compare->add_option("--data", compare_config.data.source, "\"kjv\" or a text file")
      ->capture_default_str();
  add_count(*compare, "--batch-size", compare_config.batch_size, "sequences per step");
  auto* compare_eval = compare
                           ->add_option("--eval-every", compare_config.eval_every,
                                        "steps between evaluations (default: steps / 10)")
                           ->check(whole_number(1));
  compare->add_flag("--tune-lr", tune_lr,
                    "train each optimizer at every rate of --lr-grid and compare the best of each");
  compare->add_option("--lr-grid", lr_grid, "rate multipliers of --tune-lr")
      ->check(positive_number())
      ->capture_default_str();
  add_count(*compare, "--log-every", compare_config.log_every, "steps between progress lines");
  add_model_options(*compare, compare_config.model);

  std::string schedule_config;
  int64_t schedule_steps = 0;
  int64_t schedule_every = 0;
  auto* schedule = app.add_subcommand(
      "schedule",
      "Print the learning-rate multiplier, Muon momentum and weight-decay multiplier a "
      "config's schedules give at each step.");
  schedule->add_option("--config", schedule_config,
                       "YAML config: an optimizer config or a whole run, as muon train reads it")
      ->required()
      ->check(CLI::ExistingFile);
  auto* schedule_steps_option =
      schedule
          ->add_option("--steps", schedule_steps,
                       "the run's length (default: the config's train.steps, else muon train's 400)")
          ->check(whole_number(1));
  add_count(*schedule, "--every", schedule_every, "print every N steps (0: about 20 rows)", 0);
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
  bench
      ->add_option("--only", bench_only,
                   "sections to run: orthogonalize, muon, load, adamw, distributed")
      ->check(CLI::IsMember({"orthogonalize", "muon", "load", "adamw", "distributed"}));
  bool bench_one_environment = false;
  bench->add_flag("--one-environment", bench_one_environment,
                  "skip the second run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset");
  bench->add_option("--json", bench_json, "also write every figure to this JSON file");
  bench->add_option("--reps", bench_config.reps, "timed repetitions per figure (the best counts)")
      ->check(whole_number(1, 1000))
      ->capture_default_str();
  add_count(*bench, "--muon-layers", bench_config.muon_layers,
            "layers of the GPT-shaped Muon step (7 matrices each)");
  add_count(*bench, "--muon-width", bench_config.muon_width, "width of those matrices");
  add_count(*bench, "--adamw-layers", bench_config.adamw_layers,
            "layers of the GPT-shaped AdamW parameter set");
  add_count(*bench, "--adamw-width", bench_config.adamw_width, "its width");
  add_count(*bench, "--dist-layers", bench_config.dist_layers,
            "layers of the demo GPT stepped on 1 and 2 ranks");
  add_count(*bench, "--dist-width", bench_config.dist_width, "its width");
  add_threads(*bench, threads,
              "threads of every library (LibTorch's intra-op pool, OpenBLAS; 0: one per core)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version: what was asked for
    const auto hint =
        muon::demo::did_you_mean(app, std::vector<std::string>(argv + 1, argv + argc));
    if (!hint.empty()) std::cerr << "error: " << hint << '\n';
    std::cerr << "error: " << e.what() << "\nRun with --help for more information.\n";
    return 2;  // a usage error, whichever CLI11 found (it numbers them 100 and up)
  }
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (*train) {
      invocation.progress_bar = isatty(STDOUT_FILENO) != 0;
      invocation.handle_signals = true;
      invocation.program = argv[0];
      const auto run = muon::demo::resolve_run(invocation, out_option->count() > 0, run_flags,
                                               config_path, std::cerr);
      if (print_config) {
        std::cout << run.to_yaml();
        return 0;
      }
      const auto timeout =
          std::chrono::milliseconds(static_cast<int64_t>(std::ceil(dist_timeout * 1000)));
      if (nproc > 1 && std::getenv("WORLD_SIZE") == nullptr) {
        return muon::demo::launch_local_ranks(nproc, without_nproc(argc, argv), timeout);
      }
      const auto result =
          muon::demo::train(run, std::cout, muon::Communicator::from_environment(timeout));
      if (result.interrupted_by != 0) return 128 + SIGINT;
    } else if (*compare) {
      std::vector<muon::demo::CompareEntry> entries;
      std::stringstream names(compare_list);
      std::string name;
      while (std::getline(names, name, ',')) entries.push_back(muon::demo::compare_entry(name));
      if (compare_eval->count() == 0) {  // at least ten points per curve
        compare_config.eval_every = std::max<int64_t>(1, compare_config.steps / 10);
        compare_config.log_every = std::min(compare_config.log_every, compare_config.eval_every);
      }
      if (tune_lr) compare_options.lr_grid = lr_grid;
      compare_config.handle_signals = true;
      const auto result = muon::demo::compare(compare_config, entries, compare_options, std::cout);
      if (result.interrupted_by != 0) return 128 + SIGINT;
    } else if (*schedule) {
      // The optimizer `muon train --config` would run, with the run's length unless given.
      const auto run = muon::demo::train_config_from_yaml_file(schedule_config);
      const int64_t steps = schedule_steps_option->count() > 0 ? schedule_steps : run.steps;
      print_schedule(run.optimizer, steps,
                     schedule_every > 0 ? schedule_every : std::max<int64_t>(1, steps / 20),
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
        muon::demo::write_atomically(bench_json, report.to_json());
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
      run.model.check();
      muon::demo::check_memory_need(4 * run.model.weight_count() + run.model.rope_bytes(),
                                    "route: the model", "its weights and RoPE tables",
                                    "--d-model, --layers or --seq-len");
      muon::demo::Gpt model(run.model);
      const auto optimizer = muon::build_optimizer(*model, run.optimizer, run.steps);
      std::cout << optimizer->report_text();
    }
  } catch (...) {
    return report_failure(std::current_exception());
  }
  return 0;
}
