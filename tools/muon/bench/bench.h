// `muon bench`: every speed figure of the project measured in one run, next to the machine's own
// GEMM rate and memory bandwidth (measured in the same run), as text and optionally JSON.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace muon::cli {

struct BenchConfig {
  bool orthogonalize = true;
  bool muon_step = true;
  bool adamw = true;
  bool distributed = true;
  bool load = true;  // Muon steps with and without a competing process
  int64_t muon_layers = 4;  // GPT-shaped Muon matrices: per layer 4 (w×w) and 3 (w×4w / 4w×w)
  int64_t muon_width = 768;
  int64_t adamw_layers = 6;  // GPT-shaped AdamW parameter set
  int64_t adamw_width = 512;
  int64_t vocab = 8192;
  int64_t dist_layers = 8;  // the demo GPT whose hybrid step runs on 1 and on 2 ranks
  int64_t dist_width = 256;
  int reps = 3;  // timed repetitions (the best counts), after one warm-up
  int threads = 0;  // every library's threads (LibTorch's, OpenBLAS's); 0: one per core
};

struct BenchReport {
  int threads = 0;
  std::string cpu;            // model, cpu family, feature bits
  std::string openblas_env;   // OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as this run had them
  std::string products;       // what the CPU Newton–Schulz products run on, and why
  std::string bf16_products;  // and the bf16 ones ("emulated: " and why, without bf16 products)
  struct Gemm {
    std::string name, kernels;
    bool bf16;
    double gflops;  // 2048³, best of 5
  };
  std::vector<Gemm> gemms;  // every library's
  double gemm_gflops = 0;   // the best fp32 one: the denominator
  double bf16_gflops = 0;   // the best bf16 GEMM, 0 where the CPU has no bf16 dot products
  double copy_gbs = 0, update_gbs = 0;  // a copy, and an in-place update c += s·a

  struct Orthogonalization {
    int64_t rows, cols;
    std::string method;
    // of_gemm: gflops over gemm_gflops, the GEMM rate measured in the same rounds; of_bf16_gemm
    // (bf16 methods; 0 for the others): over the best bf16 GEMM rate of the same rounds.
    double ms, gflops, gemm_gflops, of_gemm, of_bf16_gemm, orth_err, vs_plain;
  };
  std::vector<Orthogonalization> orthogonalization;

  struct MuonStep {
    int64_t matrices = 0, parameters = 0;
    double plain_ms = 0, ours_ms = 0, speedup = 0, max_rel_diff = 0;
    int plain_threads = 0;  // the LibTorch threads the plain step ran fastest with
    // With bf16 Newton–Schulz (0 where the CPU has no bf16 dot products).
    double bf16_ms = 0, bf16_speedup = 0, bf16_max_rel_diff = 0;
    // Dion on the same matrices (another update: no difference column), at rank fractions 1 and
    // 1/4.
    double dion_ms = 0, dion_quarter_ms = 0;
  } muon_step;

  struct AdamW {
    std::string name;
    double ms, speedup, gbs, of_bandwidth, state_bytes_per_param, peak_extra_mib;
  };
  int64_t adamw_parameters = 0;
  // An fp32 AdamW step's bytes streamed in one pass over the same tensors (the step's bound at its
  // working set); of_bandwidth divides by the better of it and update_gbs.
  double adamw_stream_gbs = 0;
  std::vector<AdamW> adamw;

  // The hybrid optimizer's step on 2 local ranks (threads, Gloo on loopback) vs 1 rank.
  struct Distributed {
    int64_t parameters = 0;
    double one_rank_ms = 0, per_rank_ms = 0, speedup = 0;
    double bytes_per_step = 0, minimum_bytes = 0, bytes_ratio = 0, max_rel_diff = 0;
  } distributed;

  // The step of muon::Muon (fp32 and, with bf16 dot products, bf16 Newton–Schulz) and of plain
  // ATen on 8 matrices of 512², quiet and with another busy process on the machine: medians and
  // maxima of `steps` steps (bf16 figures 0 where it does not run).
  struct Load {
    int steps = 0;
    double quiet_median_ms = 0, quiet_max_ms = 0, loaded_median_ms = 0, loaded_max_ms = 0;
    double bf16_quiet_median_ms = 0, bf16_quiet_max_ms = 0;
    double bf16_loaded_median_ms = 0, bf16_loaded_max_ms = 0;
    double plain_loaded_median_ms = 0, plain_loaded_max_ms = 0;
  } load;

  std::string to_json() const;
};

// Runs the selected measurements, printing each section's table to `log` as it completes.
BenchReport run_bench(const BenchConfig& config, std::ostream& log);

// The figures of `as_set` (a run with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as the environment has
// them) beside those of the same run with both unset (`unset_json`, its to_json()), and the Muon
// step against the plain ATen step at its best of the two.
void compare_openblas_settings(const BenchReport& as_set, const std::string& unset_json,
                               std::ostream& log);

}  // namespace muon::cli
