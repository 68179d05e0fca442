// orthogonalize() against the polar factor U·Vᵀ of an SVD computed here (the library uses none).
#include "muon/orthogonalize.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "helpers.h"
#include "needs.h"
#include "muon/internal/blas.h"
#include "muon/internal/lanes.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/error.h"
#include "muon/option_schema.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

struct Band {
  const char* table;
  double low, high;   // singular values after `steps` iterations on inputs of condition ≤ 20
  int64_t steps = 5;  // the table's own length where it is made for more than 5
};

// Known bands: Keller Jordan's quintic oscillates in about [0.68, 1.13]; Polar Express's last
// row leaves [0.86, 1.14]; Dion's table converges to about [0.98, 1.03]; CANS to [0.88, 1.12],
// the AOL rows (repeating the last) to [0.99, 1.04], the cubic steps to [0.77, 1.30], and
// DeepSeek-V4's 10 iterations to [1.000, 1.001] (docs/algorithms.md).
const Band kBands[] = {{"quintic", 0.67, 1.15},         {"polar_express", 0.85, 1.15},
                       {"dion", 0.97, 1.04},            {"cans", 0.87, 1.13},
                       {"aol", 0.98, 1.05},             {"cubic5", 0.76, 1.31},
                       {"deepseekv4", 0.999, 1.002, 10}};

struct Shape {
  std::vector<int64_t> dims;  // (..., rows, cols)
};

const Shape kShapes[] = {{{64, 64}}, {{96, 32}}, {{32, 96}}, {{3, 40, 40}}, {{2, 2, 24, 56}}};

// Rebuilds x's polar basis from an SVD and returns Uᵀ·out·V per matrix: diagonal with out's
// singular values exactly when out shares x's singular vectors.
at::Tensor in_svd_basis(const at::Tensor& x, const at::Tensor& out) {
  const auto x64 = x.to(at::kDouble);
  const auto [U, S, Vh] = at::linalg_svd(x64, /*full_matrices=*/false);
  return at::matmul(at::matmul(U.transpose(-2, -1), out.to(at::kDouble)), Vh.transpose(-2, -1));
}

at::Tensor random_batch(const Shape& shape, at::ScalarType dtype, at::Generator& gen) {
  const auto rows = shape.dims[shape.dims.size() - 2];
  const auto cols = shape.dims.back();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < shape.dims.size(); ++i) batch *= shape.dims[i];
  std::vector<at::Tensor> mats;
  for (int64_t b = 0; b < batch; ++b) {
    mats.push_back(testing::with_singular_values(rows, cols, 0.05, dtype, gen));
  }
  return at::stack(mats).reshape(shape.dims);
}

const NsMethod kMethods[] = {NsMethod::plain, NsMethod::symmetric, NsMethod::gram};

TEST(Orthogonalize, SingularValuesInTableBandAndSingularVectorsMatch) {
  auto gen = seeded(1);
  for (const auto& band : kBands) {
    for (const auto& shape : kShapes) {
      for (auto dtype : {at::kFloat, at::kDouble}) {
        for (auto method : kMethods) {
          SCOPED_TRACE(std::string(band.table) + " " + to_string(method) + " " +
                       c10::toString(dtype) + " shape " + std::to_string(shape.dims.size()) +
                       "-d " + std::to_string(shape.dims[shape.dims.size() - 2]) + "x" +
                       std::to_string(shape.dims.back()));
          const auto x = random_batch(shape, dtype, gen);
          const auto out = orthogonalize(x, OrthogonalizeOptions()
                                                .steps(band.steps)
                                                .coefficients(CoefficientTable::by_name(band.table))
                                                .method(method));
          ASSERT_EQ(out.sizes(), x.sizes());
          ASSERT_EQ(out.scalar_type(), dtype);

          const auto d = in_svd_basis(x, out);
          const auto diag = d.diagonal(0, -2, -1);
          EXPECT_GE(diag.min().item<double>(), band.low);
          EXPECT_LE(diag.max().item<double>(), band.high);
          const auto off = d - at::diag_embed(diag);
          const double tolerance = dtype == at::kDouble ? 1e-9 : 1e-4;
          EXPECT_LT(off.abs().max().item<double>(), tolerance);
          // The measured singular values agree with the diagonal (nothing hides off it).
          const auto sv = at::linalg_svdvals(out.to(at::kDouble));
          EXPECT_GE(sv.min().item<double>(), band.low);
          EXPECT_LE(sv.max().item<double>(), band.high);
        }
      }
    }
  }
}

