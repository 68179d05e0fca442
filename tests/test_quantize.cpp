// 8-bit block-quantized state (muon/quantize.h): the maps against the formats they scale, codes
// against a brute-force nearest-entry search, the CPU loop against the ATen form, and the
// optimizers' int8 state — conversions, checks and refusals.
#include "muon/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "helpers.h"
#include "muon/adam.h"
#include "muon/config.h"
#include "muon/error.h"
#include "muon/lion.h"
#include "muon/muon.h"
#include "muon/param_state.h"

namespace muon {
namespace {

using q8::CodeMap;
using testing::expect_error;
using testing::seeded;

constexpr CodeMap kMaps[] = {CodeMap::signed_e4m3, CodeMap::unsigned_e5m3};

// A format's value written out from its definition: sign, exponent bits, 3 mantissa bits.
double format_value(CodeMap map, int code) {
  const bool is_signed = map == CodeMap::signed_e4m3;
  const int bias = is_signed ? 15 : 31;
  const int magnitude = is_signed ? code % 128 : code;
  const int exponent = magnitude / 8;
  const int mantissa = magnitude % 8;
  const double value = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - bias)
                                     : std::ldexp(1.0 + mantissa / 8.0, exponent - bias);
  return is_signed && code >= 128 ? -value : value;
}

// The code a straightforward search picks for x in a block of absolute maximum `absmax`: the
// entry nearest y = fp32(x · fp32(1.875 / absmax)), ties to the even code; the magnitude for the
// unsigned map.
int nearest_code(CodeMap map, float x, float absmax) {
  const float factor = absmax == 0 ? 0.0f : 1.875f / absmax;
  float y = x * factor;
  if (map == CodeMap::unsigned_e5m3) y = std::fabs(y);
  int best = 0;
  double best_distance = INFINITY;
  for (int code = 0; code < 256; ++code) {
    const double value = format_value(map, code);
    if (map == CodeMap::signed_e4m3 && std::signbit(value) != std::signbit(y)) continue;
    const double distance = std::fabs(static_cast<double>(y) - value);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return best;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().view(at::kByte), b.contiguous().view(at::kByte));
}

TEST(Quantize, CodesDecodeToTheFormatsValuesTimesAbsmaxOver1875) {
  for (const auto map : kMaps) {
    for (int code = 0; code < 256; ++code) {
      const float value = q8::format_value(map, static_cast<uint8_t>(code));
      EXPECT_EQ(value, static_cast<float>(format_value(map, code))) << code;
      EXPECT_EQ(std::signbit(value), std::signbit(format_value(map, code))) << code;
    }
  }
  EXPECT_EQ(q8::format_value(CodeMap::signed_e4m3, 127), 1.875f);
  EXPECT_EQ(q8::format_value(CodeMap::signed_e4m3, 255), -1.875f);
  EXPECT_EQ(q8::format_value(CodeMap::unsigned_e5m3, 255), 1.875f);
  EXPECT_TRUE(std::signbit(q8::format_value(CodeMap::signed_e4m3, 128)));  // −0
  // The smallest steps: 2⁻¹⁷ and 2⁻³³.
  EXPECT_EQ(q8::format_value(CodeMap::signed_e4m3, 1), std::ldexp(1.0f, -17));
  EXPECT_EQ(q8::format_value(CodeMap::unsigned_e5m3, 1), std::ldexp(1.0f, -33));
  // Decoding: (absmax / 1.875) · v, one fp32 division per block, on both paths.
  auto gen = seeded(2);
  for (const auto map : kMaps) {
    const auto codes = at::randint(0, 256, {3, 300}, gen).to(at::kByte);
    const auto absmax = at::rand({3, 2}, gen) * 10;
    const auto out = q8::dequantize(codes, absmax, map);
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t i = 0; i < 300; i += 7) {
        const float step = absmax[r][i / q8::kBlock].item<float>() / 1.875f;
        const auto code = static_cast<uint8_t>(codes[r][i].item<int>());
        ASSERT_EQ(out[r][i].item<float>(), step * q8::format_value(map, code)) << r << " " << i;
      }
    }
  }
}

