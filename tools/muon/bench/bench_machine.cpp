#include "bench/bench_machine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "muon/internal/blas.h"
#include "muon/internal/dnnl.h"
#include "muon/internal/kernel_choice.h"

namespace muon::cli {
namespace {

std::string cpuinfo_field(const std::string& field) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind(field, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  }
  return "";
}

double seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::string cpu_description() {
  const auto& f = detail::cpu_features();
  std::string model = f.model.empty() ? cpuinfo_field("model name") : f.model;
  const auto family = cpuinfo_field("cpu family");
  return (model.empty() ? "unknown CPU" : model) +
         (family.empty() ? "" : " (cpu family " + family + ")") + "; " + f.flags();
}

struct GemmBench::Buffers {
  at::Tensor a, b, c, a16, b16, c16;
};

GemmBench::GemmBench(int64_t n) : n_(n), buffers_(new Buffers) {
  auto& t = *buffers_;
  t.a = at::randn({n, n});
  t.b = at::randn({n, n});
  t.c = at::empty({n, n});
  const auto* a = t.a.data_ptr<float>();
  const auto* b = t.b.data_ptr<float>();
  auto* c = t.c.data_ptr<float>();
  const int size = static_cast<int>(n);
  gemms_.push_back({"LibTorch at::mm", "its BLAS", false, [&t] { at::mm_out(t.c, t.a, t.b); }});
  if (detail::has_bf16_products(detail::cpu_features())) {  // what torch.matmul runs bf16 on
    t.a16 = t.a.to(at::kBFloat16);
    t.b16 = t.b.to(at::kBFloat16);
    t.c16 = at::empty_like(t.a16);
    gemms_.push_back({"LibTorch at::mm bf16", "its oneDNN", true,
                      [&t] { at::mm_out(t.c16, t.a16, t.b16); }});
  }
  if (detail::blas::available() && detail::blas::backend().rfind("BLIS", 0) == 0) {
    gemms_.push_back({"BLIS", detail::blas::kernel_family() + " kernels", false,
                      [=] { detail::blas::gemm_square(a, b, c, size); }});
  }
  using detail::dnnl::Type;
  if (detail::dnnl::available()) {
    gemms_.push_back(
        {"oneDNN", detail::dnnl::kernel(Type::f32, Type::f32), false, [=] {
           detail::dnnl::matmul(n, n, n, Type::f32, {a, n, 1}, {b, n, 1}, Type::f32, c, n, 1);
         }});
    if (detail::blas::fp32_on_onednn()) {  // the fp32 Newton–Schulz products' own GEMM
      gemms_.push_back({"oneDNN sgemm", "its jit GEMM", false, [=] {
                          detail::dnnl::sgemm(false, false, n, n, n, a, n, b, n, c, n);
                        }});
    }
    const auto bf16_kernel = detail::dnnl::kernel(Type::bf16, Type::f32);
    if (t.a16.defined() && !bf16_kernel.empty()) {
      const void* a16 = t.a16.data_ptr();
      const void* b16 = t.b16.data_ptr();
      gemms_.push_back({"oneDNN bf16 → fp32", bf16_kernel, true, [=] {
                          detail::dnnl::matmul(n, n, n, Type::bf16, {a16, n, 1}, {b16, n, 1},
                                               Type::f32, c, n, 1);
                        }});
    }
  }
  for (auto& g : gemms_) g.run();  // warm-up (oneDNN generates its kernels here)
}

GemmBench::~GemmBench() {
  delete buffers_;
}

std::vector<double> GemmBench::round() {
  std::vector<double> rates;
  const double flops = 2.0 * static_cast<double>(n_ * n_ * n_);
  for (auto& g : gemms_) rates.push_back(flops / seconds(g.run) / 1e9);
  return rates;
}

double GemmBench::best(const std::vector<Gemm>& gemms, const std::vector<double>& rates,
                       bool bf16) {
  double fastest = 0;
  for (size_t i = 0; i < gemms.size(); ++i) {
    if (gemms[i].bf16 == bf16) fastest = std::max(fastest, rates[i]);
  }
  return fastest;
}

CompetingProcess::CompetingProcess() {
  pid_ = fork();
  if (pid_ == 0) {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;  // until killed
  }
}

CompetingProcess::~CompetingProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

}  // namespace muon::cli
