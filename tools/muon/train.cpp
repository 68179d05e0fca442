#include "train.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "data.h"
#include "memory.h"
#include "muon/checkpoint.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/routing.h"
#include "plot.h"
#include "recipe/number_text.h"
#include "recipe/yaml_section.h"
#include "signals.h"

namespace muon::demo {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string clock_text(double seconds) {
  const auto s = static_cast<int64_t>(std::lround(seconds));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buffer;
}

namespace fs = std::filesystem;

std::string loss_chart(const std::vector<MetricsRow>& rows) {
  Series train{"train loss", {}}, val{"val loss", {}};
  for (const auto& r : rows) {
    if (!std::isnan(r.train_loss)) {
      train.points.emplace_back(static_cast<double>(r.step), r.train_loss);
    }
    if (r.val_loss) val.points.emplace_back(static_cast<double>(r.step), *r.val_loss);
  }
  return svg_line_chart({train, val}, "muon train", "step", "loss (nats/byte)");
}

void check_config(const TrainConfig& c) {
  c.model.check();
  check(c.steps > 0, "train: steps must be > 0, got ", c.steps);
  check(c.batch_size > 0, "train: batch_size must be > 0, got ", c.batch_size);
  const auto& name = c.optimizer.name;
  check(name == "muon" || name == "muonclip" || name == "dion" || name == "adamw",
        "train: optimizer must be muon, muonclip, dion or adamw, got \"", name, "\"");
  check(c.log_every > 0 && c.eval_every >= 0 && c.eval_batches > 0,
        "train: log_every and eval_batches must be > 0, eval_every >= 0 (0: automatic)");
  c.optimizer.check_steps(c.steps);
}

// The rate the last step used in the first group of one algorithm (NaN when it has none).
double first_rate(const HybridOptimizer& optimizer, bool muon) {
  for (const auto& group : optimizer.param_groups()) {
    const bool is_muon = dynamic_cast<const MuonOptions*>(&group.options()) != nullptr;
    if (is_muon == muon) return group.options().get_lr();
  }
  return NAN;
}

// Files of a run; a directory holding any is a run that only --resume (or overwrite) may touch.
constexpr const char* kRunFiles[] = {"checkpoint.pt", "metrics.csv", "metrics.jsonl",
                                     "config.yaml",   "routing.txt", "loss.svg"};

bool holds_a_run(const fs::path& dir) {
  for (const char* name : kRunFiles) {
    if (fs::exists(dir / name)) return true;
  }
  return false;
}

// Bytes a run needs, roughly: weights, gradients and optimizer state (4 floats per parameter), the
// activations kept for the backward pass (naive attention keeps B·heads·T² scores per layer, three
// times over) and the RoPE tables as they are built. An estimate to refuse a run the machine cannot hold before it
// allocates, not a measurement.
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

std::string checkpoint_text(const TrainConfig& config, const Progress& p) {
  return config.to_yaml() + "progress: {window_loss: " + detail::shortest_text(p.window_loss) +
         ", window_steps: " + std::to_string(p.window_steps) +
         ", elapsed_s: " + detail::shortest_text(p.elapsed_s) + "}\n";
}

// One terminal line redrawn in place: [#####.....] step | loss | elapsed / ETA.
void draw_progress(std::ostream& log, int64_t done, int64_t last, double loss, double elapsed,
                   int64_t first_step) {
  constexpr int kWidth = 30;
  const double fraction = static_cast<double>(done) / static_cast<double>(last);
  const int filled = static_cast<int>(fraction * kWidth);
  const double eta =
      elapsed / static_cast<double>(done - first_step) * static_cast<double>(last - done);
  log << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
      << done << '/' << last << " | loss " << loss << " | " << clock_text(elapsed) << " / ETA "
      << clock_text(eta) << std::flush;
}

// The log line of one metrics row: step, losses, each algorithm's rate, the gradient norm,
// throughput and time.
std::string progress_line(const MetricsRow& row, int64_t steps, int64_t steps_here,
                          double seconds_here) {
  const auto rate = [](double lr) {
    char text[16];
    std::snprintf(text, sizeof text, "%.2e", lr);
    return std::isnan(lr) ? std::string("-") : std::string(text);
  };
  const double per_step = seconds_here / static_cast<double>(std::max<int64_t>(steps_here, 1));
  char val[32] = "  -   ";  // rounded as the loss beside it, never cut
  if (row.val_loss) std::snprintf(val, sizeof val, "%.4f", *row.val_loss);
  char line[320];
  std::snprintf(
      line, sizeof line,
      "step %5lld/%lld | loss %.4f | val %s | lr muon %s adamw %s | grad %.3f | %7.0f tok/s | "
      "%.2f it/s | %s / ETA %s",
      static_cast<long long>(row.step), static_cast<long long>(steps), row.train_loss,
      val,
      rate(row.muon_lr).c_str(), rate(row.adamw_lr).c_str(), row.grad_norm, row.tokens_per_s,
      1.0 / per_step, clock_text(row.elapsed_s).c_str(),
      clock_text(per_step * static_cast<double>(steps - row.step)).c_str());
  return line;
}

}  // namespace

