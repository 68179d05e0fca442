// muon::Muon against a straightforward implementation of docs/design.md §Muon update written here
// with plain ops.
#include "muon/muon.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <torch/optim/schedulers/step_lr.h>
#include <functional>

#include "helpers.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/stochastic_rounding.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// Newton–Schulz the textbook way: transpose tall inputs, iterate X ← aX + (bA + cA²)X, transpose
// back.
at::Tensor reference_newton_schulz(at::Tensor X, const CoefficientTable& table, int64_t steps) {
  const bool tall = X.size(0) > X.size(1);
  if (tall) X = X.t();
  X = X / (X.norm() * table.safety + table.eps);
  for (int64_t k = 0; k < steps; ++k) {
    const auto& row = table.rows[std::min<size_t>(k, table.rows.size() - 1)];
    const auto A = X.mm(X.t());
    const auto B = row[1] * A + row[2] * A.mm(A);
    X = row[0] * X + B.mm(X);
  }
  return tall ? X.t() : X;
}

struct ReferenceMuon {
  MuonOptions o;
  at::Tensor buffer;  // fp32 (fp64 for fp64 parameters)

  void step(at::Tensor& W, const at::Tensor& grad) {
    const auto dtype = W.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    auto g = grad.to(dtype);
    // Emerging-Optimizers' l2: the decay enters the gradient before the momentum.
    if (o.weight_decay_method() == WeightDecayMethod::l2) g = g + o.weight_decay() * W.to(dtype);
    if (!buffer.defined()) buffer = at::zeros_like(g);
    const double beta = o.momentum();
    at::Tensor Q;
    if (o.momentum_form() == MomentumForm::ema) {
      buffer = beta * buffer + (1 - beta) * g;
      Q = o.nesterov() ? (1 - beta) * g + beta * buffer : buffer;
    } else {
      buffer = beta * buffer + g;
      Q = o.nesterov() ? g + beta * buffer : buffer;
    }
    if (o.row_equilibration()) {  // nanochat's MuonEq: every row to the RMS row norm
      const auto target = Q.norm() / std::sqrt(static_cast<double>(Q.size(0)));
      Q = Q * target / Q.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-6);
    }
    // torch.optim.Muon's Gram schedule: non-square matrices iterate by gram_coefficients, one
    // iteration per row.
    const bool gram_table = o.gram_coefficients() && W.size(0) != W.size(1);
    auto table = gram_table ? *o.gram_coefficients() : o.coefficients();
    if (o.ns_eps()) table.eps = *o.ns_eps();
    const auto steps = gram_table ? static_cast<int64_t>(table.rows.size()) : o.ns_steps();
    auto U = reference_newton_schulz(Q, table, steps);
    U = reference_post_norm(U, o.post_norm(), o.post_norm_eps());
    if (o.normuon()) U = reference_normuon(U);
    const double rows = static_cast<double>(W.size(0));
    const double cols = static_cast<double>(W.size(1));
    double factor = 1;
    switch (o.adjust_lr()) {
      case AdjustLr::original:
        factor = std::sqrt(std::max(1.0, rows / cols));
        break;
      case AdjustLr::match_rms_adamw:
        factor = 0.2 * std::sqrt(std::max(rows, cols));
        break;
      case AdjustLr::spectral:
        factor = std::sqrt(rows / cols);
        break;
      case AdjustLr::none:
        factor = 1;
        break;
    }
    const auto W32 = W.to(dtype);
    const auto mask = o.cautious_weight_decay() ? (U * W32 >= 0).to(dtype) : at::ones_like(W32);
    double shrink = 0;  // the fraction of W each method removes (Emerging-Optimizers' mixin)
    switch (o.weight_decay_method()) {
      case WeightDecayMethod::decoupled:
        shrink = o.lr() * o.weight_decay();
        break;
      case WeightDecayMethod::independent:
        shrink = o.weight_decay();
        break;
      case WeightDecayMethod::palm:
        shrink = o.lr() * o.lr() * o.weight_decay();
        break;
      case WeightDecayMethod::l2:
        break;
    }
    const auto updated = W32 - shrink * W32 * mask - o.lr() * factor * U;
    W = updated.to(W.scalar_type());
  }

  static at::Tensor unit_rows(const at::Tensor& U, double eps) {
    return U / at::sqrt(U.square().sum(1, true) + eps);
  }
  static at::Tensor unit_cols(const at::Tensor& U, double eps) {
    return U / at::sqrt(U.square().sum(0, true) + eps);
  }
  static at::Tensor reference_post_norm(const at::Tensor& U, PostNorm mode, double eps) {
    switch (mode) {
      case PostNorm::none:
        return U;
      case PostNorm::row:
        return unit_rows(U, eps);
      case PostNorm::col:
        return unit_cols(U, eps);
      case PostNorm::row_col:
        return unit_cols(unit_rows(U, eps), eps);
      case PostNorm::col_row:
        return unit_rows(unit_cols(U, eps), eps);
      case PostNorm::frobenius:
        return U * std::sqrt(static_cast<double>(std::min(U.size(0), U.size(1)))) / U.norm();
    }
    return U;
  }

  at::Tensor second_moment;  // NorMuon
  at::Tensor reference_normuon(const at::Tensor& U) {
    const auto& n = *o.normuon();
    const bool per_row =
        n.axis == NorMuonAxis::row || (n.axis == NorMuonAxis::automatic && U.size(0) >= U.size(1));
    const auto v = per_row ? U.square().mean(1, true) : U.square().mean(0, true);
    if (!second_moment.defined()) second_moment = at::zeros_like(v);
    second_moment = second_moment + (1 - n.beta2) * (v - second_moment);
    const auto scaled = U / at::sqrt(at::clamp_min(second_moment, 1e-10));
    const double norm = scaled.norm().item<double>();
    return norm > 0 ? scaled * (U.norm().item<double>() / norm) : scaled * 0;
  }
};

