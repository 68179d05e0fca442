// Learning-rate, momentum and weight-decay schedules (docs/design.md §Schedules). A learning-rate
// schedule gives a multiplier of a group's peak rate for update `step` (0-based) of a `total_steps`
// run; a `decay_steps` left unset means the run's length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muon/enum_names.h"

namespace muon {

enum class ScheduleKind {
  constant,     // 1
  cosine,       // optax warmup_cosine_decay_schedule
  power,        // lm-engine's power scheduler, optional linear tail
  linear,       // lm-engine's linear scheduler / warmup-stable-decay
  warmdown,     // nanochat/flaxchat
  one_cycle,    // torch OneCycleLR's cosine form
  exponential,  // warmup, then peak·rate^((t − warmup)/transition_steps)
};

template <>
struct EnumNames<ScheduleKind> {
  static constexpr const char* noun = "schedule";
  static constexpr const char* plural = "schedules";
  static constexpr std::array<std::pair<ScheduleKind, const char*>, 7> table{
      {{ScheduleKind::constant, "constant"},
       {ScheduleKind::cosine, "cosine"},
       {ScheduleKind::power, "power"},
       {ScheduleKind::linear, "linear"},
       {ScheduleKind::warmdown, "warmdown"},
       {ScheduleKind::one_cycle, "one_cycle"},
       {ScheduleKind::exponential, "exponential"}}};
};
inline std::string to_string(ScheduleKind kind) {
  return enum_name(kind);
}
inline ScheduleKind schedule_kind_from_string(const std::string& name) {
  return enum_from_name<ScheduleKind>(name);
}

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::constant;
  int64_t warmup_steps = 0;
  std::optional<int64_t> decay_steps;  // cosine, linear: where the decay ends (unset: run length)

  // cosine: linear init_value → 1 over the warmup, then end + (1 − end)·(½(1 +
  // cos(π·t'/T)))^exponent with t' = min(step − warmup, T), T = decay_steps − warmup (> 0).
  double init_value = 0;
  double end_value = 0;  // cosine, linear and power's tail: the final multiplier
  double exponent = 1;

  // linear: 0 → 1 over the warmup, 1 until decay_start (unset: the warmup's end), linear to
  // end_value at decay_steps, held after.
  std::optional<int64_t> decay_start;

  // power: law(t) = min(peak, a·(t·c)^b) in absolute rates, divided by the group's peak; the warmup
  // rises linearly from 0 to law(warmup_steps); with tail_start set, linear from law(tail_start)
  // to end_value·peak at tail_steps (unset: run length). (lm-engine: a = 4·batch size, c = tokens
  // per step.)
  double power_a = 1.0;
  double power_b = -0.51;
  double power_c = 1.0;
  std::optional<int64_t> tail_start;
  std::optional<int64_t> tail_steps;

  // warmdown: (t+1)/warmup during the warmup; 1 until the last warmdown_ratio of the run; then
  // down to final_lr_frac, linearly (nanochat) or with a cosine shape.
  double warmdown_ratio = 0.65;
  double final_lr_frac = 0.05;
  bool cosine_shape = false;

  // one_cycle: from 1/div_factor up to 1 over pct_start of the run (cosine), then down to
  // 1/(div_factor·final_div_factor) (cosine).
  double pct_start = 0.3;
  double div_factor = 25;
  double final_div_factor = 1e4;

  // exponential: 1·decay_rate^((step − warmup)/transition_steps), linear warmup from 0.
  double decay_rate = 0.5;
  int64_t transition_steps = 1000;

  // Throws muon::Error naming the field when the schedule cannot run for `total_steps`.
  void check(int64_t total_steps) const;
  // The multiplier for update `step`; `peak` is the group's peak rate (power's law is absolute).
  double multiplier(int64_t step, int64_t total_steps, double peak = 1.0) const;
};

// nanochat's momentum warmup: lerp(start, target, min(step / steps, 1)); with `cool_down`, back to
// `start` linearly over the last warmdown_ratio of the run.
struct MomentumSchedule {
  double start = 0.85;
  double target = 0.95;
  int64_t steps = 300;
  bool cool_down = false;
  double warmdown_ratio = 0.65;

  void check() const;
  double value(int64_t step, int64_t total_steps) const;
};

// Weight decay × 1 (constant) or × ½(1 + cos(π·min(t, N)/N)) (cosine to 0 at N = total_steps).
struct WeightDecaySchedule {
  bool cosine = false;
  double multiplier(int64_t step, int64_t total_steps) const;
};

// flaxchat/nanochat's scaling rules, B_ref = 2^19 tokens per step.
struct ScalingRules {
  double batch_tokens = 524288;  // B: tokens per optimizer step
  int64_t d_model = 768;         // D_model for the AdamW-rate rule
  double training_tokens = 0;    // D (for the weight-decay rule and auto batch size)
  double reference_tokens = 0;   // D_ref
  static constexpr double kReferenceBatch = 524288;  // 2^19

  double lr_multiplier() const;            // √(B / B_ref)
  double adamw_lr_multiplier() const;      // √(B / B_ref) · (d_model / 768)^-0.5
  double weight_decay_multiplier() const;  // √(B / B_ref) · D_ref / D (1 without D, D_ref)
  // B = 2^round(log2(B_ref · (D / D_ref)^0.383)).
  static double auto_batch_tokens(double training_tokens, double reference_tokens);
};

}  // namespace muon
