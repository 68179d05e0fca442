// CPU implementations of muon/fused_update.h. Each kernel is one loop over a contiguous range,
// written so that GCC vectorizes it; target_clones compiles it for AVX-512 (x86-64-v4: byte and
// word operations in 512-bit registers too), AVX2 and baseline x86-64 and picks one at load time. The file is built with -ffp-contract=off so every clone
// rounds identically (no FMA contraction): results do not depend on the CPU or thread count.
// Over 400 lines on purpose: every kernel needs those compile settings, which belong to this file
// alone.
#include "muon/fused_update.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../update_constants.h"
#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/quantize.h"
#include "muon/stochastic_rounding.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define MUON_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MUON_TARGET_CLONES
#endif

namespace muon {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: large enough to amortize scheduling

// ---- element conversions ----
inline float widen(float x) {
  return x;
}
inline double widen(double x) {
  return x;
}
inline float widen(c10::Half x) {
  return static_cast<float>(x);
}
inline float widen(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f = 0;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void store_param(float& dst, float v) {
  dst = v;
}
inline void store_param(double& dst, double v) {
  dst = v;
}
inline void store_param(c10::Half& dst, float v) {
  dst = c10::Half(v);
}
inline void store_param(c10::BFloat16& dst, float v) {
  dst.x = sr::nearest_bits(v);
}

inline void store_state(float& dst, float v, uint32_t, uint32_t) {
  dst = v;
}
inline void store_state(double& dst, double v, uint32_t, uint32_t) {
  dst = v;
}
inline void store_state(c10::BFloat16& dst, float v, uint32_t seed, uint32_t index) {
  dst.x = sr::round_bits(v, seed, index);
}

// Arithmetic type for parameter type P: double for double, else float.
template <class P>
using compute_t = std::conditional_t<std::is_same_v<P, double>, double, float>;

// ---- Adam family ----
using detail::adam_constants;
using detail::AdamConstants;

// One element of the Adam family: the new weight (before rounding into the parameter's dtype)
// and the new moments. Masked (cautious optimizer, arXiv 2411.16085): keep the new value only
// where the step W_old − W_new agrees in sign with the gradient, else keep W_old; the moments
// update either way.
template <class C>
struct AdamElement {
  C w, m, v;
};

template <bool Nesterov, bool Masked, class C>
inline AdamElement<C> adam_element(const AdamConstants<C>& k, C w_old, C raw_grad, C m_old,
                                   C v_old) {
  const C grad = raw_grad + k.l2 * w_old;
  const C w = w_old * k.decay;
  const C mi = m_old * k.beta1 + grad * k.one_minus_beta1;
  const C vi = v_old * k.beta2 + k.one_minus_beta2 * grad * grad;
  const C denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
  const C numerator = Nesterov ? mi * k.coef_m + grad * k.coef_g : mi;
  const C w_new = w - k.step_size * (numerator / denom);
  return {Masked ? ((w_old - w_new) * raw_grad > 0 ? w_new : w_old) : w_new, mi, vi};
}

// Kernels that round stochastically count elements with a 32-bit index (the hash's width), so
// that the index vectors are as wide as the float ones.
template <class P, class S, bool Nesterov, bool Masked>
MUON_TARGET_CLONES void adam_range(const AdamConstants<compute_t<P>>& k, P* __restrict__ p,
                                   const P* __restrict__ g, S* __restrict__ m, S* __restrict__ v,
                                   int64_t begin, int64_t end) {
  using C = compute_t<P>;
  const auto first = static_cast<uint32_t>(begin);
  const auto count = static_cast<uint32_t>(end - begin);
  p += begin, g += begin, m += begin, v += begin;
  for (uint32_t i = 0; i < count; ++i) {
    const auto e = adam_element<Nesterov, Masked, C>(k, widen(p[i]), widen(g[i]), widen(m[i]),
                                                     widen(v[i]));
    store_param(p[i], e.w);
    store_state(m[i], e.m, k.seed_m, first + i);
    store_state(v[i], e.v, k.seed_v, first + i);
  }
}

void check_same_layout(const at::Tensor& param, const at::Tensor& grad,
                       std::initializer_list<const at::Tensor*> state, const char* kernel) {
  check(param.is_contiguous() && grad.is_contiguous(), kernel,
        ": parameter and gradient must be contiguous");
  check(grad.scalar_type() == param.scalar_type(), kernel, ": gradient dtype ", grad.scalar_type(),
        " differs from the parameter's ", param.scalar_type());
  check(grad.numel() == param.numel(), kernel, ": gradient has ", grad.numel(),
        " elements, the parameter ", param.numel());
  const auto compute = full_precision(param.scalar_type());
  for (const auto* t : state) {
    check(t->is_contiguous() && t->numel() == param.numel(), kernel,
          ": state must be contiguous with the parameter's element count");
    check(t->scalar_type() == compute || t->scalar_type() == at::kBFloat16, kernel,
          ": state dtype ", t->scalar_type(), " is not ", compute, " or BFloat16");
  }
  check(param.device().is_cpu(), kernel, ": the fused kernels run on CPU tensors; got ",
        param.device());
}

// Calls f(P{}, S{}) with the parameter's element type and the state's (bf16 or compute type).
template <class F>
void dispatch(const at::Tensor& param, const at::Tensor& state, F&& f) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, param.scalar_type(), "muon_fused", [&] {
    using P = scalar_t;
    if (state.scalar_type() == at::kBFloat16) {
      f(P{}, c10::BFloat16{});
    } else {
      f(P{}, compute_t<P>{});
    }
  });
}

