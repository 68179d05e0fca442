// Dion (muon::Dion, muon::DionOptions) against a plain implementation of the paper's Algorithm 1
// (Ahn et al., arXiv 2504.05295) written here: fp64, one matrix at a time, the power iteration's
// basis by modified Gram–Schmidt.
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <cmath>
#include <sstream>

#include "helpers.h"
#include "muon/algorithms.h"
#include "muon/dion.h"
#include "muon/error.h"
#include "muon/presets.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// Orthonormal columns spanning those of A (m × r, full column rank), Gram–Schmidt style.
at::Tensor gram_schmidt(const at::Tensor& A) {
  auto P = A.clone();
  for (int64_t j = 0; j < P.size(1); ++j) {
    auto col = P.select(1, j);
    for (int64_t i = 0; i < j; ++i) {
      const auto prev = P.select(1, i);
      col.sub_(prev * at::dot(prev, col));
    }
    col.div_(col.norm());
  }
  return P;
}

// The first Q as muon-cpp documents it: standard normal entries drawn in fp64 on the CPU by a
// generator seeded with 0x44696f6e + the parameter's position.
at::Tensor documented_initial_q(const std::vector<int64_t>& shape, int64_t index) {
  auto gen = seeded(0x44696f6e + static_cast<uint64_t>(index));
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
}

// One (rows × cols) matrix under Dion, fp64.
struct ReferenceDion {
  double lr, mu, weight_decay;
  at::Tensor M, Q;  // momentum (rows × cols), right factor (short side × rank)

  void step(at::Tensor& W, const at::Tensor& G) {
    const bool flip = W.size(0) < W.size(1);  // work with the long side first
    M = M + G;                                // B_t = M_{t−1} + G_t
    const auto B = flip ? M.t() : M;
    const auto P = gram_schmidt(B.mm(Q));  // P_t = Orthogonalize(B_t·Q_{t−1})
    const auto R = B.t().mm(P);            // R_t = B_tᵀ·P_t
    const auto Bnext = B - (1 - mu) * P.mm(R.t());  // M_t = B_t − (1 − μ)·P_t·R_tᵀ
    M = flip ? Bnext.t() : Bnext;
    Q = R / (R.norm(2, {0}, true) + 1e-8);  // Q_t = ColumnNormalize(R_t)
    auto O = P.mm(Q.t());
    if (flip) O = O.t();
    const double factor = std::sqrt(static_cast<double>(W.size(0)) / W.size(1));
    W = W * (1 - lr * weight_decay) - lr * factor * O;  // X_t = X_{t−1} − η·√(m/n)·O_t
  }
};

// Dion's defaults (microsoft/dion's) at rank fraction `fraction`.
DionOptions rank(double fraction) {
  return DionOptions().rank_fraction(fraction);
}

struct Case {
  int64_t rows, cols;
  DionOptions dion;
  int64_t expected_rank;
};

TEST(Dion, RankIsTheFractionOfTheShortSideRoundedUpToItsMultiple) {
  EXPECT_EQ(dion_rank(DionOptions(), 12, 8), 8);
  EXPECT_EQ(dion_rank(rank(0.5), 12, 8), 4);
  EXPECT_EQ(dion_rank(rank(0.3), 8, 12), 3);                       // ⌈2.4⌉
  EXPECT_EQ(dion_rank(rank(0.3).rank_multiple_of(4), 8, 12), 4);   // ⌈2.4 / 4⌉·4
  EXPECT_EQ(dion_rank(rank(0.9).rank_multiple_of(4), 10, 10), 10);  // 12, capped at the short side
  EXPECT_EQ(dion_q_shape(rank(0.5), {3, 8, 12}), (std::vector<int64_t>{3, 8, 4}));
  // Settings the step refuses still give a shape (reading the state computes it): no division
  // by a multiple of 0, no NaN or infinity turned into an integer.
  EXPECT_EQ(dion_rank(DionOptions().rank_multiple_of(0), 12, 8), 8);
  EXPECT_EQ(dion_rank(DionOptions().rank_multiple_of(-4), 12, 8), 8);
  EXPECT_EQ(dion_rank(rank(std::nan("")), 12, 8), 0);
  EXPECT_EQ(dion_rank(rank(INFINITY), 12, 8), 8);
  EXPECT_EQ(dion_rank(rank(-1.0), 12, 8), 0);
}

