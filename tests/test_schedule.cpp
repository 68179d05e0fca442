// The warmdown schedule against nanochat's formula evaluated by hand at its boundaries.
#include "muon/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "helpers.h"
#include "muon/error.h"

namespace muon {
namespace {

TEST(WarmdownSchedule, BoundariesOfALinearRun) {
  // 100 steps, warmup 10, last 40% (40 steps) decay to 0.1.
  const WarmdownSchedule s{10, 0.4, 0.1, false};
  EXPECT_DOUBLE_EQ(s(0, 100), 0.1);  // (0+1)/10
  EXPECT_DOUBLE_EQ(s(9, 100), 1.0);  // (9+1)/10
  EXPECT_DOUBLE_EQ(s(10, 100), 1.0);
  EXPECT_DOUBLE_EQ(s(60, 100), 1.0);  // 100 − 40: last step at peak
  EXPECT_DOUBLE_EQ(s(61, 100), 0.1 + 0.9 * 39.0 / 40.0);
  EXPECT_DOUBLE_EQ(s(80, 100), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(s(99, 100), 0.1 + 0.9 / 40.0);
  EXPECT_DOUBLE_EQ(s(100, 100), 0.1);
  EXPECT_DOUBLE_EQ(s(150, 100), 0.1);  // held at the floor past the end
}

TEST(WarmdownSchedule, CosineShape) {
  const WarmdownSchedule s{0, 0.5, 0.0, true};
  EXPECT_DOUBLE_EQ(s(0, 100), 1.0);
  EXPECT_NEAR(s(75, 100), 0.5, 1e-12);  // halfway through the warmdown
  EXPECT_NEAR(s(60, 100), 0.5 * (1 - std::cos(M_PI * 0.8)), 1e-12);
}

TEST(WarmdownSchedule, Errors) {
  testing::expect_error<Error>([] { WarmdownSchedule{}(0, 0); }, {"total_steps must be > 0"});
  testing::expect_error<Error>(
      [] {
        WarmdownSchedule{10, 1.5, 0.0, false}(0, 10);
      },
      {"warmdown_ratio must be in [0, 1]", "1.5"});
}

}  // namespace
}  // namespace muon
