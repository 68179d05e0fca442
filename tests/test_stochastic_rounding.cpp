// Stochastic rounding against an independent scalar implementation of
// docs/design.md §Stochastic rounding written here.
#include "muon/stochastic_rounding.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "helpers.h"

namespace muon {
namespace {

// docs/design.md §Stochastic rounding, spelled out independently of the library.
uint32_t spec_fmix32(uint32_t h) {
  h = h ^ (h >> 16);
  h = static_cast<uint32_t>(static_cast<uint64_t>(h) * 0x85EBCA6Bull);
  h = h ^ (h >> 13);
  h = static_cast<uint32_t>(static_cast<uint64_t>(h) * 0xC2B2AE35ull);
  return h ^ (h >> 16);
}

uint16_t spec_round(float x, uint32_t seed, uint32_t index) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t noise =
      spec_fmix32(static_cast<uint32_t>(static_cast<uint64_t>(index) * 0x9E3779B1ull + seed)) &
      0xFFFF;
  return static_cast<uint16_t>((bits + noise) >> 16);
}

float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, 4);
  return f;
}

uint16_t bits_at(const at::Tensor& bf16, int64_t i) {
  return reinterpret_cast<const uint16_t*>(bf16.data_ptr())[i];
}

TEST(StochasticRounding, SeedsFollowTheSpec) {
  EXPECT_EQ(sr::fmix32(0), 0u);
  EXPECT_EQ(sr::fmix32(1), spec_fmix32(1));
  EXPECT_EQ(sr::fmix32(0xDEADBEEF), spec_fmix32(0xDEADBEEF));
  for (int64_t count : {0, 1, 7, 123456}) {
    const uint32_t step = spec_fmix32(static_cast<uint32_t>(count * 0x27D4EB2Fll));
    EXPECT_EQ(sr::step_seed(count), step);
    for (int64_t i : {0, 1, 5}) {
      const uint32_t salt = spec_fmix32(static_cast<uint32_t>(step + (2 * i + 1) * 0x165667B1ll));
      EXPECT_EQ(sr::tensor_salt(step, i), salt);
      EXPECT_EQ(sr::second_moment_salt(salt), spec_fmix32(salt + 0x9E3779B9u));
    }
  }
}

TEST(StochasticRounding, BitsEqualTheScalarSpec) {
  auto gen = testing::seeded(1);
  const auto x = at::randn({50000}, gen) * 3;
  for (uint32_t seed : {0u, 1u, 0xC0FFEEu}) {
    const auto rounded = sr::round_to_bf16(x, seed);
    ASSERT_EQ(rounded.scalar_type(), at::kBFloat16);
    const float* values = x.data_ptr<float>();
    int mismatches = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      mismatches += bits_at(rounded, i) != spec_round(values[i], seed, static_cast<uint32_t>(i));
    }
    EXPECT_EQ(mismatches, 0) << "seed " << seed;
  }
}

TEST(StochasticRounding, RoundsToANeighbourAndIsUnbiased) {
  // 1 + 0.3 ulp lies between bf16 1.0 and 1.0078125: it must round up 30% of the time.
  const float ulp = std::pow(2.0f, -7);
  for (float fraction : {0.3f, 0.5f, 0.9f}) {
    const float value = 1.0f + fraction * ulp;
    const auto x = at::full({200000}, value);
    const auto rounded = sr::round_to_bf16(x, 42).to(at::kFloat);
    const auto low = at::eq(rounded, 1.0f);
    const auto high = at::eq(rounded, 1.0f + ulp);
    EXPECT_TRUE(at::logical_or(low, high).all().item<bool>());
    // Standard error of the mean: ulp·√(f(1−f)/n) ≈ 1e-5; allow 5 of them.
    EXPECT_NEAR(rounded.mean().item<double>(), value, 5e-5) << fraction;
  }
  // Mixed magnitudes and signs: the mean rounding error over many draws vanishes.
  auto gen = testing::seeded(2);
  const auto x = at::randn({400000}, gen);
  const auto error = sr::round_to_bf16(x, 7).to(at::kDouble) - x.to(at::kDouble);
  const double typical_ulp = std::pow(2.0, -8);
  EXPECT_LT(std::abs(error.mean().item<double>()), 0.01 * typical_ulp);
  // Exactly representable values never move.
  const auto exact = at::tensor({1.0f, -2.5f, 0.0f, 1024.0f});
  EXPECT_TRUE(at::equal(sr::round_to_bf16(exact, 3).to(at::kFloat), exact));
}

TEST(StochasticRounding, NanAndInfinitySurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  float signalling;
  const uint32_t nan_bits = 0x7F800001u;  // a NaN that plain truncation would turn into +Inf
  std::memcpy(&signalling, &nan_bits, 4);
  const auto x = at::tensor({inf, -inf, std::nanf(""), signalling, -std::nanf("")});
  for (uint32_t seed = 0; seed < 64; ++seed) {
    const auto r = sr::round_to_bf16(x, seed);
    EXPECT_EQ(bf16_value(bits_at(r, 0)), inf);
    EXPECT_EQ(bf16_value(bits_at(r, 1)), -inf);
    EXPECT_TRUE(std::isnan(bf16_value(bits_at(r, 2))));
    EXPECT_TRUE(std::isnan(bf16_value(bits_at(r, 3))));
    EXPECT_TRUE(std::isnan(bf16_value(bits_at(r, 4))));
  }
}

TEST(StochasticRounding, SameBitsWithOneAndTwoThreads) {
  auto gen = testing::seeded(3);
  const auto x = at::randn({300000}, gen);
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = sr::round_to_bf16(x, 9);
  at::set_num_threads(2);
  const auto two = sr::round_to_bf16(x, 9);
  at::set_num_threads(before);
  EXPECT_TRUE(at::equal(one, two));
}

}  // namespace
}  // namespace muon