// ---- LAMB ----
template <class C>
struct LambConstants {
  AdamConstants<C> adam;
  C inv_bc1, weight_decay;
};

// r = m̂/(√v̂ + eps) + λ·W with the moments already updated.
template <class C>
inline C lamb_direction(const LambConstants<C>& k, C m, C v, C w) {
  return (m * k.inv_bc1) / (std::sqrt(v) * k.adam.inv_sqrt_bc2 + k.adam.eps) + k.weight_decay * w;
}

constexpr int64_t kLambBlock = 1 << 14;  // fixed blocks: sums independent of the thread count
// Partial sums per block: element i adds to lane i mod kLambLanes, so the loop vectorizes (one
// running sum would serialize it, and its division and square root with it) while every lane
// sums in the same order on every instruction set; the lanes are then added in order.
constexpr int64_t kLambLanes = 16;

template <class P, class S>
MUON_TARGET_CLONES void lamb_moments_range(const LambConstants<compute_t<P>>& k,
                                           const P* __restrict__ p, const P* __restrict__ g,
                                           S* __restrict__ m, S* __restrict__ v, int64_t begin,
                                           int64_t end, double* w_sq, double* r_sq) {
  using C = compute_t<P>;
  C sum_w[kLambLanes] = {}, sum_r[kLambLanes] = {};
  const auto element = [&](int64_t i, int64_t lane) {
    const C w = widen(p[i]);
    const C grad = widen(g[i]);
    const C mi = widen(m[i]) * k.adam.beta1 + grad * k.adam.one_minus_beta1;
    const C vi = widen(v[i]) * k.adam.beta2 + k.adam.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const C r = lamb_direction(k, mi, vi, w);
    sum_w[lane] += w * w;
    sum_r[lane] += r * r;
  };
  int64_t i = begin;
  for (; i + kLambLanes <= end; i += kLambLanes) {
    for (int64_t lane = 0; lane < kLambLanes; ++lane) element(i + lane, lane);
  }
  for (int64_t lane = 0; i < end; ++i, ++lane) element(i, lane);
  C total_w = 0, total_r = 0;
  for (int64_t lane = 0; lane < kLambLanes; ++lane) {
    total_w += sum_w[lane];
    total_r += sum_r[lane];
  }
  *w_sq = total_w;
  *r_sq = total_r;
}

