// `muon bench --only load`: the Muon step's steadiness with another busy process on the machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "bench/bench_machine.h"
#include "bench/bench_parts.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/muon.h"

namespace muon::cli {

namespace {

// Medians and maxima of `steps` timed calls of `step`, in ms.
std::pair<double, double> median_and_max(int steps, const std::function<void()>& step) {
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) ms.push_back(1e3 * seconds(step));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.back()};
}

// One row of the load table: name, median and maximum ms, their ratio.
std::string load_row(const char* name, double median_ms, double max_ms) {
  char row[160];
  std::snprintf(row, sizeof row, "| %s | %.1f | %.1f | %.2f |\n", name, median_ms, max_ms,
                max_ms / median_ms);
  return row;
}

// 20 steps of muon::Muon on 8 matrices of 512² (fp32 Newton–Schulz, and bf16 where the CPU has
// bf16 dot products), alone on the machine and with a competing process on one core; the plain
// ATen step under the same load for comparison. A step whose products wait at spinning barriers
// stalls for whole time slices there.
}  // namespace

void bench_load(BenchReport& report, std::ostream& log) {
  auto& r = report.load;
  r.steps = 20;
  std::vector<at::Tensor> ours, ours16, theirs, buffers;
  for (int i = 0; i < 8; ++i) {
    const auto p = at::randn({512, 512}).mul_(0.02);
    const auto g = at::randn({512, 512});
    for (auto* set : {&ours, &ours16, &theirs}) {
      set->push_back(p.clone().requires_grad_(true));
      set->back().mutable_grad() = g.clone();
    }
    buffers.push_back(at::zeros({512, 512}));
  }
  const auto options = MuonOptions(0.02).weight_decay(0.01);
  Muon opt(ours, options);
  Muon opt16(ours16, MuonOptions(options).ns_dtype(at::kBFloat16));
  const bool bf16 = detail::bf16_products_available();
  const auto ours_step = [&] { opt.step(); };
  const auto bf16_step = [&] { opt16.step(); };
  const auto plain_step = [&] {
    ScopedThreads one(1);  // its best setting (bench_muon_step)
    plain_muon_step(theirs, buffers, 0.02, 0.95, 0.01);
  };
  ours_step();
  std::tie(r.quiet_median_ms, r.quiet_max_ms) = median_and_max(r.steps, ours_step);
  if (bf16) {
    bf16_step();
    std::tie(r.bf16_quiet_median_ms, r.bf16_quiet_max_ms) = median_and_max(r.steps, bf16_step);
  }
  {
    CompetingProcess busy;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::tie(r.loaded_median_ms, r.loaded_max_ms) = median_and_max(r.steps, ours_step);
    if (bf16) {
      std::tie(r.bf16_loaded_median_ms, r.bf16_loaded_max_ms) = median_and_max(r.steps, bf16_step);
    }
    std::tie(r.plain_loaded_median_ms, r.plain_loaded_max_ms) = median_and_max(r.steps, plain_step);
  }
  char head[256];
  std::snprintf(head, sizeof head,
                "\n## Under load: %d steps on 8 matrices of 512², %d threads, with another busy "
                "process on the machine\n\n| step | median ms | max ms | max / median |\n"
                "|---|---|---|---|\n",
                r.steps, report.threads);
  std::string table = head;
  table += load_row("muon::Muon, alone", r.quiet_median_ms, r.quiet_max_ms);
  table += load_row("muon::Muon, loaded", r.loaded_median_ms, r.loaded_max_ms);
  if (bf16) {
    table += load_row("muon::Muon bf16, alone", r.bf16_quiet_median_ms, r.bf16_quiet_max_ms);
    table += load_row("muon::Muon bf16, loaded", r.bf16_loaded_median_ms, r.bf16_loaded_max_ms);
  }
  table += load_row("plain ATen (1 LibTorch thread, its best), loaded", r.plain_loaded_median_ms,
                    r.plain_loaded_max_ms);
  log << table << std::flush;
}

}  // namespace muon::cli
