// bf16 Newton–Schulz on CPU: its accuracy against the fp64 polar factor and against Keller
// Jordan's formulation computed in bf16, on random, condition-1e4 and low-rank inputs. The bf16
// products are emulated (fp32 products of bf16-rounded operands: the same arithmetic as oneDNN's
// bf16 kernels, summed in another order), so this runs on any CPU; where the CPU has bf16 dot
// products the same iterations run on oneDNN and are compared with the emulation.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "helpers.h"
#include "needs.h"
#include "math/cpu/bf16_rounding.h"
#include "muon/error.h"
#include "muon/internal/blas.h"
#include "muon/internal/kernel_choice.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/orthogonalize.h"

namespace muon::detail {
namespace {

using testing::seeded;

// U·Vᵀ over the singular values above fp32 rounding noise (Newton–Schulz maps zero ones to
// zero), in fp64.
at::Tensor polar_factor(const at::Tensor& x) {
  const auto [U, S, Vh] = at::linalg_svd(x.to(at::kDouble), /*full_matrices=*/false);
  const auto kept = (S > S.max() * 1e-5).to(at::kDouble);
  return at::matmul(U * kept, Vh);
}

// A bf16 matrix product as GPUs compute it: bf16 operands, fp32 sums, the result rounded to
// bf16. (LibTorch's own CPU bf16 matmul sums in bf16 in some versions: 1.13 on AVX2.)
at::Tensor mm_bf16(const at::Tensor& a, const at::Tensor& b) {
  return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(at::kBFloat16);
}

// Keller Jordan's zeropower_via_newtonschulz5 in bf16 as PyTorch 2.x on a GPU computes it: every
// tensor bf16, each operation's arithmetic in fp32 (scalars too) and its result rounded to bf16,
// products summed in fp32. (LibTorch 1.13's CPU kernels differ: a bf16 norm summed in bf16,
// scalars rounded to bf16, bf16 products summed in bf16 on AVX2 — spelled out here so that the
// reference is the same on every version.)
at::Tensor keller_jordan_bf16(const at::Tensor& g, const CoefficientTable& table, int64_t steps) {
  const auto f = [](const at::Tensor& t) { return t.to(at::kFloat); };
  const auto r = [](const at::Tensor& t) { return t.to(at::kBFloat16); };
  auto X = r(g);
  const bool tall = X.size(0) > X.size(1);
  if (tall) X = X.t();
  const auto norm = r(f(X).norm());
  X = r(f(X) / f(r(f(norm) * table.safety + table.eps)));  // the table's normalization
  for (int64_t t = 0; t < steps; ++t) {
    const auto& [a, b, c] = table.row(t);
    const auto A = mm_bf16(X, X.t());
    const auto B = r(f(r(f(A) * b)) + f(r(f(mm_bf16(A, A)) * c)));
    X = r(f(r(f(X) * a)) + f(mm_bf16(B, X)));
  }
  return f(tall ? X.t() : X).to(at::kDouble);
}

// Ours in bf16 by `method` (which normalizes as orthogonalize() does).
at::Tensor ours_bf16(const at::Tensor& g, NsMethod method, const CoefficientTable& table,
                     int64_t steps, Bf16Products products = Bf16Products::emulated) {
  const auto x = g.to(at::kFloat).unsqueeze(0).contiguous();
  auto X = at::empty_like(x);
  const auto options = OrthogonalizeOptions().steps(steps).coefficients(table);
  OrthogonalizeWorkspace ws;
  return bf16_iterations(x, X, method, table, steps, gram_restart_points(options, at::kBFloat16),
                         ws, products)[0]
      .to(at::kDouble);
}

double distance(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

struct Input {
  std::string name;
  at::Tensor x;
};

std::vector<Input> inputs() {
  auto gen = seeded(1);
  std::vector<Input> out;
  out.push_back({"random 192x192", at::randn({192, 192}, gen)});
  out.push_back({"random 96x288", at::randn({96, 288}, gen)});
  out.push_back({"random 288x96", at::randn({288, 96}, gen)});
  out.push_back(
      {"condition 1e4, 192x192", testing::with_singular_values(192, 192, 1e-4, at::kFloat, gen)});
  out.push_back(
      {"condition 1e4, 96x288", testing::with_singular_values(96, 288, 1e-4, at::kFloat, gen)});
  const auto U = testing::orthonormal_columns(192, 8, gen);
  const auto V = testing::orthonormal_columns(192, 8, gen);
  out.push_back({"rank 8, 192x192", at::matmul(U, V.t()).to(at::kFloat)});
  return out;
}

// ours at least as close as Keller Jordan's bf16 formulation with the same table, both to the fp64
// polar factor and to the same iterations in fp64 (which isolates rounding from the polynomial's
// own distance to the polar factor, which dominates the first).
// `bounded(input)`: whether the bound is asserted for that input (else only reported).
void expect_at_least_as_accurate(NsMethod method,
                                 const std::function<bool(const at::Tensor&)>& bounded = nullptr,
                                 Bf16Products products = Bf16Products::emulated) {
  for (const auto& table : {CoefficientTable::quintic(), CoefficientTable::polar_express()}) {
    for (const auto& input : inputs()) {
      SCOPED_TRACE(table.name + " " + input.name + " " + to_string(method));
      const auto options = OrthogonalizeOptions().coefficients(table);
      const auto polar = polar_factor(input.x);
      const auto fp64 = orthogonalize(input.x.to(at::kDouble), options);
      const auto kj = keller_jordan_bf16(input.x, table, 5);
      const auto ours = ours_bf16(input.x, method, table, 5, products);
      const auto fp32 = orthogonalize(input.x, options).to(at::kDouble);
      std::cout << table.name << " | " << input.name << " | " << to_string(method)
                << " | to the polar factor: ours bf16 " << distance(ours, polar)
                << ", Keller Jordan bf16 " << distance(kj, polar) << ", fp32 "
                << distance(fp32, polar) << " | to fp64 iterations: ours bf16 "
                << distance(ours, fp64) << ", Keller Jordan bf16 " << distance(kj, fp64)
                << ", fp32 " << distance(fp32, fp64) << "\n";
      if (bounded && !bounded(input.x)) continue;
      // To the polar factor, at least as close up to 0.1% of the distance: the spread that the
      // order of the products' sums alone gives (the emulation's against oneDNN's).
      EXPECT_LE(distance(ours, polar), distance(kj, polar) * (1 + 1e-3));
      EXPECT_LE(distance(ours, fp64), distance(kj, fp64));
      EXPECT_GT(distance(ours, fp64), distance(fp32, fp64));  // bf16 shows: the test is sound
    }
  }
}

TEST(OrthogonalizeBf16, PlainIsAtLeastAsAccurateAsKellerJordansBf16) {
  expect_at_least_as_accurate(NsMethod::plain);
}

TEST(OrthogonalizeBf16, SymmetricIsAtLeastAsAccurateAsKellerJordansBf16) {
  expect_at_least_as_accurate(NsMethod::symmetric);
}

bool long_matrix(const at::Tensor& x) {
  return std::max(x.size(0), x.size(1)) >= 3 * std::min(x.size(0), x.size(1));
}

// Gram in bf16 multiplies the polynomials' products together in bf16 operands: at least as
// accurate where the matrix is long (what `automatic` uses it for in bf16), not on square
// Polar Express inputs (reported above; docs/algorithms.md).
TEST(OrthogonalizeBf16, GramIsAtLeastAsAccurateAsKellerJordansBf16OnLongMatrices) {
  expect_at_least_as_accurate(NsMethod::gram, long_matrix);
}

// Under Bf16Products::libtorch, Gram's restarts and result run on LibTorch's bf16 GEMM, the
// result rounded to bf16 (every entry a bf16 value; tall matrices transposed back by tiles, whose
// edges 1500×596 exercises in both directions), on 1, 2 and 4 threads; the symmetric method has
// no such products and keeps its bits. Both stay within the spread of the products' summation
// order of the linked oneDNN's and the emulation's results, and Gram stays at least as accurate
// as Keller Jordan's chain.
TEST(OrthogonalizeBf16, LibTorchsProductsRoundGramsResultAndKeepItsAccuracy) {
  MUON_NEEDS_BF16_PRODUCTS();
  auto gen = seeded(5);
  const auto table = CoefficientTable::quintic();
  const int threads = at::get_num_threads();
  for (const auto& x : {at::randn({128, 384}, gen), at::randn({1500, 596}, gen)}) {
    for (const int run_on : {1, 2, 4}) {
      SCOPED_TRACE(std::to_string(x.size(0)) + "x" + std::to_string(x.size(1)) + " on " +
                   std::to_string(run_on) + " threads");
      at::set_num_threads(run_on);
      const auto gram = ours_bf16(x, NsMethod::gram, table, 5, Bf16Products::libtorch);
      EXPECT_TRUE(at::equal(gram, gram.to(at::kBFloat16).to(at::kDouble)));
      EXPECT_LT(distance(gram, ours_bf16(x, NsMethod::gram, table, 5, Bf16Products::onednn)), 2e-2);
      EXPECT_LT(distance(gram, ours_bf16(x, NsMethod::gram, table, 5)), 2e-2);
      EXPECT_TRUE(at::equal(ours_bf16(x, NsMethod::symmetric, table, 5, Bf16Products::libtorch),
                            ours_bf16(x, NsMethod::symmetric, table, 5, Bf16Products::onednn)));
    }
  }
  at::set_num_threads(threads);
  expect_at_least_as_accurate(NsMethod::gram, long_matrix, Bf16Products::libtorch);
}

// The description `muon bench` prints of where the bf16 products run (the oneDNN releases that
// choose between LibTorch's GEMM and ours: KernelChoice.ReleasesAreReadFromVersionTexts).
TEST(OrthogonalizeBf16, DescribesWhereItsProductsRun) {
  const auto described = bf16_products_description();
  if (!bf16_products_available()) {
    EXPECT_EQ(described.rfind("emulated: fp32 products of the bf16-rounded operands", 0), 0u)
        << described;
    EXPECT_NE(described.find(bf16_products_unavailable_reason()), std::string::npos) << described;
    EXPECT_EQ(default_bf16_products(), Bf16Products::emulated);
  } else if (default_bf16_products() == Bf16Products::libtorch) {
    EXPECT_EQ(described.rfind("whole bf16 products on LibTorch's oneDNN ", 0), 0u) << described;
  } else {
    EXPECT_EQ(described.rfind("every bf16 product on the linked oneDNN ", 0), 0u) << described;
  }
}

// Two symmetric steps against the same arithmetic spelled out with ATen's operations, on sides
// longer than the passes' tiles (32 rows × 256 columns) and not a multiple of them, wide and
// tall: W₁₆ = W rounded, A₁₆ = W₁₆·W₁₆ᵀ rounded, B = b·A₁₆ + c·A₁₆² rounded, W ← a·W + B·W₁₆
// with W in fp32, every product of bf16 operands summed in fp32 — whole products on the library
// the emulation's parts run on (blas::gemm_rows), so that only the arithmetic is compared, not
// two BLASes' orders of summation (another BLAS's fp32 sums flip some bf16 roundings of A and B:
// ~30 entries of a 300² matrix, 2e-4 of the result). Equal bit for bit here; the bound leaves
// room for a library whose split products sum otherwise than whole ones and so flip an entry
// (~4e-6 of the result's largest entry), while one entry per row left out of the mirror gives
// 1e-3.
TEST(OrthogonalizeBf16, TwoSymmetricStepsAreTheArithmeticByHandOnLargeSides) {
  auto gen = seeded(4);
  const auto table = CoefficientTable::quintic();
  const auto r = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  const auto mm = [](const at::Tensor& a, const at::Tensor& b) {
    const auto A = a.contiguous(), B = b.contiguous();
    auto C = at::empty({A.size(0), B.size(1)}, A.options());
    blas::gemm_rows(static_cast<int>(A.size(0)), static_cast<int>(B.size(1)),
                    static_cast<int>(A.size(1)), A.data_ptr<float>(), A.size(1),
                    B.data_ptr<float>(), B.size(1), C.data_ptr<float>(), C.size(1));
    return C;
  };
  for (const auto& shape : {std::vector<int64_t>{300, 520}, std::vector<int64_t>{700, 300}}) {
    SCOPED_TRACE(std::to_string(shape[0]) + "x" + std::to_string(shape[1]));
    const auto x = at::randn(shape, gen);
    const bool tall = shape[0] > shape[1];
    // Normalized as bf16_iterations normalizes: x·(1/‖x‖_F), formed in double.
    const auto x64 = x.to(at::kDouble);
    const auto normalized = (x64 * (1 / x64.norm().item<double>())).to(at::kFloat);
    auto W = (tall ? normalized.t() : normalized).contiguous();
    for (int64_t t = 0; t < 2; ++t) {
      const auto [a, b, c] = table.row(t);
      const auto W16 = r(W);
      const auto A16 = r(mm(W16, W16.t()));
      W = W * a + mm(r(A16 * b + mm(A16, A16) * c), W16);
    }
    OrthogonalizeWorkspace ws;
    const auto G = x.unsqueeze(0).contiguous();
    auto X = at::empty_like(G);
    bf16_iterations(G, X, NsMethod::symmetric, table, 2, {}, ws, Bf16Products::emulated);
    const auto got = tall ? X[0].t() : X[0];
    EXPECT_LT((got - W).abs().max().item<double>(), 1e-4 * W.abs().max().item<double>());
  }
}

// Muon orthogonalizes the same shapes every step through one workspace per shape: the result
// comes back in the workspace's buffer, the same bits each time, and a workspace that served
// another shape serves this one again.
TEST(OrthogonalizeBf16, AReusedWorkspaceGivesItsBufferAndTheSameBits) {
  const auto options = OrthogonalizeOptions().dtype(at::kBFloat16);
  auto gen = seeded(3);
  const auto wide = at::randn({2, 96, 288}, gen);
  const auto tall = at::randn({288, 96}, gen);
  MUON_NEEDS_BF16_PRODUCTS();
  OrthogonalizeWorkspace ws;
  const auto first = orthogonalize(wide, options, &ws).clone();
  const void* buffer = orthogonalize(wide, options, &ws).data_ptr();
  for (int call = 0; call < 2; ++call) {
    const auto again = orthogonalize(wide, options, &ws);
    EXPECT_EQ(again.data_ptr(), buffer);
    EXPECT_TRUE(at::equal(again, first));
  }
  EXPECT_TRUE(at::equal(orthogonalize(tall, options, &ws), orthogonalize(tall, options)));
  EXPECT_TRUE(at::equal(orthogonalize(wide, options, &ws), first));
  // The input's own memory as the iterates' (Muon's momentum directions): the same bits, wide and
  // tall, by every method.
  for (const auto method : {NsMethod::plain, NsMethod::symmetric, NsMethod::gram}) {
    const auto by_method = OrthogonalizeOptions(options).method(method);
    for (const auto& x : {wide, tall}) {
      auto scratch = x.clone();
      const auto result = orthogonalize_overwriting(scratch, by_method, &ws);
      EXPECT_EQ(result.data_ptr(), scratch.data_ptr()) << to_string(method);
      EXPECT_TRUE(at::equal(result, orthogonalize(x, by_method))) << to_string(method);
    }
  }
}

// The passes' element kernels against ATen, on lengths around the 16-wide vectors (the AVX512_BF16
// path's masked tails) and on this CPU's path, whichever it is: x·scale formed in double, rounded
// to fp32 (the copy), then to bf16 to nearest even; NaN stays NaN. The sum of squares in double,
// the same bits on 1 and 2 threads, also past the 64 pieces' minimum size.
TEST(OrthogonalizeBf16, RoundingAndSumsOfSquaresAreAtensArithmetic) {
  auto gen = seeded(9);
  for (const int64_t n : {0, 1, 15, 16, 17, 31, 33, 40, 1000}) {
    SCOPED_TRACE(n);
    auto x = at::randn({n}, gen) * 3;
    if (n > 4) x[3] = std::nan("");
    for (const double scale : {1.0, 0.37, 1e-30}) {
      auto out = at::empty({n}, at::kBFloat16);
      auto copy = at::empty({n});
      round_scaled_to_bf16(x.data_ptr<float>(), scale, copy.data_ptr<float>(),
                           out.data_ptr<at::BFloat16>(), n);
      const auto expected = (x.to(at::kDouble) * scale).to(at::kFloat);
      const auto finite = at::isfinite(expected);
      EXPECT_TRUE(at::equal(at::isnan(copy), at::isnan(expected))) << scale;
      EXPECT_TRUE(at::equal(copy.masked_select(finite), expected.masked_select(finite))) << scale;
      EXPECT_TRUE(at::equal(at::isnan(out), at::isnan(expected))) << scale;
      EXPECT_TRUE(
          at::equal(out.masked_select(finite), expected.to(at::kBFloat16).masked_select(finite)))
          << scale;
      auto rounded = at::empty({n}, at::kBFloat16);  // without a copy
      round_scaled_to_bf16(x.data_ptr<float>(), scale, nullptr, rounded.data_ptr<at::BFloat16>(),
                           n);
      EXPECT_TRUE(at::equal(rounded.masked_select(finite), out.masked_select(finite)));
    }
  }
  const int threads = at::get_num_threads();
  for (const int64_t n : {0, 1, 17, 70000, 5000000}) {
    const auto x = at::randn({n}, gen);
    at::set_num_threads(1);
    const double one = sum_of_squares(x.data_ptr<float>(), n);
    at::set_num_threads(2);
    const double two = sum_of_squares(x.data_ptr<float>(), n);
    const double expected = x.to(at::kDouble).square().sum().item<double>();
    EXPECT_EQ(one, two) << n;
    EXPECT_NEAR(one, expected, 1e-12 * expected) << n;
  }
  at::set_num_threads(threads);
}

// The hardware path and the emulation: the same arithmetic, summed in another order. A side of
// 128 is one block of the half products, spread over the threads; 600 is four (the last of 24
// rows): dealt whole to 1 or 2 threads, spread over 4 (a block left out would be far off).
TEST(OrthogonalizeBf16, TheHardwareProductsAgreeWithTheEmulation) {
  MUON_NEEDS_BF16_PRODUCTS();
  auto gen = seeded(2);
  const int threads = at::get_num_threads();
  for (const int run_on : {1, 2, 4}) {
    at::set_num_threads(run_on);
    for (const auto& x : {at::randn({128, 384}, gen), at::randn({1500, 600}, gen)}) {
      for (auto method : {NsMethod::plain, NsMethod::symmetric, NsMethod::gram}) {
        const auto table = CoefficientTable::quintic();
        EXPECT_LT(distance(ours_bf16(x, method, table, 5, Bf16Products::onednn),
                           ours_bf16(x, method, table, 5)),
                  2e-2)
            << to_string(method) << " " << x.sizes() << " on " << run_on << " threads";
      }
    }
  }
  at::set_num_threads(threads);
  EXPECT_EQ(resolve_method(at::zeros({128, 384}), OrthogonalizeOptions().dtype(at::kBFloat16)),
            NsMethod::gram);
  EXPECT_EQ(resolve_method(at::zeros({128, 256}), OrthogonalizeOptions().dtype(at::kBFloat16)),
            NsMethod::symmetric);
}

// bf16 on CPU runs on every CPU: on bf16 dot products where the CPU has them, else emulated in
// fp32 (Bf16Products::emulated, which default_bf16_products() then names) — within bf16's
// precision of the fp32 chain, and not the fp32 chain itself.
TEST(OrthogonalizeBf16, Bf16OnCpuRunsOnEveryCpu) {
  auto gen = seeded(12);
  const auto x = at::randn({96, 160}, gen);
  const auto bf16 = orthogonalize(x, OrthogonalizeOptions().dtype(at::kBFloat16));
  const auto fp32 = orthogonalize(x, OrthogonalizeOptions());
  const double distance = ((bf16 - fp32).norm() / fp32.norm()).item<double>();
  EXPECT_GT(distance, 1e-4);  // bf16 operands
  EXPECT_LT(distance, 4e-2);
  EXPECT_EQ(default_bf16_products() == Bf16Products::emulated, !bf16_products_available());
  if (!testing::cpu_flags_promise_bf16_products() || !cpu_features().ceiling.empty()) {
    EXPECT_EQ(default_bf16_products(), Bf16Products::emulated);
  }
}

}  // namespace
}  // namespace muon::detail
