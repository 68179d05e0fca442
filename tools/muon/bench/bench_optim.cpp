// `muon bench`: AdamW against torch's, and the hybrid step on one and two ranks.
#include <torch/optim/adamw.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <thread>

#include "bench/bench_machine.h"
#include "bench/bench_parts.h"
#include "demo/gpt.h"
#include "muon/adam.h"
#include "muon/distributed.h"
#include "muon/hybrid.h"
#include "muon/routing.h"
#include "system/launch.h"

namespace muon::cli {
namespace {

// ---- AdamW ----

std::vector<at::Tensor> gpt_parameters(int64_t layers, int64_t d, int64_t vocab) {
  const int64_t hidden = (8 * d / 3 + 31) / 32 * 32;
  std::vector<std::vector<int64_t>> shapes = {{vocab, d}, {d}};
  for (int64_t l = 0; l < layers; ++l) {
    for (int i = 0; i < 4; ++i) shapes.push_back({d, d});
    shapes.push_back({hidden, d});
    shapes.push_back({hidden, d});
    shapes.push_back({d, hidden});
    shapes.push_back({d});
    shapes.push_back({d});
  }
  std::vector<at::Tensor> params;
  for (const auto& s : shapes) {
    auto p = at::randn(s).mul_(0.02).requires_grad_(true);
    p.mutable_grad() = at::randn(s).mul_(1e-3);
    params.push_back(p);
  }
  return params;
}

std::vector<at::Tensor> copies_with_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    auto c = p.detach().clone().requires_grad_(true);
    c.mutable_grad() = p.grad().clone();
    out.push_back(c);
  }
  return out;
}

int64_t state_bytes(const torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    if (const auto* s = dynamic_cast<const AdamParamState*>(item.second.get())) {
      bytes += s->exp_avg().nbytes() + s->exp_avg_sq().nbytes();
    } else if (const auto* t =
                   dynamic_cast<const torch::optim::AdamWParamState*>(item.second.get())) {
      bytes += t->exp_avg().nbytes() + t->exp_avg_sq().nbytes();
    }
  }
  return bytes;
}

// The bytes of an fp32 AdamW step moved with next to no arithmetic, in one pass over the same
// tensors on the same threads: read p, g, m, v; write p, m, v — 28 bytes an element, the step's
// minimum. No step streams them faster, so its rate bounds the step's at this working set, also
// where the set fits in a cache (a fixed-size anchor out of the caches does not: 23M parameters
// sit in a 480 MiB L3, and the step ran at 1.23 of such an anchor). Needs OpenMP (CMakeLists.txt):
// at::parallel_for runs serially in a file compiled without it.
// The loop of the fused AdamW kernel (src/math/cpu/fused_update.cpp) without its arithmetic: the
// same restrict-qualified streams, vectorized for the same instruction sets — in a cache, where the
// rate depends on the vector width, as well as out of it.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void stream_step_bytes(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                       float* __restrict__ v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i];
    p[i] += x;
    m[i] += x;
    v[i] += x;
  }
}

double step_stream_gbs(const std::vector<at::Tensor>& params, int reps) {
  struct Piece {  // a run of one tensor's elements; the pieces of all tensors in one region
    float *p, *m, *v;
    const float* g;
    int64_t n;
  };
  constexpr int64_t kPiece = 1 << 16;
  std::vector<at::Tensor> keep;
  std::vector<Piece> pieces;
  int64_t n = 0;
  for (const auto& param : params) {
    auto p = param.detach().clone(), g = param.grad().clone();
    auto m = at::zeros_like(p), v = at::zeros_like(p);
    for (int64_t at = 0; at < p.numel(); at += kPiece) {
      pieces.push_back({p.data_ptr<float>() + at, m.data_ptr<float>() + at,
                        v.data_ptr<float>() + at, g.data_ptr<float>() + at,
                        std::min(kPiece, p.numel() - at)});
    }
    keep.insert(keep.end(), {p, g, m, v});
    n += p.numel();
  }
  // Each thread takes the next piece as it finishes one: a thread slowed by another process takes
  // fewer, instead of holding the others at a barrier.
  // Best of at least 10: more runs only raise a bound (interference adds time, never removes it).
  const double s = best_seconds(std::max(reps, 10), [&] {
    std::atomic<size_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      for (size_t k = next++; k < pieces.size(); k = next++) {
        const auto& t = pieces[k];
        stream_step_bytes(t.p, t.g, t.m, t.v, t.n);
      }
    });
  });
  return 28.0 * static_cast<double>(n) / s / 1e9;
}

}  // namespace

