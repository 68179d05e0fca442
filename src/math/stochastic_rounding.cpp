#include "muon/stochastic_rounding.h"

#include <ATen/Parallel.h>

#include "muon/error.h"

namespace muon::sr {

at::Tensor round_to_bf16(const at::Tensor& x, uint32_t seed) {
  check(x.scalar_type() == at::kFloat, "round_to_bf16: expected a float32 tensor, got ",
        x.scalar_type());
  check(x.device().is_cpu(), "round_to_bf16: expected a CPU tensor, got ", x.device());
  const auto src = x.contiguous();
  auto out = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  const float* in = src.data_ptr<float>();
  auto* bits = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, src.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      bits[i] = round_bits(in[i], seed, static_cast<uint64_t>(i));
  });
  return out;
}

}  // namespace muon::sr