TEST(Quantize, CodesAreTheNearestEntryForEveryCodeAndBetween) {
  auto gen = seeded(3);
  for (const auto map : kMaps) {
    SCOPED_TRACE(map == CodeMap::signed_e4m3 ? "signed" : "unsigned");
    // Every entry, the midpoints between neighbours (ties) and points just beside them, over
    // one block of absmax 1.875·2: x = value·2, so y is the value itself.
    std::vector<float> xs;
    for (int code = 0; code < 256; ++code) {
      const double v = format_value(map, code);
      xs.push_back(static_cast<float>(v * 2));
      for (double step : {-1.0, 1.0}) {
        const int next = code + static_cast<int>(step);
        if (next < 0 || next > 255 || (map == CodeMap::signed_e4m3 && next / 128 != code / 128)) {
          continue;
        }
        const double mid = (v + format_value(map, next)) / 2;
        xs.push_back(static_cast<float>(mid * 2));
        xs.push_back(std::nextafter(static_cast<float>(mid * 2), INFINITY));
        xs.push_back(std::nextafter(static_cast<float>(mid * 2), -INFINITY));
      }
    }
    // Random values across 40 binades, subnormal floats and ±0.
    const auto random = (at::randn({4096}, gen) *
                         at::pow(2.0, at::randint(-40, 1, {4096}, gen).to(at::kFloat)));
    for (int64_t i = 0; i < random.numel(); ++i) xs.push_back(random[i].item<float>());
    for (float special : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-39f}) xs.push_back(special);
    if (map == CodeMap::unsigned_e5m3) {
      for (auto& x : xs) x = std::fabs(x);
    }
    const int64_t n = static_cast<int64_t>(xs.size());
    const int64_t length = q8::kBlock;
    const int64_t rows = (n + length - 1) / length;
    xs.resize(static_cast<size_t>(rows * length), 0.0f);
    for (int64_t r = 0; r < rows; ++r) xs[static_cast<size_t>(r * length)] = 3.75f;
    const auto x = at::tensor(xs).reshape({rows, length});
    auto codes = at::empty(x.sizes(), at::kByte);
    auto absmax = at::empty({rows, 1}, at::kFloat);
    q8::quantize(x, codes, absmax, map);
    for (int64_t r = 0; r < rows; ++r) {
      const float top = absmax[r][0].item<float>();
      EXPECT_EQ(top, x[r].abs().max().item<float>());
      for (int64_t i = 0; i < length; ++i) {
        const float xi = xs[static_cast<size_t>(r * length + i)];
        ASSERT_EQ(codes[r][i].item<int>(), nearest_code(map, xi, top)) << "x = " << xi;
      }
    }
    // Dequantized, every value lies within half the widest step (1/8 before scaling) of x.
    const auto back = q8::dequantize(codes, absmax, map);
    EXPECT_TRUE(((back - x).abs().amax(1, true) <= absmax * (0.0625 / 1.875 * 1.0001)).all().item<bool>());
  }
}

// fp32 blocks of every kind: zeros, values under the smallest normal, ordinary ones over many
// binades, Inf and NaN.
at::Tensor awkward_blocks(at::Generator& gen) {
  auto x = at::randn({6, 700}, gen) * at::pow(2.0, at::randint(-20, 20, {6, 700}, gen).to(at::kFloat));
  x[0].zero_();
  x[1].fill_(1e-39f);
  x[1][5] = -1e-40f;
  x[2][3] = INFINITY;
  x[3][600] = NAN;
  x[4][1] = -0.0f;
  return x;
}

TEST(Quantize, CpuLoopAndAtenFormGiveTheSameBits) {
  auto gen = seeded(4);
  const auto x = awkward_blocks(gen);
  for (const auto map : kMaps) {
    for (const auto& t : {x, x.reshape({3, 2, 700}), at::randn({4096, 3}, gen)}) {
      auto codes = at::empty(t.sizes(), at::kByte);
      auto absmax = at::empty(q8::absmax_shape(t.sizes()), at::kFloat);
      auto codes_generic = codes.clone();
      auto absmax_generic = absmax.clone();
      q8::quantize(t, codes, absmax, map);
      q8::quantize_generic(t, codes_generic, absmax_generic, map);
      EXPECT_TRUE(same_bits(codes, codes_generic));
      EXPECT_TRUE(same_bits(absmax, absmax_generic));
    }
  }
  // The specials: a zero block and one under the smallest normal store 0; NaN a quiet NaN.
  auto codes = at::empty(x.sizes(), at::kByte);
  auto absmax = at::empty(q8::absmax_shape(x.sizes()), at::kFloat);
  q8::quantize(x, codes, absmax, CodeMap::signed_e4m3);
  EXPECT_EQ(absmax[0][0].item<float>(), 0.0f);
  EXPECT_EQ(absmax[1][0].item<float>(), 0.0f);
  EXPECT_TRUE(std::isinf(absmax[2][0].item<float>()));
  EXPECT_TRUE(std::isnan(absmax[3][2].item<float>()));
  EXPECT_TRUE(at::isnan(q8::dequantize(codes, absmax, CodeMap::signed_e4m3)[3].narrow(0, 512, 188)).all().item<bool>());
  EXPECT_EQ(codes[4][1].item<int>(), 128);  // −0 keeps its sign
}