// Inputs that stress the fast paths: Gaussian, condition number 1e4, and rank 3.
std::vector<at::Tensor> hard_inputs(int64_t rows, int64_t cols, at::ScalarType dtype,
                                    at::Generator& gen) {
  const auto k = std::min(rows, cols);
  const auto U = testing::orthonormal_columns(rows, k, gen);
  const auto V = testing::orthonormal_columns(cols, k, gen);
  const auto s = at::pow(10.0, at::linspace(0, -4, k, at::kDouble));  // condition 1e4
  const auto ill = at::matmul(U * s, V.t());
  const auto low_rank =
      at::matmul(at::randn({rows, 3}, gen, at::kDouble), at::randn({3, cols}, gen, at::kDouble));
  return {at::randn({rows, cols}, gen).to(dtype), ill.to(dtype), low_rank.to(dtype)};
}

TEST(Orthogonalize, FastPathsAreAsAccurateAsThePlainIteration) {
  // Reference: the plain iteration in float64. In float64 every method must agree with it to
  // 1e-10; in float32 a fast path's error may be at most 3× the plain float32 chain's own error
  // (plus 2e-5 absolute slack for inputs where that is ~0). Errors are relative to the largest
  // entry of the reference. Gram iterations restart where gram_restart_points() says (quintic
  // after 3, Polar Express and Dion after 2 and 4): without restarts the squared condition number
  // of the Gram matrix costs float32 up to 2e-2 on these inputs.
  auto gen = seeded(12);
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {48, 192}, {192, 48}, {100, 37}}) {
    for (const auto& x64 : hard_inputs(rows, cols, at::kDouble, gen)) {
      for (const char* table : {"quintic", "polar_express", "dion"}) {
        const auto options = OrthogonalizeOptions().coefficients(CoefficientTable::by_name(table));
        const auto truth =
            orthogonalize(x64, OrthogonalizeOptions(options).method(NsMethod::plain));
        const auto x32 = x64.to(at::kFloat);
        const double plain_error = testing::max_rel_diff(
            orthogonalize(x32, OrthogonalizeOptions(options).method(NsMethod::plain)), truth);
        for (auto method : {NsMethod::symmetric, NsMethod::gram}) {
          SCOPED_TRACE(std::string(table) + " " + to_string(method) + " " + std::to_string(rows) +
                       "x" + std::to_string(cols));
          const auto fast_options = OrthogonalizeOptions(options).method(method);
          EXPECT_LT(testing::max_rel_diff(orthogonalize(x64, fast_options), truth), 1e-10);
          EXPECT_LE(testing::max_rel_diff(orthogonalize(x32, fast_options), truth),
                    3 * plain_error + 2e-5)
              << "plain float32 error " << plain_error;
        }
      }
    }
  }
}

// Sets LibTorch's thread count for a scope.
struct Threads {
  explicit Threads(int n) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(before); }
  int before = at::get_num_threads();
};

