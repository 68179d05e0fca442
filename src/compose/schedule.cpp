// Learning-rate, momentum and weight-decay schedules (docs/design.md §Schedules). A learning-rate
// schedule is one small type per kind, holding that kind's parameters resolved for a run (warmup
// and decay end filled in), with its own check and multiplier; LrSchedule's flat fields, which
// YAML, Python and the CLI read, are turned into one of them once per call (`resolve`).
#include "muon/schedule.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "muon/error.h"

namespace muon {

namespace {

double ramp(int64_t step, int64_t steps) {  // step/steps, for a linear warmup
  return static_cast<double>(step) / static_cast<double>(steps);
}

double half_cosine(double progress) {  // 1 at 0, 0 at 1
  return 0.5 * (1.0 + std::cos(M_PI * std::clamp(progress, 0.0, 1.0)));
}

struct Constant {
  void check() const {}
  double multiplier(int64_t) const { return 1.0; }
};

// optax warmup_cosine_decay_schedule: init → 1 over the warmup, then a cosine to `end_value` at
// `end`, raised to `exponent`.
struct Cosine {
  int64_t warmup, end;
  double init_value, end_value, exponent;

  void check() const {
    muon::check(end - warmup > 0, "schedule (cosine): decay_steps (", end,
                ") must exceed warmup_steps (", warmup, ")");
    muon::check(exponent > 0, "schedule (cosine): exponent must be > 0, got ", exponent);
  }
  double multiplier(int64_t step) const {
    if (step < warmup) return init_value + (1.0 - init_value) * ramp(step, warmup);
    const double T = static_cast<double>(end - warmup);
    const double t = std::min(static_cast<double>(step - warmup), T);
    return end_value + (1.0 - end_value) * std::pow(half_cosine(t / T), exponent);
  }
};

// Warmup-stable-decay: 0 → 1 over the warmup, 1 until `start`, linear to `end_value` at `end`.
struct Linear {
  int64_t warmup, start, end;
  double end_value;

  void check() const {
    muon::check(start >= warmup, "schedule (linear): decay_start (", start,
                ") must be >= warmup_steps (", warmup, ")");
    muon::check(end > start, "schedule (linear): decay_steps (", end, ") must exceed decay_start (",
                start, ")");
  }
  double multiplier(int64_t step) const {
    if (step < warmup) return ramp(step, warmup);
    if (step <= start) return 1.0;
    if (step >= end) return end_value;
    return 1.0 + (end_value - 1.0) * ramp(step - start, end - start);
  }
};

// lm-engine's power law min(peak, a·(t·c)^b) in absolute rates, divided by `peak`; a linear tail
// when set.
struct Power {
  int64_t warmup, total_steps;
  double a, b, c, peak;
  std::optional<PowerTail> tail;

  void check() const {
    muon::check(a > 0 && c > 0, "schedule (power): a and c must be > 0");
    if (tail) {
      muon::check(tail->start >= warmup && tail->steps.value_or(total_steps) > tail->start,
                  "schedule (power): the tail must start after the warmup (", warmup,
                  ") and end after its start (", tail->start, ")");
    }
  }
  double law(int64_t t) const {
    return std::min(peak, a * std::pow(static_cast<double>(t) * c, b));
  }
  double multiplier(int64_t step) const {
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
};

// nanochat's: (step + 1)/warmup, 1, then down to final_lr_frac over the last warmdown_ratio.
struct Warmdown {
  int64_t warmup, total_steps;
  double warmdown_ratio, final_lr_frac;
  WarmdownShape shape;

