// Where CPU bf16 products run: whether this CPU and build have them at all (bf16 dot products and a
// linked oneDNN with kernels for them), and which library runs each — the linked oneDNN, or
// LibTorch's GEMM where LibTorch carries a newer oneDNN (docs/algorithms.md §Methods).
#include <ATen/Context.h>
#include <ATen/Version.h>

#include <string>

#include "muon/internal/dnnl.h"
#include "muon/internal/kernel_choice.h"
#include "muon/internal/newton_schulz_bf16.h"

namespace muon::detail {

bool bf16_products_available() {
  static const bool available = has_bf16_products(cpu_features()) && dnnl::available() &&
                                !dnnl::kernel(dnnl::Type::bf16, dnnl::Type::f32).empty() &&
                                !dnnl::kernel(dnnl::Type::bf16, dnnl::Type::bf16).empty();
  return available;
}

std::string bf16_products_unavailable_reason() {
  if (!has_bf16_products(cpu_features())) {
    const auto& cpu = cpu_features();
    return (cpu.ceiling.empty() ? "this CPU has no bf16 dot products (AVX512_BF16 or AMX); it has "
                                : cpu.ceiling + " leaves no bf16 dot products (AVX512_BF16 or "
                                                "AMX); it leaves ") +
           cpu.flags();
  }
  if (!dnnl::available()) return "this build has no oneDNN (libdnnl-dev)";
  return dnnl::version() + " has no bf16 matrix-product kernel for this CPU";
}

namespace {

struct LibTorchGemm {
  std::string theirs, ours;
  bool newer;
};

const LibTorchGemm& libtorch_gemm() {
  static const LibTorchGemm gemm = [] {
    LibTorchGemm g{at::get_mkldnn_version(), dnnl::version(), false};
    g.newer = release_of(g.theirs) > release_of(g.ours);
    return g;
  }();
  return gemm;
}

}  // namespace

Bf16Products default_bf16_products() {
  if (!bf16_products_available()) return Bf16Products::emulated;
  // at::mm leaves oneDNN for a slow path where the user turned it off (torch.backends.mkldnn).
  return libtorch_gemm().newer && at::globalContext().userEnabledMkldnn() ? Bf16Products::libtorch
                                                                          : Bf16Products::onednn;
}

std::string bf16_products_description() {
  if (!bf16_products_available()) {
    return "emulated: fp32 products of the bf16-rounded operands, each result rounded to bf16 "
           "where a bf16 product rounds it (" +
           bf16_products_unavailable_reason() + ")";
  }
  const auto& g = libtorch_gemm();
  if (default_bf16_products() == Bf16Products::onednn) {
    return "every bf16 product on the linked " + dnnl::version() +
           (g.newer ? " (LibTorch's oneDNN is turned off)" : "");
  }
  const auto theirs = release_of(g.theirs);
  return "whole bf16 products on LibTorch's oneDNN " + std::to_string(theirs[0]) + "." +
         std::to_string(theirs[1]) + "." + std::to_string(theirs[2]) + " (newer than the linked " +
         g.ours + "), the rest on the linked one";
}

}  // namespace muon::detail