TEST(Orthogonalize, FastPathsSplitTheirProductsOverAnyThreadCount) {
  // Large enough for every product to be split between the threads (row blocks of the triangles,
  // column blocks of W), with sides that are no multiple of the kernels' tiles, on 1, 2 or 3
  // threads: in float64 (BLIS or the CBLAS) the split must not change the result beyond rounding;
  // in float32 every split is as accurate as the plain float32 chain, by the bound of
  // FastPathsAreAsAccurateAsThePlainIteration. A side of 610 is five row blocks of a symmetric
  // product where float32 runs on oneDNN's or MKL's sgemm (128 rows each, the last 98;
  // blas_backend() names it there): dealt to 1 or 2 threads, each spread over 3.
  auto gen = seeded(13);
  const Threads restore(at::get_num_threads());
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{610, 803}, {803, 610}}) {
    const auto x = testing::with_singular_values(rows, cols, 0.05, at::kDouble, gen);
    const auto truth = orthogonalize(x, OrthogonalizeOptions().method(NsMethod::plain));
    const auto x32 = x.to(at::kFloat);
    const double plain_error = testing::max_rel_diff(
        orthogonalize(x32, OrthogonalizeOptions().method(NsMethod::plain)), truth);
    for (int threads : {1, 2, 3}) {
      at::set_num_threads(threads);
      for (auto method : {NsMethod::symmetric, NsMethod::gram}) {
        SCOPED_TRACE(to_string(method) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                     " on " + std::to_string(threads) + " threads, " + blas_backend());
        const auto options = OrthogonalizeOptions().method(method);
        EXPECT_LT(testing::max_rel_diff(orthogonalize(x, options), truth), 1e-10);
        EXPECT_LE(testing::max_rel_diff(orthogonalize(x32, options), truth), 3 * plain_error + 2e-5)
            << "plain float32 error " << plain_error;
      }
    }
  }
}

// With at least one matrix per thread, each thread iterates whole matrices with every product on
// that thread; what whole rounds leave over is iterated with its products split. Each matrix must
// come out as it does alone: the same products, split the same way (120×256 is large enough to
// split them), so the same bits in float32 and float64 where ATen sums the norm of the
// normalization on one thread either way (below its grain of 32768 elements); within bf16
// rounding where oneDNN sums a product's long side in an order that depends on the threads it
// runs on. A matrix mixed up with another would be far off. 5 matrices leave some over; 6 not.
void expect_lanes_iterate_whole_matrices(at::ScalarType dtype) {
  auto gen = seeded(14);
  const Threads restore(at::get_num_threads());
  for (auto [n, rows, cols] : std::vector<std::array<int64_t, 3>>{
           {5, 96, 96}, {5, 200, 72}, {6, 120, 256}}) {
    const auto x = at::randn({n, rows, cols}, gen);
    const auto input = x.to(dtype == at::kDouble ? dtype : at::kFloat);
    for (int threads : {2, 3}) {
      at::set_num_threads(threads);
      for (auto method : {NsMethod::symmetric, NsMethod::gram}) {
        SCOPED_TRACE(to_string(method) + " " + c10::toString(dtype) + " " + std::to_string(n) +
                     "x" + std::to_string(rows) + "x" + std::to_string(cols) + " on " +
                     std::to_string(threads) + " threads");
        const auto options = OrthogonalizeOptions().method(method).dtype(dtype);
        OrthogonalizeWorkspace ws;
        for (int call = 0; call < 2; ++call) {  // the second with every buffer already made
          const auto batch = orthogonalize(input, options, &ws);
          for (int64_t i = 0; i < n; ++i) {
            const auto alone = orthogonalize(input[i], options);
            if (dtype == at::kBFloat16) {
              EXPECT_LT(testing::max_rel_diff(batch[i], alone), 3e-2) << i;
            } else {
              EXPECT_TRUE(at::equal(batch[i], alone)) << i;
            }
          }
        }
      }
    }
  }
}

TEST(Orthogonalize, EachThreadIteratesWholeMatricesOfABatchInItsOwnLane) {
  expect_lanes_iterate_whole_matrices(at::kFloat);
  expect_lanes_iterate_whole_matrices(at::kDouble);
}

TEST(Orthogonalize, EachThreadIteratesWholeMatricesOfABatchInItsOwnLaneInBf16) {
  MUON_NEEDS_BF16_PRODUCTS();
  expect_lanes_iterate_whole_matrices(at::kBFloat16);
}

