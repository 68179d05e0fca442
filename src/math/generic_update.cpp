// muon/generic_update.h: the fused kernels' arithmetic as ATen operations. Every line mirrors a
// line of src/math/cpu/fused_update.cpp: the same constants (update_constants.h), the same order
// of operations, one rounding each (no `alpha` forms, which ATen computes with a fused
// multiply-add), so that on CPU the results are the fused kernels' bits.
#include "muon/generic_update.h"

#include <map>
#include <tuple>

#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/reduction.h"
#include "muon/stochastic_rounding.h"
#include "update_constants.h"

namespace muon {
namespace {

using TensorList = std::vector<at::Tensor>;

// Elements a multi-tensor operation covers at once: bounds the temporaries (a few per chunk).
constexpr int64_t kChunkElements = int64_t{1} << 24;

at::ScalarType compute_dtype(const at::Tensor& param) {
  return full_precision(param.scalar_type());
}

// `t` in dtype `dtype`: t itself when it already is (updated in place), else a copy that
// store() writes back.
at::Tensor in_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

// The parameter gets the computed value rounded to nearest (as the fused kernels store it).
void store_param(at::Tensor& param, const at::Tensor& value) {
  if (!value.is_same(param)) param.copy_(value);
}

// State gets the computed value; bf16 state with stochastic rounding (seed, flat index).
void store_state(at::Tensor& state, const at::Tensor& value, uint32_t seed) {
  if (value.is_same(state)) return;
  if (state.scalar_type() == at::kBFloat16) {
    state.copy_(sr::round_to_bf16_generic(value.to(at::kFloat), seed));
  } else {
    state.copy_(value);
  }
}

void check_entry(const AdamTensors& e, const AdamTensors& first, const char* kernel) {
  check(e.grad.sizes() == e.param.sizes() && e.exp_avg.sizes() == e.param.sizes() &&
            e.exp_avg_sq.sizes() == e.param.sizes(),
        kernel, ": gradient and state must have the parameter's shape ", e.param.sizes());
  check(e.grad.scalar_type() == e.param.scalar_type(), kernel, ": gradient dtype ",
        e.grad.scalar_type(), " differs from the parameter's ", e.param.scalar_type());
  check(e.exp_avg.is_contiguous() && e.exp_avg_sq.is_contiguous() &&
            e.exp_avg.scalar_type() == e.exp_avg_sq.scalar_type(),
        kernel, ": both moments must be contiguous, of one dtype");
  const auto& a = e.scalars;
  const auto& b = first.scalars;
  check(std::tie(a.lr, a.beta1, a.beta2, a.eps, a.decay_fraction, a.l2_weight_decay,
                 a.nesterov, a.cautious) == std::tie(b.lr, b.beta1, b.beta2, b.eps,
                                                     b.decay_fraction, b.l2_weight_decay,
                                                     b.nesterov, b.cautious),
        kernel, ": entries of one call may differ only in step and seeds");
}

// Entries that can share multi-tensor operations (device, parameter and state dtype), in order,
// cut into chunks of at most kChunkElements (a larger tensor is a chunk of its own).
std::vector<std::vector<const AdamTensors*>> chunks_of(const std::vector<AdamTensors>& entries) {
  std::map<std::tuple<std::string, at::ScalarType, at::ScalarType>, size_t> open;
  std::vector<std::vector<const AdamTensors*>> chunks;
  std::vector<int64_t> sizes;
  for (const auto& e : entries) {
    const auto key =
        std::make_tuple(e.param.device().str(), e.param.scalar_type(), e.exp_avg.scalar_type());
    auto it = open.find(key);
    if (it == open.end() || sizes[it->second] + e.param.numel() > kChunkElements) {
      it = open.insert_or_assign(key, chunks.size()).first;
      chunks.emplace_back();
      sizes.push_back(0);
    }
    chunks[it->second].push_back(&e);
    sizes[it->second] += e.param.numel();
  }
  return chunks;
}

template <class C>
using Constants = detail::AdamConstants<C>;

// One scalar per entry: field `member` of each entry's constants.
template <class C>
std::vector<at::Scalar> per_entry(const std::vector<Constants<C>>& k, C Constants<C>::*member) {
  std::vector<at::Scalar> out;
  out.reserve(k.size());
  for (const auto& ki : k) out.emplace_back(static_cast<double>(ki.*member));
  return out;
}

template <class C>
at::Scalar scalar(C value) {
  return at::Scalar(static_cast<double>(value));
}

// The tensors of a chunk in the compute dtype, and each entry's constants.
template <class C>
struct Widened {
  TensorList w, g, m, v;
  std::vector<Constants<C>> k;

