// `muon train`: trains the demo GPT with the hybrid Muon + AdamW optimizer on byte-level text.
#pragma once

#include <ATen/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "demo/gpt.h"
#include "muon/config.h"
#include "muon/hybrid.h"
#include "muon/schedule.h"
#include "training/metrics.h"

namespace muon::cli {

// Where the text comes from (the `data` section of a run config).
// clang-format off
#define MUON_DATA_FIELDS(X)                                                                        \
  X(std::string, source, source, "", "kjv", any, "", "kjv (Debian's bible-kjv) or a text file")    \
  X(double, val_fraction, val_fraction, "", 0.05, open_unit_interval, "",                          \
    "the last fraction of the text, held out for validation")
// clang-format on
struct DataConfig {
  MUON_DATA_FIELDS(MUON_FIELD_MEMBER)
};
MUON_DEFINE_VISIT(DataConfig, MUON_DATA_FIELDS)

// The training loop's settings (the `train` section of a run config).
// clang-format off
#define MUON_TRAIN_FIELDS(X)                                                                       \
  X(int64_t, steps, steps, "", 400, positive, "", "optimizer updates")                             \
  X(int64_t, batch_size, batch_size, "", 32, positive, "", "sequences per step and rank")          \
  X(int64_t, ranks, ranks, "", 0, nonnegative, "",                                                 \
    "ranks the step's batch_size x ranks sequences are split among (0: those of the launch)")     \
  X(int64_t, log_every, log_every, "", 20, positive, "", "steps between metrics rows")             \
  X(int64_t, eval_every, eval_every, "", 0, nonnegative, "",                                       \
    "steps between validation losses (0: min(100, ceil(steps/4)), so a short run gets four)")     \
  X(int64_t, eval_batches, eval_batches, "", 8, positive, "", "validation batches per evaluation") \
  X(int64_t, checkpoint_every, checkpoint_every, "", 0, nonnegative, "",                           \
    "also write checkpoint.pt every N steps (0: at the end and on a signal only)")                 \
  X(bool, step_in_backward, step_in_backward, "", false, any, "",                                  \
    "update each parameter inside backward as its gradient completes, holding no full set of "    \
    "gradients (needs nonfinite: ignore and no grad_clip)")                                       \
  X(int64_t, seed, seed, "", 1337, nonnegative, "", "seed of initialization and batches")          \
  X(int64_t, sample_bytes, sample_bytes, "", 240, nonnegative, "", "bytes of the final sample")    \
  X(std::string, sample_prompt, sample_prompt, "", "And God said", any, "", "the sample's prompt")
// clang-format on

// The embedded default optimizer of `muon train`: Muon at 0.02 for the hidden matrices, AdamW at
// 0.004 with betas (0.9, 0.95) for the rest, no weight decay, warmdown (20 warmup steps, the last
// 40% down to 5%). `name` muon, dion (Dion's defaults for the matrices, then the same rates and
// decay) or adamw (AdamW for everything at `adamw_lr`).
OptimConfig demo_optimizer(const std::string& name = "muon", at::ScalarType state = at::kFloat,
                           double muon_lr = 0.02, double adamw_lr = 0.004);

// A whole run: what it trains (model, data, optimizer) and how (the loop's settings), the same
// object whether it comes from flags, a YAML file or a checkpoint; and where it goes.
struct TrainConfig {
  GptConfig model;
  DataConfig data;
  MUON_TRAIN_FIELDS(MUON_FIELD_MEMBER)
  OptimConfig optimizer = demo_optimizer();

  // The invocation, not the run (not saved):
  std::string out_dir = "runs/latest";
  std::string resume_dir;       // continue from resume_dir/checkpoint.pt
  int64_t stop_after = 0;       // stop (with a checkpoint) after this many steps; 0: run all
  bool progress_bar = false;    // redraw a progress line every step (set when on a terminal)
  bool handle_signals = false;  // SIGINT/SIGTERM: finish the step, checkpoint, exit (muon train)
  bool overwrite = false;       // replace a run already in out_dir
  std::string program = "muon";  // the command as the user typed it, for the hints printed
  std::string threads_reason;     // why this many threads, for the header line (threads.h)

  // Steps between evaluations: eval_every, or with 0 min(100, ⌈steps/4⌉) — every 100 steps as
  // a default, yet at least four evaluations (a curve, not a line) in a short run.
  int64_t eval_interval() const {
    return eval_every > 0 ? eval_every : std::min<int64_t>(100, (steps + 3) / 4);
  }