TEST(Orthogonalize, LanesRunInTheCallersGradAndInferenceMode) {
  // The lanes' threads come from LibTorch's pool, whose thread-local modes are their own: without
  // the caller's, a tensor that requires grad fails the out= writes under no_grad, and an
  // inference tensor its in-place writes outside inference mode.
  const Threads two(2);
  auto gen = seeded(15);
  const auto x = at::randn({16, 192, 192}, gen);  // enough work for both threads to take some
  const auto expected = orthogonalize(x);
  {
    const auto leaf = x.clone().requires_grad_(true);
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(orthogonalize(leaf), expected));
  }
  {
    const c10::InferenceMode inference;
    EXPECT_TRUE(at::equal(orthogonalize(x.clone()), expected));
  }
}

TEST(Lanes, EveryItemRunsOnceOnALaneAndTheFirstErrorStopsThem) {
  const Threads three(3);
  EXPECT_EQ(detail::lane_threads(), 3);
  EXPECT_EQ(detail::items_in_lanes(8, 3), 6);  // whole rounds
  EXPECT_EQ(detail::items_in_lanes(2, 3), 0);
  EXPECT_EQ(detail::items_in_lanes(8, 1), 0);
  std::vector<std::atomic<int>> runs(50);
  std::atomic<int> outside_range{0};
  detail::for_each_in_lanes(50, 3, [&](int64_t item, int64_t lane) {
    ++runs[item];
    if (lane < 0 || lane >= 3) ++outside_range;
  });
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i], 1) << i;
  EXPECT_EQ(outside_range, 0);
  std::atomic<int> started{0};
  testing::expect_error<std::runtime_error>(
      [&] {
        detail::for_each_in_lanes(200, 3, [&](int64_t item, int64_t) {
          ++started;
          if (item == 4) throw std::runtime_error("item 4 failed");
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        });
      },
      {"item 4 failed"});
  EXPECT_LT(started, 200);  // the lanes stopped taking items
}

