// Learning-rate schedules as multipliers of a group's peak rate (SPEC §6).
#pragma once

#include <cstdint>

namespace muon {

// nanochat/flaxchat's schedule: (t+1)/warmup during warmup, 1 until the last warmdown_ratio of
// the run, then linear (or cosine-shaped) down to final_lr_frac at the last step.
struct WarmdownSchedule {
  int64_t warmup_steps = 40;
  double warmdown_ratio = 0.65;
  double final_lr_frac = 0.05;
  bool cosine = false;

  // Multiplier for update `step` (0-based) of a `total_steps` run.
  double operator()(int64_t step, int64_t total_steps) const;
};

}  // namespace muon
