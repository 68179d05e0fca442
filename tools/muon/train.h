// `muon train`: trains the demo GPT with the hybrid Muon + AdamW optimizer on byte-level text.
#pragma once

#include <ATen/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "gpt.h"
#include "muon/config.h"
#include "muon/hybrid.h"
#include "muon/schedule.h"

namespace muon::demo {

// The embedded default run: a 4-layer, 128-wide GPT on the KJV, a few minutes on 2 CPU cores.
struct TrainConfig {
  GptConfig model;
  std::string data = "kjv";  // "kjv" or a text file
  double val_fraction = 0.05;
  int64_t steps = 400;
  int64_t batch_size = 32;
  std::string optimizer = "muon";           // "muon": Muon + AdamW routed; "adamw": AdamW for all
  at::ScalarType state_dtype = at::kFloat;  // optimizer state: kFloat or kBFloat16
  double muon_lr = 0.02;                    // hidden matrices
  double adamw_lr = 0.004;                  // embedding and norm weights
  double weight_decay = 0.0;
  LrSchedule schedule = default_schedule();  // warmdown: 20 warmup steps, last 40% down to 5%
  int64_t log_every = 20;
  int64_t eval_every = 100;
  int64_t eval_batches = 8;
  uint64_t seed = 1337;
  std::string out_dir = "runs/latest";
  // A YAML optimizer config (muon train --config); replaces optimizer, state_dtype, muon_lr,
  // adamw_lr, weight_decay and schedule when set.
  std::optional<OptimConfig> optimizer_config;
  int64_t checkpoint_every = 0;  // also write out_dir/checkpoint.pt every N steps (0: end only)
  std::string resume_dir;        // continue from resume_dir/checkpoint.pt
  int64_t stop_after = 0;        // stop (with a checkpoint) after this many steps; 0: run all
  bool progress_bar = false;     // redraw a progress line every step (set when on a terminal)
  int64_t sample_bytes = 240;
  std::string sample_prompt = "And God said";

  std::string describe() const;  // the resolved settings, one `key: value` per line

  static LrSchedule default_schedule() {
    LrSchedule s;
    s.kind = ScheduleKind::warmdown;
    s.warmup_steps = 20;
    s.warmdown_ratio = 0.4;
    s.final_lr_frac = 0.05;
    return s;
  }
};

struct MetricsRow {
  int64_t step;  // updates done
  double train_loss;
  std::optional<double> val_loss;
  double lr;  // Muon's rate at this step
  double tokens_per_s;
  double elapsed_s;
};

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
  std::vector<MetricsRow> rows;
  double initial_val_loss = 0;
  double final_val_loss = 0;
  double tokens_per_s = 0;
  double optimizer_share = 0;  // fraction of step time spent in optimizer.step()
  int64_t loss_alerts = 0;     // non-finite losses and spikes reported (LossMonitor)
  std::string sample;
};

// A run from YAML: optional `model`, `data` ({source, val_fraction}) and `train` ({steps,
// batch_size, log_every, eval_every, eval_batches, checkpoint_every, seed, sample_bytes,
// sample_prompt}) sections over `defaults`; everything else is the optimizer config.
TrainConfig train_config_from_yaml(const std::string& text, TrainConfig defaults = {});
TrainConfig train_config_from_yaml_file(const std::string& path, TrainConfig defaults = {});

// The optimizer settings a run uses (also what `muon route` reports).
HybridOptions hybrid_options(const TrainConfig& config);

// Mean loss over the fixed validation windows.
double evaluate(Gpt& model, const class TextDataset& data, const TrainConfig& config);

// Runs the whole job, printing one progress line per log interval to `log` and writing config.txt,
// routing.txt, metrics.csv and checkpoint.pt into config.out_dir. With a communicator of N ranks
// (every rank calls train), each rank computes batch_size of the step's N·batch_size windows, the
// hybrid optimizer averages and shards (docs/design.md §Data parallelism), and rank 0 alone logs
// and writes files; the others' results hold throughput only.
TrainResult train(const TrainConfig& config, std::ostream& log,
                  std::shared_ptr<Communicator> communicator = nullptr);

}  // namespace muon::demo
