// muon train: the demo GPT with the hybrid optimizer, on one process or --nproc ranks.
#include <ATen/Parallel.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "commands/command.h"
#include "muon/distributed.h"
#include "system/launch.h"
#include "system/threads.h"
#include "training/train.h"

namespace muon::cli {

namespace {

// The ranks of this launch: WORLD_SIZE under a launcher (a malformed one counts 1 here and is
// reported by Communicator::from_environment), else --nproc.
int64_t launch_world(int nproc) {
  const char* text = std::getenv("WORLD_SIZE");
  if (text == nullptr) return nproc;
  char* end = nullptr;
  const long long world = std::strtoll(text, &end, 10);
  return end != text && *end == '\0' && world >= 1 ? world : 1;
}

// Sets this process's threads (threads.h: LibTorch's pool and OpenBLAS's alike, unless
// OPENBLAS_NUM_THREADS chose OpenBLAS's; with several, idle ones sleep) and notes why for the
// run's header line.
void use_threads(int requested, const std::vector<std::string>& args, TrainConfig& invocation) {
  const auto choice = train_threads(requested);
  sleep_idle_threads(choice.threads, args);
  at::set_num_threads(choice.threads);
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) set_openblas_threads(choice.threads);
  invocation.threads_reason = choice.reason;
  if (const char* policy = std::getenv("OMP_WAIT_POLICY"); policy != nullptr && choice.threads > 1) {
    invocation.threads_reason += ", OMP_WAIT_POLICY=" + std::string(policy);
  }
}

class Train : public Command {
 public:
  explicit Train(CLI::App& program)
      : Command(program.add_subcommand(
            "train",
            "Train the demo GPT (byte-level, RoPE, GQA, SwiGLU) with Muon for hidden matrices and "
            "AdamW for the rest. Prints progress; writes into --out: config.yaml (the run, "
            "readable by --config), routing.txt, metrics.csv and metrics.jsonl (a row per log "
            "interval, appended as logged), loss.svg (redrawn at each evaluation) and "
            "checkpoint.pt (at the end, every --checkpoint-every steps and on Ctrl-C). Ctrl-C or "
            "SIGTERM: the current step finishes, a checkpoint is written and the resume command "
            "printed; a second one exits at once.")) {
    auto& cmd = *app_;
    run_flags_ = cli::add_run_flags(cmd, parsed_);
    out_ = cmd.add_option("--out", invocation_.out_dir,
                          "output directory (with --resume: that one)")
               ->capture_default_str();
    add_threads(cmd, threads_,
                "threads of LibTorch's intra-op pool and OpenBLAS's (0: OMP_NUM_THREADS when "
                "set, else every usable CPU); with several, idle ones sleep "
                "(OMP_WAIT_POLICY=passive unless set)");
    cmd.add_option("--config", config_path_,
                   "YAML run config: the optimizer (docs/config.md) and optional model, data and "
                   "train sections; flags given beside it override it")
        ->check(CLI::ExistingFile);
    cmd.add_option("--resume", invocation_.resume_dir,
                   "continue the run in DIR from its checkpoint: its config is the run's; "
                   "--steps, --log-every, --eval-every, --eval-batches and --checkpoint-every may "
                   "change, any other flag must agree with it")
        ->check(CLI::ExistingDirectory);
    cmd.add_flag("--overwrite", invocation_.overwrite, "replace a run already in --out");
    cmd.add_option("--nproc", nproc_,
                   "data-parallel ranks to launch on this machine (loopback, Gloo); under an "
                   "external launcher set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT instead")
        ->check(cli::whole_number(1, 256))
        ->capture_default_str();
    cmd.add_option("--dist-timeout", dist_timeout_,
                   "seconds a rank waits for the others before failing")
        ->check(cli::number_in(0.001, 86400))
        ->capture_default_str();
    cmd.add_flag("--print-config", print_config_,
                 "print the run config (the YAML the run stores as config.yaml) and exit");
  }

  int run(const std::vector<std::string>& args) override {
    invocation_.progress_bar = isatty(STDOUT_FILENO) != 0;
    invocation_.handle_signals = true;
    invocation_.program = args.at(0);
    use_threads(threads_, args, invocation_);
    const auto run = cli::resolve_run(invocation_, out_->count() > 0, run_flags_, config_path_,
                                       std::cerr, launch_world(nproc_));
    if (print_config_) {
      std::cout << run.to_yaml();
      return 0;
    }
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::ceil(dist_timeout_ * 1000)));
    if (nproc_ > 1 && std::getenv("WORLD_SIZE") == nullptr) {
      // The launched ranks must not launch again.
      return cli::launch_local_ranks(nproc_, cli::without_option(args, "--nproc"), timeout);
    }
    const auto result = cli::train(run, std::cout, Communicator::from_environment(timeout));
    return result.interrupted_by != 0 ? 128 + SIGINT : 0;
  }

 private:
  cli::ParsedFlags parsed_;
  std::vector<cli::RunFlag> run_flags_;
  cli::TrainConfig invocation_;
  CLI::Option* out_ = nullptr;
  int threads_ = 0;
  std::string config_path_;
  bool print_config_ = false;
  int nproc_ = 1;
  double dist_timeout_ = 120;
};

}  // namespace

std::unique_ptr<Command> train_command(CLI::App& program) {
  return std::make_unique<Train>(program);
}

}  // namespace muon::cli