// Compares parameters after each step: fp32/fp64 to a tight relative tolerance of the change, bf16
// to within one bf16 rounding.
void expect_same_parameter(const at::Tensor& ours, const at::Tensor& ref,
                           const at::Tensor& before) {
  if (ours.scalar_type() == at::kBFloat16) {
    const auto diff = (ours.to(at::kFloat) - ref.to(at::kFloat)).abs();
    const double ulp = ref.to(at::kFloat).abs().max().item<double>() * std::pow(2.0, -7);
    EXPECT_LE(diff.max().item<double>(), ulp);
    EXPECT_GE(at::eq(ours, ref).to(at::kDouble).mean().item<double>(), 0.99);
    return;
  }
  const double tol = ours.scalar_type() == at::kDouble ? 1e-12 : 5e-5;
  EXPECT_LT(testing::max_rel_diff(ours - before, ref - before), tol);
}

TEST(Muon, MatchesReferenceForEveryFormNesterovAdjustDecayAndDtype) {
  int cases = 0;
  for (const auto& fused : testing::kernel_paths()) {
    for (auto form : {MomentumForm::ema, MomentumForm::sum}) {
      for (bool nesterov : {true, false}) {
        for (auto adjust :
             {AdjustLr::original, AdjustLr::match_rms_adamw, AdjustLr::spectral, AdjustLr::none}) {
          for (double wd : {0.0, 0.1}) {
            for (auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
              for (auto shape : {std::vector<int64_t>{24, 16}, std::vector<int64_t>{16, 40}}) {
                SCOPED_TRACE(testing::path_name(fused) + " " + to_string(form) +
                             (nesterov ? " nesterov " : " plain ") + to_string(adjust) + " wd " +
                             std::to_string(wd) + " " + c10::toString(dtype) + " " +
                             std::to_string(shape[0]) + "x" + std::to_string(shape[1]));
                auto gen = seeded(100 + cases++);
                const auto options = MuonOptions(0.05)
                                         .momentum(0.9)
                                         .nesterov(nesterov)
                                         .momentum_form(form)
                                         .adjust_lr(adjust)
                                         .weight_decay(wd)
                                         .fused(fused);
                auto W = at::randn(shape, gen).to(dtype).requires_grad_(true);
                auto W_ref = W.detach().clone();
                Muon opt({W}, options);
                ReferenceMuon ref{options, {}};
                for (int step = 0; step < 3; ++step) {
                  const auto grad = at::randn(shape, gen).to(dtype);
                  W.mutable_grad() = grad.clone();
                  const auto before = W.detach().clone();
                  opt.step();
                  ref.step(W_ref, grad);
                  expect_same_parameter(W.detach(), W_ref, before);
                  W_ref = W.detach().clone();  // follow ours so bf16 roundings do not compound
                }
                const auto& state =
                    static_cast<const MuonParamState&>(*opt.state().begin()->second);
                EXPECT_EQ(state.step(), 3);
                EXPECT_EQ(state.momentum_buffer().scalar_type(),
                          dtype == at::kDouble ? at::kDouble : at::kFloat);
              }
            }
          }
        }
      }
    }
  }
}

// Runs ours (through each kernel path) and the reference for `steps` steps on one (rows × cols)
// parameter and compares. `before_step(step, ours, reference)` may change options between steps
// (a schedule).
void expect_matches_reference(
    const MuonOptions& options, int64_t rows, int64_t cols, uint64_t seed, int steps = 3,
    const std::function<void(int, MuonOptions&, MuonOptions&)>& before_step = nullptr,
    at::ScalarType dtype = at::kFloat) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(seed);
    auto W = at::randn({rows, cols}, gen).to(dtype).requires_grad_(true);
    auto W_ref = W.detach().clone();
    Muon opt({W}, MuonOptions(options).fused(fused));
    ReferenceMuon ref{options, {}};
    for (int step = 0; step < steps; ++step) {
      if (before_step) {
        before_step(step, static_cast<MuonOptions&>(opt.param_groups()[0].options()), ref.o);
      }
      const auto grad = at::randn({rows, cols}, gen).to(dtype);
      W.mutable_grad() = grad.clone();
      const auto before = W.detach().clone();
      opt.step();
      ref.step(W_ref, grad);
      expect_same_parameter(W.detach(), W_ref, before);
      W_ref = W.detach().clone();
    }
  }
}