template <class P, class S>
MUON_TARGET_CLONES void lamb_apply_range(const LambConstants<compute_t<P>>& k, compute_t<P> scale,
                                         P* __restrict__ p, const S* __restrict__ m,
                                         const S* __restrict__ v, int64_t begin, int64_t end) {
  using C = compute_t<P>;
  for (int64_t i = begin; i < end; ++i) {
    const C w = widen(p[i]);
    store_param(p[i], w - scale * lamb_direction(k, widen(m[i]), widen(v[i]), w));
  }
}

// ---- Lion ----
using detail::lion_constants;
using detail::LionConstants;

template <class C>
inline C sign_of(C x) {
  return static_cast<C>((x > 0) - (x < 0));
}

// One element of Lion: the new weight and momentum.
template <class C>
inline std::array<C, 2> lion_element(const LionConstants<C>& k, C w, C grad, C m) {
  const C c = m * k.beta1 + grad * k.one_minus_beta1;
  return {w * k.decay - k.lr * sign_of(c), m * k.beta2 + grad * k.one_minus_beta2};
}

template <class P, class S>
MUON_TARGET_CLONES void lion_range(const LionConstants<compute_t<P>>& k, P* __restrict__ p,
                                   const P* __restrict__ g, S* __restrict__ m, int64_t begin,
                                   int64_t end) {
  using C = compute_t<P>;
  const auto first = static_cast<uint32_t>(begin);
  const auto count = static_cast<uint32_t>(end - begin);
  p += begin, g += begin, m += begin;
  for (uint32_t i = 0; i < count; ++i) {
    const auto [w, mi] = lion_element<C>(k, widen(p[i]), widen(g[i]), widen(m[i]));
    store_param(p[i], w);
    store_state(m[i], mi, k.seed, first + i);
  }
}

// ---- Muon's elementwise parts ----
template <class C>
struct MomentumConstants {
  C beta, one_minus_beta;
  uint32_t seed;
};

// One element of Muon's momentum: the new buffer B and the direction Newton–Schulz takes.
template <bool Ema, bool Nesterov, class C>
inline std::array<C, 2> momentum_element(const MomentumConstants<C>& k, C grad, C b) {
  const C bi = Ema ? k.beta * b + k.one_minus_beta * grad : k.beta * b + grad;
  if constexpr (!Nesterov) {
    return {bi, bi};
  } else if constexpr (Ema) {
    return {bi, k.one_minus_beta * grad + k.beta * bi};  // lerp(g, B, β)
  } else {
    return {bi, grad + k.beta * bi};
  }
}

template <class P, class S, bool Ema, bool Nesterov>
MUON_TARGET_CLONES void momentum_range(const MomentumConstants<compute_t<P>>& k,
                                       const P* g, S* __restrict__ b, compute_t<P>* q,
                                       int64_t begin, int64_t end) {
  using C = compute_t<P>;
  const auto first = static_cast<uint32_t>(begin);
  const auto count = static_cast<uint32_t>(end - begin);
  g += begin, b += begin, q += begin;
  for (uint32_t i = 0; i < count; ++i) {
    const auto [bi, qi] = momentum_element<Ema, Nesterov, C>(k, widen(g[i]), widen(b[i]));
    store_state(b[i], bi, k.seed, first + i);
    q[i] = qi;
  }
}

// Cautious weight decay (flaxchat/nanochat) decays only entries where U·W ≥ 0. Masked (cautious
// optimizer) keeps W_old wherever (W_old − W_new)·g ≤ 0.
template <class P, bool CautiousDecay, bool Masked>
MUON_TARGET_CLONES void apply_range(compute_t<P> decay, compute_t<P> scale, P* __restrict__ p,
                                    const compute_t<P>* __restrict__ u, const P* __restrict__ g,
                                    int64_t begin, int64_t end) {
  using C = compute_t<P>;
  for (int64_t i = begin; i < end; ++i) {
    const C w = widen(p[i]);
    const C kept = CautiousDecay ? (u[i] * w >= 0 ? w * decay : w) : w * decay;
    const C w_new = kept - scale * u[i];
    if constexpr (Masked) {
      store_param(p[i], (w - w_new) * widen(g[i]) > 0 ? w_new : w);
    } else {
      store_param(p[i], w_new);
    }
  }
}

}  // namespace