void bench_adamw(const BenchConfig& config, BenchReport& report, std::ostream& log) {
  const auto base = gpt_parameters(config.adamw_layers, config.adamw_width, config.vocab);
  int64_t n = 0;
  for (const auto& p : base) n += p.numel();
  report.adamw_parameters = n;
  // The anchor: the better of the in-place update (out of the caches) and the step's own bytes
  // streamed over the same tensors (step_stream_gbs): no step can beat both.
  report.adamw_stream_gbs = step_stream_gbs(base, config.reps);
  const double best_gbs = std::max(report.update_gbs, report.adamw_stream_gbs);
  auto measure = [&](const std::string& name, torch::optim::Optimizer& opt, double min_bytes) {
    opt.step();  // allocates the state
    const double peak = peak_extra_mib([&] { opt.step(); });
    const double s = best_seconds(std::max(config.reps, 5), [&] { opt.step(); });
    const double gbs = min_bytes * static_cast<double>(n) / s / 1e9;
    report.adamw.push_back({name, s * 1e3, 0, gbs, gbs / best_gbs,
                            static_cast<double>(state_bytes(opt)) / static_cast<double>(n), peak});
  };
  {
    auto params = copies_with_grads(base);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
    measure("torch::optim::AdamW", opt, 28);
  }
  {
    auto params = copies_with_grads(base);
    AdamW opt(params, AdamWOptions(1e-3).weight_decay(0.1));
    measure("muon::AdamW fp32 state", opt, 28);  // read p, g, m, v; write p, m, v
  }
  {
    auto params = copies_with_grads(base);
    AdamW opt(params, AdamWOptions(1e-3).weight_decay(0.1).state_dtype(at::kBFloat16));
    measure("muon::AdamW bf16 state", opt, 20);  // moments 2 bytes each
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "\n## AdamW step: %lld tensors, %.1fM parameters (GPT, %lld layers, width %lld, "
                "vocab %lld)\n\nbandwidth bound %.1f GB/s: the better of the in-place update and "
                "the step's bytes streamed over the same tensors (%.1f GB/s)\n\n"
                "| optimizer | ms/step | speed-up vs torch | GB/s (min bytes) | of the bound | "
                "state bytes/param | peak extra MiB in a step |\n|---|---|---|---|---|---|---|\n",
                static_cast<long long>(base.size()), n / 1e6,
                static_cast<long long>(config.adamw_layers),
                static_cast<long long>(config.adamw_width), static_cast<long long>(config.vocab),
                best_gbs, report.adamw_stream_gbs);
  log << line;
  for (auto& r : report.adamw) {
    r.speedup = report.adamw[0].ms / r.ms;
    std::snprintf(line, sizeof line, "| %s | %.1f | %.2fx | %.1f | %.2f | %.1f | %.0f |\n",
                  r.name.c_str(), r.ms, r.speedup, r.gbs, r.of_bandwidth, r.state_bytes_per_param,
                  r.peak_extra_mib);
    log << line;
  }
  log << std::flush;
}

namespace {

// Sets every trainable parameter's gradient to fixed noise (the same on every rank) and times the
// optimizer's step; returns (best ms, bytes sent per step).
std::pair<double, double> time_hybrid_step(HybridOptimizer& opt, Communicator& communicator,
                                           int reps) {
  auto generator = at::detail::createCPUGenerator(7);
  for (const auto& [name, p] : opt.named_trainable()) {
    p.mutable_grad() = at::normal(0, 1e-3, p.sizes(), generator);
  }
  opt.step();  // warm-up: state and workspaces
  const auto before = communicator.bytes_sent();
  const double ms = 1e3 * best_seconds(reps, [&] { opt.step(); });
  return {ms, static_cast<double>(communicator.bytes_sent() - before) / reps};
}

}  // namespace

