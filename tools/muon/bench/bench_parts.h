// Internal to `muon bench`: the timing helpers its measurements share, and the measurements kept
// in files of their own (bench_optim.cpp: AdamW and the data-parallel step; bench_load.cpp: the
// step under load).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "bench/bench.h"

namespace muon::cli {

inline double seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every timed figure is the best of `reps` runs, like the GEMM rate it is compared with: on a
// shared machine interference only ever adds time, so the fastest run is the least disturbed.
inline double best_seconds(int reps, const std::function<void()>& fn) {
  double best = seconds(fn);
  for (int r = 1; r < reps; ++r) best = std::min(best, seconds(fn));
  return best;
}

// Resident-set figures from /proc/self/status, in MiB.
inline double status_mib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stod(line.substr(std::strlen(field))) / 1024.0;
  }
  return -1;
}

// Peak RSS a call adds above the RSS before it (Linux: writing 5 to clear_refs resets VmHWM).
inline double peak_extra_mib(const std::function<void()>& fn) {
  std::ofstream("/proc/self/clear_refs") << "5";
  const double before = status_mib("VmRSS:");
  fn();
  return status_mib("VmHWM:") - before;
}

// LibTorch's intra-op threads set to `threads` for a scope. The plain ATen step runs fastest with
// one (its GEMMs are OpenBLAS's, on OpenBLAS's own threads; an OpenMP team of LibTorch's spinning
// beside them halves their rate on 2 cores), so it is timed with one and with every thread, and
// the better counts: the baseline at its best.
struct ScopedThreads {
  explicit ScopedThreads(int threads) : before(at::get_num_threads()) {
    at::set_num_threads(threads);
  }
  ~ScopedThreads() { at::set_num_threads(before); }
  int before;
};

// torch.optim.Muon's formulation in plain ATen, the baseline of the Muon step: EMA momentum with
// Nesterov, the quintic on the transposed tall matrix, decoupled decay, √max(1, rows/cols).
void plain_muon_step(std::vector<at::Tensor>& params, std::vector<at::Tensor>& buffers, double lr,
                     double beta, double weight_decay);

// 20 steps of muon::Muon alone and beside a competing process (bench_load.cpp).
void bench_load(BenchReport& report, std::ostream& log);
void bench_adamw(const BenchConfig& config, BenchReport& report, std::ostream& log);
// The demo GPT's hybrid step on 1 and on 2 ranks (one process each, over loopback).
void bench_distributed(const BenchConfig& config, BenchReport& report, std::ostream& log);

}  // namespace muon::cli
