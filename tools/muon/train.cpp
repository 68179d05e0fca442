#include "train.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "data.h"
#include "muon/checkpoint.h"
#include "muon/distributed.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/routing.h"
#include "plot.h"

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

void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream file(path);
  check(file.good(), "train: cannot write '", path.string(), "'");
  file << content;
}

std::string metrics_jsonl(const std::vector<MetricsRow>& rows) {
  std::ostringstream out;
  out.precision(8);
  for (const auto& r : rows) {
    out << "{\"step\": " << r.step << ", \"train_loss\": " << r.train_loss << ", \"val_loss\": ";
    if (r.val_loss) {
      out << *r.val_loss;
    } else {
      out << "null";
    }
    out << ", \"lr\": " << r.lr << ", \"tokens_per_s\": " << r.tokens_per_s
        << ", \"elapsed_s\": " << r.elapsed_s << "}\n";
  }
  return out.str();
}

std::string loss_chart(const std::vector<MetricsRow>& rows) {
  Series train{"train loss", {}}, val{"val loss", {}};
  for (const auto& r : rows) {
    train.points.emplace_back(static_cast<double>(r.step), r.train_loss);
    if (r.val_loss) val.points.emplace_back(static_cast<double>(r.step), *r.val_loss);
  }
  return svg_line_chart({train, val}, "muon train", "step", "loss (nats/byte)");
}

std::string metrics_csv(const std::vector<MetricsRow>& rows) {
  std::ostringstream out;
  out << "step,train_loss,val_loss,lr,tokens_per_s,elapsed_s\n";
  for (const auto& r : rows) {
    out << r.step << ',' << r.train_loss << ',';
    if (r.val_loss) out << *r.val_loss;
    out << ',' << r.lr << ',' << r.tokens_per_s << ',' << r.elapsed_s << '\n';
  }
  return out.str();
}

void check_config(const TrainConfig& c) {
  c.model.check();
  check(c.steps > 0, "train: steps must be > 0, got ", c.steps);
  check(c.batch_size > 0, "train: batch_size must be > 0, got ", c.batch_size);
  c.schedule.check(c.steps);
  check(c.optimizer == "muon" || c.optimizer == "adamw", "train: optimizer must be \"muon\" or ",
        "\"adamw\", got \"", c.optimizer, "\"");
  check(c.log_every > 0 && c.eval_every > 0 && c.eval_batches > 0,
        "train: log_every, eval_every and eval_batches must be > 0");
}

// One terminal line redrawn in place: [#####.....] step | loss | elapsed / ETA.
void draw_progress(std::ostream& log, int64_t done, int64_t last, double loss, double elapsed,
                   int64_t first_step) {
  constexpr int kWidth = 30;
  const double fraction = static_cast<double>(done) / static_cast<double>(last);
  const int filled = static_cast<int>(fraction * kWidth);
  const double eta = elapsed / static_cast<double>(done - first_step) *
                     static_cast<double>(last - done);
  log << "\r\033[K[" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] "
      << done << '/' << last << " | loss " << loss << " | " << clock_text(elapsed) << " / ETA "
      << clock_text(eta) << std::flush;
}

