#include "bench/bench.h"

#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include <thread>

#include "bench/bench_machine.h"
#include "bench/bench_parts.h"
#include "demo/gpt.h"
#include "muon/adam.h"
#include "muon/dion.h"
#include "muon/distributed.h"
#include "muon/hybrid.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/muon.h"
#include "muon/orthogonalize.h"
#include "muon/routing.h"
#include "system/launch.h"
#include "system/memory.h"

namespace muon::cli {

void plain_muon_step(std::vector<at::Tensor>& params, std::vector<at::Tensor>& buffers, double lr,
                     double beta, double weight_decay) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    const auto& g = p.grad();
    buffers[i].lerp_(g, 1 - beta);
    auto X = g.lerp(buffers[i], beta);
    const bool tall = X.size(0) > X.size(1);
    if (tall) X = X.t();
    X = X / (X.norm() + 1e-7);
    for (int k = 0; k < 5; ++k) {
      const auto A = X.mm(X.t());
      X = 3.4445 * X + (-4.7750 * A + 2.0315 * A.mm(A)).mm(X);
    }
    if (tall) X = X.t();
    p.mul_(1 - lr * weight_decay);
    p.add_(X, -lr * std::sqrt(std::max(1.0, static_cast<double>(p.size(0)) / p.size(1))));
  }
}

namespace {

// ---- orthogonalization ----

double plain_flops(int64_t rows, int64_t cols, int64_t steps) {
  const double k = static_cast<double>(std::min(rows, cols));
  const double m = static_cast<double>(std::max(rows, cols));
  return static_cast<double>(steps) * (4.0 * k * k * m + 2.0 * k * k * k);
}

// Per shape, `reps` rounds each time every method once and every library's 2048³ GEMM once; each
// figure is its best over the rounds, divided by the best fp32 GEMM rate of the same rounds (and a
// bf16 method's also by the best bf16 GEMM rate), so a method and the rate it is divided by see
// the same phases of a noisy machine.
void bench_orthogonalize(const BenchConfig& config, BenchReport& report, std::ostream& log) {
  log << "\n## Orthogonalization (quintic, 5 steps, fp32): plain-algorithm FLOPs / time vs GEMM\n\n"
      << "| shape | method | ms | GFLOP/s | GEMM GFLOP/s (same rounds) | of GEMM rate "
         "| of bf16 GEMM rate | orth_err | vs plain |\n"
      << "|---|---|---|---|---|---|---|---|---|\n";
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1024, 1024}, {1024, 4096}, {4096, 1024}, {768, 768}, {768, 3072}};
  // Each method in fp32, and in bf16 where the CPU has bf16 dot products.
  struct Variant {
    NsMethod method;
    std::optional<at::ScalarType> dtype;
  };
  std::vector<Variant> variants = {{NsMethod::plain, std::nullopt},
                                   {NsMethod::symmetric, std::nullopt},
                                   {NsMethod::gram, std::nullopt},
                                   {NsMethod::automatic, std::nullopt}};
  if (detail::bf16_products_available()) {
    for (auto m : {NsMethod::symmetric, NsMethod::gram, NsMethod::automatic}) {
      variants.push_back({m, at::kBFloat16});
    }
  } else {
    log << "(no bf16 rows: " << detail::bf16_products_unavailable_reason() << ")\n\n";
  }
  const auto options_of = [](const Variant& v) {
    return OrthogonalizeOptions().method(v.method).dtype(v.dtype);
  };
  GemmBench gemm(2048);
  for (const auto& [rows, cols] : shapes) {
    const auto x = at::randn({rows, cols});
    const auto plain = orthogonalize(x, OrthogonalizeOptions().method(NsMethod::plain));
    const size_t n = variants.size();
    std::vector<OrthogonalizeWorkspace> workspaces(n);
    std::vector<at::Tensor> outs(n);
    std::vector<double> best(n, 1e300);
    for (size_t i = 0; i < n; ++i) {  // warm-up, sizes the workspaces
      outs[i] = orthogonalize(x, options_of(variants[i]), &workspaces[i]);
    }
    double gemm_gflops = 0, bf16_gemm_gflops = 0;
    // Each library's work is timed apart from the other's: after a call, the workers of either
    // keep spinning for a while and slow the other's next call — OpenMP's threads for a few ms,
    // OpenBLAS's for ~0.1 s (~5 ms of a 1024² orthogonalization). So a round runs the methods on
    // the library's products, then `plain` and the GEMMs, then pauses. (The Muon step below keeps
    // that hand-over: it happens once per optimizer step.)
    for (int round = 0; round < std::max(config.reps, 1); ++round) {
      for (size_t i = n; i-- > 0;) {  // bf16, then automatic, gram, symmetric, plain
        const auto options = options_of(variants[i]);
        best[i] = std::min(best[i],
                           seconds([&] { outs[i] = orthogonalize(x, options, &workspaces[i]); }));
      }
      const auto rates = gemm.round();
      gemm_gflops = std::max(gemm_gflops, GemmBench::best(gemm.gemms(), rates, false));
      bf16_gemm_gflops = std::max(bf16_gemm_gflops, GemmBench::best(gemm.gemms(), rates, true));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (size_t i = 0; i < n; ++i) {
      const auto& v = variants[i];
      const double gflops = plain_flops(rows, cols, 5) / best[i] / 1e9;
      std::string name = (v.dtype ? "bf16 " : "") + to_string(v.method);
      if (v.method == NsMethod::automatic) {
        name += "→" + to_string(resolve_method(x, options_of(v)));
      }
      BenchReport::Orthogonalization row{
          rows,
          cols,
          name,
          best[i] * 1e3,
          gflops,
          gemm_gflops,
          gflops / gemm_gflops,
          v.dtype ? gflops / bf16_gemm_gflops : 0.0,
          orthogonality_error(outs[i]),
          ((outs[i] - plain).abs().max() / plain.abs().max()).item<double>()};
      char of_bf16[16] = "—";
      if (row.of_bf16_gemm > 0) std::snprintf(of_bf16, sizeof of_bf16, "%.2f", row.of_bf16_gemm);
      char line[256];
      std::snprintf(line, sizeof line,
                    "| %lldx%lld | %s | %.1f | %.1f | %.1f | %.2f | %s | %.3f | %.1e |\n",
                    static_cast<long long>(rows), static_cast<long long>(cols), row.method.c_str(),
                    row.ms, row.gflops, row.gemm_gflops, row.of_gemm, of_bf16, row.orth_err,
                    row.vs_plain);
      log << line << std::flush;
      report.orthogonalization.push_back(row);
    }
  }
}

