// What muon train prints and draws: the progress bar, the log line of a metrics row, the loss
// chart, the loss monitor's warnings and samples made printable.
#include "training/train_log.h"

#include <cmath>
#include <cstdio>

#include "training/plot.h"

namespace muon::cli {

namespace {

std::string clock_text(double seconds) {
  const auto s = static_cast<int64_t>(std::lround(seconds));
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buffer;
}

}  // namespace

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
                          double seconds_here, const std::string& others) {
  const auto rate = [](double lr) {
    char text[16];
    std::snprintf(text, sizeof text, "%.2e", lr);
    return std::isnan(lr) ? std::string("-") : std::string(text);
  };
  const double per_step = seconds_here / static_cast<double>(std::max<int64_t>(steps_here, 1));
  char val[32] = "  -   ";  // rounded as the loss beside it, never cut
  if (row.val_loss) std::snprintf(val, sizeof val, "%.4f", *row.val_loss);
  char grad[32] = "  -  ";  // not measured (nonfinite: ignore without clipping)
  if (!std::isnan(row.grad_norm)) std::snprintf(grad, sizeof grad, "%.3f", row.grad_norm);
  char line[320];
  std::snprintf(
      line, sizeof line,
      "step %5lld/%lld | loss %.4f | val %s | lr muon %s %s %s | grad %s | %7.0f tok/s | "
      "%.2f it/s | %s / ETA %s",
      static_cast<long long>(row.step), static_cast<long long>(steps), row.train_loss,
      val,
      rate(row.muon_lr).c_str(), others.c_str(), rate(row.adamw_lr).c_str(), grad, row.tokens_per_s,
      1.0 / per_step, clock_text(row.elapsed_s).c_str(),
      clock_text(per_step * static_cast<double>(steps - row.step)).c_str());
  return line;
}

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

}  // namespace muon::cli
