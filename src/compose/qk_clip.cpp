#include "muon/qk_clip.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "muon/error.h"

namespace muon {
namespace {

// A matrix of `rows` rows, or a weight another rank holds (undefined).
bool held_rows(const at::Tensor& w, int64_t rows) {
  return !w.defined() || (w.dim() == 2 && w.size(0) == rows);
}

void check_target(const QkClipTarget& t, const at::Tensor& logits) {
  check(!t.qk_norm, "qk_clip: layer '", t.layer,
        "' uses QK-norm, which already bounds the logits; train it without QK-clip");
  check(logits.dim() == 1 && logits.size(0) == t.n_heads, "qk_clip: layer '", t.layer, "' has ",
        t.n_heads, " heads but its max-logit statistics have shape ", logits.sizes());
  if (t.kind == AttentionKind::grouped_query) {
    check(t.n_kv_heads > 0 && t.n_heads % t.n_kv_heads == 0 && t.head_dim > 0, "qk_clip: layer '",
          t.layer, "': n_heads (", t.n_heads, ") must be a multiple of n_kv_heads (", t.n_kv_heads,
          ") and head_dim > 0");
    const int64_t q_rows = t.n_heads * t.head_dim * (t.gated_query ? 2 : 1);
    check(held_rows(t.q_weight, q_rows), "qk_clip: layer '", t.layer,
          "': the query weight has shape ", t.q_weight.sizes(), ", expected ", q_rows, " rows");
    check(held_rows(t.k_weight, t.n_kv_heads * t.head_dim), "qk_clip: layer '", t.layer,
          "': the key weight has shape ", t.k_weight.sizes(), ", expected ",
          t.n_kv_heads * t.head_dim, " rows");
  } else {
    const int64_t q_rows = t.n_heads * (t.qk_nope_head_dim + t.qk_rope_head_dim);
    const int64_t kv_rows = t.n_heads * (t.qk_nope_head_dim + t.v_head_dim);
    check(held_rows(t.q_weight, q_rows), "qk_clip: layer '", t.layer, "': q_b_proj has shape ",
          t.q_weight.sizes(), ", expected ", q_rows, " rows");
    check(held_rows(t.k_weight, kv_rows), "qk_clip: layer '", t.layer, "': kv_b_proj has shape ",
          t.k_weight.sizes(), ", expected ", kv_rows, " rows");
  }
}

// Multiplies `count` rows starting at `first` by `factor`, in place (where this rank holds `w`).
void scale_rows(const at::Tensor& w, int64_t first, int64_t count, double factor) {
  if (factor != 1.0 && w.defined()) w.narrow(0, first, count).mul_(factor);
}

void clip_grouped(const QkClipTarget& t, const std::vector<double>& gamma,
                  std::vector<QkClipScaling>& out) {
  const int64_t group = t.n_heads / t.n_kv_heads;
  const int64_t d = t.head_dim;
  for (int64_t kv = 0; kv < t.n_kv_heads; ++kv) {
    const double eta =
        *std::min_element(gamma.begin() + kv * group, gamma.begin() + (kv + 1) * group);
    if (eta >= 1.0) continue;
    const double factor = std::sqrt(eta);
    for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
      const int64_t first = t.gated_query ? h * 2 * d : h * d;  // gate rows follow, untouched
      scale_rows(t.q_weight, first, d, factor);
      out.push_back({t.layer, h, factor});
    }
    scale_rows(t.k_weight, kv * d, d, factor);
  }
}

void clip_latent(const QkClipTarget& t, const std::vector<double>& gamma,
                 std::vector<QkClipScaling>& out) {
  const int64_t q_per_head = t.qk_nope_head_dim + t.qk_rope_head_dim;
  const int64_t kv_per_head = t.qk_nope_head_dim + t.v_head_dim;
  for (int64_t h = 0; h < t.n_heads; ++h) {
    if (gamma[h] >= 1.0) continue;
    const double root = std::sqrt(gamma[h]);
    scale_rows(t.q_weight, h * q_per_head, t.qk_nope_head_dim, root);
    // The rotary key is shared by all heads, so the query's rotary part takes the whole γ.
    scale_rows(t.q_weight, h * q_per_head + t.qk_nope_head_dim, t.qk_rope_head_dim, gamma[h]);
    scale_rows(t.k_weight, h * kv_per_head, t.qk_nope_head_dim, root);
    out.push_back({t.layer, h, root});
  }
}

}  // namespace

void check_qk_clip(const std::vector<QkClipTarget>& targets,
                   const std::map<std::string, at::Tensor>& max_logits, double tau) {
  check(std::isfinite(tau) && tau > 0, "qk_clip: tau must be > 0, got ", tau);
  for (const auto& t : targets) {
    const auto stats = max_logits.find(t.layer);
    if (stats != max_logits.end()) check_target(t, stats->second);
  }
}

std::vector<QkClipScaling> qk_clip(const std::vector<QkClipTarget>& targets,
                                   const std::map<std::string, at::Tensor>& max_logits,
                                   double tau) {
  check_qk_clip(targets, max_logits, tau);  // every layer before scaling any
  at::NoGradGuard no_grad;
  std::vector<QkClipScaling> out;
  for (const auto& t : targets) {
    const auto stats = max_logits.find(t.layer);
    if (stats == max_logits.end()) continue;
    // The statistics may live on the model's device; γ is computed on the host.
    const auto s = stats->second.to(at::kCPU, at::kDouble).contiguous();
    std::vector<double> gamma(static_cast<size_t>(t.n_heads));
    for (int64_t h = 0; h < t.n_heads; ++h) {
      const double logit = s.data_ptr<double>()[h];
      gamma[h] = logit > 0 ? std::min(1.0, tau / (logit + 1e-6)) : 1.0;
    }
    if (t.kind == AttentionKind::grouped_query) {
      clip_grouped(t, gamma, out);
    } else {
      clip_latent(t, gamma, out);
    }
  }
  return out;
}

}  // namespace muon
