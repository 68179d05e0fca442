// muon train's loop: a TrainingRun per rank — set-up, steps, finish — and what it checks first.
// Over 400 lines on purpose: one run's life in the order it happens.
#include "training/train.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "demo/data.h"
#include "muon/algorithms.h"
#include "muon/checkpoint.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/internal/number_text.h"
#include "muon/routing.h"
#include "muon/step_in_backward.h"
#include "system/memory.h"
#include "training/plot.h"
#include "training/signals.h"
#include "training/train_log.h"

namespace muon::cli {

double evaluate(Gpt& model, const TextDataset& data, const TrainConfig& config, int64_t world) {
  at::NoGradGuard no_grad;
  double total = 0;
  const int64_t batch = config.batch_size * world;  // the step's global batch: any world size
  for (int64_t i = 0; i < config.eval_batches; ++i) {
    const auto [x, y] = data.val_batch(i, batch, config.model.seq_len, config.eval_batches);
    total += model->loss(x, y).item<double>();
  }
  return total / static_cast<double>(config.eval_batches);
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

namespace fs = std::filesystem;

void check_config(const TrainConfig& c) {
  c.model.check();
  check(c.steps > 0, "train: steps must be > 0, got ", c.steps);
  check(c.batch_size > 0, "train: batch_size must be > 0, got ", c.batch_size);
  const auto& names = optimizer_names();
  check(std::any_of(names.begin(), names.end(),
                    [&](const OptimizerName& n) { return c.optimizer.name == n.name; }),
        "train: optimizer must be one of ", optimizer_name_list(), ", got \"", c.optimizer.name,
        "\"");
  check(c.log_every > 0 && c.eval_every >= 0 && c.eval_batches > 0,
        "train: log_every and eval_batches must be > 0, eval_every >= 0 (0: automatic)");
  c.optimizer.check_steps(c.steps);
}

// The rate the last step used in the first group of one algorithm (NaN when it has none).
double first_rate(const HybridOptimizer& optimizer, bool muon) {
  for (const auto& group : optimizer.param_groups()) {
    const bool is_muon = algorithm_kind(group.options()) == ParamKind::matrices;
    if (is_muon == muon) return group.options().get_lr();
  }
  return NAN;
}

// Bytes a run needs, roughly: weights, gradients and optimizer state (4 floats per parameter), the
// activations kept for the backward pass (naive attention keeps B·heads·T² scores per layer, three
// times over) and the RoPE tables as they are built. An estimate to refuse a run the machine cannot
// hold before it allocates, not a measurement.
void check_memory(const TrainConfig& c, int64_t world) {
  const auto& m = c.model;
  const double d = static_cast<double>(m.d_model), T = static_cast<double>(m.seq_len);
  const double L = static_cast<double>(m.n_layers), V = static_cast<double>(m.vocab_size);
  const double B = static_cast<double>(c.batch_size) * static_cast<double>(world);
  const double activations =
      L * B * (3 * static_cast<double>(m.n_heads) * T * T + 34 * T * d) + B * T * V * 3;
  const double bytes = 4.0 * (4 * m.weight_count() + activations) + m.rope_bytes();
  check_memory_need(bytes, "train: the run",
                    "weights, state and the activations of " +
                        std::to_string(c.batch_size * world) + " × " + std::to_string(m.seq_len) +
                        " tokens",
                    "--batch-size, --seq-len, --d-model or --layers");
}

// The loop's position within a log interval, saved with each checkpoint so that a resumed run
// logs the rows the uninterrupted one would.
struct Progress {
  double window_loss = 0;  // sum of the losses since the last row
  int64_t window_steps = 0;
  double elapsed_s = 0;  // training time before this process
};

std::string progress_text(const Progress& p) {
  return "progress: {window_loss: " + detail::shortest_text(p.window_loss) +
         ", window_steps: " + std::to_string(p.window_steps) +
         ", elapsed_s: " + detail::shortest_text(p.elapsed_s) + "}\n";
}

// The signal that stops the run after this step, the same on every rank: any rank's first.
int agree_on_stop(int signal, Communicator& communicator) {
  if (communicator.world_size() == 1) return signal;
  auto value = at::full({1}, static_cast<double>(signal), at::kDouble);
  communicator.all_reduce(value, ReduceOp::max);
  return static_cast<int>(value.item<double>());
}

// splitmix64 (Steele, Lea, Flood 2014) of (seed, step): well-separated generator seeds for
// neighbouring steps.
uint64_t batch_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Discards what it is given: the log of ranks other than 0.
class NullStream : public std::ostream {
 public:
  NullStream() : std::ostream(nullptr) {}
};

// The model every rank starts from: seeded, built while no other thread (a rank of an in-process
// test) draws from the global generator.
Gpt seeded_model(const TrainConfig& config) {
  static std::mutex global_generator;
  std::lock_guard<std::mutex> lock(global_generator);
  at::manual_seed(static_cast<uint64_t>(config.seed));
  return Gpt(config.model);
}

// The mean over ranks of this rank's loss (the loss of the whole batch).
double global_mean(const at::Tensor& loss, Communicator& communicator) {
  auto value = loss.detach().to(at::kDouble).reshape({1}).clone();
  communicator.all_reduce(value, ReduceOp::sum);
  return value.item<double>() / communicator.world_size();
}

// One rank's run of muon train. The constructor sets it up — everything checked before the first
// file is written, then the run's files, the opening log line and the evaluation before any
// update —, step() does one update with its log row, evaluation and checkpoint, and finish() the
// last checkpoint and the summary.
class TrainingRun {
 public:
  TrainingRun(const TrainConfig& config, std::ostream& rank0_log,
              std::shared_ptr<Communicator> communicator);
  bool running() const { return done_ < last_ && stopped_by_ == 0; }
  void step();
  TrainResult finish();

 private:
  void resume();
  void open_files();
  void log_start();
  void log_row(bool evaluate_now);
  void save_checkpoint_now();
  std::string run_yaml() const;
  double elapsed() const { return progress_.elapsed_s + seconds_since(start_); }
  const char* line_start() const { return config_.progress_bar ? "\r\033[K" : ""; }

  const TrainConfig& config_;
  std::shared_ptr<Communicator> communicator_;
  const int rank_;
  const int64_t world_;
  const bool writer_;  // rank 0 logs and writes the run's files
  NullStream quiet_;
  std::ostream& log_;
  const fs::path out_dir_;
  const std::string checkpoint_path_;
  const TextDataset data_;
  Gpt model_{nullptr};
  std::unique_ptr<HybridOptimizer> optimizer_;
  std::unique_ptr<StepInBackward> in_backward_;  // with train.step_in_backward
  int64_t first_step_ = 0;
  Progress progress_;
  std::optional<MetricsLog> metrics_;
  LossMonitor monitor_;
  std::optional<StopRequests> signals_;
  double tokens_per_step_ = 0;
  int64_t last_ = 0;  // the step this process stops after
  int64_t done_ = 0;
  int stopped_by_ = 0;
  Clock::time_point start_, window_start_;
  int64_t window_timed_steps_ = 0;  // steps of this window run by this process (a resumed window
                                    // also holds steps from before the interruption)
  double optimizer_seconds_ = 0;
  double eval_seconds_ = 0;  // excluded from throughput and the optimizer's share
};

const TrainConfig& checked(const TrainConfig& config) {
  check_config(config);
  return config;
}

TrainingRun::TrainingRun(const TrainConfig& config, std::ostream& rank0_log,
                         std::shared_ptr<Communicator> communicator)
    : config_(checked(config)),
      communicator_(communicator ? std::move(communicator) : std::make_shared<Communicator>()),
      rank_(communicator_->rank()),
      world_(communicator_->world_size()),
      writer_(rank_ == 0),
      log_(writer_ ? rank0_log : quiet_),
      out_dir_(config.out_dir),
      checkpoint_path_((out_dir_ / "checkpoint.pt").string()),
      data_(load_text(config.data.source), config.data.val_fraction) {
  check(config_.ranks == 0 || config_.ranks == world_, "train: the config's batch_size is per rank "
        "of ", ranks_text(config_.ranks), " (ranks: ", config_.ranks, "), but ",
        ranks_text(world_), " run it; split_batch re-splits its global batch");
  data_.check_window(config_.model.seq_len);
  check_memory(config_, world_);
  model_ = seeded_model(config_);
  optimizer_ = build_optimizer(*model_, config_.optimizer, config_.steps);
  optimizer_->set_communicator(communicator_);
  optimizer_->set_qk_clip_source(model_.get());  // used when the config sets qk_clip
  if (!config_.resume_dir.empty()) resume();
  if (config_.step_in_backward) {
    try {  // what the optimizer cannot do inside backward, refused before the first step
      optimizer_->begin_parameter_steps();
    } catch (const Error& e) {
      throw Error(std::string("train: step_in_backward: ") + e.what() +
                  (config_.resume_dir.empty() ? "" : " (a resumed run keeps its optimizer "
                   "settings: continue this one without --step-in-backward)"));
    }
    in_backward_ = std::make_unique<StepInBackward>(*optimizer_);
  }
  if (writer_) open_files();
  log_start();
  if (writer_ && first_step_ == 0) {
    const double val = evaluate(model_, data_, config_, world_);
    MetricsRow before;  // step 0: before any update
    before.val_loss = val;
    metrics_->append(before);
    log_ << "step 0 | val loss " << val << " (uniform: " << std::log(256.0) << ")\n";
  }
  tokens_per_step_ = static_cast<double>(config_.batch_size * world_ * config_.model.seq_len);
  last_ = config_.stop_after > 0 ? std::min(config_.stop_after, config_.steps) : config_.steps;
  done_ = first_step_;
  if (config_.handle_signals) {
    signals_.emplace("\nsecond interrupt: stopped at once, without a new checkpoint. If " +
                     checkpoint_path_ + " exists, " + config_.program + " train --resume " +
                     config_.out_dir + " continues from it; if not, start the run again with " +
                     "--overwrite.\n");
  }
  start_ = window_start_ = Clock::now();
}

void TrainingRun::resume() {
  const auto stored = read_stored_run(config_.resume_dir);
  const auto path = (fs::path(config_.resume_dir) / "checkpoint.pt").string();
  const auto loaded = load_checkpoint(path, *optimizer_, model_.get());
  first_step_ = loaded.step_count;
  if (!loaded.converted_state.empty()) {  // state_dtype changed: converted once, said once
    log_ << "resume: " << loaded.converted_state.size()
         << " optimizer state tensors converted to this run's state dtype (" << loaded.converted_state.front()
         << (loaded.converted_state.size() > 1 ? ", ..." : "") << ")\n";
  }
  check(first_step_ < config_.steps, "train: the checkpoint in '", config_.resume_dir,
        "' is at step ", first_step_, ", not before --steps ", config_.steps);
  progress_ = {stored.window_loss, stored.window_steps, stored.elapsed_s};
}

// Rank 0's files: checked, then written.
void TrainingRun::open_files() {
  check_out_dir(config_);
  std::optional<fs::path> earlier;
  if (!config_.resume_dir.empty()) earlier = fs::path(config_.resume_dir);
  metrics_.emplace(out_dir_, earlier, first_step_);
  fs::create_directories(out_dir_);
  if (config_.resume_dir.empty()) clear_run_files(config_.out_dir);
  write_atomically(out_dir_ / "config.yaml", run_yaml());
  write_atomically(out_dir_ / "routing.txt", optimizer_->report_text());
  metrics_->open();
  for (const auto& note : config_.optimizer.notes) log_ << note << '\n';
  if (first_step_ > 0) {
    log_ << "resumed from " << (fs::path(config_.resume_dir) / "checkpoint.pt").string()
         << " at step " << first_step_ << "\n";
  }
}

void TrainingRun::log_start() {
  int64_t muon_tensors = 0, other_tensors = 0;
  for (const auto& row : optimizer_->report()) {
    muon_tensors += row.role == Role::matrices;
    other_tensors += row.role == Role::others;
  }
  const auto& matrices = optimizer_->options().matrices;  // empty under name adamw
  log_ << "muon train: " << config_.model.n_layers << " layers, d_model " << config_.model.d_model
       << ", " << muon_tensors << " " << (matrices ? algorithm_name(*matrices) : "muon")
       << " matrices, " << other_tensors << " " << algorithm_name(*optimizer_->options().others)
       << " tensors; " << data_.train_bytes() << " training bytes, " << at::get_num_threads()
       << (at::get_num_threads() == 1 ? " thread" : " threads")
       << (config_.threads_reason.empty() ? "" : " (" + config_.threads_reason + ")")
       << (world_ > 1 ? ", " + std::to_string(world_) + " ranks" : "")
       << (in_backward_ ? "; steps inside backward" : "") << "\n";
}

void TrainingRun::step() {
  const int64_t step = done_;
  // Each step's batch depends on (seed, step) only, so a resumed run sees the same data. With
  // ranks, the step draws world × batch_size windows and each rank takes its own rows: N ranks
  // see exactly the batch one process with N × batch_size would.
  auto generator =
      at::detail::createCPUGenerator(batch_seed(static_cast<uint64_t>(config_.seed), step));
  auto [x, y] = data_.train_batch(config_.batch_size * world_, config_.model.seq_len, generator);
  x = x.narrow(0, rank_ * config_.batch_size, config_.batch_size);
  y = y.narrow(0, rank_ * config_.batch_size, config_.batch_size);
  const auto loss = model_->loss(x, y);
  if (in_backward_) {  // the updates run inside backward
    const double before = in_backward_->seconds();
    loss.backward();
    optimizer_seconds_ += in_backward_->seconds() - before;
  } else {
    optimizer_->zero_grad();
    loss.backward();
    const auto optimizer_start = Clock::now();
    optimizer_->step();
    optimizer_seconds_ += seconds_since(optimizer_start);
  }
  const double step_loss = world_ > 1 ? global_mean(loss, *communicator_) : loss.item<double>();
  progress_.window_loss += step_loss;
  ++progress_.window_steps;
  ++window_timed_steps_;
  done_ = step + 1;
  if (const auto alert = monitor_.observe(done_, step_loss)) {
    log_ << line_start() << *alert << std::endl;
  }
  if (config_.progress_bar && writer_) {
    draw_progress(log_, done_, last_, step_loss, seconds_since(start_), first_step_);
  }
  // Every rank stops after the same step (the first signal on any of them).
  stopped_by_ = signals_ ? agree_on_stop(StopRequests::signal(), *communicator_) : 0;
  const bool evaluate_now = done_ % config_.eval_interval() == 0 || done_ == config_.steps;
  if (done_ % config_.log_every == 0 || evaluate_now) log_row(evaluate_now);
  if (config_.checkpoint_every > 0 && done_ % config_.checkpoint_every == 0 && done_ < last_) {
    save_checkpoint_now();
  }
}

// The row of the log interval that ends at this step (with the validation loss when due).
void TrainingRun::log_row(bool evaluate_now) {
  const auto& stats = optimizer_->last_step();
  MetricsRow row;
  row.step = done_;
  row.train_loss = progress_.window_loss / static_cast<double>(progress_.window_steps);
  row.muon_lr = first_rate(*optimizer_, true);
  row.adamw_lr = first_rate(*optimizer_, false);
  row.grad_norm = stats.grad_norm;
  row.clip_factor = stats.clip_factor;
  row.tokens_per_s =
      tokens_per_step_ * static_cast<double>(window_timed_steps_) / seconds_since(window_start_);
  if (evaluate_now && writer_) {
    const auto eval_start = Clock::now();
    row.val_loss = evaluate(model_, data_, config_, world_);
    eval_seconds_ += seconds_since(eval_start);
  }
  row.elapsed_s = elapsed();
  log_ << line_start()
       << progress_line(row, config_.steps, done_ - first_step_, seconds_since(start_),
                        algorithm_name(*optimizer_->options().others))
       << std::endl;
  if (writer_) {
    metrics_->append(row);
    if (row.val_loss) write_atomically(out_dir_ / "loss.svg", loss_chart(metrics_->rows()));
  }
  progress_.window_loss = 0;
  progress_.window_steps = 0;
  window_timed_steps_ = 0;
  window_start_ = Clock::now();
}

void TrainingRun::save_checkpoint_now() {
  save_checkpoint(checkpoint_path_, *optimizer_, model_.get(),
                  run_yaml() + progress_text({progress_.window_loss, progress_.window_steps,
                                              elapsed()}));
}

// The run as stored, with the ranks that ran it: its global batch is batch_size × ranks, which a
// resume on another world size keeps (split_batch).
std::string TrainingRun::run_yaml() const {
  auto recorded = config_;
  recorded.ranks = world_;
  return recorded.to_yaml();
}

TrainResult TrainingRun::finish() {
  save_checkpoint_now();
  const double total_seconds = seconds_since(start_) - eval_seconds_;
  TrainResult result;
  result.tokens_per_s = tokens_per_step_ * static_cast<double>(done_ - first_step_) / total_seconds;
  result.optimizer_share = optimizer_seconds_ / total_seconds;
  result.loss_alerts = monitor_.alerts();
  result.steps_done = done_;
  result.interrupted_by = stopped_by_;
  if (!writer_) return result;
  result.take_rows(metrics_->rows());
  if (stopped_by_ != 0) {
    log_ << line_start() << "interrupted by " << (stopped_by_ == SIGTERM ? "SIGTERM" : "SIGINT")
         << " after step " << done_ << "/" << config_.steps << "; wrote " << checkpoint_path_
         << "\nresume with: " << config_.program << " train --resume " << config_.out_dir
         << std::endl;  // before any second signal
    return result;
  }
  if (done_ < config_.steps) {
    log_ << "stopped after step " << done_ << "/" << config_.steps << "; wrote " << checkpoint_path_
         << "\n";
    return result;
  }
  auto sample_generator = at::detail::createCPUGenerator(static_cast<uint64_t>(config_.seed));
  result.sample =
      generate(model_, config_.sample_prompt, config_.sample_bytes, 0.8, sample_generator);
  log_ << "final val loss " << result.final_val_loss << " | "
       << static_cast<int64_t>(result.tokens_per_s) << " tok/s | optimizer "
       << static_cast<int>(100 * result.optimizer_share) << "% of step time\n--- sample ---\n"
       << printable(result.sample) << "\n--------------\n"
       << "wrote " << (out_dir_ / "metrics.csv").string()
       << ", metrics.jsonl, loss.svg, checkpoint.pt, routing.txt, config.yaml\n";
  return result;
}

}  // namespace

TrainResult train(const TrainConfig& config, std::ostream& rank0_log,
                  std::shared_ptr<Communicator> communicator) {
  TrainingRun run(config, rank0_log, std::move(communicator));
  while (run.running()) run.step();
  return run.finish();
}

}  // namespace muon::cli