TEST(Muon, WeightDecayMethodsMatchTheirFormulas) {
  uint64_t seed = 600;
  for (auto method : {WeightDecayMethod::decoupled, WeightDecayMethod::independent,
                      WeightDecayMethod::l2, WeightDecayMethod::palm}) {
    for (auto dtype : {at::kFloat, at::kDouble}) {
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 16}, {16, 40}}) {
        SCOPED_TRACE(to_string(method) + " " + c10::toString(dtype) + " " +
                     std::to_string(rows) + "x" + std::to_string(cols));
        // A decay large enough that each method's factor shows: lr 0.05, λ 0.3.
        expect_matches_reference(
            MuonOptions(0.05).weight_decay(0.3).weight_decay_method(method), rows, cols, ++seed,
            4, nullptr, dtype);
      }
    }
  }
  // The multiplicative methods compose with cautious weight decay.
  expect_matches_reference(MuonOptions(0.05)
                               .weight_decay(0.3)
                               .weight_decay_method(WeightDecayMethod::palm)
                               .cautious_weight_decay(true),
                           24, 16, 650);
}

TEST(Muon, WeightDecayMethodsDiffer) {
  // The four methods give four different parameters after one step (the test above cannot pass
  // by every method doing the same thing).
  std::vector<at::Tensor> results;
  for (auto method : {WeightDecayMethod::decoupled, WeightDecayMethod::independent,
                      WeightDecayMethod::l2, WeightDecayMethod::palm}) {
    auto gen = seeded(7);
    auto W = at::randn({8, 12}, gen).requires_grad_(true);
    W.mutable_grad() = at::randn({8, 12}, gen);
    Muon({W}, MuonOptions(0.05).weight_decay(0.3).weight_decay_method(method)).step();
    for (const auto& other : results) EXPECT_FALSE(at::allclose(W.detach(), other));
    results.push_back(W.detach().clone());
  }
}

TEST(Muon, RowEquilibrationMatchesReference) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 16}, {16, 40}}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + std::to_string(rows) + "x" +
                   std::to_string(cols));
      expect_matches_reference(MuonOptions(0.02).row_equilibration(true), rows, cols, 700 + rows,
                               3, nullptr, dtype);
      // nanochat's order: MuonEq, then Polar Express.
      expect_matches_reference(MuonOptions(0.02).row_equilibration(true).coefficients(
                                   CoefficientTable::polar_express()),
                               rows, cols, 710 + rows, 3, nullptr, dtype);
    }
  }
  // It changes the update: rows of very different norms are evened out before orthogonalizing.
  auto gen = seeded(9);
  const auto grad = at::randn({8, 12}, gen) * at::linspace(0.01, 10, 8).unsqueeze(1);
  std::vector<at::Tensor> out;
  for (bool eq : {false, true}) {
    auto W = at::zeros({8, 12}).requires_grad_(true);
    W.mutable_grad() = grad.clone();
    Muon({W}, MuonOptions(0.02).row_equilibration(eq)).step();
    out.push_back(W.detach().clone());
  }
  EXPECT_FALSE(at::allclose(out[0], out[1], 1e-3, 1e-5));
}

// A parameter split by num_heads or split_sizes against the textbook reference run on each row
// block as a parameter of its own (its own orthogonalization and shape factor).
void expect_blocks_match_reference(const MuonOptions& options, const std::vector<int64_t>& blocks,
                                   int64_t cols, uint64_t seed, at::ScalarType dtype) {
  int64_t rows = 0;
  for (auto b : blocks) rows += b;
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(seed);
    auto W = at::randn({rows, cols}, gen).to(dtype).requires_grad_(true);
    std::vector<at::Tensor> W_ref;
    std::vector<ReferenceMuon> refs;
    for (int64_t r0 = 0, i = 0; i < static_cast<int64_t>(blocks.size()); r0 += blocks[i++]) {
      W_ref.push_back(W.detach().narrow(0, r0, blocks[i]).clone());
      refs.push_back(ReferenceMuon{options, {}});
    }
    Muon opt({W}, MuonOptions(options).fused(fused));
    for (int step = 0; step < 3; ++step) {
      const auto grad = at::randn({rows, cols}, gen).to(dtype);
      W.mutable_grad() = grad.clone();
      const auto before = W.detach().clone();
      opt.step();
      for (int64_t r0 = 0, i = 0; i < static_cast<int64_t>(blocks.size()); r0 += blocks[i++]) {
        refs[i].step(W_ref[i], grad.narrow(0, r0, blocks[i]));
        expect_same_parameter(W.detach().narrow(0, r0, blocks[i]), W_ref[i],
                              before.narrow(0, r0, blocks[i]));
        W_ref[i] = W.detach().narrow(0, r0, blocks[i]).clone();
      }
    }
  }
}

