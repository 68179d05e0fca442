// The one rule for the dtype optimizer arithmetic and state use, whatever the parameter's dtype.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "muon/quantize.h"

namespace muon {

// Full precision for a parameter of dtype `param`: float64 for float64, else float32 (bf16 and
// fp16 parameters accumulate in float32).
inline at::ScalarType full_precision(at::ScalarType param) {
  return param == at::kDouble ? at::kDouble : at::kFloat;
}

// The dtype state tensors are stored in: bf16 when `state_dtype` asks for it, else full precision
// (8-bit state, where a tensor does not take it, included).
inline at::ScalarType state_storage_dtype(at::ScalarType param, at::ScalarType state_dtype) {
  return state_dtype == at::kBFloat16 ? at::kBFloat16 : full_precision(param);
}

// The state dtypes as YAML, the CLI and Python's strings name them.
constexpr const char* kStateDtypeChoices = "float32, bfloat16 or int8";

inline std::string state_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    default: return c10::toString(dtype);
  }
}

// The dtype a state dtype's name stands for (nullopt for any other text).
inline std::optional<at::ScalarType> state_dtype_named(const std::string& name) {
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kChar}) {
    if (state_dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

// Whether `p`'s state is stored 8-bit (muon/quantize.h): `state_dtype` int8 asks for it, and
// tensors of at least q8::kMinElements elements in two or more dimensions take it. Such a state
// tensor X is kept as X_codes (uint8, p's shape) and X_absmax (fp32, one per block).
inline bool quantized_state(const at::Tensor& p, at::ScalarType state_dtype) {
  return state_dtype == at::kChar && q8::quantizes(p.sizes());
}

}  // namespace muon