// ---- a whole Muon step vs the same math in plain ATen ----

// The matrices of `layers` GPT blocks at `width`: q, k, v, o (width²), the MLP's up and gate
// (4·width × width) and down (width × 4·width).
std::vector<std::vector<int64_t>> gpt_matrix_shapes(int64_t layers, int64_t width) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 0; l < layers; ++l) {
    for (int i = 0; i < 4; ++i) shapes.push_back({width, width});
    shapes.push_back({4 * width, width});
    shapes.push_back({4 * width, width});
    shapes.push_back({width, 4 * width});
  }
  return shapes;
}

// The largest difference of one step's update `mine` (parameters after it) from the reference's
// (`theirs`), relative to the reference update's largest entry; `before` holds the parameters
// both started from.
double worst_update_difference(const std::vector<at::Tensor>& mine,
                               const std::vector<at::Tensor>& theirs,
                               const std::vector<at::Tensor>& before) {
  double worst = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto theirs_delta = theirs[i].detach() - before[i];
    const auto mine_delta = mine[i].detach() - before[i];
    worst = std::max(
        worst, ((mine_delta - theirs_delta).abs().max() / theirs_delta.abs().max()).item<double>());
  }
  return worst;
}

// The Muon step's table: plain ATen, muon::Muon (and bf16 Newton–Schulz when `bf16`), Dion.
void log_muon_step(const BenchConfig& config, const BenchReport::MuonStep& r, bool bf16,
                   std::ostream& log) {
  char line[768];
  std::snprintf(line, sizeof line,
                "\n## Muon step: %lld matrices (%lld layers at width %lld, %.1fM parameters)\n\n"
                "| implementation | ms/step | speed-up | largest difference of one step's update "
                "from plain ATen's, relative to its largest entry |\n|---|---|---|---|\n"
                "| plain ATen (torch.optim.Muon's math; at its best, %d LibTorch threads) | %.0f | "
                "1.00x | |\n"
                "| muon::Muon | %.0f | %.2fx | %.1e |\n",
                static_cast<long long>(r.matrices), static_cast<long long>(config.muon_layers),
                static_cast<long long>(config.muon_width), r.parameters / 1e6, r.plain_threads,
                r.plain_ms, r.ours_ms, r.speedup, r.max_rel_diff);
  log << line;
  if (bf16) {
    std::snprintf(line, sizeof line, "| muon::Muon, bf16 Newton–Schulz | %.0f | %.2fx | %.1e |\n",
                  r.bf16_ms, r.bf16_speedup, r.bf16_max_rel_diff);
    log << line;
  }
  for (const auto& [fraction, ms] : {std::pair{"1", r.dion_ms}, std::pair{"1/4", r.dion_quarter_ms}}) {
    std::snprintf(line, sizeof line,
                  "| muon::Dion, rank_fraction %s (another update) | %.0f | %.2fx | — |\n",
                  fraction, ms, r.plain_ms / ms);
    log << line;
  }
  if (!bf16) log << "\n(no bf16 row: " << detail::bf16_products_unavailable_reason() << ")\n";
  log << std::flush;
}

