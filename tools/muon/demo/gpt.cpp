#include "demo/gpt.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>

#include <cmath>
#include <limits>

#include "muon/error.h"

namespace muon::cli {

namespace F = torch::nn::functional;

double GptConfig::weight_count() const {
  const double d = static_cast<double>(d_model), L = static_cast<double>(n_layers);
  const double kv = static_cast<double>(n_kv_heads) * static_cast<double>(head_dim());
  return static_cast<double>(vocab_size) * d * (tie_embeddings ? 1 : 2) +
         L * (2 * d * d + 2 * d * kv + 3 * d * static_cast<double>(hidden()));
}

double GptConfig::rope_bytes() const {
  // float64 positions, angles and their cosine or sine, then the two float32 tables kept.
  const double T = static_cast<double>(seq_len), half = static_cast<double>(head_dim() / 2);
  return 8 * T + 24 * T * half;
}

void GptConfig::check() const {
  muon::check(vocab_size > 0 && seq_len > 0 && d_model > 0 && n_layers > 0,
              "model: vocab_size, seq_len, d_model and n_layers must be > 0");
  muon::check(n_heads > 0 && d_model % n_heads == 0, "model: d_model (", d_model,
              ") must be a multiple of n_heads (", n_heads, ")");
  muon::check(head_dim() % 2 == 0, "model: head_dim = d_model / n_heads = ", head_dim(),
              " must be even for RoPE");
  muon::check(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "model: n_heads (", n_heads,
              ") must be a multiple of n_kv_heads (", n_kv_heads, ")");
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return x * at::rsqrt(x.square().mean(-1, /*keepdim=*/true) + eps_) * weight;
}

namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Rotates channel pairs (i, i + d/2) of x (batch, time, heads, d) by position-dependent angles
// (Su et al., RoFormer, arXiv 2104.09864; the half-split layout of GPT-NeoX/Llama).
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  const auto x1 = x.narrow(-1, 0, half);
  const auto x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

}  // namespace

AttentionImpl::AttentionImpl(const GptConfig& c)
    : n_heads_(c.n_heads), n_kv_heads_(c.n_kv_heads), head_dim_(c.head_dim()) {
  q_proj = register_module("q_proj", linear(c.d_model, c.n_heads * head_dim_));
  k_proj = register_module("k_proj", linear(c.d_model, c.n_kv_heads * head_dim_));
  v_proj = register_module("v_proj", linear(c.d_model, c.n_kv_heads * head_dim_));
  o_proj = register_module("o_proj", linear(c.n_heads * head_dim_, c.d_model));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) {
  const auto B = x.size(0);
  const auto T = x.size(1);
  auto q = apply_rope(q_proj(x).view({B, T, n_heads_, head_dim_}), cos, sin).transpose(1, 2);
  auto k = apply_rope(k_proj(x).view({B, T, n_kv_heads_, head_dim_}), cos, sin).transpose(1, 2);
  auto v = v_proj(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
  // Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
  const auto group = n_heads_ / n_kv_heads_;
  if (group > 1) {
    k = k.repeat_interleave(group, 1);
    v = v.repeat_interleave(group, 1);
  }
  auto scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  const auto future = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  max_logits = scores.detach().amax({0, 2, 3}).to(at::kFloat);  // for QK-clip
  const auto y = at::matmul(at::softmax(scores, -1), v);
  return o_proj(y.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_}));
}

SwiGluImpl::SwiGluImpl(const GptConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.d_model, c.hidden()));
  up_proj = register_module("up_proj", linear(c.d_model, c.hidden()));
  down_proj = register_module("down_proj", linear(c.hidden(), c.d_model));
}

at::Tensor SwiGluImpl::forward(const at::Tensor& x) {
  // Shazeer, "GLU Variants Improve Transformer" (arXiv 2002.05202).
  return down_proj(F::silu(gate_proj(x)) * up_proj(x));
}

BlockImpl::BlockImpl(const GptConfig& c) {
  attn_norm = register_module("attn_norm", RMSNorm(c.d_model, c.norm_eps));
  attn = register_module("attn", Attention(c));
  mlp_norm = register_module("mlp_norm", RMSNorm(c.d_model, c.norm_eps));
  mlp = register_module("mlp", SwiGlu(c));
}