TEST(Quantize, DequantizingAndQuantizingAgainGivesTheSameCodes) {
  auto gen = seeded(5);
  for (const auto map : kMaps) {
    auto x = at::randn({33, 300}, gen) * at::pow(2.0, at::randint(-30, 5, {33, 300}, gen).to(at::kFloat));
    if (map == CodeMap::unsigned_e5m3) x = x.square();
    auto codes = at::empty(x.sizes(), at::kByte);
    auto absmax = at::empty(q8::absmax_shape(x.sizes()), at::kFloat);
    q8::quantize(x, codes, absmax, map);
    auto codes2 = codes.clone();
    auto absmax2 = absmax.clone();
    q8::quantize(q8::dequantize(codes, absmax, map), codes2, absmax2, map);
    EXPECT_TRUE(at::equal(codes, codes2));
    // A block's largest element decodes to (absmax / 1.875) · 1.875: absmax to within the one
    // rounding of that division, which the product need not undo.
    EXPECT_LE(((absmax2 - absmax).abs() / absmax).max().item<float>(), 0x1p-23f);
  }
}

TEST(Quantize, BlocksLieWithinRowsAndSmallOrFlatTensorsKeepFullPrecision) {
  EXPECT_EQ(q8::absmax_shape({10, 1000}), (std::vector<int64_t>{10, 4}));
  EXPECT_EQ(q8::absmax_shape({4, 8, 100}), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(q8::absmax_shape({5000, 16}), (std::vector<int64_t>{5000, 1}));
  EXPECT_TRUE(q8::quantizes({64, 64}));
  EXPECT_FALSE(q8::quantizes({63, 64}));
  EXPECT_FALSE(q8::quantizes({100000}));
  AdamW opt({at::zeros({64, 64}, at::requires_grad()), at::zeros({32, 32}, at::requires_grad())},
            AdamWOptions(1e-3).state_dtype(at::kChar));
  const auto big = expected_state_slots(opt, opt.param_groups()[0].params()[0]);
  const auto small = expected_state_slots(opt, opt.param_groups()[0].params()[1]);
  std::vector<std::string> names;
  for (const auto& s : big) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"exp_avg_codes", "exp_avg_absmax", "exp_avg_sq_codes",
                                             "exp_avg_sq_absmax"}));
  ASSERT_EQ(small.size(), 2u);
  EXPECT_EQ(small[0].name, "exp_avg");
  EXPECT_EQ(small[0].dtype, at::kFloat);
}

// One AdamW step's worth of state, as another precision keeps it, converts once on load.
TEST(Quantize, StateOfAnotherPrecisionIsConvertedOnLoad) {
  auto gen = seeded(6);
  const auto p = at::randn({64, 100}, gen).requires_grad_(true);
  AdamW fp32({p}, AdamWOptions(1e-3));
  p.mutable_grad() = at::randn(p.sizes(), gen);
  fp32.step();
  auto entry = read_param_state(fp32, p).value();
  const auto m = entry.tensors.at("exp_avg").clone();
  AdamW int8({p}, AdamWOptions(1e-3).state_dtype(at::kChar));
  const auto lines = convert_state_precision(int8, p, entry, "state[0]");
  EXPECT_EQ(lines, (std::vector<std::string>{"exp_avg → exp_avg_codes, exp_avg_absmax",
                                             "exp_avg_sq → exp_avg_sq_codes, exp_avg_sq_absmax"}));
  check_param_state(int8, p, entry, "state[0]");
  auto codes = at::empty(m.sizes(), at::kByte);
  auto absmax = at::empty(q8::absmax_shape(m.sizes()), at::kFloat);
  q8::quantize(m, codes, absmax, CodeMap::signed_e4m3);
  EXPECT_TRUE(at::equal(entry.tensors.at("exp_avg_codes"), codes));
  EXPECT_TRUE(at::equal(entry.tensors.at("exp_avg_absmax"), absmax));
  // And back: the dequantized values.
  EXPECT_EQ(convert_state_precision(fp32, p, entry, "state[0]").size(), 2u);
  EXPECT_TRUE(at::equal(entry.tensors.at("exp_avg"), q8::dequantize(codes, absmax, CodeMap::signed_e4m3)));
}