TEST(Orthogonalize, GramRestartPointsFollowTheTableAndAnyScheduleIsExactInFloat64) {
  const auto points = [](const CoefficientTable& table, int64_t steps) {
    return gram_restart_points(OrthogonalizeOptions().coefficients(table).steps(steps));
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(points(CoefficientTable::quintic(), 5), V({3}));
  EXPECT_EQ(points(CoefficientTable::polar_express(), 5), V({2, 4}));
  EXPECT_EQ(points(CoefficientTable::dion(), 5), V({2, 4}));
  EXPECT_EQ(points(CoefficientTable::quintic(), 6), V({3, 4}));  // the last stretch stays at 2
  EXPECT_EQ(points(CoefficientTable::quintic(), 3), V({1}));
  EXPECT_EQ(points(CoefficientTable::quintic(), 2), V());
  EXPECT_EQ(points(CoefficientTable::polar_express(), 3), V({2}));
  EXPECT_EQ(gram_restart_points(OrthogonalizeOptions().gram_restarts(V{1, 7})), V({1, 7}));

  // In float64 every schedule computes the same polynomial as the plain chain: this runs each
  // branch (restart right away, every iteration, never, past the last step).
  auto gen = seeded(14);
  const auto x = testing::with_singular_values(24, 70, 0.01, at::kDouble, gen);
  for (const auto& table : {CoefficientTable::quintic(), CoefficientTable::polar_express()}) {
    const auto options = OrthogonalizeOptions().coefficients(table);
    const auto truth = orthogonalize(x, OrthogonalizeOptions(options).method(NsMethod::plain));
    for (const auto& restarts : {V{}, V{1}, V{1, 2, 3, 4}, V{2, 4}, V{3}, V{4, 9}}) {
      SCOPED_TRACE(table.name + " restarts " + c10::str(at::IntArrayRef(restarts)));
      const auto gram = orthogonalize(
          x.t(), OrthogonalizeOptions(options).method(NsMethod::gram).gram_restarts(restarts));
      EXPECT_LT(testing::max_rel_diff(gram.t(), truth), 1e-10);
    }
  }

  for (const auto& bad : {V{2, 2}, V{0}, V{3, 1}}) {
    expect_error<Error>([&] { orthogonalize(x, OrthogonalizeOptions().gram_restarts(bad)); },
                        {"gram_restarts must be strictly increasing iteration counts >= 1",
                         c10::str(at::IntArrayRef(bad))});
  }
  auto table = CoefficientTable::custom({{3.4445, -4.7750, 2.0315}});
  table.gram_restart_interval = 0;
  expect_error<Error>([&] { orthogonalize(x, OrthogonalizeOptions().coefficients(table)); },
                      {"gram_restart_interval must be >= 1, got 0", "table 'custom'"});
}

TEST(Orthogonalize, TheBlasBackendLeavesLibTorchItsOwnBlas) {
  EXPECT_TRUE(blas_backend().rfind("BLIS ", 0) == 0 || blas_backend().rfind("CBLAS", 0) == 0)
      << blas_backend();
  // BLIS is linked statically, and it brings BLAS-compatible sgemm_ & co. If the executable
  // exported them, LibTorch's own GEMMs would bind to them instead of its BLAS.
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  ASSERT_NE(sgemm, nullptr);
  Dl_info where{};
  ASSERT_NE(dladdr(sgemm, &where), 0);
  const auto self = std::filesystem::canonical("/proc/self/exe");
  EXPECT_NE(std::filesystem::canonical(where.dli_fname), self) << "sgemm_ resolves to " << self;
}

TEST(Orthogonalize, AutomaticPicksByShapeAndWorkspacesAreReused) {
  auto gen = seeded(13);
  EXPECT_EQ(resolve_method(at::zeros({64, 64}), {}), NsMethod::symmetric);
  EXPECT_EQ(resolve_method(at::zeros({64, 512}), {}), NsMethod::gram);
  // Nearly square: BLIS's triangular products make gram the cheaper one for any m > k; a CBLAS's
  // (GEMMs on 128-row blocks: whole products below k = 128) only from m > 5k/3 at such k, and so
  // do row blocks of an sgemm (fp32 on oneDNN's or MKL's, 128 rows) and of oneDNN's bf16 products
  // (192 rows).
  const bool triangles = blas_backend().rfind("BLIS", 0) == 0 && !detail::blas::fp32_on_sgemm();
  EXPECT_EQ(resolve_method(at::zeros({64, 65}), {}),
            triangles ? NsMethod::gram : NsMethod::symmetric);
  EXPECT_EQ(resolve_method(at::zeros({64, 65}, at::kDouble), {}),
            blas_backend().rfind("BLIS", 0) == 0 ? NsMethod::gram : NsMethod::symmetric);
  EXPECT_EQ(resolve_method(at::zeros({512, 64}, at::kDouble), {}), NsMethod::gram);
  // bf16 on CPU: the same choice on bf16 dot products and on their emulation (the CPU default
  // stays float32; test_orthogonalize_bf16.cpp has the bf16 path itself).
  const auto bf16 = OrthogonalizeOptions().dtype(at::kBFloat16);
  EXPECT_EQ(resolve_method(at::zeros({64, 64}, at::kBFloat16), bf16), NsMethod::symmetric);
  EXPECT_EQ(resolve_method(at::zeros({64, 512}), bf16), NsMethod::gram);
  expect_error<Error>(
      [] {
        orthogonalize(at::zeros({4, 4}, at::kDouble).to(at::kMeta),
                      OrthogonalizeOptions().method(NsMethod::gram));
      },
      {"method 'gram' runs on CPU float32/float64", "on meta", "'automatic' or 'plain'"});
  OrthogonalizeWorkspace ws;
  const auto x = at::randn({3, 32, 96}, gen);
  const auto first = orthogonalize(x, {}, &ws);
  const void* storage = first.data_ptr();
  const auto expected = first.clone();
  const auto second = orthogonalize(x, {}, &ws);
  EXPECT_EQ(second.data_ptr(), storage);  // same buffer: no allocation in the steady state
  EXPECT_TRUE(at::equal(second, expected));
  EXPECT_TRUE(at::equal(second, orthogonalize(x)));
  // A smaller batch of another shape takes the front of the same buffers (one set of buffers for
  // every shape: the largest's), and the larger one finds them again: shapes in turn allocate
  // nothing. (Which of the two iterate buffers holds a result depends on the method the shape
  // gets, and that on the BLAS.)
  const auto small = at::randn({2, 40, 24}, gen);
  const auto third = orthogonalize(small, {}, &ws);
  const void* small_storage = third.data_ptr();
  EXPECT_TRUE(at::equal(third, orthogonalize(small)));
  EXPECT_EQ(orthogonalize(x, {}, &ws).data_ptr(), storage);
  EXPECT_EQ(orthogonalize(small, {}, &ws).data_ptr(), small_storage);
  // Given up by the caller, the input's own memory holds the first iterate (the result ends in it
  // or in the workspace's second buffer, which the fp32 methods alternate with): the same bits.
  for (const auto method : {NsMethod::symmetric, NsMethod::gram}) {
    auto scratch = x.clone();
    const auto options = OrthogonalizeOptions().method(method);
    const auto result = orthogonalize_overwriting(scratch, options, &ws);
    EXPECT_TRUE(at::equal(result, orthogonalize(x, options))) << to_string(method);
    EXPECT_FALSE(at::equal(scratch, x)) << to_string(method);  // its memory was used
  }
  auto doubles = x.to(at::kDouble);  // a cast first (working dtype float32): x is not touched
  const auto kept = doubles.clone();
  const auto cast = orthogonalize_overwriting(doubles, OrthogonalizeOptions().dtype(at::kFloat));
  EXPECT_TRUE(at::equal(doubles, kept));
  EXPECT_NE(cast.data_ptr(), doubles.data_ptr());
  expect_error<Error>([] { ns_method_from_string("fast"); },
                      {"'fast'", "automatic, plain, symmetric, gram"});
}

TEST(Orthogonalize, MoreStepsOfQuinticStayInBandAndTableRowsRepeat) {
  auto gen = seeded(2);
  const auto x = testing::with_singular_values(48, 48, 0.05, at::kDouble, gen);
  const auto ten = orthogonalize(x, OrthogonalizeOptions().steps(10));
  const auto sv = at::linalg_svdvals(ten);
  EXPECT_GE(sv.min().item<double>(), 0.67);
  EXPECT_LE(sv.max().item<double>(), 1.15);
  // A one-row custom table equal to the quintic gives the quintic's result.
  const auto custom =
      orthogonalize(x, OrthogonalizeOptions().steps(10).coefficients(
                           CoefficientTable::custom({{3.4445, -4.7750, 2.0315}})));
  EXPECT_TRUE(at::equal(custom, ten));
}

TEST(Orthogonalize, TallEqualsTransposedWide) {
  auto gen = seeded(3);
  const auto x = testing::with_singular_values(80, 24, 0.1, at::kDouble, gen);
  const auto tall = orthogonalize(x);
  const auto wide = orthogonalize(x.t().contiguous()).t();
  EXPECT_LT(testing::max_rel_diff(tall, wide), 1e-12);
}

TEST(Orthogonalize, CustomTableFollowsTheFormulaByHand) {
  // One step of p(x) = a·x + b·x³ + c·x⁵ on a diagonal matrix acts on each singular value.
  const auto x = at::diag(at::tensor({3.0, 4.0}, at::kDouble));  // ‖x‖_F = 5
  const auto out = orthogonalize(x, OrthogonalizeOptions().steps(1).coefficients(
                                        CoefficientTable::custom({{2, -1, 0.5}}, 1.0, 1e-12)));
  for (int i = 0; i < 2; ++i) {
    const double s = (i == 0 ? 3.0 : 4.0) / 5.0;
    EXPECT_NEAR(out[i][i].item<double>(), 2 * s - s * s * s + 0.5 * std::pow(s, 5), 1e-12);
  }
  EXPECT_EQ(out[0][1].item<double>(), 0.0);
}

TEST(Orthogonalize, InputIsNeverModified) {
  auto gen = seeded(4);
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const auto x = at::randn({16, 8}, gen).to(dtype);
    const auto copy = x.clone();
    orthogonalize(x);
    orthogonalize(x.t());  // a non-contiguous view
    EXPECT_TRUE(at::equal(x, copy));
  }
}