  // The run as YAML (model, data, train and the optimizer config), read back by
  // train_config_from_yaml to the same run.
  std::string to_yaml() const;
};
MUON_DEFINE_VISIT(TrainConfig, MUON_TRAIN_FIELDS)

// Watches the training loss for trouble a long run must not hide: a non-finite loss, or a spike
// above `factor` × the running mean (an exponential average, trusted after `warmup` steps).
class LossMonitor {
 public:
  explicit LossMonitor(double factor = 2.0, int64_t warmup = 20, double beta = 0.95)
      : factor_(factor), beta_(beta), warmup_(warmup) {}
  // A warning line for step `step` (1-based), or nullopt when the loss looks normal.
  std::optional<std::string> observe(int64_t step, double loss);
  int64_t alerts() const { return alerts_; }

 private:
  double factor_, beta_;
  int64_t warmup_, seen_ = 0, alerts_ = 0;
  double mean_ = 0;
};

struct TrainResult {
  std::vector<MetricsRow> rows;  // every row of the run, earlier processes' included
  double initial_val_loss = 0;
  double final_val_loss = 0;
  double tokens_per_s = 0;
  double optimizer_share = 0;  // fraction of step time spent in optimizer.step()
  int64_t loss_alerts = 0;     // non-finite losses and spikes reported (LossMonitor)
  int64_t steps_done = 0;      // the step the run stopped at (its steps unless stopped early)
  int interrupted_by = 0;      // the signal that stopped it (0: none)
  std::string sample;          // empty unless the run finished

  // Sets rows and, from them, the validation losses before and after training.
  void take_rows(std::vector<MetricsRow> all);
};

// What a run directory's checkpoint says of its run: the run config (as TrainConfig, invocation
// fields at their defaults), the step it reached, and the loop's position in its log interval.
struct StoredRun {
  TrainConfig config;
  int64_t step = 0;
  double window_loss = 0;
  int64_t window_steps = 0;
  double elapsed_s = 0;
};
StoredRun read_stored_run(const std::string& dir);

// The result of the run in `dir` as far as its checkpoint goes, read back from its files: the
// metrics rows and validation losses (throughput, the loss alerts and the sample are not stored).
TrainResult finished_run(const std::string& dir);

// Throws unless config.out_dir may receive the run's files: a new or empty directory, the run
// being resumed, or anything with config.overwrite.
void check_out_dir(const TrainConfig& config);
// Removes the files of a run from `dir` (before a fresh run writes there).
void clear_run_files(const std::string& dir);

// A run from YAML: optional `model`, `data` and `train` sections over `defaults` (their keys:
// MUON_GPT_FIELDS, MUON_DATA_FIELDS, MUON_TRAIN_FIELDS); everything else is the optimizer config,
// which replaces the defaults' when the text has any of it.
TrainConfig train_config_from_yaml(const std::string& text);
TrainConfig train_config_from_yaml(const std::string& text, const TrainConfig& defaults);
// `bytes` with every byte that is not printable ASCII (or a newline or tab) written as \xNN: a
// sample from a barely trained byte model may hold control bytes that a terminal would act on.
std::string printable(const std::string& bytes);

// `run` on `world` ranks with the same global batch: batch_size × ranks sequences a step, each
// rank taking global / world of them (ranks becomes world). ranks 0 — a config file without the
// key, or a run written before runs recorded it — means batch_size is per rank of this launch.
// Throws, naming the divisors, when world does not divide the global batch (docs/distributed.md).
TrainConfig split_batch(TrainConfig run, int64_t world);
// "1 rank", "2 ranks".
std::string ranks_text(int64_t n);

// The config a checkpoint stored (what train_config_from_yaml reads, also as written by earlier
// versions).
TrainConfig stored_train_config_from_yaml(const std::string& text);
TrainConfig train_config_from_yaml_file(const std::string& path);
TrainConfig train_config_from_yaml_file(const std::string& path, const TrainConfig& defaults);

// Mean loss over the fixed validation windows: eval_batches batches of the step's global batch
// (batch_size × world), so the figure does not depend on the number of ranks.
double evaluate(Gpt& model, const class TextDataset& data, const TrainConfig& config,
                int64_t world = 1);

// Runs the whole job, printing one progress line per log interval to `log` and writing
// config.yaml, routing.txt, metrics.csv/.jsonl (appended row by row), loss.svg (at each
// evaluation) and checkpoint.pt into config.out_dir. With a communicator of N ranks
// (every rank calls train), each rank computes batch_size of the step's N·batch_size windows, the
// hybrid optimizer averages and shards (docs/design.md §Data parallelism), and rank 0 alone logs
// and writes files; the others' results hold throughput only.
TrainResult train(const TrainConfig& config, std::ostream& log,
                  std::shared_ptr<Communicator> communicator = nullptr);

}  // namespace muon::cli
