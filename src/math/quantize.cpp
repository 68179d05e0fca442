// muon/quantize.h. The block loops are compiled for AVX-512 (x86-64-v4), AVX2 and baseline x86-64
// (one picked at load time) without FMA contraction: the same bits on every CPU. The ATen form repeats each
// step as tensor operations: fp32 products, the same integer rounding of the bits.
#include "muon/quantize.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>

#include "muon/error.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MUON_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MUON_TARGET_CLONES
#endif

namespace muon::q8 {
namespace {

const detail::Format& format_of(CodeMap map) {
  return map == CodeMap::signed_e4m3 ? detail::kSignedFormat : detail::kUnsignedFormat;
}

// v(code) for all 256 codes: the ATen form's table.
std::array<float, 256> make_table(CodeMap map) {
  std::array<float, 256> table{};
  for (uint32_t code = 0; code < 256; ++code) {
    table[code] = format_value(map, static_cast<uint8_t>(code));
  }
  return table;
}

MUON_TARGET_CLONES void decode_signed(const uint8_t* __restrict__ codes, float step,
                                      float* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = step * signed_value(codes[i]);
}

MUON_TARGET_CLONES void decode_unsigned(const uint8_t* __restrict__ codes, float step,
                                        float* __restrict__ out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = step * unsigned_value(codes[i]);
}

// Largest |x| of a block by its bits: as unsigned integers the magnitudes of floats order as the
// floats do, and any NaN lies above +Inf.
MUON_TARGET_CLONES uint32_t max_magnitude_bits(const float* __restrict__ x, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, detail::bits_of(x[i]) & 0x7FFFFFFFu);
  return top;
}

// Codes in 32-bit lanes, narrowed in a loop of their own (muon/quantize.h: why).
MUON_TARGET_CLONES void encode_signed(const float* __restrict__ x, float factor,
                                      uint8_t* __restrict__ codes, int64_t n) {
  uint32_t wide[kBlock];
  for (int64_t i = 0; i < n; ++i) wide[i] = detail::signed_code32(x[i] * factor);
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(wide[i]);
}

MUON_TARGET_CLONES void encode_unsigned(const float* __restrict__ x, float factor,
                                        uint8_t* __restrict__ codes, int64_t n) {
  uint32_t wide[kBlock];
  for (int64_t i = 0; i < n; ++i) wide[i] = detail::unsigned_code32(x[i] * factor);
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(wide[i]);
}

void check_codes(const at::Tensor& codes, const at::Tensor& absmax, const char* function) {
  check(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.dim() >= 1, function,
        ": codes must be a contiguous uint8 tensor");
  check(absmax.scalar_type() == at::kFloat && absmax.is_contiguous() &&
            absmax.sizes() == at::IntArrayRef(absmax_shape(codes.sizes())),
        function, ": absmax must be a contiguous float32 tensor of shape ",
        at::IntArrayRef(absmax_shape(codes.sizes())), " for codes of shape ", codes.sizes());
}

// x as (rows, blocks, kBlock), zero-padded at the end of each row.
at::Tensor as_blocks(const at::Tensor& x) {
  const auto rows = block_rows(x.sizes());
  const auto flat = x.reshape({rows.rows, rows.length});
  const int64_t padding = rows.blocks * kBlock - rows.length;
  const auto padded = padding == 0 ? flat : at::constant_pad_nd(flat, {0, padding}, 0);
  return padded.reshape({rows.rows, rows.blocks, kBlock});
}

// The first `length` elements of each row of (rows, blocks, kBlock) `blocked`, in `shape`.
at::Tensor from_blocks(const at::Tensor& blocked, at::IntArrayRef shape) {
  const auto rows = block_rows(shape);
  return blocked.reshape({rows.rows, rows.blocks * kBlock})
      .narrow(1, 0, rows.length)
      .reshape(shape);
}

// Decodes `n` ≤ kBlock codes of one block into fp32: out[i] = decode_step(absmax) · v(codes[i]).
void decode_block(CodeMap map, const uint8_t* codes, float absmax, float* out, int64_t n) {
  if (map == CodeMap::signed_e4m3) {
    decode_signed(codes, decode_step(absmax), out, n);
  } else {
    decode_unsigned(codes, decode_step(absmax), out, n);
  }
}

// Encodes `n` ≤ kBlock fp32 values as one block: writes their codes, returns the stored absmax.
float encode_block(CodeMap map, const float* x, uint8_t* codes, int64_t n) {
  const uint32_t top = max_magnitude_bits(x, n);
  float absmax = 0;
  std::memcpy(&absmax, &top, sizeof absmax);
  const float stored = stored_absmax(absmax);
  const float factor = code_factor(stored);
  if (map == CodeMap::signed_e4m3) {
    encode_signed(x, factor, codes, n);
  } else {
    encode_unsigned(x, factor, codes, n);
  }
  return stored;
}

}  // namespace

