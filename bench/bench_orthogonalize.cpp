// Orthogonalization throughput as a fraction of this machine's fp32 GEMM rate, both measured in
// the same run. FLOPs counted are those of the plain algorithm: per iteration, for a k×m matrix
// with k ≤ m, 2k²m (A = XXᵀ) + 2k³ (A²) + 2k²m (B·X).
//
//   build/bench/bench_orthogonalize                     # all shapes
//   build/bench/bench_orthogonalize --benchmark_filter=Orthogonalize/1024
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "muon/orthogonalize.h"

namespace {

double g_gemm_flops_per_s = 0;

// Best of several timed square fp32 GEMMs of size n.
double measure_gemm_rate(int64_t n) {
  const auto a = at::randn({n, n});
  const auto b = at::randn({n, n});
  auto c = at::empty({n, n});
  at::mm_out(c, a, b);  // warm-up
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

double plain_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double k = static_cast<double>(std::min(rows, cols));
  const double m = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * k * k * m + 2.0 * k * k * k);
}

const muon::NsMethod kMethods[] = {muon::NsMethod::plain, muon::NsMethod::symmetric,
                                   muon::NsMethod::gram, muon::NsMethod::automatic};

void BM_Orthogonalize(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t cols = state.range(1);
  const auto method = kMethods[state.range(2)];
  state.SetLabel(muon::to_string(method));
  const auto x = at::randn({rows, cols});
  const auto restart = state.range(3);
  const auto options = muon::OrthogonalizeOptions().method(method).gram_restarts(
      restart > 0 ? std::vector<int64_t>{restart} : std::vector<int64_t>{});
  muon::OrthogonalizeWorkspace workspace;
  at::Tensor out;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    out = muon::orthogonalize(x, options, &workspace);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate =
      plain_flops(rows, cols, 5) * static_cast<double>(state.iterations()) / seconds;
  state.counters["GFLOPs"] = rate / 1e9;
  state.counters["of_gemm"] = rate / g_gemm_flops_per_s;  // plain-algorithm FLOP rate / GEMM rate
  state.counters["orth_err"] = muon::orthogonality_error(out);
  // Largest elementwise distance from the plain iteration, relative to its largest entry.
  const auto plain =
      muon::orthogonalize(x, muon::OrthogonalizeOptions().method(muon::NsMethod::plain));
  state.counters["vs_plain"] = ((out - plain).abs().max() / plain.abs().max()).item<double>();
}

void BM_Gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto a = at::randn({n, n});
  const auto b = at::randn({n, n});
  auto c = at::empty({n, n});
  for (auto _ : state) at::mm_out(c, a, b);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Gemm)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
// Args: rows, cols, method (0 plain, 1 symmetric, 2 gram, 3 automatic), gram restart point (0:
// none).
BENCHMARK(BM_Orthogonalize)
    ->ArgsProduct({{512}, {512}, {0, 1}, {0}})
    ->ArgsProduct({{1024}, {1024}, {0, 1}, {0}})
    ->ArgsProduct({{2048}, {2048}, {0, 1}, {0}})
    ->ArgsProduct({{512}, {2048}, {0, 1}, {0}})
    ->ArgsProduct({{512}, {2048}, {2}, {0, 2}})
    ->ArgsProduct({{1024}, {4096}, {0, 1}, {0}})
    ->ArgsProduct({{1024}, {4096}, {2}, {0, 2}})
    ->ArgsProduct({{2048}, {512}, {0, 1}, {0}})
    ->ArgsProduct({{2048}, {512}, {2}, {0, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  g_gemm_flops_per_s = measure_gemm_rate(2048);
  std::printf("machine fp32 GEMM rate (2048^3, best of 5): %.1f GFLOP/s, %d threads\n",
              g_gemm_flops_per_s / 1e9, at::get_num_threads());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