void fused_adam_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     at::Tensor& exp_avg_sq, const AdamStepScalars& s) {
  check_same_layout(param, grad, {&exp_avg, &exp_avg_sq}, "fused_adam_step");
  check(exp_avg.scalar_type() == exp_avg_sq.scalar_type(),
        "fused_adam_step: both moments must have one dtype");
  dispatch(param, exp_avg, [&](auto p_tag, auto s_tag) {
    using P = decltype(p_tag);
    using S = decltype(s_tag);
    const auto k = adam_constants<compute_t<P>>(s);
    auto* p = param.data_ptr<P>();
    const auto* g = grad.data_ptr<P>();
    auto* m = static_cast<S*>(exp_avg.data_ptr());
    auto* v = static_cast<S*>(exp_avg_sq.data_ptr());
    at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (s.nesterov) {
        s.cautious ? adam_range<P, S, true, true>(k, p, g, m, v, begin, end)
                   : adam_range<P, S, true, false>(k, p, g, m, v, begin, end);
      } else {
        s.cautious ? adam_range<P, S, false, true>(k, p, g, m, v, begin, end)
                   : adam_range<P, S, false, false>(k, p, g, m, v, begin, end);
      }
    });
  });
}

void fused_lion_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                     const LionStepScalars& s) {
  check_same_layout(param, grad, {&exp_avg}, "fused_lion_step");
  dispatch(param, exp_avg, [&](auto p_tag, auto s_tag) {
    using P = decltype(p_tag);
    using S = decltype(s_tag);
    const auto k = lion_constants<compute_t<P>>(s);
    auto* p = param.data_ptr<P>();
    const auto* g = grad.data_ptr<P>();
    auto* m = static_cast<S*>(exp_avg.data_ptr());
    at::parallel_for(0, param.numel(), kGrain,
                     [&](int64_t begin, int64_t end) { lion_range<P, S>(k, p, g, m, begin, end); });
  });
}

double fused_lamb_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                       at::Tensor& exp_avg_sq, const AdamStepScalars& s, double weight_decay) {
  check_same_layout(param, grad, {&exp_avg, &exp_avg_sq}, "fused_lamb_step");
  check(exp_avg.scalar_type() != at::kBFloat16 && exp_avg_sq.scalar_type() != at::kBFloat16,
        "fused_lamb_step: LAMB keeps full-precision state");
  double trust = 1.0;
  dispatch(param, exp_avg, [&](auto p_tag, auto) {
    using P = decltype(p_tag);
    using C = compute_t<P>;
    const LambConstants<C> k{adam_constants<C>(s), detail::lamb_inv_bc1<C>(s),
                             static_cast<C>(weight_decay)};
    auto* p = param.data_ptr<P>();
    const auto* g = grad.data_ptr<P>();
    auto* m = static_cast<C*>(exp_avg.data_ptr());
    auto* v = static_cast<C*>(exp_avg_sq.data_ptr());
    const int64_t n = param.numel();
    const int64_t blocks = (n + kLambBlock - 1) / kLambBlock;
    std::vector<double> w_sq(static_cast<size_t>(blocks)), r_sq(static_cast<size_t>(blocks));
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        lamb_moments_range<P, C>(k, p, g, m, v, b * kLambBlock, std::min(n, (b + 1) * kLambBlock),
                                 &w_sq[b], &r_sq[b]);
      }
    });
    double w_norm = 0, r_norm = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      w_norm += w_sq[b];
      r_norm += r_sq[b];
    }
    w_norm = std::sqrt(w_norm);
    r_norm = std::sqrt(r_norm);
    trust = (w_norm > 0 && r_norm > 0) ? w_norm / r_norm : 1.0;
    const auto scale = static_cast<C>(s.lr * trust);
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      lamb_apply_range<P, C>(k, scale, p, m, v, begin, end);
    });
  });
  return trust;
}

