#include "muon/schedule.h"

#include <algorithm>
#include <cmath>

#include "muon/error.h"

namespace muon {

namespace {

double ramp(int64_t step, int64_t steps) {  // step/steps, for a linear warmup
  return static_cast<double>(step) / static_cast<double>(steps);
}

double half_cosine(double progress) {  // 1 at 0, 0 at 1
  return 0.5 * (1.0 + std::cos(M_PI * std::clamp(progress, 0.0, 1.0)));
}

}  // namespace

int64_t LrSchedule::warmup() const {
  return warmup_steps.value_or(kind == ScheduleKind::warmdown ? kWarmdownWarmup : 0);
}

void LrSchedule::check(int64_t total_steps) const {
  const int64_t warmup = this->warmup();
  const auto name = to_string(kind);
  muon::check(total_steps > 0, "schedule: total_steps must be > 0, got ", total_steps);
  muon::check(warmup >= 0, "schedule.warmup_steps must be >= 0, got ", warmup);
  const int64_t end = decay_steps.value_or(total_steps);
  switch (kind) {
    case ScheduleKind::constant:
      return;
    case ScheduleKind::cosine:
      muon::check(end - warmup > 0, "schedule (cosine): decay_steps (", end,
                  ") must exceed warmup_steps (", warmup, ")");
      muon::check(exponent > 0, "schedule (cosine): exponent must be > 0, got ", exponent);
      return;
    case ScheduleKind::linear: {
      const int64_t start = decay_start.value_or(warmup);
      muon::check(start >= warmup, "schedule (linear): decay_start (", start,
                  ") must be >= warmup_steps (", warmup, ")");
      muon::check(end > start, "schedule (linear): decay_steps (", end,
                  ") must exceed decay_start (", start, ")");
      return;
    }
    case ScheduleKind::power:
      muon::check(power_a > 0 && power_c > 0, "schedule (power): a and c must be > 0");
      if (tail) {
        muon::check(tail->start >= warmup && tail->steps.value_or(total_steps) > tail->start,
                    "schedule (power): the tail must start after the warmup (", warmup,
                    ") and end after its start (", tail->start, ")");
      }
      return;
    case ScheduleKind::warmdown:
      muon::check(warmdown_ratio >= 0 && warmdown_ratio <= 1,
                  "schedule (warmdown): warmdown_ratio must be in [0, 1], got ", warmdown_ratio);
      return;
    case ScheduleKind::one_cycle:
      muon::check(pct_start > 0 && pct_start < 1, "schedule (one_cycle): pct_start must be in ",
                  "(0, 1), got ", pct_start);
      muon::check(div_factor > 0 && final_div_factor > 0,
                  "schedule (one_cycle): div_factor and final_div_factor must be > 0");
      return;
    case ScheduleKind::exponential:
      muon::check(decay_rate > 0 && transition_steps > 0,
                  "schedule (exponential): decay_rate and transition_steps must be > 0");
      return;
  }
  (void)name;
}

double LrSchedule::multiplier(int64_t step, int64_t total_steps, double peak) const {
  const int64_t warmup = this->warmup();
  const int64_t end = decay_steps.value_or(total_steps);
  switch (kind) {
    case ScheduleKind::constant:
      return 1.0;
    case ScheduleKind::cosine: {
      if (step < warmup) return init_value + (1.0 - init_value) * ramp(step, warmup);
      const double T = static_cast<double>(end - warmup);
      const double t = std::min(static_cast<double>(step - warmup), T);
      return end_value + (1.0 - end_value) * std::pow(half_cosine(t / T), exponent);
    }
    case ScheduleKind::linear: {
      if (step < warmup) return ramp(step, warmup);
      const int64_t start = decay_start.value_or(warmup);
      if (step <= start) return 1.0;
      if (step >= end) return end_value;
      return 1.0 + (end_value - 1.0) * ramp(step - start, end - start);
    }
    case ScheduleKind::power: {
      auto law = [&](int64_t t) {
        return std::min(peak, power_a * std::pow(static_cast<double>(t) * power_c, power_b));
      };
      double rate;
      if (step < warmup) {
        rate = law(warmup) * ramp(step, warmup);
      } else if (tail && step >= tail->start) {
        const int64_t tail_end = tail->steps.value_or(total_steps);
        const double from = law(tail->start);
        rate = step >= tail_end ? tail->end * peak
                                : from + (tail->end * peak - from) *
                                             ramp(step - tail->start, tail_end - tail->start);
      } else {
        rate = law(step);
      }
      return rate / peak;
    }
    case ScheduleKind::warmdown: {
      if (step < warmup) return ramp(step + 1, warmup);
      const auto warmdown = std::llround(warmdown_ratio * static_cast<double>(total_steps));
      if (step <= total_steps - warmdown) return 1.0;
      // progress falls from 1 at the warmdown's start to 0 at total_steps (nanochat's form).
      const double progress =
          std::max(0.0, static_cast<double>(total_steps - step) / static_cast<double>(warmdown));
      const double fall =
          this->shape == WarmdownShape::cosine ? 1.0 - half_cosine(progress) : progress;
      return final_lr_frac + (1.0 - final_lr_frac) * fall;
    }
    case ScheduleKind::one_cycle: {
      const double up = pct_start * static_cast<double>(total_steps);
      const double low = 1.0 / div_factor;
      const double final_low = low / final_div_factor;
      const double s = static_cast<double>(step);
      if (s < up) return 1.0 + (low - 1.0) * half_cosine(s / up);
      return final_low +
             (1.0 - final_low) * half_cosine((s - up) / (static_cast<double>(total_steps) - up));
    }
    case ScheduleKind::exponential:
      if (step < warmup) return ramp(step, warmup);
      return std::pow(decay_rate, static_cast<double>(step - warmup) /
                                      static_cast<double>(transition_steps));
  }
  return 1.0;
}

void MomentumSchedule::check() const {
  muon::check(start >= 0 && start < 1 && target >= 0 && target < 1,
              "momentum schedule: start and target must be in [0, 1), got ", start, " and ",
              target);
  muon::check(steps > 0, "momentum schedule: steps must be > 0, got ", steps);
}

double MomentumSchedule::value(int64_t step, int64_t total_steps) const {
  const double warm = start + (target - start) * std::min(1.0, ramp(step, steps));
  if (!cool_down) return warm;
  const auto warmdown = std::llround(warmdown_ratio * static_cast<double>(total_steps));
  if (warmdown == 0 || step <= total_steps - warmdown) return warm;
  const double progress =
      std::max(0.0, static_cast<double>(total_steps - step) / static_cast<double>(warmdown));
  return start + (warm - start) * progress;
}

double WeightDecaySchedule::multiplier(int64_t step, int64_t total_steps) const {
  return cosine ? half_cosine(static_cast<double>(step) / static_cast<double>(total_steps)) : 1.0;
}

double ScalingRules::lr_multiplier() const {
  check(batch_tokens > 0, "scaling: batch_tokens must be > 0, got ", batch_tokens);
  return std::sqrt(batch_tokens / kReferenceBatch);
}

double ScalingRules::adamw_lr_multiplier() const {
  check(d_model > 0, "scaling: d_model must be > 0, got ", d_model);
  return lr_multiplier() * std::pow(static_cast<double>(d_model) / 768.0, -0.5);
}

double ScalingRules::weight_decay_multiplier() const {
  if (training_tokens <= 0 || reference_tokens <= 0) return lr_multiplier();
  return lr_multiplier() * reference_tokens / training_tokens;
}

double ScalingRules::auto_batch_tokens(double training_tokens, double reference_tokens) {
  check(training_tokens > 0 && reference_tokens > 0,
        "scaling: automatic batch size needs training_tokens and reference_tokens > 0");
  return std::exp2(
      std::round(std::log2(kReferenceBatch * std::pow(training_tokens / reference_tokens, 0.383))));
}

}  // namespace muon
