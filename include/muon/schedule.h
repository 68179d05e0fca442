// Learning-rate, momentum and weight-decay schedules (docs/design.md §Schedules). A learning-rate
// schedule gives a multiplier of a group's peak rate for update `step` (0-based) of a `total_steps`
// run; a `decay_steps` left unset means the run's length.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "muon/enum_names.h"
#include "muon/option_schema.h"

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

enum class WarmdownShape { linear, cosine };
template <>
struct EnumNames<WarmdownShape> {
  static constexpr const char* noun = "warmdown shape";
  static constexpr const char* plural = "shapes";
  static constexpr std::array<std::pair<WarmdownShape, const char*>, 2> table{
      {{WarmdownShape::linear, "linear"}, {WarmdownShape::cosine, "cosine"}}};
};

// The power schedule's tail: linear from law(start) to end·peak at `steps` (unset: the run's
// length), held after.
// clang-format off
#define MUON_POWER_TAIL_FIELDS(X)                                                                  \
  X(int64_t, start, start, "", 0, nonnegative, "", "the update the tail starts at (required)")     \
  X(std::optional<int64_t>, steps, steps, "", std::nullopt, any, "",                               \
    "the update it ends at; unset: the run's length")                                              \
  X(double, end, end, "", 0.0, nonnegative, "", "the multiplier it ends at")
// clang-format on
struct PowerTail {
  MUON_POWER_TAIL_FIELDS(MUON_FIELD_MEMBER)
};
MUON_DEFINE_VISIT(PowerTail, MUON_POWER_TAIL_FIELDS)

// A learning-rate schedule: `name` picks the formula, the other fields are its parameters (each
// belongs to the kinds named in its `kinds` column).
//   cosine: linear init_value → 1 over the warmup, then end + (1 − end)·(½(1 +
//   cos(π·t'/T)))^exponent
//     with t' = min(step − warmup, T), T = decay_steps − warmup (> 0);
//   linear: 0 → 1 over the warmup, 1 until decay_start, linear to end_value at decay_steps, held;
//   power: law(t) = min(peak, a·(t·c)^b) in absolute rates, divided by the group's peak; the warmup
//     rises linearly from 0 to law(warmup_steps); then the tail, if any (lm-engine: a = 4·batch
//     size, c = tokens per step);
//   warmdown: (t+1)/warmup during the warmup; 1 until the last warmdown_ratio of the run; then down
//     to final_lr_frac, linearly (nanochat) or with a cosine shape;
//   one_cycle: from 1/div_factor up to 1 over pct_start of the run (cosine), then down to
//     1/(div_factor·final_div_factor) (cosine);
//   exponential: decay_rate^((step − warmup)/transition_steps), linear warmup from 0.
// clang-format off
#define MUON_LR_SCHEDULE_FIELDS(X)                                                                 \
  X(ScheduleKind, kind, name, "", ScheduleKind::constant, any, "",                                 \
    "constant, cosine, power, linear, warmdown, one_cycle or exponential (required)")              \
  X(std::optional<int64_t>, warmup_steps, warmup_steps, "", std::nullopt, nonnegative, "",         \
    "updates of warmup; unset: 40 for warmdown (flaxchat/nanochat), 0 for the others")            \
  X(std::optional<int64_t>, decay_steps, decay_steps, "", std::nullopt, any, "cosine linear",      \
    "where the decay ends; unset: the run's length")                                               \
  X(double, init_value, init_value, "", 0.0, any, "cosine", "the multiplier the warmup starts at") \
  X(double, end_value, end_value, "", 0.0, any, "cosine linear", "the final multiplier")           \
  X(double, exponent, exponent, "", 1.0, positive, "cosine", "power of the cosine factor")         \
  X(std::optional<int64_t>, decay_start, decay_start, "", std::nullopt, any, "linear",             \
    "where the decay starts; unset: the warmup's end")                                             \
  X(double, power_a, a, "", 1.0, any, "power", "a of min(peak, a·(t·c)^b)")                        \
  X(double, power_b, b, "", -0.51, any, "power", "b of min(peak, a·(t·c)^b)")                      \
  X(double, power_c, c, "", 1.0, any, "power", "c of min(peak, a·(t·c)^b)")                        \
  X(std::optional<PowerTail>, tail, tail, "", std::nullopt, any, "power",                          \
    "unset (no tail) or {start, steps, end}: linear from law(start) to end·peak at steps")         \
  X(double, warmdown_ratio, warmdown_ratio, "", 0.65, any, "warmdown",                             \
    "the last fraction of the run that decays")                                                    \
  X(double, final_lr_frac, final_lr_frac, "", 0.05, any, "warmdown", "the multiplier at the end")  \
  X(WarmdownShape, shape, shape, "", WarmdownShape::linear, any, "warmdown",                       \
    "linear (nanochat) or cosine")                                                                 \
  X(double, pct_start, pct_start, "", 0.3, any, "one_cycle", "the fraction of the run rising")     \
  X(double, div_factor, div_factor, "", 25.0, any, "one_cycle", "the start is 1/div_factor")       \
  X(double, final_div_factor, final_div_factor, "", 1e4, any, "one_cycle",                         \
    "the end is 1/(div_factor·final_div_factor)")                                                  \
  X(double, decay_rate, decay_rate, "", 0.5, any, "exponential", "the factor per transition")      \
  X(int64_t, transition_steps, transition_steps, "", 1000, any, "exponential",                     \
    "updates per factor decay_rate")
// clang-format on
struct LrSchedule {
  MUON_LR_SCHEDULE_FIELDS(MUON_FIELD_MEMBER)

  static constexpr int64_t kWarmdownWarmup = 40;  // flaxchat's warmup for its warmdown schedule
  // warmup_steps, or the kind's default when unset.
  int64_t warmup() const;
  // Throws muon::Error naming the field when the schedule cannot run for `total_steps`.
  void check(int64_t total_steps) const;
  // The multiplier for update `step`; `peak` is the group's peak rate (power's law is absolute).
  double multiplier(int64_t step, int64_t total_steps, double peak = 1.0) const;
};
MUON_DEFINE_VISIT(LrSchedule, MUON_LR_SCHEDULE_FIELDS)

// nanochat's momentum warmup: lerp(start, target, min(step / steps, 1)); with `cool_down`, back to
// `start` linearly over the last warmdown_ratio of the run.
// clang-format off
#define MUON_MOMENTUM_SCHEDULE_FIELDS(X)                                                           \
  X(double, start, start, "", 0.85, any, "", "the momentum at update 0, in [0, 1)")                \
  X(double, target, target, "", 0.95, any, "", "the momentum after the warmup, in [0, 1)")         \
  X(int64_t, steps, steps, "", 300, any, "", "updates of the warmup (> 0)")                        \
  X(bool, cool_down, cool_down, "", false, any, "", "back to start over the run's warmdown")       \
  X(double, warmdown_ratio, warmdown_ratio, "", 0.65, any, "", "the last fraction of the run")
// clang-format on
struct MomentumSchedule {
  MUON_MOMENTUM_SCHEDULE_FIELDS(MUON_FIELD_MEMBER)

  void check() const;
  double value(int64_t step, int64_t total_steps) const;
};
MUON_DEFINE_VISIT(MomentumSchedule, MUON_MOMENTUM_SCHEDULE_FIELDS)

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
