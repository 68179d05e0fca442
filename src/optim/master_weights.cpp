#include "master_weights.h"

namespace muon::detail {

at::Tensor join_halves(const at::Tensor& param, const at::Tensor& mantissa) {
  // int16 → int32 sign-extends; the high half is shifted into place, the low half masked to its
  // 16 bits, and the int32 bits read as fp32.
  const auto high = param.contiguous().view(at::kShort).to(at::kInt).__lshift__(16);
  const auto low = mantissa.contiguous().to(at::kInt).bitwise_and(0xFFFF);
  return high.bitwise_or(low).view(at::kFloat);
}

void split_halves(const at::Tensor& master, at::Tensor& param, at::Tensor& mantissa) {
  const auto bits = master.contiguous().view(at::kInt);
  // Arithmetic shift: the high half, sign included; int32 → int16 keeps the low 16 bits.
  param.view(at::kShort).copy_(bits.__rshift__(16).to(at::kShort));
  mantissa.copy_(bits.bitwise_and(0xFFFF).to(at::kShort));
}

}  // namespace muon::detail
