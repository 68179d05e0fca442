#include "muon/stochastic_rounding.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "muon/error.h"

namespace muon::sr {
namespace {

void check_input(const at::Tensor& x, const char* function) {
  check(x.scalar_type() == at::kFloat, function, ": expected a float32 tensor, got ",
        x.scalar_type());
}

// A uint32 constant as the int32 with the same bits (ATen has no uint32 arithmetic).
int64_t as_int32(uint32_t value) {
  return static_cast<int32_t>(value);
}

// x >> s for x read as uint32.
at::Tensor logical_shift_right(const at::Tensor& x, int s) {
  return at::bitwise_right_shift(x, s).bitwise_and_(as_int32(0xFFFFFFFFu >> s));
}

// fmix32 of every element, in place.
void fmix32_(at::Tensor& h) {
  h.bitwise_xor_(logical_shift_right(h, 16)).mul_(as_int32(0x85EBCA6Bu));
  h.bitwise_xor_(logical_shift_right(h, 13)).mul_(as_int32(0xC2B2AE35u));
  h.bitwise_xor_(logical_shift_right(h, 16));
}

// round_bits() of the fp32 bit patterns `bits` (int32) whose flat indices start at `first`.
at::Tensor rounded_bits(const at::Tensor& bits, uint32_t seed, int64_t first) {
  // Indices mod 2³² as int32 bit patterns: 0..n−1 plus `first`, wrapping as uint32 does.
  auto h = at::arange(bits.numel(), bits.options()).add_(as_int32(static_cast<uint32_t>(first)));
  h.mul_(as_int32(0x9E3779B1u)).add_(as_int32(seed));
  fmix32_(h);
  const auto noise = h.bitwise_and_(0xFFFF);
  const auto rounded = logical_shift_right(bits + noise, 16);
  const auto quiet_nan = logical_shift_right(bits, 16).bitwise_or_(0x0040);
  const auto is_nan = bits.bitwise_and(0x7FFFFFFF) > 0x7F800000;
  return at::where(is_nan, quiet_nan, rounded);
}

}  // namespace

at::Tensor round_to_bf16(const at::Tensor& x, uint32_t seed) {
  check_input(x, "round_to_bf16");
  if (!x.device().is_cpu()) return round_to_bf16_generic(x, seed);
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

at::Tensor round_to_bf16_generic(const at::Tensor& x, uint32_t seed) {
  check_input(x, "round_to_bf16_generic");
  constexpr int64_t kChunk = int64_t{1} << 24;
  const auto bits = x.contiguous().view(at::kInt).reshape(-1);
  auto out = at::empty({bits.numel()}, x.options().dtype(at::kShort));
  for (int64_t first = 0; first < bits.numel(); first += kChunk) {
    const int64_t n = std::min(kChunk, bits.numel() - first);
    auto r = rounded_bits(bits.narrow(0, first, n), seed, first);
    // [0, 0xFFFF] into int16's bit patterns.
    out.narrow(0, first, n).copy_(at::where(r >= 0x8000, r - 0x10000, r));
  }
  return out.view(at::kBFloat16).view(x.sizes());
}

}  // namespace muon::sr