TEST(Orthogonalize, ZeroTinyAndThinMatrices) {
  const auto zero = orthogonalize(at::zeros({5, 7}));
  EXPECT_TRUE(at::equal(zero, at::zeros({5, 7})));
  // Entries whose squares underflow float32: the same result as at unit scale.
  const auto tiny = orthogonalize(at::full({4, 4}, 1e-30, at::kFloat));
  EXPECT_TRUE(at::allclose(tiny, orthogonalize(at::ones({4, 4}))));
  for (auto shape : std::vector<std::vector<int64_t>>{{1, 9}, {9, 1}, {3, 8}, {8, 3}}) {
    auto gen = seeded(5);
    const auto x = at::randn(shape, gen);
    const auto out = orthogonalize(x);
    EXPECT_EQ(out.sizes(), x.sizes());
    EXPECT_TRUE(at::isfinite(out).all().item<bool>());
    const auto sv = at::linalg_svdvals(out.to(at::kDouble));
    EXPECT_GE(sv.min().item<double>(), 0.67);
    EXPECT_LE(sv.max().item<double>(), 1.15);
  }
  // A single column orthogonalizes to its direction scaled into the band.
  const auto column = orthogonalize(at::tensor({3.0, 4.0}, at::kDouble).view({2, 1}));
  EXPECT_NEAR(column[0][0].item<double>() / column[1][0].item<double>(), 0.75, 1e-12);
  EXPECT_EQ(orthogonalize(at::zeros({0, 4})).sizes(), (std::vector<int64_t>{0, 4}));
}

