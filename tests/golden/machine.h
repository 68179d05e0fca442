// What decides the bits of a golden result beyond the code: the CPU Newton–Schulz products'
// library and kernels, the CPU's feature bits, and LibTorch's version (its GEMMs and kernels).
#pragma once

#include <torch/version.h>

#include <string>

#include "muon/internal/kernel_choice.h"
#include "muon/orthogonalize.h"

namespace muon::golden {

inline std::string machine() {
  return blas_backend() + "; " + detail::cpu_features().flags() + "; LibTorch " + TORCH_VERSION;
}

}  // namespace muon::golden
