// The one rule for the dtype optimizer arithmetic and state use, whatever the parameter's dtype.
#pragma once

#include <c10/core/ScalarType.h>

namespace muon {

// Full precision for a parameter of dtype `param`: float64 for float64, else float32 (bf16 and
// fp16 parameters accumulate in float32).
inline at::ScalarType full_precision(at::ScalarType param) {
  return param == at::kDouble ? at::kDouble : at::kFloat;
}

// The dtype state tensors are stored in: bf16 when `state_dtype` asks for it, else full precision.
inline at::ScalarType state_storage_dtype(at::ScalarType param, at::ScalarType state_dtype) {
  return state_dtype == at::kBFloat16 ? at::kBFloat16 : full_precision(param);
}

}  // namespace muon