TEST(Dion, MatchesThePapersAlgorithmOverSeveralSteps) {
  const std::vector<Case> cases{{12, 8, DionOptions(), 8},
                                {12, 8, rank(0.5), 4},
                                {8, 12, rank(0.3).rank_multiple_of(2), 4},
                                {10, 10, rank(0.4), 4}};
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    for (const auto& fused : testing::kernel_paths()) {
      for (const auto& c : cases) {
        SCOPED_TRACE(testing::path_name(fused) + ", " + c10::toString(dtype) + ", " +
                     std::to_string(c.rows) + "x" + std::to_string(c.cols));
        auto gen = seeded(7);
        const auto W0 = at::randn({c.rows, c.cols}, gen, at::kDouble);
        auto W = W0.to(dtype).clone();
        const auto options = DionOptions(c.dion).lr(0.05).weight_decay(0.1).fused(fused);
        Dion opt({W}, options);
        ReferenceDion ref{0.05, 0.95, 0.1, at::zeros_like(W0),
                          documented_initial_q({std::min(c.rows, c.cols), c.expected_rank}, 0)};
        auto W_ref = W0.clone();
        for (int step = 0; step < 4; ++step) {
          const auto G = at::randn({c.rows, c.cols}, gen, at::kDouble);
          W.mutable_grad() = G.to(dtype);
          opt.step();
          ref.step(W_ref, G);
        }
        const double tolerance = dtype == at::kDouble ? 1e-10 : 2e-5;
        EXPECT_LT(testing::max_rel_diff(W, W_ref), tolerance);
        const auto& state = static_cast<const DionParamState&>(*opt.state().begin()->second);
        EXPECT_LT(testing::max_rel_diff(state.momentum_buffer(), ref.M), tolerance * 10);
        EXPECT_EQ(state.dion_q().sizes(), ref.Q.sizes());
        EXPECT_EQ(state.dion_q().scalar_type(), dtype);
      }
    }
  }
}

TEST(Dion, EachMatrixOfAStackHasItsOwnFactors) {
  auto gen = seeded(3);
  const auto W0 = at::randn({2, 6, 10}, gen, at::kDouble);
  auto W = W0.clone();
  Dion opt({W}, rank(0.5).lr(0.03));
  const auto Q0 = documented_initial_q({2, 6, 3}, 0);
  std::vector<ReferenceDion> refs;
  std::vector<at::Tensor> W_refs;
  for (int64_t e = 0; e < 2; ++e) {
    refs.push_back({0.03, 0.95, 0.01, at::zeros({6, 10}, at::kDouble), Q0[e]});
    W_refs.push_back(W0[e].clone());
  }
  for (int step = 0; step < 3; ++step) {
    const auto G = at::randn({2, 6, 10}, gen, at::kDouble);
    W.mutable_grad() = G;
    opt.step();
    for (int64_t e = 0; e < 2; ++e) refs[e].step(W_refs[e], G[e]);
  }
  for (int64_t e = 0; e < 2; ++e) EXPECT_LT(testing::max_rel_diff(W[e], W_refs[e]), 1e-10);
}

TEST(Dion, AtFullRankTheBufferKeepsMuTimesTheSum) {
  // With r = min(rows, cols), P spans B's columns, so P·Rᵀ = P·Pᵀ·B = B and M_t = μ·B_t.
  auto gen = seeded(11);
  auto W = at::randn({9, 5}, gen, at::kDouble);
  Dion opt({W}, DionOptions().momentum(0.8));
  auto sum = at::zeros_like(W);
  for (int step = 0; step < 3; ++step) {
    const auto G = at::randn({9, 5}, gen, at::kDouble);
    W.mutable_grad() = G;
    opt.step();
    sum = 0.8 * (sum + G);
    const auto& state = static_cast<const DionParamState&>(*opt.state().begin()->second);
    EXPECT_LT(testing::max_rel_diff(state.momentum_buffer(), sum), 1e-12);
  }
}