bool quantizes(at::IntArrayRef sizes) {
  int64_t n = 1;
  for (const auto s : sizes) n *= s;
  return sizes.size() >= 2 && n >= kMinElements;
}

BlockRows block_rows(at::IntArrayRef sizes) {
  check(!sizes.empty(), "8-bit state: a tensor of rank ≥ 1 is needed");
  int64_t length = 1;
  for (size_t d = 1; d < sizes.size(); ++d) length *= sizes[d];
  return {sizes[0], length, std::max<int64_t>(1, (length + kBlock - 1) / kBlock)};
}

std::vector<int64_t> absmax_shape(at::IntArrayRef sizes) {
  const auto rows = block_rows(sizes);
  return {rows.rows, rows.blocks};
}

float format_value(CodeMap map, uint8_t code) {
  return map == CodeMap::signed_e4m3 ? signed_value(code) : unsigned_value(code);
}

at::Tensor format_table(CodeMap map, at::Device device) {
  const auto table = make_table(map);
  return at::tensor(at::ArrayRef<float>(table.data(), table.size()), at::kFloat).to(device);
}

at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& absmax, CodeMap map) {
  check_codes(codes, absmax, "q8::dequantize");
  if (!codes.device().is_cpu()) {
    const auto values =
        format_table(map, codes.device()).index_select(0, codes.reshape(-1).to(at::kLong));
    // absmax / 1.875 correctly rounded (through fp64: some ATen builds divide fp32 approximately).
    const auto step = absmax.to(at::kDouble).div(static_cast<double>(kTop)).to(at::kFloat);
    const auto scaled = as_blocks(values.reshape(codes.sizes())) * step.unsqueeze(-1);
    return from_blocks(scaled, codes.sizes());
  }
  auto out = at::empty(codes.sizes(), codes.options().dtype(at::kFloat));
  const auto* c = codes.data_ptr<uint8_t>();
  const auto* s = absmax.data_ptr<float>();
  auto* o = out.data_ptr<float>();
  for_each_block(codes.sizes(), [&](int64_t b, int64_t first, int64_t n) {
    decode_block(map, c + first, s[b], o + first, n);
  });
  return out;
}

void quantize(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map) {
  check_codes(codes, absmax, "q8::quantize");
  check(x.sizes() == codes.sizes() && x.is_floating_point(), "q8::quantize: x (", x.sizes(),
        ") must be a floating-point tensor of the codes' shape ", codes.sizes());
  if (!codes.device().is_cpu()) {
    quantize_generic(x, codes, absmax, map);
    return;
  }
  const auto values = x.to(at::kFloat).contiguous();
  const auto* v = values.data_ptr<float>();
  auto* c = codes.data_ptr<uint8_t>();
  auto* s = absmax.data_ptr<float>();
  for_each_block(codes.sizes(), [&](int64_t b, int64_t first, int64_t n) {
    s[b] = encode_block(map, v + first, c + first, n);
  });
}

void quantize_generic(const at::Tensor& x, at::Tensor& codes, at::Tensor& absmax, CodeMap map) {
  check_codes(codes, absmax, "q8::quantize_generic");
  const auto& f = format_of(map);
  const auto blocks = as_blocks(x.to(at::kFloat));
  auto top = blocks.abs().amax(-1);
  top = at::where(top < std::numeric_limits<float>::min(), at::zeros_like(top), top);
  top = at::where(at::isnan(top), at::full_like(top, std::numeric_limits<float>::quiet_NaN()), top);
  // 1.875 / absmax correctly rounded (through fp64, as above).
  const auto factor = at::where(
      top == 0, at::zeros_like(top),
      at::full_like(top, kTop, top.options().dtype(at::kDouble)).div(top.to(at::kDouble)).to(at::kFloat));
  const auto y = (blocks * factor.unsqueeze(-1)).contiguous();
  // The integer rounding of magnitude_code, in int64 (no wrap-around for NaN's bits).
  const auto bits = y.view(at::kInt).to(at::kLong);
  const auto magnitude_bits = bits.bitwise_and(0x7FFFFFFF);
  const auto magnitude = magnitude_bits.to(at::kInt).view(at::kFloat);
  const auto normal =
      (magnitude_bits + 0x7FFFF + magnitude_bits.bitwise_right_shift(20).bitwise_and(1))
          .bitwise_right_shift(20) -
      (int64_t{127 - f.bias} << 3);
  const auto subnormal = (magnitude + f.magic).view(at::kInt).to(at::kLong) -
                         static_cast<int64_t>(detail::bits_of(f.magic));
  auto code = at::where(magnitude < f.min_normal, subnormal, normal)
                  .clamp_max(static_cast<int64_t>(f.top_code));
  if (map == CodeMap::signed_e4m3) code += (bits < 0).to(at::kLong) * 128;
  codes.copy_(from_blocks(code.to(at::kByte), codes.sizes()));
  absmax.copy_(top);
}

}  // namespace muon::q8
