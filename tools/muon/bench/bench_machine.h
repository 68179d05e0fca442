// What `muon bench` measures against: the CPU (model, family, feature bits), the fp32 GEMM of
// every library this build can call — the fastest is the denominator of every orthogonalization
// figure — the bf16 one where the CPU has bf16 dot products, and a competing process for the
// figures under load.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "system/threads.h"  // set_all_threads: every library in a figure on the same threads

namespace muon::cli {

// "AMD EPYC 7B13 (cpu family 25); avx2 fma": the brand string, /proc/cpuinfo's family, the
// feature bits the kernel choices read.
std::string cpu_description();

// n×n×n GEMMs, each library's: LibTorch's at::mm (its BLAS), BLIS (the products of the CPU
// Newton–Schulz methods, on LibTorch's thread count) and oneDNN in fp32; where the CPU has bf16
// dot products, LibTorch's at::mm in bf16 (its own oneDNN, which torch.optim.Muon's products run
// on) and the system's oneDNN bf16 → fp32 (which the bf16 Newton–Schulz products run on).
class GemmBench {
 public:
  explicit GemmBench(int64_t n = 2048);
  ~GemmBench();

  struct Gemm {
    std::string name;  // "LibTorch at::mm", "BLIS", "oneDNN", "LibTorch at::mm bf16", ...
    std::string kernels;
    bool bf16 = false;
    std::function<void()> run;
  };
  const std::vector<Gemm>& gemms() const { return gemms_; }
  // Each GEMM once, in gemms() order, as GFLOP/s.
  std::vector<double> round();
  // The fastest fp32 (or bf16) rate of a round(); 0 if there is no such GEMM.
  static double best(const std::vector<Gemm>& gemms, const std::vector<double>& rates, bool bf16);

 private:
  struct Buffers;
  int64_t n_;
  std::vector<Gemm> gemms_;
  Buffers* buffers_;
};

// A child process that keeps one core busy from construction to destruction: the "another busy
// process on the machine" of the figures under load.
class CompetingProcess {
 public:
  CompetingProcess();
  ~CompetingProcess();
  CompetingProcess(const CompetingProcess&) = delete;
  CompetingProcess& operator=(const CompetingProcess&) = delete;

 private:
  pid_t pid_ = -1;
};

}  // namespace muon::cli