  explicit Widened(const std::vector<const AdamTensors*>& chunk) {
    const auto dtype = c10::CppTypeToScalarType<C>::value;
    for (const auto* e : chunk) {
      w.push_back(in_dtype(e->param, dtype));
      g.push_back(in_dtype(e->grad, dtype));
      m.push_back(in_dtype(e->exp_avg, dtype));
      v.push_back(in_dtype(e->exp_avg_sq, dtype));
      k.push_back(detail::adam_constants<C>(e->scalars));
    }
  }

  // m ← β1·m + (1−β1)·g;  v ← β2·v + ((1−β2)·g)·g.
  void update_moments(const TensorList& grad) {
    const auto& k0 = k.front();
    at::_foreach_mul_(m, scalar(k0.beta1));
    at::_foreach_add_(m, at::_foreach_mul(grad, scalar(k0.one_minus_beta1)));
    at::_foreach_mul_(v, scalar(k0.beta2));
    auto squares = at::_foreach_mul(grad, scalar(k0.one_minus_beta2));
    at::_foreach_mul_(squares, grad);
    at::_foreach_add_(v, squares);
  }

  // √v·(1/√(1−β2ᵗ)) + eps.
  TensorList denominators() const {
    auto d = at::_foreach_sqrt(v);
    at::_foreach_mul_(d, per_entry(k, &Constants<C>::inv_sqrt_bc2));
    at::_foreach_add_(d, scalar(k.front().eps));
    return d;
  }