void bench_muon_step(const BenchConfig& config, BenchReport& report, std::ostream& log) {
  const auto shapes = gpt_matrix_shapes(config.muon_layers, config.muon_width);
  std::vector<at::Tensor> ours, ours16, dion, dion_quarter, theirs, buffers;
  const auto copy = [](const at::Tensor& p, const at::Tensor& g) {
    auto c = p.clone().requires_grad_(true);
    c.mutable_grad() = g.clone();
    return c;
  };
  auto& r = report.muon_step;
  for (const auto& s : shapes) {
    const auto p = at::randn(s).mul_(0.02);
    const auto g = at::randn(s);
    for (auto* list : {&ours, &ours16, &dion, &dion_quarter, &theirs}) list->push_back(copy(p, g));
    buffers.push_back(at::zeros(s));
    r.parameters += p.numel();
  }
  r.matrices = static_cast<int64_t>(shapes.size());
  std::vector<at::Tensor> before;
  for (const auto& p : ours) before.push_back(p.detach().clone());
  const auto options = MuonOptions(0.02).weight_decay(0.01);
  Muon opt(ours, options);
  const bool bf16 = detail::bf16_products_available();
  Muon opt16(ours16, MuonOptions(options).ns_dtype(at::kBFloat16));
  Dion opt_dion(dion, DionOptions());
  Dion opt_dion_quarter(dion_quarter, DionOptions().rank_fraction(0.25));
  // One step each from the same state: compare the updates, then time further steps.
  const double first_ours = seconds([&] { opt.step(); });
  const auto plain_step = [&] { plain_muon_step(theirs, buffers, 0.02, 0.95, 0.01); };
  const auto plain_one_thread = [&] {
    ScopedThreads one(1);
    plain_step();
  };
  const double first_plain = seconds(plain_step);
  const double first_bf16 = bf16 ? seconds([&] { opt16.step(); }) : 0.0;
  r.max_rel_diff = worst_update_difference(ours, theirs, before);
  if (bf16) r.bf16_max_rel_diff = worst_update_difference(ours16, theirs, before);
  // Alternating steps, so that all see the same phases of a noisy machine.
  double ours_s = first_ours, plain_s = first_plain, plain_one_s = 1e300, bf16_s = first_bf16;
  double dion_s = seconds([&] { opt_dion.step(); });
  double dion_quarter_s = seconds([&] { opt_dion_quarter.step(); });
  for (int rep = 0; rep < config.reps; ++rep) {
    dion_s = std::min(dion_s, seconds([&] { opt_dion.step(); }));
    dion_quarter_s = std::min(dion_quarter_s, seconds([&] { opt_dion_quarter.step(); }));
    ours_s = std::min(ours_s, seconds([&] { opt.step(); }));
    plain_s = std::min(plain_s, seconds(plain_step));
    plain_one_s = std::min(plain_one_s, seconds(plain_one_thread));
    if (bf16) bf16_s = std::min(bf16_s, seconds([&] { opt16.step(); }));
  }
  r.plain_threads = plain_one_s < plain_s ? 1 : report.threads;
  r.plain_ms = 1e3 * std::min(plain_s, plain_one_s);
  r.ours_ms = 1e3 * ours_s;
  r.speedup = r.plain_ms / r.ours_ms;
  if (bf16) {
    r.bf16_ms = 1e3 * bf16_s;
    r.bf16_speedup = r.plain_ms / r.bf16_ms;
  }
  r.dion_ms = 1e3 * dion_s;
  r.dion_quarter_ms = 1e3 * dion_quarter_s;
  log_muon_step(config, r, bf16, log);
}

std::string openblas_environment() {
  std::string out;
  for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}) {
    if (const char* v = std::getenv(name))
      out += (out.empty() ? "" : " ") + std::string(name) + "=" + v;
  }
  return out.empty() ? "unset" : out;
}

