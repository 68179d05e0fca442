// Internal to the algorithms layer: the state dtypes an algorithm takes, and the device-generic
// form of an update with 8-bit state (muon/quantize.h).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <string>

#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/quantize.h"

namespace muon::detail {

// Throws unless `who` (an algorithm keeping low-precision state) can store its state in `dtype`:
// float32 (full precision: float64 for float64 parameters), bfloat16 or int8.
inline void check_state_dtype(const char* who, at::ScalarType dtype) {
  check(state_dtype_named(state_dtype_name(dtype)).has_value(), who, ": state_dtype ",
        state_dtype_name(dtype),
        " is not supported; use float32 (full precision), bfloat16 (stochastic rounding) or int8 "
        "(8-bit blocks)");
}

// Throws unless parameter `p` (named by `where`) can keep `who`'s state in `dtype`: int8 state is
// for float32, bfloat16 and float16 parameters.
inline void check_state_for(const char* who, const at::Tensor& p, at::ScalarType dtype,
                            const std::string& where) {
  check(dtype != at::kChar || p.scalar_type() != at::kDouble, who, ": ", where,
        " is float64; int8 state is kept for float32, bfloat16 and float16 parameters (give it "
        "a param group with state_dtype float32)");
}

// The device-generic form of an update with 8-bit state: `update(values)` runs on fp32 copies of
// `states` (decoded by `maps`), which are then quantized back — the bits of the fused kernels,
// which do the same block by block.
template <size_t N, class F>
void on_dequantized(const std::array<QuantizedState*, N>& states,
                    const std::array<q8::CodeMap, N>& maps, F&& update) {
  std::array<at::Tensor, N> values;
  for (size_t i = 0; i < N; ++i) {
    values[i] = q8::dequantize(states[i]->codes, states[i]->absmax, maps[i]);
  }
  update(values);
  for (size_t i = 0; i < N; ++i) {
    q8::quantize(values[i], states[i]->codes, states[i]->absmax, maps[i]);
  }
}

}  // namespace muon::detail