TEST(Muon, HeadsAndSplitBlocksAreOrthogonalizedAlone) {
  for (auto dtype : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    // Four heads of 6 rows (each 6 × 20: wide), and a fused QKV projection with 2 KV heads.
    expect_blocks_match_reference(MuonOptions(0.02).num_heads(4), {6, 6, 6, 6}, 20, 800, dtype);
    expect_blocks_match_reference(
        MuonOptions(0.02).split_sizes(std::vector<int64_t>{16, 8, 8}).weight_decay(0.1), {16, 8, 8},
        12, 801, dtype);
    // Per block: MuonEq, Muon+ columns and the shape factor (16 × 4 blocks are tall).
    expect_blocks_match_reference(MuonOptions(0.02)
                                      .split_sizes(std::vector<int64_t>{16, 4})
                                      .row_equilibration(true)
                                      .post_norm(PostNorm::col)
                                      .adjust_lr(AdjustLr::spectral),
                                  {16, 4}, 4, 802, dtype);
  }
  // Splitting changes the update (the blocks' polar factors are not the whole matrix's).
  auto gen = seeded(10);
  const auto grad = at::randn({12, 8}, gen);
  std::vector<at::Tensor> out;
  for (bool heads : {false, true}) {
    auto W = at::zeros({12, 8}).requires_grad_(true);
    W.mutable_grad() = grad.clone();
    auto options = MuonOptions(0.02);
    if (heads) options.num_heads(3);
    Muon({W}, options).step();
    out.push_back(W.detach().clone());
  }
  EXPECT_FALSE(at::allclose(out[0], out[1], 1e-3, 1e-5));
}

TEST(Muon, SplitsThatDoNotFitAreRefusedBeforeAnythingChanges) {
  auto W = at::ones({12, 4}).requires_grad_(true);
  W.mutable_grad() = at::ones({12, 4});
  expect_error<Error>([&] { Muon({W}, MuonOptions().num_heads(5)).step(); },
                      {"Muon: parameter 0 of param group 0 has 12 rows", "num_heads 5 does not divide"});
  expect_error<Error>(
      [&] { Muon({W}, MuonOptions().split_sizes(std::vector<int64_t>{8, 8})).step(); },
      {"Muon: split_sizes [8, 8] add up to 16 rows, but parameter 0 of param group 0 has 12"});
  expect_error<Error>([&] { Muon({W}, MuonOptions().split_sizes(std::vector<int64_t>{12, 0})); },
                      {"split_sizes must be row counts > 0"});
  expect_error<Error>(
      [&] { Muon({W}, MuonOptions().num_heads(2).split_sizes(std::vector<int64_t>{6, 6})); },
      {"num_heads and split_sizes", "set one of them"});
  expect_error<Error>([&] { Muon({W}, MuonOptions().num_heads(2).normuon(NorMuonOptions{})); },
                      {"normuon keeps statistics of whole matrices"});
  expect_error<Error>([&] { Muon({W}, MuonOptions().num_heads(0)); },
                      {"Muon: num_heads must be > 0, got 0"});
  EXPECT_TRUE(at::equal(W.detach(), at::ones({12, 4})));
}

TEST(Muon, NsEpsReplacesTheTablesEps) {
  // An eps comparable to ‖Q‖_F shrinks the normalized direction, which the reference reproduces
  // only if it is the eps used.
  for (auto dtype : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    expect_matches_reference(MuonOptions(0.02).ns_eps(2.0), 24, 16, 720, 3, nullptr, dtype);
  }
  auto W = at::ones({4, 4}).requires_grad_(true);
  expect_error<Error>([&] { Muon({W}, MuonOptions().ns_eps(0.0)); },
                      {"Muon: ns_eps must be > 0, got 0"});
}

TEST(Muon, GramCoefficientsDriveNonSquareMatricesOnly) {
  // A schedule unlike the quintic (a contracting first row, then the quintic, 6 iterations in
  // all), so that which table ran shows; square matrices keep coefficients and ns_steps.
  const auto gram = CoefficientTable::custom(
      {{2.0, -1.5, 0.5}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315},
       {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}, {3.4445, -4.7750, 2.0315}});
  const auto options = MuonOptions(0.02).weight_decay(0.1).gram_coefficients(gram);
  for (auto dtype : {at::kFloat, at::kDouble}) {
    SCOPED_TRACE(c10::toString(dtype));
    expect_matches_reference(options, 12, 40, 730, 3, nullptr, dtype);
    expect_matches_reference(options, 40, 12, 731, 3, nullptr, dtype);
    expect_matches_reference(options, 16, 16, 732, 3, nullptr, dtype);
  }
  // Against plain Muon: the same on a square matrix, different on a rectangular one.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 16}, {12, 40}}) {
    auto gen = seeded(733);
    const auto start = at::randn({rows, cols}, gen, at::kDouble);
    const auto grad = at::randn({rows, cols}, gen, at::kDouble);
    auto A = start.clone().requires_grad_(true);
    auto B = start.clone().requires_grad_(true);
    Muon with({A}, options), without({B}, MuonOptions(0.02).weight_decay(0.1));
    A.mutable_grad() = grad.clone();
    B.mutable_grad() = grad.clone();
    with.step();
    without.step();
    EXPECT_EQ(rows == cols, testing::max_rel_diff(A.detach() - start, B.detach() - start) < 1e-12);
  }
  auto W = at::ones({4, 8}).requires_grad_(true);
  expect_error<Error>(
      [&] { Muon({W}, MuonOptions().gram_coefficients(CoefficientTable::custom({}))); },
      {"Muon: gram_coefficients must have 1 to 1000 rows [a, b, c] (one per iteration), got 0"});
  expect_error<Error>(
      [&] {
        Muon({W}, MuonOptions().gram_coefficients(CoefficientTable::custom({{1, NAN, 0}})));
      },
      {"Muon: gram_coefficients has a non-finite coefficient"});
}

