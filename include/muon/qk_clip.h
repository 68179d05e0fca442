// QK-clip (MuonClip, Kimi K2, arXiv 2507.20534; docs/design.md §QK-clip): after the optimizer step,
// shrink the query and key projections of every attention head whose largest pre-softmax logit
// exceeded tau.
//
// Weights use libtorch's Linear layout (out, in): head h owns output rows [h·d, (h+1)·d).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

namespace muon {

enum class AttentionKind {
  grouped_query,  // multi-head (n_kv_heads = n_heads) and grouped-query attention
  latent,         // multi-head latent attention (MLA, DeepSeek-V3 / Kimi K2)
};

// One attention layer's projections as QK-clip sees them.
struct QkClipTarget {
  std::string layer;  // the key of its statistics
  AttentionKind kind = AttentionKind::grouped_query;
  // q_proj (grouped_query) or q_b_proj (latent), and k_proj or kv_b_proj. Undefined: a weight
  // another rank holds and rescales (HybridOptimizer::set_partition), left alone here.
  at::Tensor q_weight;
  at::Tensor k_weight;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // grouped_query only
  int64_t head_dim = 0;    // grouped_query only
  // Gated query (grouped_query): per head, head_dim query rows followed by head_dim gate rows.
  bool gated_query = false;
  bool qk_norm = false;  // such layers must train without QK-clip
  // latent only: per head q_b_proj rows are [nope | rope], kv_b_proj rows are [key nope | value].
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

// A model that reports its attention layers and their per-head max logits (fp32, already reduced
// across data-parallel ranks, including the 1/√d scale).
class QkClipSource {
 public:
  virtual ~QkClipSource() = default;
  virtual std::vector<QkClipTarget> qk_clip_targets() = 0;
  // layer → (n_heads) max logits of the last forward pass; empty when none were recorded.
  virtual std::map<std::string, at::Tensor> qk_max_logits() = 0;
};

struct QkClipScaling {
  std::string layer;
  int64_t head;   // the query head
  double factor;  // what its query rows were multiplied by (√γ, or √η under GQA)
};

// γ_h = min(1, tau / (s_h + 1e-6)) for s_h > 0, else 1. Grouped-query: a key head and all the query
// heads sharing it use η = min γ over those query heads; query rows and key rows × √η (gate rows
// untouched). Latent: query nope rows × √γ, query rope rows × γ, key nope rows of kv_b_proj × √γ,
// value rows and the shared rotary key untouched. Layers without statistics are left alone. Throws
// muon::Error (changing nothing) for tau ≤ 0, a QK-norm layer, or statistics of the wrong shape.
std::vector<QkClipScaling> qk_clip(const std::vector<QkClipTarget>& targets,
                                   const std::map<std::string, at::Tensor>& max_logits, double tau);

// The checks qk_clip() makes before it changes anything.
void check_qk_clip(const std::vector<QkClipTarget>& targets,
                   const std::map<std::string, at::Tensor>& max_logits, double tau);

}  // namespace muon