  void store(const std::vector<const AdamTensors*>& chunk) {
    for (size_t i = 0; i < chunk.size(); ++i) {
      auto param = chunk[i]->param;
      auto exp_avg = chunk[i]->exp_avg;
      auto exp_avg_sq = chunk[i]->exp_avg_sq;
      store_param(param, w[i]);
      store_state(exp_avg, m[i], k[i].seed_m);
      store_state(exp_avg_sq, v[i], k[i].seed_v);
    }
  }
};

template <class C>
void adam_chunk(const std::vector<const AdamTensors*>& chunk) {
  Widened<C> t(chunk);
  const auto& k0 = t.k.front();
  const bool cautious = chunk.front()->scalars.cautious;
  TensorList w_old;
  if (cautious) {
    for (const auto& w : t.w) w_old.push_back(w.clone());
  }
  auto grad = t.g;  // g ← g + λ_L2·W (before the decay)
  if (k0.l2 != 0) grad = at::_foreach_add(t.g, at::_foreach_mul(t.w, scalar(k0.l2)));
  if (k0.decay != 1) at::_foreach_mul_(t.w, scalar(k0.decay));
  t.update_moments(grad);
  const auto denominators = t.denominators();
  auto numerators = t.m;  // NAdam: β1/(1−β1ᵗ⁺¹)·m + (1−β1)/(1−β1ᵗ)·g, step size lr
  if (chunk.front()->scalars.nesterov) {
    numerators = at::_foreach_mul(t.m, per_entry(t.k, &Constants<C>::coef_m));
    at::_foreach_add_(numerators, at::_foreach_mul(grad, per_entry(t.k, &Constants<C>::coef_g)));
  }
  auto steps = at::_foreach_div(numerators, denominators);
  at::_foreach_mul_(steps, per_entry(t.k, &Constants<C>::step_size));
  at::_foreach_sub_(t.w, steps);
  if (cautious) {  // keep W_old where (W_old − W_new)·g ≤ 0
    for (size_t i = 0; i < t.w.size(); ++i) {
      t.w[i].copy_(at::where((w_old[i] - t.w[i]) * t.g[i] > 0, t.w[i], w_old[i]));
    }
  }
  t.store(chunk);
}

template <class C>
void lamb_chunk(const std::vector<const AdamTensors*>& chunk, double weight_decay) {
  Widened<C> t(chunk);
  t.update_moments(t.g);
  // r = (m·(1/(1−β1ᵗ))) / (√v·(1/√(1−β2ᵗ)) + eps) + λ·W
  std::vector<at::Scalar> inv_bc1;
  for (const auto* e : chunk) inv_bc1.emplace_back(double(detail::lamb_inv_bc1<C>(e->scalars)));
  auto r = at::_foreach_mul(t.m, inv_bc1);
  at::_foreach_div_(r, t.denominators());
  at::_foreach_add_(r, at::_foreach_mul(t.w, at::Scalar(double(static_cast<C>(weight_decay)))));
  for (size_t i = 0; i < r.size(); ++i) {
    // Trust ratio ‖W‖/‖r‖ (1 when either is 0), kept on the device.
    const auto w_norm = vector_norm(t.w[i], {}, false, at::kDouble);
    const auto r_norm = vector_norm(r[i], {}, false, at::kDouble);
    const auto trust =
        at::where((w_norm > 0).logical_and_(r_norm > 0), w_norm / r_norm, at::ones_like(w_norm));
    const auto scale = (trust * chunk[i]->scalars.lr).to(t.w[i].scalar_type());
    t.w[i].sub_(r[i].mul_(scale));
  }
  t.store(chunk);
}

template <class F>
void for_each_chunk(const std::vector<AdamTensors>& entries, const char* kernel, F&& run) {
  if (entries.empty()) return;
  for (const auto& e : entries) check_entry(e, entries.front(), kernel);
  for (const auto& chunk : chunks_of(entries)) {
    if (compute_dtype(chunk.front()->param) == at::kDouble) {
      run(double{}, chunk);
    } else {
      run(float{}, chunk);
    }
  }
}

}  // namespace

void generic_adam_step(const std::vector<AdamTensors>& entries) {
  for_each_chunk(entries, "generic_adam_step",
                 [](auto c, const auto& chunk) { adam_chunk<decltype(c)>(chunk); });
}

void generic_lamb_step(const std::vector<AdamTensors>& entries, double weight_decay) {
  for (const auto& e : entries) {
    check(e.exp_avg.scalar_type() == compute_dtype(e.param), "generic_lamb_step: LAMB keeps ",
          compute_dtype(e.param), " state, got ", e.exp_avg.scalar_type());
  }
  for_each_chunk(entries, "generic_lamb_step",
                 [&](auto c, const auto& chunk) { lamb_chunk<decltype(c)>(chunk, weight_decay); });
}

void generic_lion_step(at::Tensor& param, const at::Tensor& grad, at::Tensor& exp_avg,
                       const LionStepScalars& s) {
  const auto run = [&](auto c_tag) {
    using C = decltype(c_tag);
    const auto k = detail::lion_constants<C>(s);
    const auto dtype = c10::CppTypeToScalarType<C>::value;
    const auto w = in_dtype(param, dtype);
    const auto g = in_dtype(grad, dtype);
    const auto m = in_dtype(exp_avg, dtype);
    // c ← β1·m + (1−β1)·g;  W ← W·decay − lr·sign(c);  m ← β2·m + (1−β2)·g
    const auto c = m.mul(scalar(k.beta1)).add(g.mul(scalar(k.one_minus_beta1)));
    param.copy_(w.mul(scalar(k.decay)).sub(at::sign(c).mul(scalar(k.lr))));
    store_state(exp_avg, m.mul(scalar(k.beta2)).add(g.mul(scalar(k.one_minus_beta2))), k.seed);
  };
  compute_dtype(param) == at::kDouble ? run(double{}) : run(float{});
}

void generic_momentum(const at::Tensor& grad, at::Tensor& buffer, at::Tensor& direction,
                      const MomentumScalars& k) {
  const auto dtype = direction.scalar_type();
  check(dtype == compute_dtype(grad), "generic_momentum: the direction must be ",
        compute_dtype(grad), ", got ", dtype);
  const auto g = in_dtype(grad, dtype);
  auto b = in_dtype(buffer, dtype);
  // ema: B ← β·B + (1−β)·g;  sum: B ← β·B + g
  b.mul_(k.beta).add_(k.ema ? g * (1.0 - k.beta) : g);
  if (!k.nesterov) {
    direction.copy_(b);
  } else {  // ema: Q = (1−β)·g + β·B (lerp(g, B, β));  sum: Q = g + β·B
    direction.copy_(k.ema ? g * (1.0 - k.beta) : g).add_(b * k.beta);
  }
  store_state(buffer, b, k.seed);
}

void generic_apply_update(at::Tensor& param, const at::Tensor& update, double decay, double scale,
                          bool cautious, const at::Tensor* mask_grad) {
  check(update.scalar_type() == compute_dtype(param), "generic_apply_update: the update must be ",
        compute_dtype(param), ", got ", update.scalar_type());
  const auto w = in_dtype(param, update.scalar_type());
  const auto decayed = w * decay;  // cautious weight decay: only where U·W ≥ 0
  auto w_new = (cautious ? at::where(update * w >= 0, decayed, w) : decayed) - update * scale;
  if (mask_grad != nullptr) {  // cautious optimizer: keep W_old where (W_old − W_new)·g ≤ 0
    w_new = at::where((w - w_new) * in_dtype(*mask_grad, w.scalar_type()) > 0, w_new, w);
  }
  param.copy_(w_new);
}

}  // namespace muon