TEST(Muon, MuonPlusModesMatchReference) {
  for (auto mode :
       {PostNorm::row, PostNorm::col, PostNorm::row_col, PostNorm::col_row, PostNorm::frobenius}) {
    for (auto shape : {std::pair<int64_t, int64_t>{24, 16}, {16, 40}}) {
      SCOPED_TRACE(to_string(mode) + " " + std::to_string(shape.first) + "x" +
                   std::to_string(shape.second));
      expect_matches_reference(MuonOptions(0.02).post_norm(mode).weight_decay(0.1), shape.first,
                               shape.second, 20);
    }
  }
  // col_row really does columns then rows: it differs from col alone and from row_col.
  auto gen = seeded(21);
  const auto U = orthogonalize(at::randn({12, 20}, gen));
  const auto col = post_normalize(U, PostNorm::col);
  const auto col_row = post_normalize(U, PostNorm::col_row);
  EXPECT_GT((col_row - col).abs().max().item<double>(), 1e-3);
  EXPECT_GT((col_row - post_normalize(U, PostNorm::row_col)).abs().max().item<double>(), 1e-3);
  // After col_row every row has unit norm; after row_col every column.
  EXPECT_LT((col_row.square().sum(1) - 1).abs().max().item<double>(), 1e-5);
  EXPECT_LT((post_normalize(U, PostNorm::row_col).square().sum(0) - 1).abs().max().item<double>(),
            1e-5);
  // frobenius: ‖U‖_F = √min(rows, cols), and a zero update stays zero.
  EXPECT_NEAR(post_normalize(U, PostNorm::frobenius).norm().item<double>(), std::sqrt(12.0), 1e-4);
  EXPECT_TRUE(at::equal(post_normalize(at::zeros({3, 4}), PostNorm::frobenius), at::zeros({3, 4})));
  testing::expect_error<Error>([] { post_norm_from_string("rows"); },
                               {"'rows'", "row, col, row_col, col_row, frobenius"});
}

TEST(Muon, NorMuonMatchesReferenceForEachAxis) {
  for (auto axis : {NorMuonAxis::automatic, NorMuonAxis::row, NorMuonAxis::col}) {
    for (auto shape : {std::pair<int64_t, int64_t>{24, 16}, {16, 40}}) {
      SCOPED_TRACE(to_string(axis) + " " + std::to_string(shape.first) + "x" +
                   std::to_string(shape.second));
      expect_matches_reference(MuonOptions(0.02).normuon(NorMuonOptions{0.9, axis}), shape.first,
                               shape.second, 30, 4);
    }
  }
  // The statistic's shape follows the axis: per row for tall/square, per column for wide.
  EXPECT_EQ(normuon_state_shape({3, 24, 16}, NorMuonAxis::automatic),
            (std::vector<int64_t>{3, 24, 1}));
  EXPECT_EQ(normuon_state_shape({16, 40}, NorMuonAxis::automatic), (std::vector<int64_t>{1, 40}));
  EXPECT_EQ(normuon_state_shape({16, 40}, NorMuonAxis::row), (std::vector<int64_t>{16, 1}));
}

TEST(Muon, NorMuonOnAZeroGradientIsFiniteAndLeavesTheParameter) {
  auto W = at::randn({8, 6}).requires_grad_(true);
  const auto W0 = W.detach().clone();
  Muon opt({W}, MuonOptions(0.02).normuon(NorMuonOptions{}));
  for (int step = 0; step < 3; ++step) {
    W.mutable_grad() = at::zeros({8, 6});
    opt.step();
  }
  EXPECT_TRUE(at::equal(W.detach(), W0));
  const auto& state = static_cast<const MuonParamState&>(*opt.state().begin()->second);
  EXPECT_TRUE(at::isfinite(state.normuon_second_moment()).all().item<bool>());
}

TEST(Muon, CautiousWeightDecayMatchesReference) {
  expect_matches_reference(MuonOptions(0.05).weight_decay(0.5).cautious_weight_decay(true), 20, 12,
                           40);
  // By hand on a case where U·W < 0 for one entry: that entry is not decayed.
  auto W = at::tensor({1.0f, -1.0f}).view({1, 2}).requires_grad_(true);
  Muon opt({W}, MuonOptions(0.1)
                    .momentum(0)
                    .nesterov(false)
                    .weight_decay(1.0)
                    .cautious_weight_decay(true)
                    .ns_method(NsMethod::plain));
  W.mutable_grad() = at::tensor({1.0f, 1.0f}).view({1, 2});  // U ∝ (1, 1)/√2·s
  opt.step();
  const auto u = orthogonalize(at::tensor({1.0f, 1.0f}).view({1, 2}),
                               OrthogonalizeOptions().method(NsMethod::plain))[0][0]
                     .item<float>();
  EXPECT_NEAR(W[0][0].item<float>(), 1.0f * 0.9f - 0.1f * u, 1e-6);  // U·W > 0: decayed
  EXPECT_NEAR(W[0][1].item<float>(), -1.0f - 0.1f * u, 1e-6);        // U·W < 0: kept
}

