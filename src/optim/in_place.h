// Internal to the algorithms layer: which kernels update a parameter, and how a fused kernel
// updates one in place.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "muon/error.h"

namespace muon::detail {

// Whether `p` goes through the fused CPU kernels (muon/fused_update.h) rather than their
// device-generic ATen form (muon/generic_update.h): the `fused` option when set, else whether p
// is on CPU.
inline bool runs_fused(const std::optional<bool>& fused, const at::Tensor& p) {
  return fused.value_or(p.device().is_cpu());
}

// Throws unless `fused` can update `p` (fused: true needs a CPU tensor). `who` and `where` name
// the optimizer and the parameter.
inline void check_kernels(const std::optional<bool>& fused, const at::Tensor& p, const char* who,
                          const std::string& where) {
  check(!fused.value_or(false) || p.device().is_cpu(), who, ": ", where, " is on ", p.device(),
        "; fused: true runs the fused CPU kernels, which need CPU tensors (leave fused unset to "
        "pick per device, or false for the device-generic ATen form)");
}

// Throws unless an elementwise rule named `who` can update `p` with gradient `grad` (undefined:
// none this step): a real floating-point tensor, kernels `fused` can run, a dense gradient of
// p's shape.
inline void check_elementwise_item(const char* who, const at::Tensor& p, const at::Tensor& grad,
                                   const std::optional<bool>& fused, const std::string& where) {
  check(!p.is_complex(), who, ": ", where, " is complex (", p.scalar_type(), "); ", who,
        " supports real floating-point parameters only");
  check(p.is_floating_point(), who, ": ", where, " has dtype ", p.scalar_type(),
        "; expected float32, float64, bfloat16 or float16");
  check_kernels(fused, p, who, where);
  if (grad.defined()) {
    check(!grad.is_sparse(), who, " does not support sparse gradients (", where, ")");
    check(grad.sizes() == p.sizes(), who, ": ", where, " has a gradient of shape ", grad.sizes(),
          " for a parameter of shape ", p.sizes());
  }
}

// Runs `update` on a contiguous tensor holding p's data (a copy for a non-contiguous parameter,
// written back afterwards) and records the in-place change for autograd's version checks.
template <class F>
void update_in_place(at::Tensor& p, F&& update) {
  if (p.is_contiguous()) {
    update(p);
  } else {
    auto dense = p.contiguous();
    update(dense);
    p.copy_(dense);
  }
  p.unsafeGetTensorImpl()->bump_version();
}

}  // namespace muon::detail