  void check() const {
    muon::check(warmdown_ratio >= 0 && warmdown_ratio <= 1,
                "schedule (warmdown): warmdown_ratio must be in [0, 1], got ", warmdown_ratio);
  }
  double multiplier(int64_t step) const {
    if (step < warmup) return ramp(step + 1, warmup);
    const auto warmdown = std::llround(warmdown_ratio * static_cast<double>(total_steps));
    if (step <= total_steps - warmdown) return 1.0;
    // progress falls from 1 at the warmdown's start to 0 at total_steps (nanochat's form).
    const double progress =
        std::max(0.0, static_cast<double>(total_steps - step) / static_cast<double>(warmdown));
    const double fall = shape == WarmdownShape::cosine ? 1.0 - half_cosine(progress) : progress;
    return final_lr_frac + (1.0 - final_lr_frac) * fall;
  }
};

// torch OneCycleLR's cosine form: 1/div_factor up to 1 over pct_start of the run, then down to
// 1/(div_factor·final_div_factor).
struct OneCycle {
  int64_t total_steps;
  double pct_start, div_factor, final_div_factor;

  void check() const {
    muon::check(pct_start > 0 && pct_start < 1, "schedule (one_cycle): pct_start must be in ",
                "(0, 1), got ", pct_start);
    muon::check(div_factor > 0 && final_div_factor > 0,
                "schedule (one_cycle): div_factor and final_div_factor must be > 0");
  }
  double multiplier(int64_t step) const {
    const double up = pct_start * static_cast<double>(total_steps);
    const double low = 1.0 / div_factor;
    const double final_low = low / final_div_factor;
    const double s = static_cast<double>(step);
    if (s < up) return 1.0 + (low - 1.0) * half_cosine(s / up);
    return final_low +
           (1.0 - final_low) * half_cosine((s - up) / (static_cast<double>(total_steps) - up));
  }
};

// optax exponential_decay after a linear warmup from 0.
struct Exponential {
  int64_t warmup;
  double decay_rate;
  int64_t transition_steps;

  void check() const {
    muon::check(decay_rate > 0 && transition_steps > 0,
                "schedule (exponential): decay_rate and transition_steps must be > 0");
  }
  double multiplier(int64_t step) const {
    if (step < warmup) return ramp(step, warmup);
    return std::pow(decay_rate,
                    static_cast<double>(step - warmup) / static_cast<double>(transition_steps));
  }
};

using Resolved = std::variant<Constant, Cosine, Power, Linear, Warmdown, OneCycle, Exponential>;

// The kind's type with its parameters for a `total_steps` run of peak rate `peak`.
Resolved resolve(const LrSchedule& s, int64_t total_steps, double peak) {
  const int64_t warmup = s.warmup();
  const int64_t end = s.decay_steps.value_or(total_steps);
  switch (s.kind) {
    case ScheduleKind::constant:
      return Constant{};
    case ScheduleKind::cosine:
      return Cosine{warmup, end, s.init_value, s.end_value, s.exponent};
    case ScheduleKind::linear:
      return Linear{warmup, s.decay_start.value_or(warmup), end, s.end_value};
    case ScheduleKind::power:
      return Power{warmup, total_steps, s.power_a, s.power_b, s.power_c, peak, s.tail};
    case ScheduleKind::warmdown:
      return Warmdown{warmup, total_steps, s.warmdown_ratio, s.final_lr_frac, s.shape};
    case ScheduleKind::one_cycle:
      return OneCycle{total_steps, s.pct_start, s.div_factor, s.final_div_factor};
    case ScheduleKind::exponential:
      return Exponential{warmup, s.decay_rate, s.transition_steps};
  }
  throw Error("schedule: unknown kind " + std::to_string(static_cast<int>(s.kind)));
}

}  // namespace

int64_t LrSchedule::warmup() const {
  return warmup_steps.value_or(kind == ScheduleKind::warmdown ? kWarmdownWarmup : 0);
}

void LrSchedule::check(int64_t total_steps) const {
  muon::check(total_steps > 0, "schedule: total_steps must be > 0, got ", total_steps);
  muon::check(warmup() >= 0, "schedule.warmup_steps must be >= 0, got ", warmup());
  std::visit([](const auto& schedule) { schedule.check(); }, resolve(*this, total_steps, 1.0));
}

double LrSchedule::multiplier(int64_t step, int64_t total_steps, double peak) const {
  return std::visit([&](const auto& schedule) { return schedule.multiplier(step); },
                    resolve(*this, total_steps, peak));
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