TEST(Muon, NanochatRecipeComposes) {
  // Polar Express + NorMuon (beta2 0.9) + cautious weight decay, as flaxchat/nanochat train.
  expect_matches_reference(MuonOptions(0.02)
                               .coefficients(CoefficientTable::polar_express())
                               .normuon(NorMuonOptions{0.9})
                               .cautious_weight_decay(true)
                               .weight_decay(0.2),
                           32, 16, 50, 4);
}

TEST(Muon, ExpertStackEqualsSeparateMatrices) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(60);
    const int64_t E = 4;
    auto stack = at::randn({E, 12, 20}, gen).requires_grad_(true);
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < E; ++e)
      experts.push_back(stack[e].detach().clone().requires_grad_(true));
    const auto options =
        MuonOptions(0.02).normuon(NorMuonOptions{}).post_norm(PostNorm::row_col).fused(fused);
    Muon together({stack}, options);
    Muon apart(experts, options);
    for (int step = 0; step < 3; ++step) {
      const auto g = at::randn({E, 12, 20}, gen);
      stack.mutable_grad() = g.clone();
      for (int64_t e = 0; e < E; ++e) experts[e].mutable_grad() = g[e].clone();
      together.step();
      apart.step();
    }
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_LT(testing::max_rel_diff(stack[e].detach(), experts[e].detach()), 1e-6) << e;
    }
  }
}

TEST(Muon, MatrixViewFlattensAConvKernel) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(61);
    auto conv = at::randn({8, 3, 3, 3}, gen).requires_grad_(true);
    auto flat = conv.detach().reshape({8, 27}).clone().requires_grad_(true);
    Muon a({conv}, MuonOptions().fused(fused)), b({flat}, MuonOptions().fused(fused));
    a.set_matrix_view(conv, {8, 27});
    EXPECT_EQ(a.matrix_view(conv), (std::vector<int64_t>{8, 27}));
    for (int step = 0; step < 2; ++step) {
      const auto g = at::randn({8, 3, 3, 3}, gen);
      conv.mutable_grad() = g;
      flat.mutable_grad() = g.reshape({8, 27});
      a.step();
      b.step();
    }
    EXPECT_TRUE(at::equal(conv.detach().reshape({8, 27}), flat.detach()));
    expect_error<Error>([&] { a.set_matrix_view(conv, {8, 26}); }, {"holds 208 elements", "216"});
    expect_error<Error>([&] { a.set_matrix_view(flat, {8, 27}); }, {"not a parameter"});
    expect_error<Error>([&] { a.set_matrix_view(conv, {216}); }, {"(batch..., rows, cols)"});
  }
}

TEST(Muon, SameShapeMatricesShareOneBatchAndMatchSeparateOptimizers) {
  auto gen = seeded(62);
  std::vector<at::Tensor> params, copies;
  for (int i = 0; i < 3; ++i) {
    params.push_back(at::randn({16, 24}, gen).requires_grad_(true));
    copies.push_back(params.back().detach().clone().requires_grad_(true));
  }
  params.push_back(at::randn({24, 16}, gen).requires_grad_(true));  // another batch
  copies.push_back(params.back().detach().clone().requires_grad_(true));
  Muon together(params);
  std::vector<std::unique_ptr<Muon>> alone;
  for (auto& c : copies) alone.push_back(std::make_unique<Muon>(std::vector<at::Tensor>{c}));
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto g = at::randn(params[i].sizes(), gen);
      params[i].mutable_grad() = g.clone();
      copies[i].mutable_grad() = g.clone();
    }
    together.step();
    for (auto& opt : alone) opt->step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LT(testing::max_rel_diff(params[i].detach(), copies[i].detach()), 1e-6) << i;
  }
}