void bench_machine(BenchReport& report, std::ostream& log) {
  report.cpu = cpu_description();
  report.openblas_env = openblas_environment();
  report.products = blas_backend();
  report.bf16_products = bf16_products();
  GemmBench gemm(2048);
  std::vector<double> best(gemm.gemms().size(), 0.0);
  for (int rep = 0; rep < 5; ++rep) {
    const auto rates = gemm.round();
    for (size_t i = 0; i < rates.size(); ++i) best[i] = std::max(best[i], rates[i]);
  }
  for (size_t i = 0; i < best.size(); ++i) {
    const auto& g = gemm.gemms()[i];
    report.gemms.push_back({g.name, g.kernels, g.bf16, best[i]});
  }
  report.gemm_gflops = GemmBench::best(gemm.gemms(), best, /*bf16=*/false);
  report.bf16_gflops = GemmBench::best(gemm.gemms(), best, /*bf16=*/true);
  const int64_t n = 1 << 25;  // 128 MiB per float array: far beyond the caches
  const auto a = at::randn({n});
  auto c = at::empty({n});
  // A copy's bytes as counted (read a, write c; its write-allocate read of c goes uncounted), and
  // an in-place update c += 0.5·a (read c and a, write c: no write-allocate), the pattern of an
  // optimizer step, whose bytes are all counted.
  report.copy_gbs = 8.0 * n / best_seconds(5, [&] { c.copy_(a); }) / 1e9;
  report.update_gbs = 12.0 * n / best_seconds(5, [&] { c.add_(a, 0.5); }) / 1e9;
  log << "machine: " << report.cpu << "\n"
      << report.threads << " threads for every library (LibTorch's intra-op pool and OpenBLAS's); "
      << report.openblas_env << "\nGEMM 2048³, best of 5:";
  char line[256];
  for (const auto& g : report.gemms) {
    std::snprintf(line, sizeof line, " %s (%s) %.1f GFLOP/s;", g.name.c_str(), g.kernels.c_str(),
                  g.gflops);
    log << line;
  }
  std::snprintf(line, sizeof line,
                "\nbest fp32 GEMM %.1f GFLOP/s%s; copy %.1f GB/s, in-place update %.1f GB/s\n",
                report.gemm_gflops,
                report.bf16_gflops > 0 ? "" : " (no bf16 GEMM: this CPU has no bf16 dot products)",
                report.copy_gbs, report.update_gbs);
  log << line << "Newton–Schulz products on " << report.products << "\n";
  log << "bf16 Newton–Schulz products: " << report.bf16_products << "\n" << std::flush;
}

}  // namespace

namespace {

// Refuses sizes this machine cannot hold before anything is allocated. Each section keeps several
// copies of its parameters side by side (ours, the reference's, gradients, state): ten for the
// Muon and AdamW sections, weights, gradients and two moments on three models for the distributed.
void check_bench_memory(const BenchConfig& c) {
  const double w = static_cast<double>(c.muon_width), a = static_cast<double>(c.adamw_width);
  const double muon = c.muon_step ? 10 * 16 * w * w * static_cast<double>(c.muon_layers) : 0;
  const double adamw =
      c.adamw ? 10 * (12 * a * a * static_cast<double>(c.adamw_layers) +
                      static_cast<double>(c.vocab) * a)
              : 0;
  GptConfig dist_model;
  dist_model.n_layers = c.dist_layers;
  dist_model.d_model = c.dist_width;
  const double dist = c.distributed ? 3 * 4 * dist_model.weight_count() : 0;
  check_memory_need(4 * std::max({muon, adamw, dist}), "bench",
                    "the parameters, gradients and state of its largest section",
                    "--muon-width, --muon-layers, --adamw-width, --adamw-layers, --dist-width or "
                    "--dist-layers");
}

}  // namespace

BenchReport run_bench(const BenchConfig& config, std::ostream& log) {
  check_bench_memory(config);
  BenchReport report;
  report.threads = config.threads > 0
                       ? config.threads
                       : usable_cpus();
  set_all_threads(report.threads);
  bench_machine(report, log);
  if (config.orthogonalize) bench_orthogonalize(config, report, log);
  if (config.muon_step) bench_muon_step(config, report, log);
  if (config.load) bench_load(report, log);
  if (config.adamw) bench_adamw(config, report, log);
  if (config.distributed) bench_distributed(config, report, log);
  return report;
}

}  // namespace muon::cli