// Gradients are small late in training and under loss scaling: an eps added to ‖X‖_F (1e-7 for
// the quintic) changed the update of a 64×32 gradient of norm 4.5e-7 by 28%. Now X/‖X‖_F for
// every table and method, from 1e-10 to 1e10 per entry (and beyond: the norm is taken of
// X / max|X|); zero stays zero.
void expect_the_result_does_not_depend_on_the_scale(at::ScalarType dtype) {
  for (const auto& band : kBands) {
    for (const auto method : kMethods) {
      for (const auto& shape : {std::vector<int64_t>{24, 40}, std::vector<int64_t>{40, 24}}) {
        SCOPED_TRACE(std::string(band.table) + " " + to_string(method) + " " +
                     c10::toString(dtype) + (shape[0] < shape[1] ? " wide" : " tall"));
        const auto options = OrthogonalizeOptions()
                                 .coefficients(CoefficientTable::by_name(band.table))
                                 .steps(band.steps)
                                 .method(method)
                                 .dtype(dtype);
        auto gen = seeded(740);
        const auto x = at::randn(shape, gen, at::kDouble).to(dtype == at::kDouble ? dtype
                                                                                   : at::kFloat);
        const auto unscaled = orthogonalize(x, options);
        // A power of two scales X/max|X| exactly: the same bits on every path. Also where the
        // largest magnitude is a negative entry (every entry negative here).
        const auto negative = -x.abs();
        const auto negative_unscaled = orthogonalize(negative, options);
        for (const double scale : {0x1p-100, 0x1p-33, 0x1p33, 0x1p100}) {
          EXPECT_TRUE(at::equal(orthogonalize(x * scale, options), unscaled)) << scale;
          EXPECT_TRUE(at::equal(orthogonalize(negative * scale, options), negative_unscaled))
              << "negative, " << scale;
        }
        // Other factors round X/max|X| in its last bit, which the iterations amplify — to 1.5e-5
        // in float32 and 2.7e-14 in float64 (measured), and bf16 products to their own
        // resolution (1.4e-2).
        const double tolerance =
            dtype == at::kBFloat16 ? 3e-2 : (dtype == at::kFloat ? 1e-4 : 1e-12);
        for (const double scale : {1e-30, 1e-10, 1e-5, 1e5, 1e10}) {
          SCOPED_TRACE(scale);
          const auto scaled = orthogonalize(x * scale, options);
          EXPECT_LT(testing::max_rel_diff(scaled.to(at::kDouble), unscaled.to(at::kDouble)),
                    tolerance);
        }
        EXPECT_TRUE(at::equal(orthogonalize(at::zeros_like(x), options), at::zeros_like(x)));
      }
    }
  }
}