TEST(Muon, ThreadsUpdateWholeParametersInLanesWithTheBitsOfOneThread) {
  // On several threads, a batch of equal pieces is updated in lanes — each thread runs the
  // momentum and the final update of whole parameters, its loops serial — and what whole rounds
  // leave over with every loop split (6 matrices on 4 threads); a batch of unequal pieces (an
  // expert stack beside single matrices), split heads and a tensor listed twice (as LibTorch's
  // Module::parameters() lists a tied weight; two lanes would update it at once) run as before.
  // Elementwise kernels do
  // not depend on how a loop is split, and these matrices are small enough for every reduction
  // to run on one thread: the bits must be those of one thread. Through both kernel paths — the
  // generic one writes the parameters with ATen in-place operations, which fail on a lane's
  // thread without the caller's no_grad — and with the options that add work per piece.
  const std::vector<std::pair<std::string, MuonOptions>> configurations{
      {"defaults", MuonOptions(0.02)},
      {"bf16 momentum, cautious decay, MuonEq",
       MuonOptions(0.02).state_dtype(at::kBFloat16).weight_decay(0.1).cautious_weight_decay(true)
           .row_equilibration(true)},
      {"cautious, L2 decay",
       MuonOptions(0.02).cautious(true).weight_decay(0.1).weight_decay_method(
           WeightDecayMethod::l2)},
      {"NorMuon, Muon+", MuonOptions(0.02).normuon(NorMuonOptions{}).post_norm(PostNorm::row_col)},
      {"two heads", MuonOptions(0.02).num_heads(2)},
  };
  const int before = at::get_num_threads();
  for (const auto& fused : testing::kernel_paths()) {
    for (const auto& configuration : configurations) {
      const auto& name = configuration.first;
      const auto& options = configuration.second;  // a reference a lambda can capture in C++17
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {  // bf16: with mantissa tracking
        const auto run = [&](int threads) {
          at::set_num_threads(threads);
          auto gen = seeded(63);
          std::vector<at::Tensor> params;
          for (int i = 0; i < 6; ++i) params.push_back(at::randn({40, 24}, gen));  // in lanes
          params[5] = params[5].t().contiguous().t();                // one column-major
          for (int i = 0; i < 2; ++i) params.push_back(at::randn({3, 32, 16}, gen));  // lanes
          params.push_back(at::randn({24, 40}, gen));                // a batch of its own
          params.push_back(at::randn({256, 256}, gen));              // listed twice: updated
          params.push_back(params.back());                           // twice, one at a time
          params.push_back(at::randn({2, 20, 12}, gen));             // unequal pieces
          for (int i = 0; i < 2; ++i) params.push_back(at::randn({20, 12}, gen));
          for (auto& p : params) p = p.to(dtype).requires_grad_(true);
          Muon opt(params, MuonOptions(options).fused(fused).mantissa_tracking(
                               dtype == at::kBFloat16));
          for (int step = 0; step < 3; ++step) {
            for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen).to(dtype);
            opt.step();
          }
          at::set_num_threads(before);
          std::vector<at::Tensor> out;
          for (auto& p : params) {
            out.push_back(p.detach().clone());
            const auto& state = static_cast<const MuonParamState&>(
                *opt.state().at(compat::param_state_key(p)));
            out.push_back(state.momentum_buffer().clone());
          }
          return out;
        };
        const auto one = run(1);
        for (int threads : {2, 4}) {
          SCOPED_TRACE(testing::path_name(fused) + ", " + name + ", " + c10::toString(dtype) +
                       ", " + std::to_string(threads) + " threads");
          const auto many = run(threads);
          for (size_t i = 0; i < one.size(); ++i) {
            EXPECT_TRUE(at::equal(one[i], many[i]))
                << (i % 2 ? "momentum of parameter " : "parameter ") << i / 2;
          }
        }
      }
    }
  }
}

TEST(Muon, PolarExpressTableAndMomentumChangedBetweenSteps) {
  const double schedule[] = {0.85, 0.9, 0.95};  // a momentum schedule
  expect_matches_reference(MuonOptions(0.02).coefficients(CoefficientTable::polar_express()), 32,
                           32, 7, 3, [&](int step, MuonOptions& ours, MuonOptions& reference) {
                             ours.momentum(schedule[step]);
                             reference.momentum(schedule[step]);
                           });
}

TEST(Muon, Bf16MomentumHoldsTheSpecRoundingAndTracksFp32) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(8);
    auto W = at::randn({32, 16}, gen).requires_grad_(true);
    auto W32 = W.detach().clone().requires_grad_(true);
    Muon opt({W}, MuonOptions(0.02).state_dtype(at::kBFloat16).fused(fused));
    Muon ref({W32}, MuonOptions(0.02));
    const auto g = at::randn({32, 16}, gen);
    W.mutable_grad() = g;
    W32.mutable_grad() = g;
    opt.step();
    ref.step();
    // From a zero buffer the fp32 momentum is (1−β)·g; it is stored rounded with tensor 0's seed.
    const auto& state = static_cast<const MuonParamState&>(*opt.state().begin()->second);
    ASSERT_EQ(state.momentum_buffer().scalar_type(), at::kBFloat16);
    const auto* bits = reinterpret_cast<const uint16_t*>(state.momentum_buffer().data_ptr());
    const float* grad = g.data_ptr<float>();
    const uint32_t seed = sr::tensor_salt(sr::step_seed(0), 0);
    for (int64_t i = 0; i < g.numel(); ++i) {
      ASSERT_EQ(bits[i], sr::round_bits(static_cast<float>(1.0 - 0.95) * grad[i], seed, i)) << i;
    }
    for (int step = 0; step < 20; ++step) {
      const auto gi = at::randn({32, 16}, gen);
      W.mutable_grad() = gi;
      W32.mutable_grad() = gi;
      opt.step();
      ref.step();
    }
    EXPECT_LT(testing::max_rel_diff(W.detach(), W32.detach()), 2e-2);
    EXPECT_FALSE(at::equal(W.detach(), W32.detach()));
  }
}

