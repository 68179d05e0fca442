// Stochastic rounding of fp32 to bfloat16 as a pure function of (seed, flat element index)
// (docs/design.md §Stochastic rounding; Dew's stochastic_round_bf16). No RNG state: the same bits
// whatever the thread count.
//
// Why: round-to-nearest drops every second-moment increment smaller than half a bf16 spacing —
// most of them at β2 = 0.999 — while stochastic rounding keeps each one in expectation.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

namespace muon::sr {

// MurmurHash3's 32-bit finalizer (Appleby): a bijective avalanche mix.
constexpr uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}

// Seed of a whole update, from the step count before the update.
constexpr uint32_t step_seed(int64_t count) {
  return fmix32(static_cast<uint32_t>(count) * 0x27D4EB2Fu);
}

// Seed of tensor `index` (its position in the optimizer) within an update; it rounds the first
// moment (or Muon's momentum).
constexpr uint32_t tensor_salt(uint32_t step, int64_t index) {
  return fmix32(step + (2u * static_cast<uint32_t>(index) + 1u) * 0x165667B1u);
}

// Seed of the second moment of the tensor whose first moment uses `salt`.
constexpr uint32_t second_moment_salt(uint32_t salt) {
  return fmix32(salt + 0x9E3779B9u);
}

// bf16 bits of x rounded up with probability equal to the discarded fraction: 16 hashed noise bits
// are added below the kept mantissa and truncated. NaN stays a (quiet) NaN, ±Inf stays ±Inf.
// (A select, not a branch, so that loops over it vectorize.)
inline uint16_t round_bits(float x, uint32_t seed, uint64_t index) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t noise = fmix32(static_cast<uint32_t>(index) * 0x9E3779B1u + seed) & 0xFFFFu;
  const uint32_t rounded = (bits + noise) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// bf16 bits of x rounded to nearest even, the deterministic rounding (c10::BFloat16's, NaN kept a
// quiet NaN), in the same vectorizable form.
inline uint16_t nearest_bits(float x) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

// The fp32 tensor x rounded elementwise to a new bfloat16 tensor on x's device, index = position
// in x's row-major order: a vectorized loop on CPU, round_to_bf16_generic elsewhere.
at::Tensor round_to_bf16(const at::Tensor& x, uint32_t seed);

// The same bits from ATen integer operations alone, on any device: fmix32 in wrapping int32
// arithmetic, logical shifts as arithmetic shifts masked. Works in chunks, so temporaries stay
// bounded (a few int32 tensors of at most 2²⁴ elements).
at::Tensor round_to_bf16_generic(const at::Tensor& x, uint32_t seed);

}  // namespace muon::sr
