// The demo model: a decoder-only GPT (tied token embedding and head, RMSNorm, RoPE, grouped-query
// attention, SwiGLU, no biases), small enough to train on 2 CPU cores in minutes.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>

#include "muon/option_schema.h"
#include "muon/qk_clip.h"

namespace muon::cli {

// The model's shape, one declaration per field (the `model` section of a run config).
// clang-format off
#define MUON_GPT_FIELDS(X)                                                                         \
  X(int64_t, vocab_size, vocab_size, "", 256, positive, "", "token vocabulary (bytes: 256)")       \
  X(int64_t, seq_len, seq_len, "", 128, positive, "", "context length in tokens")                  \
  X(int64_t, d_model, d_model, "", 128, positive, "", "model width")                               \
  X(int64_t, n_layers, n_layers, "", 4, positive, "", "transformer blocks")                        \
  X(int64_t, n_heads, n_heads, "", 4, positive, "", "query heads")                                 \
  X(int64_t, n_kv_heads, n_kv_heads, "", 2, positive, "", "key/value heads (grouped-query)")       \
  X(int64_t, ffn_hidden, ffn_hidden, "", 0, nonnegative, "",                                       \
    "SwiGLU width; 0: 8/3·d_model rounded up to a multiple of 32")                                 \
  X(bool, tie_embeddings, tie_embeddings, "", true, any, "", "the head shares the token embedding") \
  X(double, rope_theta, rope_theta, "", 10000.0, positive, "", "RoPE base")                        \
  X(double, norm_eps, norm_eps, "", 1e-6, positive, "", "RMSNorm eps")                             \
  X(double, init_std, init_std, "", 0.02, positive, "", "std of the weights' initialization")
// clang-format on
struct GptConfig {
  MUON_GPT_FIELDS(MUON_FIELD_MEMBER)

  int64_t head_dim() const { return d_model / n_heads; }
  int64_t hidden() const { return ffn_hidden > 0 ? ffn_hidden : (8 * d_model / 3 + 31) / 32 * 32; }
  double weight_count() const;  // parameters (embeddings and head included)
  double rope_bytes() const;    // the RoPE tables at their peak, while they are built
  void check() const;           // throws muon::Error naming the inconsistent field
};
MUON_DEFINE_VISIT(GptConfig, MUON_GPT_FIELDS)

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Per-head maximum of the scaled pre-softmax logits of the last forward pass (fp32, (heads)).
  at::Tensor max_logits;
  int64_t n_heads() const { return n_heads_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
};
TORCH_MODULE(Attention);

class SwiGluImpl : public torch::nn::Module {
 public:
  explicit SwiGluImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(SwiGlu);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& config);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Attention attn{nullptr};
  SwiGlu mlp{nullptr};
};
TORCH_MODULE(Block);

// The output projection; with tied embeddings its weight *is* the token embedding's tensor,
// registered under a second name (routing must optimize it once).
class LmHeadImpl : public torch::nn::Module {
 public:
  explicit LmHeadImpl(at::Tensor weight);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
};
TORCH_MODULE(LmHead);

class GptImpl : public torch::nn::Module, public QkClipSource {
 public:
  explicit GptImpl(GptConfig config);
  // tokens (batch, time) int64 → logits (batch, time, vocab)
  at::Tensor forward(const at::Tensor& tokens);
  // mean cross-entropy of predicting targets (batch, time)
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  const GptConfig& config() const { return config_; }

  // QK-clip: one grouped-query target per block, keyed "blocks.<i>.attn".
  std::vector<QkClipTarget> qk_clip_targets() override;
  std::map<std::string, at::Tensor> qk_max_logits() override;

  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  RMSNorm norm{nullptr};
  LmHead lm_head{nullptr};

 private:
  GptConfig config_;
  at::Tensor rope_cos_, rope_sin_;
};
TORCH_MODULE(Gpt);

// Continues `prompt` by `n_bytes` sampled bytes at `temperature` (deterministic for a generator).
std::string generate(Gpt& model, const std::string& prompt, int64_t n_bytes, double temperature,
                     at::Generator generator);

}  // namespace muon::cli