TEST(Muon, NonContiguousParameterMatchesContiguous) {
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(testing::path_name(fused));
    auto gen = seeded(11);
    auto view = at::randn({24, 16}, gen).t().requires_grad_(true);  // (16, 24), column-major
    auto dense = view.detach().contiguous().requires_grad_(true);
    Muon a({view}, MuonOptions().fused(fused)), b({dense}, MuonOptions().fused(fused));
    for (int step = 0; step < 3; ++step) {
      const auto g = at::randn({16, 24}, gen);
      view.mutable_grad() = g;
      dense.mutable_grad() = g;
      a.step();
      b.step();
    }
    EXPECT_FALSE(view.is_contiguous());
    EXPECT_TRUE(at::equal(view.detach(), dense.detach()));
  }
}

TEST(Muon, ShapeFactorClosedForms) {
  EXPECT_DOUBLE_EQ(shape_factor(AdjustLr::original, 400, 100), 2.0);
  EXPECT_DOUBLE_EQ(shape_factor(AdjustLr::original, 100, 400), 1.0);
  EXPECT_DOUBLE_EQ(shape_factor(AdjustLr::match_rms_adamw, 100, 400), 4.0);
  EXPECT_DOUBLE_EQ(shape_factor(AdjustLr::spectral, 100, 400), 0.5);
  EXPECT_DOUBLE_EQ(shape_factor(AdjustLr::none, 7, 3), 1.0);
}

TEST(Muon, ClosureRunsOnceAndItsLossIsReturned) {
  auto W = at::ones({4, 3}).requires_grad_(true);
  Muon opt({W});
  int calls = 0;
  const auto loss = opt.step([&] {
    ++calls;
    opt.zero_grad();
    auto l = (W * W).sum();
    l.backward();
    return l;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_DOUBLE_EQ(loss.item<double>(), 12.0);
  EXPECT_FALSE(at::equal(W.detach(), at::ones({4, 3})));
}

TEST(Muon, ParametersWithoutGradientsAreSkipped) {
  auto W = at::ones({4, 3}).requires_grad_(true);
  Muon opt({W});
  opt.step();
  EXPECT_TRUE(at::equal(W.detach(), at::ones({4, 3})));
  EXPECT_TRUE(opt.state().empty());
}

TEST(Muon, LrSchedulerReachesTheGroups) {
  auto W = at::ones({4, 3}).requires_grad_(true);
  Muon opt({W}, MuonOptions(0.1));
  torch::optim::StepLR scheduler(opt, /*step_size=*/1, /*gamma=*/0.5);
  scheduler.step();  // libtorch's StepLR leaves its first call's rates unchanged
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.1);
  scheduler.step();
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 0.05);
}

TEST(Muon, RejectsBadParametersAtConstruction) {
  expect_error<Error>([] { Muon({at::ones({5}, at::kFloat).requires_grad_(true)}); },
                      {"[5]", "matrices (out, in), or stacks of them", "AdamW"});
  expect_error<Error>([] { Muon({at::ones({}, at::kFloat).requires_grad_(true)}); }, {"[]"});
  expect_error<Error>(
      [] {
        Muon({at::ones({2, 2}, at::kComplexFloat).requires_grad_(true)});
      },
      {"complex"});
  expect_error<Error>([] { Muon({at::ones({2, 2}, at::kInt)}); }, {"dtype Int", "floating"});
}

// Options out of range: test_conformance.cpp, for every algorithm. Muon's own rules here.
TEST(Muon, RejectsBadOptions) {
  auto W = at::ones({2, 2}).requires_grad_(true);
  expect_error<Error>([&] { Muon({W}, MuonOptions().state_dtype(at::kHalf)); },
                      {"Muon: state_dtype Half", "float32 (full precision), bfloat16 (stochastic rounding) or int8"});
  expect_error<Error>(
      [&] {
        Muon({W}, MuonOptions()
                      .weight_decay_method(WeightDecayMethod::l2)
                      .cautious_weight_decay(true));
      },
      {"Muon: cautious_weight_decay", "decoupled, independent or palm"});
}

TEST(Muon, SparseGradientIsRejectedBeforeAnythingChanges) {
  auto gen = seeded(9);
  auto A = at::randn({3, 3}, gen).requires_grad_(true);
  auto B = at::randn({3, 3}, gen).requires_grad_(true);
  const auto A0 = A.detach().clone();
  const auto B0 = B.detach().clone();
  Muon opt({A, B});
  A.mutable_grad() = at::ones({3, 3});
  B.mutable_grad() = at::eye(3).to_sparse();
  expect_error<Error>([&] { opt.step(); }, {"Muon does not support sparse gradients"});
  EXPECT_TRUE(at::equal(A.detach(), A0));
  EXPECT_TRUE(at::equal(B.detach(), B0));
  EXPECT_TRUE(opt.state().empty());
}

TEST(Muon, ParameterAddedLaterIsCheckedAtStep) {
  auto W = at::ones({2, 2}).requires_grad_(true);
  auto v = at::ones({3}).requires_grad_(true);
  Muon opt({W});
  opt.add_param_group(torch::optim::OptimizerParamGroup({v}));
  v.mutable_grad() = at::ones({3});
  W.mutable_grad() = at::ones({2, 2});
  expect_error<Error>([&] { opt.step(); }, {"parameter 0 of param group 1", "[3]"});
  EXPECT_TRUE(at::equal(W.detach(), at::ones({2, 2})));
}

}  // namespace
}  // namespace muon