TEST(Orthogonalize, TheResultDoesNotDependOnTheInputsScale) {
  expect_the_result_does_not_depend_on_the_scale(at::kFloat);
  expect_the_result_does_not_depend_on_the_scale(at::kDouble);
}

TEST(Orthogonalize, TheResultDoesNotDependOnTheInputsScaleInBf16) {
  MUON_NEEDS_BF16_PRODUCTS();
  expect_the_result_does_not_depend_on_the_scale(at::kBFloat16);
}

TEST(Orthogonalize, BfloatInputComputesInFloatOnCpu) {
  auto gen = seeded(6);
  const auto x = testing::with_singular_values(32, 32, 0.1, at::kFloat, gen).to(at::kBFloat16);
  EXPECT_EQ(orthogonalize_dtype(x, std::nullopt), at::kFloat);
  const auto out = orthogonalize(x);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  const auto expected = orthogonalize(x.to(at::kFloat)).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(out, expected));
}

TEST(Orthogonalize, OrthogonalityErrorIsZeroForExactAndLargeForScaled) {
  auto gen = seeded(7);
  const auto q = testing::orthonormal_columns(20, 6, gen);
  EXPECT_LT(orthogonality_error(q), 1e-12);
  EXPECT_LT(orthogonality_error(q.t()), 1e-12);
  EXPECT_NEAR(orthogonality_error(q * 2.0), 3.0, 1e-12);  // ‖4I − I‖_F / √k = 3
}

// The named tables are one list: each name finds its table, and Muon's option documentation and
// docs/algorithms.md's table of tables name every one.
TEST(Orthogonalize, TheNamedTablesAreOneList) {
  std::vector<std::string> names;
  std::stringstream listed(CoefficientTable::names());
  for (std::string name; std::getline(listed >> std::ws, name, ',');) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"quintic", "polar_express", "dion", "cans", "aol",
                                              "cubic5", "deepseekv4"}));
  std::ifstream file(MUON_SOURCE_DIR "/docs/algorithms.md");
  const std::string docs((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  for (const auto& name : names) {
    EXPECT_EQ(CoefficientTable::by_name(name).name, name);
    EXPECT_NE(docs.find("| `" + name + "`"), std::string::npos) << name;
  }
  EXPECT_EQ(std::string(coefficients_option_doc()),
            "the iterations' polynomial: " + CoefficientTable::names() + " or rows [a, b, c]");
}

TEST(Orthogonalize, ErrorsNameTheProblem) {
  expect_error<Error>([] { orthogonalize(at::ones({5})); }, {"at least 2 dims", "[5]"});
  expect_error<Error>(
      [] {
        orthogonalize(at::ones({2, 2}, at::kLong));
      },
      {"floating-point", "Long"});
  expect_error<Error>(
      [] {
        orthogonalize(at::ones({2, 2}, at::kComplexFloat));
      },
      {"complex", "ComplexFloat"});
  expect_error<Error>(
      [] {
        orthogonalize(at::ones({2, 2}), OrthogonalizeOptions().steps(0));
      },
      {"steps must be a whole number in [1, 1000]", "got 0"});
  expect_error<Error>(
      [] {
        orthogonalize(at::ones({2, 2}), OrthogonalizeOptions().coefficients(
                                            CoefficientTable::custom({{1, 0, 0}}, 1.0, -1e-3)));
      },
      {"eps must be >= 0, got -0.001", "custom"});
  expect_error<Error>(
      [] {
        orthogonalize(at::ones({2, 2}),
                      OrthogonalizeOptions().coefficients(CoefficientTable::custom({})));
      },
      {"no rows"});
  expect_error<Error>([] { CoefficientTable::by_name("cubic"); },
                      {"'cubic'", "quintic, polar_express, dion, cans, aol, cubic5, deepseekv4"});
}

}  // namespace
}  // namespace muon