at::Tensor BlockImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto h = x + attn(attn_norm(x), cos, sin);
  return h + mlp(mlp_norm(h));
}

LmHeadImpl::LmHeadImpl(at::Tensor w) {
  weight = register_parameter("weight", std::move(w));
}

at::Tensor LmHeadImpl::forward(const at::Tensor& x) {
  return F::linear(x, weight);
}

GptImpl::GptImpl(GptConfig config) : config_(config) {
  config_.check();
  const auto& c = config_;
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layers; ++i) blocks->push_back(Block(c));
  norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
  lm_head = register_module(
      "lm_head", LmHead(c.tie_embeddings ? wte->weight : at::empty({c.vocab_size, c.d_model})));

  // GPT-2 style init: N(0, 0.02), residual output projections scaled by 1/√(2·layers).
  at::NoGradGuard no_grad;
  const double residual_std = c.init_std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  for (auto& item : named_parameters()) {
    auto& p = item.value();
    if (p.dim() < 2) continue;
    const bool residual = item.key().find("o_proj") != std::string::npos ||
                          item.key().find("down_proj") != std::string::npos;
    p.normal_(0.0, residual ? residual_std : c.init_std);
  }

  const auto half = c.head_dim() / 2;
  const auto inv_freq =
      at::pow(c.rope_theta, -at::arange(0, half, at::kDouble) / static_cast<double>(half));
  const auto angles = at::outer(at::arange(c.seq_len, at::kDouble), inv_freq);
  // (time, 1, half): broadcasts over (batch, time, heads, half)
  rope_cos_ = register_buffer("rope_cos", angles.cos().to(at::kFloat).unsqueeze(1));
  rope_sin_ = register_buffer("rope_sin", angles.sin().to(at::kFloat).unsqueeze(1));
}

at::Tensor GptImpl::forward(const at::Tensor& tokens) {
  const auto T = tokens.size(1);
  muon::check(T <= config_.seq_len, "model: sequence of ", T, " tokens exceeds seq_len ",
              config_.seq_len);
  const auto cos = rope_cos_.narrow(0, 0, T);
  const auto sin = rope_sin_.narrow(0, 0, T);
  auto x = wte(tokens);
  for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x, cos, sin);
  return lm_head(norm(x));
}

at::Tensor GptImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  const auto logits = forward(tokens);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

std::vector<QkClipTarget> GptImpl::qk_clip_targets() {
  std::vector<QkClipTarget> out;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto& attn = *blocks[i]->as<BlockImpl>()->attn;
    QkClipTarget t;
    t.layer = "blocks." + std::to_string(i) + ".attn";
    t.q_weight = attn.q_proj->weight;
    t.k_weight = attn.k_proj->weight;
    t.n_heads = attn.n_heads();
    t.n_kv_heads = attn.n_kv_heads();
    t.head_dim = attn.head_dim();
    out.push_back(std::move(t));
  }
  return out;
}

std::map<std::string, at::Tensor> GptImpl::qk_max_logits() {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < blocks->size(); ++i) {
    const auto& logits = blocks[i]->as<BlockImpl>()->attn->max_logits;
    if (logits.defined()) out["blocks." + std::to_string(i) + ".attn"] = logits;
  }
  return out;
}

std::string generate(Gpt& model, const std::string& prompt, int64_t n_bytes, double temperature,
                     at::Generator generator) {
  at::NoGradGuard no_grad;
  const auto seq_len = model->config().seq_len;
  std::string text = prompt.empty() ? std::string("\n") : prompt;
  for (int64_t i = 0; i < n_bytes; ++i) {
    const auto start = text.size() > static_cast<size_t>(seq_len) ? text.size() - seq_len : 0;
    std::vector<int64_t> window(text.begin() + static_cast<std::ptrdiff_t>(start), text.end());
    for (auto& t : window) t = static_cast<uint8_t>(t);  // bytes, not signed chars
    const auto context = at::tensor(window, at::kLong).unsqueeze(0);
    const auto logits = model->forward(context).select(1, -1).squeeze(0);
    const auto probs = at::softmax(logits.to(at::kDouble) / temperature, -1);
    const auto next = at::multinomial(probs, 1, false, generator).item<int64_t>();
    text.push_back(static_cast<char>(next));
  }
  return text;
}

}  // namespace muon::cli
