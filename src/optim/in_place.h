// Internal to the algorithms layer: how a fused kernel updates a parameter in place.
#pragma once

#include <ATen/ATen.h>

namespace muon::detail {

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