std::string printable(const std::string& bytes) {
  std::string out;
  for (const unsigned char c : bytes) {
    if ((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t') {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    }
  }
  return out;
}

namespace {

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

}  // namespace

std::optional<std::string> LossMonitor::observe(int64_t step, double loss) {
  char line[160];
  if (!std::isfinite(loss)) {
    ++alerts_;
    std::snprintf(line, sizeof line, "warning: step %lld: the loss is %g",
                  static_cast<long long>(step), loss);
    return std::string(line);
  }
  const double mean = mean_;
  const bool spike = seen_ >= warmup_ && loss > factor_ * mean;
  // The average follows the loss (spikes included: a lasting jump stops being one).
  mean_ = seen_ == 0 ? loss : beta_ * mean_ + (1 - beta_) * loss;
  ++seen_;
  if (!spike) return std::nullopt;
  ++alerts_;
  std::snprintf(line, sizeof line,
                "warning: step %lld: loss spike %.4f, %.1fx its running mean (threshold %.1fx)",
                static_cast<long long>(step), loss, loss / mean, factor_);
  return std::string(line);
}

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

// The run's metrics rows and the validation losses before and after training among them.
void take_rows(TrainResult& result, std::vector<MetricsRow> rows) {
  result.rows = std::move(rows);
  for (const auto& row : result.rows) {
    if (row.step == 0 && row.val_loss) result.initial_val_loss = *row.val_loss;
    if (row.val_loss) result.final_val_loss = *row.val_loss;
  }
}

// The mean over ranks of this rank's loss (the loss of the whole batch).
double global_mean(const at::Tensor& loss, Communicator& communicator) {
  auto value = loss.detach().to(at::kDouble).reshape({1}).clone();
  communicator.all_reduce(value, ReduceOp::sum);
  return value.item<double>() / communicator.world_size();
}

}  // namespace

TrainResult finished_run(const std::string& dir) {
  const auto stored = read_stored_run(dir);
  TrainResult result;
  result.steps_done = stored.step;
  take_rows(result, MetricsLog(dir, fs::path(dir), stored.step).rows());
  return result;
}

StoredRun read_stored_run(const std::string& dir) {
  const auto path = (fs::path(dir) / "checkpoint.pt").string();
  std::error_code error;
  check(fs::exists(path, error) || !holds_a_run(dir), "train: '", dir,
        "' holds a run that stopped before its first checkpoint (no checkpoint.pt), so it cannot "
        "be continued; start it again with --overwrite --out ", dir);
  const auto info = read_checkpoint_info(path);
  return with_context(path, [&] {
    YAML::Node root;
    try {
      root = YAML::Load(info.config_yaml);
    } catch (const YAML::Exception& e) {
      throw Error(std::string("its run config is not YAML (") + e.what() + ")");
    }
    check(root.IsMap() && root["progress"] && root["model"],
          "it does not describe its run (written by an older muon train?); start a new run");
    StoredRun stored;
    stored.step = info.step_count;
    detail::Section progress(root["progress"], "progress");
    stored.window_loss = progress.number("window_loss").value_or(0.0);
    stored.window_steps = progress.integer("window_steps").value_or(0);
    stored.elapsed_s = progress.number("elapsed_s").value_or(0.0);
    progress.finish();
    root.remove("progress");
    stored.config = stored_train_config_from_yaml(YAML::Dump(root));
    return stored;
  });
}

void check_out_dir(const TrainConfig& config) {
  const fs::path out(config.out_dir);
  std::error_code error;
  check(!fs::exists(out, error) || fs::is_directory(out, error), "train: --out '", config.out_dir,
        "' exists and is not a directory");
  const bool same_run = !config.resume_dir.empty() && fs::exists(out, error) &&
                        fs::equivalent(out, config.resume_dir, error);
  if (same_run || config.overwrite || !holds_a_run(out)) return;
  check(!fs::exists(out / "checkpoint.pt", error), "train: '", config.out_dir,
        "' holds a run already; continue it with --resume ", config.out_dir,
        ", choose another --out, or pass --overwrite to replace it");
  throw Error("train: '" + config.out_dir +
              "' holds a run that stopped before its first checkpoint, so it cannot be "
              "continued; pass --overwrite to start it again there, or choose another --out");
}

TrainResult train(const TrainConfig& config, std::ostream& rank0_log,
                  std::shared_ptr<Communicator> communicator) {
  check_config(config);
  if (communicator == nullptr) communicator = std::make_shared<Communicator>();
  const int rank = communicator->rank();
  const int64_t world = communicator->world_size();
  const bool writer = rank == 0;  // rank 0 logs and writes the run's files
  NullStream quiet;
  std::ostream& log = writer ? rank0_log : quiet;
  const fs::path out_dir(config.out_dir);

  // Everything is checked before the first file is written.
  const TextDataset data(load_text(config.data.source), config.data.val_fraction);
  data.check_window(config.model.seq_len);
  check_memory(config, world);
  Gpt model = seeded_model(config);
  auto owned = build_optimizer(*model, config.optimizer, config.steps);
  auto& optimizer = *owned;
  optimizer.set_communicator(communicator);
  optimizer.set_qk_clip_source(model.get());  // used when the config sets qk_clip
  int64_t first_step = 0;
  Progress progress;
  if (!config.resume_dir.empty()) {
    const auto stored = read_stored_run(config.resume_dir);
    const auto path = (fs::path(config.resume_dir) / "checkpoint.pt").string();
    first_step = load_checkpoint(path, optimizer, model.get()).step_count;
    check(first_step < config.steps, "train: the checkpoint in '", config.resume_dir,
          "' is at step ", first_step, ", not before --steps ", config.steps);
    progress = {stored.window_loss, stored.window_steps, stored.elapsed_s};
  }
  std::optional<MetricsLog> metrics;
  if (writer) {
    check_out_dir(config);
    std::optional<fs::path> earlier;
    if (!config.resume_dir.empty()) earlier = fs::path(config.resume_dir);
    metrics.emplace(out_dir, earlier, first_step);
    // Checked: write.
    fs::create_directories(out_dir);
    if (config.resume_dir.empty()) {
      for (const char* name : kRunFiles) fs::remove(out_dir / name);
    }
    write_atomically(out_dir / "config.yaml", config.to_yaml());
    write_atomically(out_dir / "routing.txt", optimizer.report_text());
    metrics->open();
    for (const auto& note : config.optimizer.notes) log << note << '\n';
    if (first_step > 0) {
      log << "resumed from " << (fs::path(config.resume_dir) / "checkpoint.pt").string()
          << " at step " << first_step << "\n";
    }
  }
  const auto checkpoint_path = (out_dir / "checkpoint.pt").string();
  int64_t muon_tensors = 0, adamw_tensors = 0;
  for (const auto& row : optimizer.report()) {
    muon_tensors += row.role == Role::muon;
    adamw_tensors += row.role == Role::adamw;
  }
  log << "muon train: " << config.model.n_layers << " layers, d_model " << config.model.d_model
      << ", " << muon_tensors << " Muon matrices, " << adamw_tensors << " AdamW tensors; "
      << data.train_bytes() << " training bytes, " << at::get_num_threads() << " threads"
      << (world > 1 ? ", " + std::to_string(world) + " ranks" : "") << "\n";

  TrainResult result;
  if (writer && first_step == 0) {
    const double val = evaluate(model, data, config, world);
    metrics->append({0, NAN, val, NAN, NAN, NAN, 1.0, 0.0, 0.0});  // before any update
    log << "step 0 | val loss " << val << " (uniform: " << std::log(256.0) << ")\n";
  }

  const auto tokens_per_step =
      static_cast<double>(config.batch_size * world * config.model.seq_len);
  const auto start = Clock::now();
  double optimizer_seconds = 0;
  double eval_seconds = 0;  // excluded from throughput and the optimizer's share
  auto window_start = Clock::now();
  int64_t window_timed_steps = 0;  // steps of this window run by this process (a resumed window
                                   // also holds steps from before the interruption)
  const int64_t last =
      config.stop_after > 0 ? std::min(config.stop_after, config.steps) : config.steps;
  std::optional<StopRequests> signals;
  if (config.handle_signals) {
    const auto checkpoint = (fs::path(config.out_dir) / "checkpoint.pt").string();
    signals.emplace("\nsecond interrupt: stopped at once, without a new checkpoint. If " +
                    checkpoint + " exists, " + config.program + " train --resume " +
                    config.out_dir + " continues from it; if not, start the run again with " +
                    "--overwrite.\n");
  }
  LossMonitor monitor;
  int64_t done = first_step;
  int stopped_by = 0;
  const auto elapsed = [&] { return progress.elapsed_s + seconds_since(start); };
  while (done < last && stopped_by == 0) {
    const int64_t step = done;
    // Each step's batch depends on (seed, step) only, so a resumed run sees the same data. With
    // ranks, the step draws world × batch_size windows and each rank takes its own rows: N ranks
    // see exactly the batch one process with N × batch_size would.
    auto generator =
        at::detail::createCPUGenerator(batch_seed(static_cast<uint64_t>(config.seed), step));
    auto [x, y] = data.train_batch(config.batch_size * world, config.model.seq_len, generator);
    x = x.narrow(0, rank * config.batch_size, config.batch_size);
    y = y.narrow(0, rank * config.batch_size, config.batch_size);
    const auto loss = model->loss(x, y);
    optimizer.zero_grad();
    loss.backward();
    const auto optimizer_start = Clock::now();
    optimizer.step();
    optimizer_seconds += seconds_since(optimizer_start);
    const double step_loss = world > 1 ? global_mean(loss, *communicator) : loss.item<double>();
    progress.window_loss += step_loss;
    ++progress.window_steps;
    ++window_timed_steps;
    done = step + 1;
    if (const auto alert = monitor.observe(done, step_loss)) {
      log << (config.progress_bar ? "\r\033[K" : "") << *alert << std::endl;
    }
    if (config.progress_bar && writer) {
      draw_progress(log, done, last, step_loss, seconds_since(start), first_step);
    }
    // Every rank stops after the same step (the first signal on any of them).
    stopped_by = signals ? agree_on_stop(StopRequests::signal(), *communicator) : 0;

    const bool evaluate_now = done % config.eval_interval() == 0 || done == config.steps;
    if (done % config.log_every == 0 || evaluate_now) {
      const auto& stats = optimizer.last_step();
      MetricsRow row{done,
                     progress.window_loss / static_cast<double>(progress.window_steps),
                     std::nullopt,
                     first_rate(optimizer, true),
                     first_rate(optimizer, false),
                     stats.grad_norm,
                     stats.clip_factor,
                     tokens_per_step * static_cast<double>(window_timed_steps) /
                         seconds_since(window_start),
                     0.0};
      if (evaluate_now && writer) {
        const auto eval_start = Clock::now();
        row.val_loss = evaluate(model, data, config, world);
        eval_seconds += seconds_since(eval_start);
      }
      row.elapsed_s = elapsed();
      log << (config.progress_bar ? "\r\033[K" : "")
          << progress_line(row, config.steps, done - first_step, seconds_since(start)) << std::endl;
      if (writer) {
        metrics->append(row);
        if (row.val_loss) write_atomically(out_dir / "loss.svg", loss_chart(metrics->rows()));
      }
      progress.window_loss = 0;
      progress.window_steps = 0;
      window_timed_steps = 0;
      window_start = Clock::now();
    }
    if (config.checkpoint_every > 0 && done % config.checkpoint_every == 0 && done < last) {
      save_checkpoint(
          checkpoint_path, optimizer, model.get(),
          checkpoint_text(config, {progress.window_loss, progress.window_steps, elapsed()}));
    }
  }
  save_checkpoint(
      checkpoint_path, optimizer, model.get(),
      checkpoint_text(config, {progress.window_loss, progress.window_steps, elapsed()}));
  const double total_seconds = seconds_since(start) - eval_seconds;
  result.tokens_per_s = tokens_per_step * static_cast<double>(done - first_step) / total_seconds;
  result.optimizer_share = optimizer_seconds / total_seconds;
  result.loss_alerts = monitor.alerts();
  result.steps_done = done;
  result.interrupted_by = stopped_by;
  if (!writer) return result;
  take_rows(result, metrics->rows());
  if (stopped_by != 0) {
    log << (config.progress_bar ? "\r\033[K" : "") << "interrupted by "
        << (stopped_by == SIGTERM ? "SIGTERM" : "SIGINT") << " after step " << done << "/"
        << config.steps << "; wrote " << checkpoint_path << "\nresume with: " << config.program
        << " train --resume " << config.out_dir << std::endl;  // before any second signal
    return result;
  }
  if (done < config.steps) {
    log << "stopped after step " << done << "/" << config.steps << "; wrote " << checkpoint_path
        << "\n";
    return result;
  }

  auto sample_generator = at::detail::createCPUGenerator(static_cast<uint64_t>(config.seed));
  result.sample = generate(model, config.sample_prompt, config.sample_bytes, 0.8, sample_generator);
  log << "final val loss " << result.final_val_loss << " | "
      << static_cast<int64_t>(result.tokens_per_s) << " tok/s | optimizer "
      << static_cast<int>(100 * result.optimizer_share) << "% of step time\n--- sample ---\n"
      << printable(result.sample) << "\n--------------\n"
      << "wrote " << (out_dir / "metrics.csv").string()
      << ", metrics.jsonl, loss.svg, checkpoint.pt, routing.txt, config.yaml\n";
  return result;
}

}  // namespace muon::demo