void fused_momentum(const at::Tensor& grad, at::Tensor& buffer, at::Tensor& direction,
                    const MomentumScalars& s) {
  check_same_layout(grad, grad, {&buffer, &direction}, "fused_momentum");
  check(direction.scalar_type() != at::kBFloat16, "fused_momentum: direction must be fp32/fp64");
  dispatch(grad, buffer, [&](auto p_tag, auto s_tag) {
    using P = decltype(p_tag);
    using S = decltype(s_tag);
    using C = compute_t<P>;
    const MomentumConstants<C> k{static_cast<C>(s.beta), static_cast<C>(1.0 - s.beta), s.seed};
    const auto* g = grad.data_ptr<P>();
    auto* b = static_cast<S*>(buffer.data_ptr());
    auto* q = direction.data_ptr<C>();
    at::parallel_for(0, grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (s.ema) {
        s.nesterov ? momentum_range<P, S, true, true>(k, g, b, q, begin, end)
                   : momentum_range<P, S, true, false>(k, g, b, q, begin, end);
      } else {
        s.nesterov ? momentum_range<P, S, false, true>(k, g, b, q, begin, end)
                   : momentum_range<P, S, false, false>(k, g, b, q, begin, end);
      }
    });
  });
}

void fused_apply_update(at::Tensor& param, const at::Tensor& update, double decay, double scale,
                        bool cautious, const at::Tensor* mask_grad) {
  check_same_layout(param, mask_grad != nullptr ? *mask_grad : param, {&update},
                    "fused_apply_update");
  dispatch(param, update, [&](auto p_tag, auto) {
    using P = decltype(p_tag);
    using C = compute_t<P>;
    check(update.scalar_type() == c10::CppTypeToScalarType<C>::value,
          "fused_apply_update: the update must be in the compute dtype");
    auto* p = param.data_ptr<P>();
    const auto* u = update.data_ptr<C>();
    const P* g = mask_grad != nullptr ? mask_grad->data_ptr<P>() : nullptr;
    const auto d = static_cast<C>(decay);
    const auto sc = static_cast<C>(scale);
    at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (g != nullptr) {
        cautious ? apply_range<P, true, true>(d, sc, p, u, g, begin, end)
                 : apply_range<P, false, true>(d, sc, p, u, g, begin, end);
      } else {
        cautious ? apply_range<P, true, false>(d, sc, p, u, g, begin, end)
                 : apply_range<P, false, false>(d, sc, p, u, g, begin, end);
      }
    });
  });
}

// ---- 8-bit state: each block decoded, updated by the fp32-state element functions and coded
// again in one pass (so an update's arithmetic is fp32 state's, and the bits are those of
// dequantizing, updating and quantizing whole tensors) ----
namespace {

void check_quantized(const at::Tensor& param, const QuantizedState& q, const char* kernel) {
  check(q.codes.scalar_type() == at::kByte && q.codes.is_contiguous() &&
            q.codes.sizes() == param.sizes(),
        kernel, ": 8-bit codes must be a contiguous uint8 tensor of the parameter's shape ",
        param.sizes());
  const auto shape = q8::absmax_shape(param.sizes());
  check(q.absmax.scalar_type() == at::kFloat && q.absmax.is_contiguous() &&
            q.absmax.sizes() == at::IntArrayRef(shape),
        kernel, ": absmax must be a contiguous float32 tensor of shape ", at::IntArrayRef(shape));
  check(q.codes.device() == param.device() && q.absmax.device() == param.device(), kernel,
        ": 8-bit state must be on the parameter's device");
}

// Calls f(P{}) with the parameter's element type: float32, bfloat16 or float16 (8-bit state is
// not kept for float64 parameters).
template <class F>
void dispatch_quantized(const at::Tensor& param, const char* kernel, F&& f) {
  check(param.scalar_type() != at::kDouble, kernel,
        ": 8-bit state is not kept for float64 parameters");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, param.scalar_type(), "muon_q8", [&] {
    if constexpr (!std::is_same_v<scalar_t, double>) f(scalar_t{});
  });
}

// A kernel's 8-bit states in order: the first (momentum, first moment) in the signed map, the
// second (second moment) in the unsigned one.
template <size_t N>
using Q8States = std::array<QuantizedState*, N>;