TEST(Dion, TheUpdateHasRankRAndUnitColumnFactors) {
  // O = P·Qᵀ with orthonormal P (long × r) and unit-norm columns of Q: rank r, ‖O‖_F² = r (less
  // about 2·epsilon/‖R_j‖ per column, from the 1e-8 in the normalization).
  auto gen = seeded(5);
  const auto W0 = at::randn({16, 12}, gen, at::kDouble);
  auto W = W0.clone();
  Dion opt({W}, rank(0.25).lr(0.1).weight_decay(0));
  W.mutable_grad() = at::randn({16, 12}, gen, at::kDouble);
  opt.step();
  const auto O = (W0 - W) / (0.1 * std::sqrt(16.0 / 12.0));
  const auto s = at::linalg_svdvals(O);
  EXPECT_NEAR(s.square().sum().item<double>(), 3.0, 1e-7);
  EXPECT_GT(s[2].item<double>(), 1e-3);
  EXPECT_LT(s[3].item<double>(), 1e-12);
}

TEST(Dion, AZeroMomentumOnlyDecaysAndKeepsQ) {
  auto W = at::ones({6, 4}, at::kDouble);
  Dion opt({W}, rank(0.5).lr(0.1).weight_decay(0.5));
  W.mutable_grad() = at::zeros({6, 4}, at::kDouble);
  opt.step();
  EXPECT_TRUE(at::allclose(W, at::full({6, 4}, 0.95, at::kDouble), 0, 1e-15));
  const auto& state = static_cast<const DionParamState&>(*opt.state().begin()->second);
  const auto Q0 = documented_initial_q({4, 2}, 0);
  EXPECT_TRUE(at::allclose(state.dion_q(), Q0 / (Q0.norm(2, {0}, true) + 1e-8), 0, 1e-14));
}

// Options out of range and resuming: test_conformance.cpp, for every algorithm. Dion's own rules.
TEST(Dion, InvalidSettingsAreRefused) {
  auto W = at::randn({6, 4});
  expect_error<Error>(
      [&] {
        Dion({W}, DionOptions().cautious_weight_decay(true).weight_decay_method(
                      WeightDecayMethod::l2));
      },
      {"Dion: cautious_weight_decay needs a multiplicative weight_decay_method"});
  expect_error<Error>([&] { Dion({at::randn({6})}, DionOptions()); },
                      {"Dion: parameter 0 of param group 0 has shape [6]; Dion optimizes matrices"});
  Dion opt({W}, DionOptions());
  W.mutable_grad() = at::randn({4, 6});
  expect_error<Error>([&] { opt.step(); },
                      {"Dion: parameter 0 of param group 0 has a gradient of shape [4, 6] for a "
                       "parameter of shape [6, 4]"});
}

// An algorithm of the registry: its name, kind, defaults (the preset dion's) and state by name, as
// checkpoints and the hybrid read them.
TEST(Dion, IsARegisteredMatricesAlgorithm) {
  const DionOptions defaults;
  EXPECT_STREQ(algorithm_name(defaults), "dion");
  EXPECT_EQ(algorithm_kind(defaults), ParamKind::matrices);
  EXPECT_EQ(algorithm_names_text(ParamKind::matrices), "muon, dion");
  const auto made = default_options_of("dion", ParamKind::matrices);
  EXPECT_DOUBLE_EQ(made->get_lr(), 0.01);
  // microsoft/dion's defaults: lr 0.01, μ 0.95, weight decay 0.01, the √(rows/cols) factor.
  EXPECT_EQ(group_settings(defaults),
            (SettingValues{{"lr", 0.01}, {"momentum", 0.95}, {"weight_decay", 0.01}}));
  EXPECT_EQ(defaults.adjust_lr(), AdjustLr::spectral);
  EXPECT_STREQ(algorithm_name(*muon_preset("dion").options), "dion");
  const auto slots = state_slots(rank(0.5), at::zeros({8, 6}), {8, 6});
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].name, "momentum_buffer");
  EXPECT_EQ(slots[0].shape, (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(slots[1].name, "dion_q");
  EXPECT_EQ(slots[1].shape, (std::vector<int64_t>{6, 3}));
}

}  // namespace
}  // namespace muon
