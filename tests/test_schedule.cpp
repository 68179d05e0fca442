// Schedules against values computed independently here at their boundary steps
// (docs/design.md §Schedules).
#include "muon/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "helpers.h"
#include "muon/config.h"
#include "muon/error.h"

namespace muon {
namespace {

using testing::expect_error;

LrSchedule of(ScheduleKind kind) {
  LrSchedule s;
  s.kind = kind;
  return s;
}

TEST(Schedule, CosineIsOptaxWarmupCosineDecay) {
  auto s = of(ScheduleKind::cosine);
  s.init_value = 0.1;
  s.warmup_steps = 10;
  s.decay_steps = 100;
  s.end_value = 0.05;
  // optax: warmup linear init → peak; then cosine_decay_schedule(peak, 90, alpha = end/peak).
  auto optax = [](int64_t t) {
    if (t < 10) return 0.1 + 0.9 * t / 10.0;
    const double c = std::min<double>(t - 10, 90);
    return (1 - 0.05) * 0.5 * (1 + std::cos(M_PI * c / 90)) + 0.05;
  };
  for (int64_t t : {0, 1, 9, 10, 11, 55, 99, 100, 150}) {
    EXPECT_NEAR(s.multiplier(t, 200), optax(t), 1e-12) << t;
  }
  EXPECT_DOUBLE_EQ(s.multiplier(10, 200), 1.0);
  EXPECT_DOUBLE_EQ(s.multiplier(100, 200), 0.05);
  s.exponent = 2;
  EXPECT_NEAR(s.multiplier(55, 200), 0.05 + 0.95 * std::pow(0.5, 2), 1e-12);
  s.decay_steps.reset();  // the run's length
  EXPECT_NEAR(s.multiplier(105, 200), 0.05 + 0.95 * std::pow(0.5, 2), 1e-12);
}

TEST(Schedule, LinearIsWarmupStableDecay) {
  auto s = of(ScheduleKind::linear);
  s.warmup_steps = 10;
  s.decay_start = 50;
  s.decay_steps = 100;
  s.end_value = 0.1;
  EXPECT_DOUBLE_EQ(s.multiplier(0, 120), 0.0);
  EXPECT_DOUBLE_EQ(s.multiplier(9, 120), 0.9);
  EXPECT_DOUBLE_EQ(s.multiplier(10, 120), 1.0);
  EXPECT_DOUBLE_EQ(s.multiplier(50, 120), 1.0);
  EXPECT_DOUBLE_EQ(s.multiplier(75, 120), 1.0 - 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(s.multiplier(100, 120), 0.1);
  EXPECT_DOUBLE_EQ(s.multiplier(119, 120), 0.1);
  s.decay_start.reset();  // decays right after the warmup
  EXPECT_DOUBLE_EQ(s.multiplier(55, 120), 1.0 - 0.9 * 0.5);
}

TEST(Schedule, PowerLawWithWarmupAndTail) {
  auto s = of(ScheduleKind::power);
  s.power_a = 0.1;
  s.warmup_steps = 10;
  s.tail = PowerTail{200, 300, 0.0};
  const double peak = 0.02;
  auto law = [&](double t) { return std::min(peak, 0.1 * std::pow(t, -0.51)); };
  EXPECT_NEAR(s.multiplier(0, 400, peak), 0.0, 1e-15);
  EXPECT_NEAR(s.multiplier(5, 400, peak), law(10) * 0.5 / peak, 1e-12);
  EXPECT_NEAR(s.multiplier(10, 400, peak), law(10) / peak, 1e-12);  // capped at the peak
  EXPECT_NEAR(s.multiplier(100, 400, peak), law(100) / peak, 1e-12);
  EXPECT_LT(s.multiplier(100, 400, peak), 1.0);
  EXPECT_NEAR(s.multiplier(199, 400, peak), law(199) / peak, 1e-12);
  EXPECT_NEAR(s.multiplier(250, 400, peak), law(200) * 0.5 / peak, 1e-12);
  EXPECT_NEAR(s.multiplier(300, 400, peak), 0.0, 1e-15);
  EXPECT_NEAR(s.multiplier(350, 400, peak), 0.0, 1e-15);
}

TEST(Schedule, WarmdownIsNanochats) {
  auto s = of(ScheduleKind::warmdown);
  s.warmup_steps = 10;
  s.warmdown_ratio = 0.4;
  s.final_lr_frac = 0.1;
  EXPECT_DOUBLE_EQ(s.multiplier(0, 100), 0.1);  // (0+1)/10
  EXPECT_DOUBLE_EQ(s.multiplier(9, 100), 1.0);
  EXPECT_DOUBLE_EQ(s.multiplier(60, 100), 1.0);  // 100 − 40: the last step at peak
  EXPECT_DOUBLE_EQ(s.multiplier(61, 100), 0.1 + 0.9 * 39.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.multiplier(80, 100), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(s.multiplier(100, 100), 0.1);
  EXPECT_DOUBLE_EQ(s.multiplier(150, 100), 0.1);
  s.shape = WarmdownShape::cosine;
  s.final_lr_frac = 0.0;
  EXPECT_NEAR(s.multiplier(80, 100), 0.5, 1e-12);
  EXPECT_NEAR(s.multiplier(70, 100), 0.5 * (1 - std::cos(M_PI * 0.75)), 1e-12);
}

TEST(Schedule, OneCycleAndExponential) {
  auto s = of(ScheduleKind::one_cycle);
  EXPECT_NEAR(s.multiplier(0, 100), 1.0 / 25, 1e-12);
  EXPECT_NEAR(s.multiplier(30, 100), 1.0, 1e-12);
  EXPECT_NEAR(s.multiplier(100, 100), 1.0 / 25 / 1e4, 1e-15);
  EXPECT_NEAR(s.multiplier(15, 100), 1.0 / 25 + (1 - 1.0 / 25) * 0.5, 1e-12);
  auto e = of(ScheduleKind::exponential);
  e.warmup_steps = 4;
  e.decay_rate = 0.5;
  e.transition_steps = 10;
  EXPECT_DOUBLE_EQ(e.multiplier(2, 100), 0.5);
  EXPECT_DOUBLE_EQ(e.multiplier(4, 100), 1.0);
  EXPECT_DOUBLE_EQ(e.multiplier(24, 100), 0.25);
  EXPECT_DOUBLE_EQ(of(ScheduleKind::constant).multiplier(7, 10), 1.0);
}

TEST(Schedule, MomentumWeightDecayAndScalingRules) {
  MomentumSchedule m;  // 0.85 → 0.95 over 300 steps
  EXPECT_DOUBLE_EQ(m.value(0, 1000), 0.85);
  EXPECT_DOUBLE_EQ(m.value(150, 1000), 0.90);
  EXPECT_DOUBLE_EQ(m.value(300, 1000), 0.95);
  EXPECT_DOUBLE_EQ(m.value(900, 1000), 0.95);
  m.cool_down = true;  // back towards 0.85 over the last 65%
  EXPECT_DOUBLE_EQ(m.value(350, 1000), 0.95);
  EXPECT_NEAR(m.value(675, 1000), 0.85 + 0.1 * 0.5, 1e-12);
  WeightDecaySchedule wd{true};
  EXPECT_DOUBLE_EQ(wd.multiplier(0, 100), 1.0);
  EXPECT_NEAR(wd.multiplier(50, 100), 0.5, 1e-12);
  EXPECT_NEAR(wd.multiplier(100, 100), 0.0, 1e-12);
  ScalingRules rules;
  rules.batch_tokens = 4 * 524288.0;
  rules.d_model = 3072;
  rules.training_tokens = 2e9;
  rules.reference_tokens = 1e9;
  EXPECT_DOUBLE_EQ(rules.lr_multiplier(), 2.0);
  EXPECT_DOUBLE_EQ(rules.adamw_lr_multiplier(), 2.0 * 0.5);
  EXPECT_DOUBLE_EQ(rules.weight_decay_multiplier(), 2.0 * 0.5);
  // 2^19 · 2^0.383 = 2^19.383 → 2^19; 2^19 · 8^0.383 = 2^20.149 → 2^20.
  EXPECT_DOUBLE_EQ(ScalingRules::auto_batch_tokens(2e9, 1e9), 524288.0);
  EXPECT_DOUBLE_EQ(ScalingRules::auto_batch_tokens(8e9, 1e9), 1048576.0);
}

TEST(Schedule, InvalidRangesAreErrors) {
  auto cosine = of(ScheduleKind::cosine);
  cosine.warmup_steps = 100;
  cosine.decay_steps = 100;
  expect_error<Error>([&] { cosine.check(200); },
                      {"decay_steps (100) must exceed warmup_steps (100)"});
  auto linear = of(ScheduleKind::linear);
  linear.warmup_steps = 20;
  linear.decay_start = 10;
  expect_error<Error>([&] { linear.check(100); },
                      {"decay_start (10) must be >= warmup_steps (20)"});
  auto warmdown = of(ScheduleKind::warmdown);
  warmdown.warmdown_ratio = 1.5;
  expect_error<Error>([&] { warmdown.check(10); }, {"warmdown_ratio must be in [0, 1]", "1.5"});
  expect_error<Error>([] { of(ScheduleKind::constant).check(0); }, {"total_steps must be > 0"});
  expect_error<Error>([] { schedule_kind_from_string("step"); },
                      {"unknown schedule 'step'", "cosine, power, linear, warmdown"});
  MomentumSchedule m;
  m.target = 1.0;
  expect_error<Error>([&] { m.check(); }, {"start and target must be in [0, 1)"});
}

}  // namespace
}  // namespace muon

namespace muon {
namespace {

TEST(Schedule, WarmdownWarmsUpForFlaxchatsFortyStepsUnlessSet) {
  // flaxchat's warmdown schedule: 40 warmup steps by default, (t+1)/40 during them.
  const auto config = OptimConfig::from_yaml("optimizer: {schedule: {name: warmdown}}");
  const auto& s = *config.hybrid.schedule;
  EXPECT_FALSE(s.warmup_steps.has_value());
  EXPECT_EQ(s.warmup(), 40);
  EXPECT_DOUBLE_EQ(s.multiplier(0, 1000), 1.0 / 40.0);
  EXPECT_DOUBLE_EQ(s.multiplier(39, 1000), 1.0);
  EXPECT_NE(config.to_yaml().find("warmup_steps: null"), std::string::npos);
  // Set, it is what it says; other kinds default to none.
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {schedule: {name: warmdown, warmup_steps: 0}}")
                .hybrid.schedule->warmup(),
            0);
  EXPECT_EQ(
      OptimConfig::from_yaml("optimizer: {schedule: {name: cosine}}").hybrid.schedule->warmup(), 0);
}

}  // namespace
}  // namespace muon