inline float q8_value(size_t state, uint32_t code) {
  return state == 0 ? q8::detail::signed_value32(code) : q8::detail::unsigned_value32(code);
}

inline uint32_t q8_code(size_t state, float y) {
  return state == 0 ? q8::detail::signed_code32(y) : q8::detail::unsigned_code32(y);
}

// One block of n ≤ kBlock elements starting at element `first`: decodes each element's N state
// values, runs element(i, old) (which writes what else it updates and returns the new state
// values), takes the block's new absmax as it goes, then codes the block again. One function, so
// that the compiler vectorizes decoding, update and maximum as one loop with the values in
// registers. (Element is a class, not a lambda: GCC clones no function templates of local types.)
template <size_t N, class Element>
MUON_TARGET_CLONES void q8_block(const Element& element, const std::array<uint8_t*, N>& codes,
                                 const std::array<float*, N>& absmax, int64_t first, int64_t n) {
  float fresh[N][q8::kBlock];
  std::array<float, N> step{};
  std::array<uint32_t, N> top{};
  for (size_t j = 0; j < N; ++j) step[j] = q8::decode_step(*absmax[j]);
  // The next block's inputs, into L2: the coding loops below load nothing from memory, and the
  // hardware prefetcher alone leaves the update loop waiting (a quarter of the step). A whole
  // block's worth whatever n is (a prefetch past the end does nothing): a fixed count unrolls.
  for (int64_t i = 0; i < q8::kBlock; i += 16) element.prefetch(first + q8::kBlock + i);
  for (size_t j = 0; j < N; ++j) {
    for (int64_t i = 0; i < q8::kBlock; i += 64) __builtin_prefetch(codes[j] + q8::kBlock + i, 1, 2);
  }
  for (int64_t i = 0; i < n; ++i) {
    std::array<float, N> old{};
    for (size_t j = 0; j < N; ++j) old[j] = step[j] * q8_value(j, codes[j][i]);
    const std::array<float, N> now = element(first + i, old);
    for (size_t j = 0; j < N; ++j) {
      fresh[j][i] = now[j];
      top[j] = std::max(top[j], q8::detail::bits_of(now[j]) & 0x7FFFFFFFu);
    }
  }
  for (size_t j = 0; j < N; ++j) {
    const float stored = q8::stored_absmax(q8::detail::from_bits(top[j]));
    const float factor = q8::code_factor(stored);
    *absmax[j] = stored;
    uint32_t wide[q8::kBlock];  // codes in 32-bit lanes, narrowed apart (muon/quantize.h: why)
    for (int64_t i = 0; i < n; ++i) wide[i] = q8_code(j, fresh[j][i] * factor);
    uint8_t* __restrict__ out = codes[j];  // a byte store may alias anything, `codes` included
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(wide[i]);
  }
}

// element(i, old) → new state values, for every element of `param`, block by block.
template <size_t N, class Element>
void on_q8_blocks(const at::Tensor& param, const Q8States<N>& states, const Element& element) {
  q8::for_each_block(param.sizes(), [&](int64_t b, int64_t first, int64_t n) {
    std::array<uint8_t*, N> codes{};
    std::array<float*, N> absmax{};
    for (size_t j = 0; j < N; ++j) {
      codes[j] = states[j]->codes.template data_ptr<uint8_t>() + first;
      absmax[j] = states[j]->absmax.template data_ptr<float>() + b;
    }
    q8_block<N>(element, codes, absmax, first, n);
  });
}

template <class P, bool Nesterov, bool Masked>
struct AdamQ8 {
  AdamConstants<float> k;
  P* p;
  const P* g;
  void prefetch(int64_t i) const {
    __builtin_prefetch(p + i, 1, 2);
    __builtin_prefetch(g + i, 0, 2);
  }
  std::array<float, 2> operator()(int64_t i, const std::array<float, 2>& mv) const {
    const auto e = adam_element<Nesterov, Masked, float>(k, widen(p[i]), widen(g[i]), mv[0], mv[1]);
    store_param(p[i], e.w);
    return {e.m, e.v};
  }
};