void bench_distributed(const BenchConfig& config, BenchReport& report, std::ostream& log) {
  constexpr int kRanks = 2;
  GptConfig model_config;
  model_config.n_layers = config.dist_layers;
  model_config.d_model = config.dist_width;
  const auto make = [&] {
    at::manual_seed(1);
    return Gpt(model_config);
  };
  const auto options = [] {
    HybridOptions o;
    o.matrices = MuonOptions(0.02).weight_decay(0.01);
    o.others = AdamWOptions(0.004).weight_decay(0.01);
    o.max_grad_norm = 1.0;
    return o;
  }();
  auto& r = report.distributed;
  const int threads = at::get_num_threads();

  // One rank with every thread.
  Gpt single = make();
  HybridOptimizer single_opt(route(*single), options);
  Communicator alone;
  r.one_rank_ms = time_hybrid_step(single_opt, alone, config.reps).first;

  // Two ranks, each with half the threads (LibTorch's and OpenBLAS's), in this process.
  const int blas_threads = set_openblas_threads(1);
  if (blas_threads > 0) set_openblas_threads(std::max(1, blas_threads / kRanks));
  const int port = free_local_port();
  std::vector<std::thread> ranks;
  std::vector<std::exception_ptr> errors(kRanks);
  std::vector<Gpt> models;
  for (int rank = 0; rank < kRanks; ++rank) models.push_back(make());
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        at::set_num_threads(std::max(1, threads / kRanks));
        auto communicator =
            Communicator::connect(rank, kRanks, "127.0.0.1", port, std::chrono::seconds(120));
        HybridOptimizer opt(route(*models[rank]), options);
        opt.set_communicator(communicator);
        const auto [ms, bytes] = time_hybrid_step(opt, *communicator, config.reps);
        if (rank == 0) {
          r.per_rank_ms = ms;
          r.bytes_per_step = bytes;
        }
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (blas_threads > 0) set_openblas_threads(blas_threads);
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  // The minimum a rank must send per step: (N−1)/N of the float32 gradients (reduce-scatter)
  // and of the parameters (all-gather).
  double gradient_bytes = 0, parameter_bytes = 0;
  for (const auto& [name, p] : single_opt.named_trainable()) {
    r.parameters += p.numel();
    gradient_bytes += 4.0 * static_cast<double>(p.numel());
    parameter_bytes += static_cast<double>(p.numel() * p.element_size());
  }
  r.minimum_bytes = (kRanks - 1.0) / kRanks * (gradient_bytes + parameter_bytes);
  r.bytes_ratio = r.bytes_per_step / r.minimum_bytes;
  r.speedup = r.one_rank_ms / r.per_rank_ms;
  // Same result: the ranks' parameters equal one rank's (same gradients, warm-up + reps steps).
  const auto ours = models[0]->parameters();
  const auto reference = single->parameters();
  for (size_t i = 0; i < ours.size(); ++i) {
    const auto diff = (ours[i] - reference[i]).abs().max() / reference[i].abs().max();
    r.max_rel_diff = std::max(r.max_rel_diff, diff.item<double>());
  }

  char line[512];
  log << "\n## Data parallel: the hybrid step of a " << config.dist_layers << "-layer, width "
      << config.dist_width << " demo GPT (" << r.parameters << " parameters)\n\n";
  std::snprintf(line, sizeof line,
                "1 rank (%d intra-op / %d BLAS threads) %.1f ms | 2 ranks (Gloo loopback, half the "
                "threads each) %.1f ms per rank | speedup %.2fx | sent %.2f MB/step per rank, "
                "minimum %.2f MB (ratio %.3f) | max rel diff %.1e\n",
                threads, blas_threads, r.one_rank_ms, r.per_rank_ms, r.speedup,
                r.bytes_per_step / 1e6, r.minimum_bytes / 1e6, r.bytes_ratio, r.max_rel_diff);
  log << line << std::flush;
}

}  // namespace muon::cli