// splitmix64 (Steele, Lea, Flood 2014) of (seed, step): well-separated generator seeds for
// neighbouring steps.
uint64_t batch_seed(uint64_t seed, int64_t step) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The rate the last step used in the first Muon group (AdamW's without Muon): what the log shows.
double leading_rate(const HybridOptimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    if (dynamic_cast<const MuonOptions*>(&group.options()) != nullptr) {
      return group.options().get_lr();
    }
  }
  return optimizer.param_groups().front().options().get_lr();
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

std::string TrainConfig::describe() const {
  std::ostringstream out;
  out << "model: {vocab_size: " << model.vocab_size << ", seq_len: " << model.seq_len
      << ", d_model: " << model.d_model << ", n_layers: " << model.n_layers
      << ", n_heads: " << model.n_heads << ", n_kv_heads: " << model.n_kv_heads
      << ", ffn_hidden: " << model.hidden()
      << ", tie_embeddings: " << (model.tie_embeddings ? "true" : "false") << "}\n"
      << "data: " << data << "\nval_fraction: " << val_fraction << "\nsteps: " << steps
      << "\nbatch_size: " << batch_size << "\noptimizer: " << optimizer
      << "\nstate_dtype: " << state_dtype << "\nmuon_lr: " << muon_lr << "\nadamw_lr: " << adamw_lr
      << "\nweight_decay: " << weight_decay << "\nschedule: {name: " << to_string(schedule.kind)
      << ", warmup_steps: " << schedule.warmup_steps
      << ", warmdown_ratio: " << schedule.warmdown_ratio
      << ", final_lr_frac: " << schedule.final_lr_frac << "}\nlog_every: " << log_every
      << "\neval_every: " << eval_every << "\neval_batches: " << eval_batches << "\nseed: " << seed
      << "\nout_dir: " << out_dir << '\n';
  return out.str();
}

HybridOptions hybrid_options(const TrainConfig& config) {
  HybridOptions options;
  options.muon =
      MuonOptions(config.muon_lr).weight_decay(config.weight_decay).state_dtype(config.state_dtype);
  options.adamw = AdamWOptions(config.adamw_lr)
                      .betas({0.9, 0.95})
                      .weight_decay(config.weight_decay)
                      .state_dtype(config.state_dtype);
  options.all_adamw = config.optimizer == "adamw";
  options.schedule = config.schedule;
  options.total_steps = config.steps;
  return options;
}

double evaluate(Gpt& model, const TextDataset& data, const TrainConfig& config) {
  at::NoGradGuard no_grad;
  double total = 0;
  for (int64_t i = 0; i < config.eval_batches; ++i) {
    const auto [x, y] =
        data.val_batch(i, config.batch_size, config.model.seq_len, config.eval_batches);
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
  at::manual_seed(config.seed);
  return Gpt(config.model);
}

// The mean over ranks of this rank's loss (the loss of the whole batch).
double global_mean(const at::Tensor& loss, Communicator& communicator) {
  auto value = loss.detach().to(at::kDouble).reshape({1}).clone();
  communicator.all_reduce(value, ReduceOp::sum);
  return value.item<double>() / communicator.world_size();
}

}  // namespace

TrainResult train(const TrainConfig& config, std::ostream& rank0_log,
                  std::shared_ptr<Communicator> communicator) {
  check_config(config);
  if (communicator == nullptr) communicator = std::make_shared<Communicator>();
  const int rank = communicator->rank();
  const int64_t world = communicator->world_size();
  const bool writer = rank == 0;  // rank 0 logs and writes the run's files
  NullStream quiet;
  std::ostream& log = writer ? rank0_log : quiet;
  const std::filesystem::path out_dir(config.out_dir);
  if (writer) {
    std::filesystem::create_directories(out_dir);
    write_file(out_dir / "config.txt", config.describe());
  }

  const TextDataset data(load_text(config.data), config.val_fraction);
  Gpt model = seeded_model(config);

  auto owned = config.optimizer_config
                   ? build_optimizer(*model, *config.optimizer_config, config.steps)
                   : std::make_unique<HybridOptimizer>(route(*model), hybrid_options(config));
  auto& optimizer = *owned;
  optimizer.set_communicator(communicator);
  if (config.optimizer_config && writer) {
    write_file(out_dir / "config.yaml", config.optimizer_config->to_yaml());
    for (const auto& note : config.optimizer_config->notes) log << note << '\n';
  }
  optimizer.set_qk_clip_source(model.get());  // used when the config sets qk_clip
  if (writer) write_file(out_dir / "routing.txt", optimizer.report_text());
  int64_t first_step = 0;
  if (!config.resume_dir.empty()) {
    const auto path = (std::filesystem::path(config.resume_dir) / "checkpoint.pt").string();
    first_step = load_checkpoint(path, optimizer, model.get()).step_count;
    check(first_step < config.steps, "train: the checkpoint in '", config.resume_dir,
          "' is at step ", first_step, ", not before --steps ", config.steps);
    log << "resumed from " << path << " at step " << first_step << "\n";
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
  if (writer) {
    result.initial_val_loss = evaluate(model, data, config);
    log << "step 0 | val loss " << result.initial_val_loss << " (uniform: " << std::log(256.0)
        << ")\n";
  }

  const auto tokens_per_step =
      static_cast<double>(config.batch_size * world * config.model.seq_len);
  const auto start = Clock::now();
  double optimizer_seconds = 0;
  double eval_seconds = 0;  // excluded from throughput and the optimizer's share
  double window_loss = 0;
  auto window_start = Clock::now();
  const int64_t last =
      config.stop_after > 0 ? std::min(config.stop_after, config.steps) : config.steps;
  LossMonitor monitor;
  for (int64_t step = first_step; step < last; ++step) {
    // Each step's batch depends on (seed, step) only, so a resumed run sees the same data. With
    // ranks, the step draws world × batch_size windows and each rank takes its own rows: N ranks
    // see exactly the batch one process with N × batch_size would.
    auto generator = at::detail::createCPUGenerator(batch_seed(config.seed, step));
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
    window_loss += step_loss;
    if (const auto alert = monitor.observe(step + 1, step_loss)) {
      log << (config.progress_bar ? "\r\033[K" : "") << *alert << std::endl;
    }

    const int64_t done = step + 1;
    if (config.progress_bar && writer) {
      draw_progress(log, done, last, step_loss, seconds_since(start), first_step);
    }
    const bool evaluate_now = done % config.eval_every == 0 || done == last;
    const bool log_now = done % config.log_every == 0 || evaluate_now;
    if (log_now) {
      const int64_t window_steps = std::min((done - 1) % config.log_every + 1, done - first_step);
      MetricsRow row{
          done,
          window_loss / static_cast<double>(window_steps),
          std::nullopt,
          leading_rate(optimizer),
          tokens_per_step * static_cast<double>(window_steps) / seconds_since(window_start),
          seconds_since(start)};
      if (evaluate_now && writer) {
        const auto eval_start = Clock::now();
        row.val_loss = evaluate(model, data, config);
        eval_seconds += seconds_since(eval_start);
      }
      const double eta = row.elapsed_s / static_cast<double>(done - first_step) *
                         static_cast<double>(last - done);
      char line[256];
      std::snprintf(
          line, sizeof line,
          "step %5lld/%lld | loss %.4f | val loss %s | lr %.2e | %7.0f tok/s | %s / ETA %s",
          static_cast<long long>(done), static_cast<long long>(config.steps), row.train_loss,
          row.val_loss ? std::to_string(*row.val_loss).substr(0, 6).c_str() : "   -  ", row.lr,
          row.tokens_per_s, clock_text(row.elapsed_s).c_str(), clock_text(eta).c_str());
      log << (config.progress_bar ? "\r\033[K" : "") << line << std::endl;
      result.rows.push_back(row);
      window_loss = 0;
      window_start = Clock::now();
    }
    if (config.checkpoint_every > 0 && done % config.checkpoint_every == 0 && done < last) {
      save_checkpoint(checkpoint_path, optimizer, model.get(), config.describe());
    }
  }
  save_checkpoint(checkpoint_path, optimizer, model.get(), config.describe());
  const double total_seconds = seconds_since(start) - eval_seconds;
  result.tokens_per_s = tokens_per_step * static_cast<double>(last - first_step) / total_seconds;
  result.optimizer_share = optimizer_seconds / total_seconds;
  result.loss_alerts = monitor.alerts();
  if (!writer) return result;
  result.final_val_loss = *result.rows.back().val_loss;
  write_file(out_dir / "metrics.csv", metrics_csv(result.rows));
  write_file(out_dir / "metrics.jsonl", metrics_jsonl(result.rows));
  write_file(out_dir / "loss.svg", loss_chart(result.rows));

  auto sample_generator = at::detail::createCPUGenerator(config.seed);
  result.sample = generate(model, config.sample_prompt, config.sample_bytes, 0.8, sample_generator);
  log << "final val loss " << result.final_val_loss << " | "
      << static_cast<int64_t>(result.tokens_per_s) << " tok/s | optimizer "
      << static_cast<int>(100 * result.optimizer_share) << "% of step time\n--- sample ---\n"
      << result.sample << "\n--------------\n"
      << "wrote " << (out_dir / "metrics.csv").string() << ", metrics.jsonl, loss.svg, "
      << "checkpoint.pt, routing.txt, config.txt"
      << (config.optimizer_config ? ", config.yaml" : "") << "\n";
  return result;
}

}  // namespace muon::demo