template <class P>
struct LionQ8 {
  LionConstants<float> k;
  P* p;
  const P* g;
  void prefetch(int64_t i) const {
    __builtin_prefetch(p + i, 1, 2);
    __builtin_prefetch(g + i, 0, 2);
  }
  std::array<float, 1> operator()(int64_t i, const std::array<float, 1>& m) const {
    const auto [w, mi] = lion_element<float>(k, widen(p[i]), widen(g[i]), m[0]);
    store_param(p[i], w);
    return {mi};
  }
};

template <class P, bool Ema, bool Nesterov>
struct MomentumQ8 {
  MomentumConstants<float> k;
  const P* g;
  float* q;
  void prefetch(int64_t i) const {
    __builtin_prefetch(q + i, 1, 2);
    __builtin_prefetch(g + i, 0, 2);
  }
  std::array<float, 1> operator()(int64_t i, const std::array<float, 1>& b) const {
    const auto [bi, qi] = momentum_element<Ema, Nesterov, float>(k, widen(g[i]), b[0]);
    q[i] = qi;
    return {bi};
  }
};

}  // namespace

void fused_adam_step(at::Tensor& param, const at::Tensor& grad, QuantizedState& exp_avg,
                     QuantizedState& exp_avg_sq, const AdamStepScalars& s) {
  check_same_layout(param, grad, {}, "fused_adam_step");
  check_quantized(param, exp_avg, "fused_adam_step");
  check_quantized(param, exp_avg_sq, "fused_adam_step");
  dispatch_quantized(param, "fused_adam_step", [&](auto p_tag) {
    using P = decltype(p_tag);
    const auto k = adam_constants<float>(s);
    const auto run = [&](auto nesterov, auto masked) {
      on_q8_blocks<2>(param, {&exp_avg, &exp_avg_sq},
                      AdamQ8<P, nesterov(), masked()>{k, param.data_ptr<P>(), grad.data_ptr<P>()});
    };
    using Yes = std::true_type;
    using No = std::false_type;
    s.nesterov ? (s.cautious ? run(Yes{}, Yes{}) : run(Yes{}, No{}))
               : (s.cautious ? run(No{}, Yes{}) : run(No{}, No{}));
  });
}

void fused_lion_step(at::Tensor& param, const at::Tensor& grad, QuantizedState& exp_avg,
                     const LionStepScalars& s) {
  check_same_layout(param, grad, {}, "fused_lion_step");
  check_quantized(param, exp_avg, "fused_lion_step");
  dispatch_quantized(param, "fused_lion_step", [&](auto p_tag) {
    using P = decltype(p_tag);
    on_q8_blocks<1>(param, {&exp_avg},
                    LionQ8<P>{lion_constants<float>(s), param.data_ptr<P>(), grad.data_ptr<P>()});
  });
}

void fused_momentum(const at::Tensor& grad, QuantizedState& buffer, at::Tensor& direction,
                    const MomentumScalars& s) {
  check_same_layout(grad, grad, {&direction}, "fused_momentum");
  check_quantized(grad, buffer, "fused_momentum");
  check(direction.scalar_type() == at::kFloat, "fused_momentum: direction must be fp32");
  dispatch_quantized(grad, "fused_momentum", [&](auto p_tag) {
    using P = decltype(p_tag);
    const MomentumConstants<float> k{static_cast<float>(s.beta),
                                     static_cast<float>(1.0 - s.beta), s.seed};
    const auto run = [&](auto ema, auto nesterov) {
      on_q8_blocks<1>(grad, {&buffer}, MomentumQ8<P, ema(), nesterov()>{
                                           k, grad.data_ptr<P>(), direction.data_ptr<float>()});
    };
    using Yes = std::true_type;
    using No = std::false_type;
    s.ema ? (s.nesterov ? run(Yes{}, Yes{}) : run(Yes{}, No{}))
          : (s.nesterov ? run(No{}, Yes{}) : run(No{}, No{}));
  });
}

}  // namespace muon
