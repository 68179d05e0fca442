// AdamW step speed and memory on a transformer-shaped parameter set, all measured in one run:
//   - muon::AdamW (fp32 and bf16 state) vs torch::optim::AdamW: time per step and the ratio;
//   - achieved bandwidth (minimum bytes a step must move / time) vs the best of a plain copy and
//     a triad a = b + s·c over the same number of elements and threads;
//   - optimizer-state bytes per parameter and the peak resident memory a step adds.
//
//   build/bench/bench_adamw [--layers 6] [--d-model 512] [--vocab 8192] [--steps 10]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "muon/adam.h"

namespace {

double median_seconds(int reps, const std::function<void()>& fn) {
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Resident-set figures from /proc/self/status, in MiB.
double status_mib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) / 1024.0;
  }
  return -1;
}

// Peak RSS a call adds above the RSS before it (Linux: writing 5 to clear_refs resets VmHWM).
double peak_extra_mib(const std::function<void()>& fn) {
  std::ofstream("/proc/self/clear_refs") << "5";
  const double before = status_mib("VmRSS:");
  fn();
  return status_mib("VmHWM:") - before;
}

// Weights of a GPT with SwiGLU MLPs: per layer q, k, v, o, gate, up, down and two norms; plus a
// token embedding and a final norm.
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
  for (const auto& s : shapes) params.push_back(at::randn(s).mul_(0.02).requires_grad_(true));
  return params;
}

std::vector<at::Tensor> copies_with_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    auto c = p.detach().clone().requires_grad_(true);
    c.mutable_grad() = at::randn(p.sizes()).mul_(1e-3);
    out.push_back(c);
  }
  return out;
}

int64_t state_bytes(const torch::optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (const auto& item : opt.state()) {
    if (const auto* s = dynamic_cast<const muon::AdamParamState*>(item.second.get())) {
      bytes += s->exp_avg().nbytes() + s->exp_avg_sq().nbytes();
    } else if (const auto* t =
                   dynamic_cast<const torch::optim::AdamWParamState*>(item.second.get())) {
      bytes += t->exp_avg().nbytes() + t->exp_avg_sq().nbytes();
    }
  }
  return bytes;
}

int64_t arg(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::stoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t layers = arg(argc, argv, "--layers", 6);
  const int64_t d = arg(argc, argv, "--d-model", 512);
  const int64_t vocab = arg(argc, argv, "--vocab", 8192);
  const int steps = static_cast<int>(arg(argc, argv, "--steps", 10));
  at::manual_seed(0);
  const auto base = gpt_parameters(layers, d, vocab);
  int64_t n = 0;
  for (const auto& p : base) n += p.numel();
  std::printf("parameter set: %lld tensors, %.1fM parameters (GPT, %lld layers, width %lld, vocab "
              "%lld); %d threads; median of %d steps after one warm-up step\n\n",
              static_cast<long long>(base.size()), n / 1e6, static_cast<long long>(layers),
              static_cast<long long>(d), static_cast<long long>(vocab), at::get_num_threads(),
              steps);

  // Reference bandwidths over n floats: copy moves 8 bytes per element, triad 12.
  const auto a = at::randn({n});
  const auto b = at::randn({n});
  auto c = at::empty({n});
  const double copy_gbs = 8.0 * n / median_seconds(steps, [&] { c.copy_(a); }) / 1e9;
  const double triad_gbs =
      12.0 * n / median_seconds(steps, [&] { at::add_out(c, a, b, 0.5); }) / 1e9;
  const double best_gbs = std::max(copy_gbs, triad_gbs);
  std::printf("plain copy %.1f GB/s, triad %.1f GB/s\n\n", copy_gbs, triad_gbs);

  struct Row {
    const char* name;
    double seconds, min_bytes_per_param, state_bytes_per_param, peak_mib;
  };
  std::vector<Row> rows;
  auto measure = [&](const char* name, torch::optim::Optimizer& opt, double min_bytes) {
    opt.step();  // allocates the state
    const double peak = peak_extra_mib([&] { opt.step(); });
    const double s = median_seconds(steps, [&] { opt.step(); });
    rows.push_back({name, s, min_bytes, static_cast<double>(state_bytes(opt)) / n, peak});
  };
  {
    auto params = copies_with_grads(base);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
    measure("torch::optim::AdamW", opt, 28);
  }
  {
    auto params = copies_with_grads(base);
    muon::AdamW opt(params, muon::AdamWOptions(1e-3).weight_decay(0.1));
    measure("muon::AdamW fp32 state", opt, 28);  // read p, g, m, v; write p, m, v (4 bytes each)
  }
  {
    auto params = copies_with_grads(base);
    muon::AdamW opt(params, muon::AdamWOptions(1e-3).weight_decay(0.1).state_dtype(at::kBFloat16));
    measure("muon::AdamW bf16 state", opt, 20);  // moments are 2 bytes each
  }

  const double torch_seconds = rows[0].seconds;
  std::printf("| optimizer | ms/step | speed-up vs torch | GB/s (min bytes) | of best copy/triad | "
              "state bytes/param | peak extra MiB in a step |\n|---|---|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    const double gbs = r.min_bytes_per_param * n / r.seconds / 1e9;
    std::printf("| %s | %.1f | %.2fx | %.1f | %.2f | %.1f | %.0f |\n", r.name, r.seconds * 1e3,
                torch_seconds / r.seconds, gbs, gbs / best_gbs, r.state_bytes_per_param,
                r.peak_mib);
  }
  return 0;
}
