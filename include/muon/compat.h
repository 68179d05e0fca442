// The one place where LibTorch version differences live (1.13 vs 2.x).
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <string>

namespace muon::compat {

// Key of a parameter in torch::optim::Optimizer::state(): LibTorch 1.x keys by the TensorImpl
// address printed as a string, 2.x by the address itself.
#if TORCH_VERSION_MAJOR >= 2
inline void* param_state_key(const at::Tensor& p) {
  return p.unsafeGetTensorImpl();
}
#else
inline std::string param_state_key(const at::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}
#endif

}  // namespace muon::compat
