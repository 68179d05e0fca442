#include "muon/schedule.h"

#include <cmath>

#include "muon/error.h"

namespace muon {

double WarmdownSchedule::operator()(int64_t step, int64_t total_steps) const {
  check(total_steps > 0, "warmdown schedule: total_steps must be > 0, got ", total_steps);
  check(warmup_steps >= 0, "warmdown schedule: warmup_steps must be >= 0, got ", warmup_steps);
  check(warmdown_ratio >= 0 && warmdown_ratio <= 1,
        "warmdown schedule: warmdown_ratio must be in [0, 1], got ", warmdown_ratio);
  if (step < warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const auto warmdown_steps = std::llround(warmdown_ratio * static_cast<double>(total_steps));
  if (step <= total_steps - warmdown_steps) return 1.0;
  // progress runs from 1 at the warmdown's start to 0 at total_steps (nanochat's form).
  const double progress =
      std::max(0.0, static_cast<double>(total_steps - step) / static_cast<double>(warmdown_steps));
  const double shape = cosine ? 0.5 * (1.0 - std::cos(M_PI * progress)) : progress;
  return final_lr_frac + (1.0 - final_lr_frac) * shape;
}

}  // namespace muon
