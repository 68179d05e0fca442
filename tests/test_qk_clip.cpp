// QK-clip against scalings computed by hand for each attention kind (docs/design.md §QK-clip).
#include "muon/qk_clip.h"

#include <gtest/gtest.h>

#include <cmath>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/error.h"
#include "muon/hybrid.h"

namespace muon {
namespace {

using testing::expect_error;

// Rows scaled by `factors` (one per row) relative to an all-ones weight of `cols` columns.
void expect_rows(const at::Tensor& w, const std::vector<double>& factors) {
  ASSERT_EQ(w.size(0), static_cast<int64_t>(factors.size()));
  for (int64_t r = 0; r < w.size(0); ++r) {
    for (int64_t c = 0; c < w.size(1); ++c) {
      EXPECT_NEAR(w[r][c].item<double>(), factors[r], 1e-6) << "row " << r;
    }
  }
}

QkClipTarget grouped(int64_t heads, int64_t kv_heads, int64_t d, bool gated = false) {
  QkClipTarget t;
  t.layer = "attn";
  t.n_heads = heads;
  t.n_kv_heads = kv_heads;
  t.head_dim = d;
  t.gated_query = gated;
  t.q_weight = at::ones({heads * d * (gated ? 2 : 1), 3}, at::kDouble);
  t.k_weight = at::ones({kv_heads * d, 3}, at::kDouble);
  return t;
}

TEST(QkClip, StandardAttentionScalesTheOffendingHeadBySqrtGamma) {
  auto t = grouped(2, 2, 2);
  const auto scalings = qk_clip({t}, {{"attn", at::tensor({200.0f, 50.0f})}}, 100.0);
  const double g = std::sqrt(100.0 / (200.0 + 1e-6));
  expect_rows(t.q_weight, {g, g, 1, 1});
  expect_rows(t.k_weight, {g, g, 1, 1});
  ASSERT_EQ(scalings.size(), 1u);
  EXPECT_EQ(scalings[0].head, 0);
  EXPECT_NEAR(scalings[0].factor, g, 1e-12);
}

TEST(QkClip, GroupedQueryUsesTheMinimumOverTheGroup) {
  auto t = grouped(4, 2, 1);
  // γ = (0.5, 0.8333, 1, 1): group 0 uses η = 0.5 for both query heads and its key head.
  qk_clip({t}, {{"attn", at::tensor({200.0f, 120.0f, 50.0f, -3.0f})}}, 100.0);
  const double e = std::sqrt(100.0 / (200.0 + 1e-6));
  expect_rows(t.q_weight, {e, e, 1, 1});
  expect_rows(t.k_weight, {e, 1});
}

TEST(QkClip, GatedQueryScalesOnlyQueryRows) {
  auto t = grouped(2, 1, 2, /*gated=*/true);  // per head: 2 query rows, then 2 gate rows
  qk_clip({t}, {{"attn", at::tensor({50.0f, 400.0f})}}, 100.0);
  const double e = std::sqrt(100.0 / (400.0 + 1e-6));
  expect_rows(t.q_weight, {e, e, 1, 1, e, e, 1, 1});
  expect_rows(t.k_weight, {e, e});
}

TEST(QkClip, LatentAttentionSplitsRotaryAndNonRotaryParts) {
  QkClipTarget t;
  t.layer = "mla";
  t.kind = AttentionKind::latent;
  t.n_heads = 2;
  t.qk_nope_head_dim = 2;
  t.qk_rope_head_dim = 1;
  t.v_head_dim = 3;
  t.q_weight = at::ones({2 * 3, 4}, at::kDouble);  // per head [nope nope rope]
  t.k_weight = at::ones({2 * 5, 4}, at::kDouble);  // per head [nope nope v v v]
  qk_clip({t}, {{"mla", at::tensor({400.0f, 10.0f})}}, 100.0);
  const double gamma = 100.0 / (400.0 + 1e-6);
  const double root = std::sqrt(gamma);
  expect_rows(t.q_weight, {root, root, gamma, 1, 1, 1});
  expect_rows(t.k_weight, {root, root, 1, 1, 1, 1, 1, 1, 1, 1});
}

TEST(QkClip, LogitsBelowTauNegativeOrMissingChangeNothing) {
  auto t = grouped(2, 2, 2);
  auto scalings = qk_clip({t}, {{"attn", at::tensor({99.0f, -500.0f})}}, 100.0);
  EXPECT_TRUE(scalings.empty());
  EXPECT_TRUE(at::equal(t.q_weight, at::ones({4, 3}, at::kDouble)));
  scalings = qk_clip({t}, {}, 100.0);
  EXPECT_TRUE(scalings.empty());
}

TEST(QkClip, ErrorsChangeNothing) {
  auto t = grouped(2, 2, 2);
  auto normed = grouped(2, 2, 2);
  normed.layer = "normed";
  normed.qk_norm = true;
  const std::map<std::string, at::Tensor> stats = {{"attn", at::tensor({500.0f, 500.0f})},
                                                   {"normed", at::tensor({1.0f, 1.0f})}};
  expect_error<Error>(
      [&] {
        qk_clip({t, normed}, stats, 100.0);
      },
      {"layer 'normed' uses QK-norm", "without QK-clip"});
  EXPECT_TRUE(at::equal(t.q_weight, at::ones({4, 3}, at::kDouble)));  // checked before scaling
  expect_error<Error>([&] { qk_clip({t}, stats, 0.0); }, {"tau must be > 0", "got 0"});
  expect_error<Error>(
      [&] {
        qk_clip({t}, {{"attn", at::tensor({1.0f, 2.0f, 3.0f})}}, 1.0);
      },
      {"layer 'attn' has 2 heads", "[3]"});
}

cli::GptConfig tiny() {
  cli::GptConfig c;
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

TEST(QkClip, DemoGptReportsPerHeadMaxLogitsAndTheHybridClips) {
  at::manual_seed(0);
  cli::Gpt model(tiny());
  const auto tokens = at::randint(0, 32, {2, 8}, at::kLong);
  // Recompute layer 0's logits by hand from its projections.
  auto& block = *model->blocks[0]->as<cli::BlockImpl>();
  {
    at::NoGradGuard no_grad;
    model->forward(tokens);
  }
  const auto logits = model->qk_max_logits();
  ASSERT_EQ(logits.size(), 2u);
  ASSERT_EQ(logits.at("blocks.0.attn").sizes(), (std::vector<int64_t>{4}));
  {
    at::NoGradGuard no_grad;
    const auto x = block.attn_norm(model->wte(tokens));
    const auto q = block.attn->q_proj(x);  // rotary phases do not change norms; check a bound
    const auto k = block.attn->k_proj(x);
    const double bound = (q.norm(2, -1).max() * k.norm(2, -1).max()).item<double>() / 2.0;
    EXPECT_LE(logits.at("blocks.0.attn").abs().max().item<double>(), bound + 1e-5);
  }
  const auto targets = model->qk_clip_targets();
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_TRUE(
      targets[1].q_weight.is_same(model->blocks[1]->as<cli::BlockImpl>()->attn->q_proj->weight));

  // No statistics → exactly the step without QK-clip.
  cli::Gpt a(tiny()), b(tiny());
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < a->parameters().size(); ++i)
      b->parameters()[i].copy_(a->parameters()[i]);
  }
  HybridOptions with_clip;
  with_clip.qk_clip_tau = 1e-3;  // tiny: every head with statistics would be clipped
  HybridOptimizer clipped(route(*a), with_clip), plain(route(*b), HybridOptions{});
  for (auto& p : a->parameters()) p.mutable_grad() = at::ones_like(p);
  const auto untouched = a->parameters()[0].detach().clone();
  testing::expect_error<Error>(  // without the logits QK-clip would do nothing: refused
      [&] { clipped.step(); },
      {"HybridOptimizer: QK-clip (tau 0.001) needs the model's attention logits: call "
       "set_qk_clip_source(model) before step()"});
  EXPECT_TRUE(at::equal(a->parameters()[0], untouched));
  clipped.set_qk_clip_source(a.get());
  for (auto& p : a->parameters()) p.mutable_grad() = at::ones_like(p);
  for (auto& p : b->parameters()) p.mutable_grad() = at::ones_like(p);
  clipped.step();  // a has run no forward pass: no statistics
  plain.step();
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(a->parameters()[i], b->parameters()[i])) << i;
  }
  EXPECT_TRUE(clipped.last_step().qk_clip.empty());
  // After a forward pass every head exceeds tau = 1e-3 and gets clipped.
  a->loss(tokens, tokens).backward();
  clipped.step();
  EXPECT_EQ(clipped.last_step().qk_clip.size(), 8u);  // 2 layers × 4 query heads
}

}  // namespace
}  // namespace muon