TEST(Quantize, BadScalesAndCodesAreRefusedNamingTheTensor) {
  auto gen = seeded(7);
  const auto p = at::randn({64, 100}, gen).requires_grad_(true);
  Muon opt({p}, MuonOptions(0.02).state_dtype(at::kChar));
  p.mutable_grad() = at::randn(p.sizes(), gen);
  opt.step();
  const auto good = read_param_state(opt, p).value();
  const auto with = [&](const std::string& name, const at::Tensor& t) {
    auto e = good;
    e.tensors[name] = t;
    return e;
  };
  const auto absmax = good.tensors.at("momentum_buffer_absmax");
  struct Case {
    ParamStateEntry entry;
    std::string message;
  };
  const std::vector<Case> cases = {
      {with("momentum_buffer_absmax", absmax.clone().fill_(NAN)),
       "state[0].momentum_buffer_absmax holds NaN or Inf"},
      {with("momentum_buffer_absmax", absmax.clone().fill_(INFINITY)),
       "state[0].momentum_buffer_absmax holds NaN or Inf"},
      {with("momentum_buffer_absmax", -absmax),
       "state[0].momentum_buffer_absmax holds a negative scale"},
      {with("momentum_buffer_absmax", at::zeros({64, 2})),
       "state[0].momentum_buffer_absmax has shape [64, 2], this optimizer needs [64, 1]"},
      {with("momentum_buffer_codes", at::zeros({64, 100}, at::kInt)),
       "state[0].momentum_buffer_codes has dtype Int, this optimizer stores Byte"},
  };
  for (const auto& c : cases) {
    auto entry = c.entry;
    expect_error<Error>([&] { check_param_state(opt, p, entry, "state[0]"); }, {c.message});
  }
  // Converting from 8-bit to float32 checks the same.
  Muon full({p}, MuonOptions(0.02));
  auto bad = with("momentum_buffer_absmax", -absmax);
  expect_error<Error>([&] { convert_state_precision(full, p, bad, "state[0]"); },
                      {"state[0].momentum_buffer_absmax holds a negative scale"});
}

TEST(Quantize, Int8StateIsRefusedWhereItCannotBeKept) {
  const auto p64 = at::zeros({64, 64}, at::TensorOptions(at::kDouble).requires_grad(true));
  p64.mutable_grad() = at::ones_like(p64);
  expect_error<Error>([&] { AdamW({p64}, AdamWOptions(1e-3).state_dtype(at::kChar)).step(); },
                      {"AdamW: parameter 0 of param group 0 is float64; int8 state is kept for "
                       "float32, bfloat16 and float16 parameters"});
  EXPECT_TRUE(at::equal(p64, at::zeros_like(p64)));  // nothing changed
  expect_error<Error>([] { Lamb({at::zeros({64, 64}, at::requires_grad())},
                                LambOptions(1e-3).state_dtype(at::kChar)); },
                      {"Lamb: state_dtype int8 is not supported; LAMB keeps float32 state"});
  expect_error<Error>([] { Muon({at::zeros({64, 64}, at::requires_grad())},
                                MuonOptions(0.02).state_dtype(at::kShort)); },
                      {"Muon: state_dtype Short is not supported; use float32 (full precision), "
                       "bfloat16 (stochastic rounding) or int8 (8-bit blocks)"});
  expect_error<Error>([] { OptimConfig::from_yaml("optimizer: {state_dtype: int4}\n"); },
                      {"optimizer.state_dtype: expected float32, bfloat16 or int8, got 'int4'"});
  expect_error<Error>([] { OptimConfig::from_yaml("optimizer: {name: dion, state_dtype: int8}\n"); },
                      {"optimizer.state_dtype: dion (the matrices' algorithm) has no int8 state "
                       "(its momentum M and the power iteration on it need full precision"});
}

}  // namespace
}  // namespace muon
