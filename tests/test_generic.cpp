// The device-generic ATen form of every update (what runs on GPUs) against the fused CPU kernels,
// on CPU. The ATen form rounds where the fused kernels round, so the two give the same bits —
// bf16 state included — whenever the orthogonalization is the same (ns_method plain); with the
// CPU's BLIS/CBLAS Newton–Schulz methods Muon agrees to the orthogonalization's own precision.
#include "muon/generic_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/adam.h"
#include "muon/checkpoint.h"
#include "muon/config.h"
#include "muon/error.h"
#include "muon/hybrid.h"
#include "muon/muon.h"
#include "muon/param_state.h"
#include "muon/stochastic_rounding.h"

namespace muon {
namespace {

using testing::expect_error;
using testing::seeded;

// Bit patterns, so that NaNs compare too.
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto as_int = [](const at::Tensor& t) {
    const auto dense = t.contiguous();
    switch (dense.element_size()) {
      case 1:
        return dense;
      case 2:
        return dense.view(at::kShort);
      case 4:
        return dense.view(at::kInt);
      default:
        return dense.view(at::kLong);
    }
  };
  return at::equal(as_int(a), as_int(b));
}

// fp32 values over many binades, with zeros, subnormals, infinities and NaNs of both signs.
at::Tensor awkward_floats(int64_t n, at::Generator& gen) {
  auto x = at::randn({n}, gen) * at::pow(2.0, at::randint(-130, 120, {n}, gen).to(at::kFloat));
  const float specials[] = {0.0f,    -0.0f,  INFINITY, -INFINITY, NAN,  -NAN, 1e-45f,
                            -1e-45f, 1e-38f, 3.4e38f,  -3.4e38f,  1.0f, -1.0f};
  for (size_t i = 0; i < std::size(specials); ++i) x[static_cast<int64_t>(i)] = specials[i];
  return x;
}

TEST(Generic, StochasticRoundingEqualsTheCpuLoopBitForBit) {
  auto gen = seeded(1);
  for (uint32_t seed : {0u, 1u, 0x9E3779B9u, 0xFFFFFFFFu}) {
    const auto x = awkward_floats(100000, gen);
    EXPECT_TRUE(same_bits(sr::round_to_bf16_generic(x, seed), sr::round_to_bf16(x, seed))) << seed;
  }
  // Past the first chunk of 2^24 elements the indices continue (the loop's own, unchunked).
  const int64_t n = (int64_t{1} << 24) + 4096;
  const auto big = at::randn({n}, gen);
  const auto generic = sr::round_to_bf16_generic(big, 77);
  EXPECT_TRUE(same_bits(generic, sr::round_to_bf16(big, 77)));
  const auto* bits = reinterpret_cast<const uint16_t*>(generic.data_ptr());
  for (int64_t i : {int64_t{0}, n / 2, (int64_t{1} << 24) - 1, int64_t{1} << 24, n - 1}) {
    EXPECT_EQ(bits[i], sr::round_bits(big[i].item<float>(), 77, static_cast<uint64_t>(i))) << i;
  }
  // Shape kept, any layout read in row-major order.
  const auto matrix = at::randn({40, 30}, gen).t();
  EXPECT_TRUE(same_bits(sr::round_to_bf16_generic(matrix, 5), sr::round_to_bf16(matrix, 5)));
  EXPECT_EQ(sr::round_to_bf16_generic(matrix, 5).sizes(), matrix.sizes());
}

// ---- Adam family ----

struct AdamCase {
  std::string rule;  // adamw, adam, lamb
  bool nesterov = false;
  bool cautious = false;
  at::ScalarType state = at::kFloat;
  at::ScalarType param = at::kFloat;
};

std::string describe(const AdamCase& c) {
  return c.rule + (c.nesterov ? " nesterov" : "") + (c.cautious ? " cautious" : "") + " state " +
         c10::toString(c.state) + " param " + c10::toString(c.param);
}

std::unique_ptr<torch::optim::Optimizer> make_adam(const AdamCase& c,
                                                   std::vector<at::Tensor> params,
                                                   std::optional<bool> fused) {
  if (c.rule == "lamb") {
    return std::make_unique<Lamb>(std::move(params),
                                  LambOptions(1e-2).weight_decay(0.05).fused(fused));
  }
  if (c.rule == "adam") {
    return std::make_unique<Adam>(std::move(params), AdamOptions(3e-3)
                                                         .weight_decay(0.05)
                                                         .betas({0.8, 0.99})
                                                         .nesterov(c.nesterov)
                                                         .cautious(c.cautious)
                                                         .state_dtype(c.state)
                                                         .fused(fused));
  }
  return std::make_unique<AdamW>(std::move(params), AdamWOptions(1e-2)
                                                        .weight_decay(0.1)
                                                        .betas({0.9, 0.95})
                                                        .nesterov(c.nesterov)
                                                        .cautious(c.cautious)
                                                        .state_dtype(c.state)
                                                        .fused(fused));
}

// Parameters of several shapes and layouts: 0-d, empty, vectors, matrices, a 4-d tensor, a
// transposed and a strided view.
std::vector<at::Tensor> assorted(at::ScalarType dtype, at::Generator& gen) {
  std::vector<at::Tensor> out;
  for (auto shape :
       std::vector<std::vector<int64_t>>{{}, {0}, {7}, {3, 5}, {64, 33}, {2, 3, 4, 5}, {70000}}) {
    out.push_back(at::randn(shape, gen).to(dtype));
  }
  out.push_back(at::randn({6, 9}, gen).to(dtype).t());
  out.push_back(at::randn({10, 8}, gen).to(dtype).slice(1, 0, 8, 2));
  // Large enough for int8 state: rows shorter than a block, and rows of several blocks (the last
  // one short) seen transposed.
  out.push_back(at::randn({80, 70}, gen).to(dtype));
  out.push_back(at::randn({1000, 9}, gen).to(dtype).t());
  return out;
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    auto copy = at::empty_strided(p.sizes(), p.strides(), p.options());
    copy.copy_(p);
    out.push_back(copy.requires_grad_(true));
  }
  return out;
}

void expect_same_state(torch::optim::Optimizer& a, torch::optim::Optimizer& b,
                       const std::vector<at::Tensor>& pa, const std::vector<at::Tensor>& pb) {
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto sa = read_param_state(a, pa[i]);
    const auto sb = read_param_state(b, pb[i]);
    ASSERT_EQ(sa.has_value(), sb.has_value());
    if (!sa) continue;
    EXPECT_EQ(sa->step, sb->step);
    for (const auto& [name, t] : sa->tensors) {
      EXPECT_TRUE(same_bits(t, sb->tensors.at(name))) << "tensor " << i << " " << name;
      EXPECT_EQ(t.device(), pa[i].device());
    }
  }
}

// Both paths for `steps` steps on the same gradients; `compare` checks parameters.
template <class Compare>
void run_both(const AdamCase& c, int steps, uint64_t seed, Compare&& compare) {
  auto gen = seeded(seed);
  const auto init = assorted(c.param, gen);
  auto fused_params = copies(init);
  auto generic_params = copies(init);
  auto fused = make_adam(c, fused_params, std::nullopt);
  auto generic = make_adam(c, generic_params, false);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < init.size(); ++i) {
      // A parameter without a gradient on one step: skipped by both.
      if (step == 1 && i == 3) {
        fused_params[i].mutable_grad() = at::Tensor();
        generic_params[i].mutable_grad() = at::Tensor();
        continue;
      }
      const auto g = at::randn(init[i].sizes(), gen).to(c.param);
      fused_params[i].mutable_grad() = g.clone();
      generic_params[i].mutable_grad() = g.clone();
    }
    fused->step();
    generic->step();
  }
  for (size_t i = 0; i < init.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    EXPECT_EQ(generic_params[i].strides(), init[i].strides());  // updated in place
    compare(fused_params[i].detach(), generic_params[i].detach(), init[i]);
  }
  if (c.rule != "lamb") expect_same_state(*fused, *generic, fused_params, generic_params);
}

TEST(Generic, AdamAdamWAndNAdamEqualTheFusedKernelsBitForBit) {
  int cases = 0;
  for (const char* rule : {"adamw", "adam"}) {
    for (bool nesterov : {false, true}) {
      for (bool cautious : {false, true}) {
        for (auto state : {at::kFloat, at::kBFloat16, at::kChar}) {
          for (auto param : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
            if (state == at::kChar && param == at::kDouble) continue;  // refused
            const AdamCase c{rule, nesterov, cautious, state, param};
            SCOPED_TRACE(describe(c));
            run_both(c, 4, 10 + cases++, [](const at::Tensor& a, const at::Tensor& b, auto&&) {
              EXPECT_TRUE(same_bits(a, b));
            });
          }
        }
      }
    }
  }
}

TEST(Generic, LambAgreesWithTheFusedKernel) {
  // The trust ratio's norms are summed in another order (fp32 blocks there, fp64 here).
  for (auto param : {at::kFloat, at::kDouble, at::kBFloat16}) {
    const AdamCase c{"lamb", false, false, at::kFloat, param};
    SCOPED_TRACE(describe(c));
    run_both(c, 6, 50, [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& init) {
      if (a.numel() == 0) return;
      if (param == at::kBFloat16) {  // within one rounding of the parameter
        const auto diff = (a.to(at::kFloat) - b.to(at::kFloat)).abs();
        EXPECT_LE(diff.max().item<double>(),
                  std::pow(2.0, -8) * a.to(at::kFloat).abs().max().item<double>() + 1e-30);
      } else {
        const double tol = param == at::kDouble ? 1e-12 : 1e-5;
        EXPECT_LE(testing::max_rel_diff(a - init, b - init), tol);
      }
    });
  }
}

TEST(Generic, AdamChunksSplitLargeGroupsWithoutChangingTheResult) {
  // 3 × 6M elements exceed one multi-tensor chunk (2^24 elements): the group is cut in two.
  auto gen = seeded(60);
  std::vector<at::Tensor> init;
  for (int i = 0; i < 3; ++i) init.push_back(at::randn({6000000}, gen));
  auto a = copies(init);
  auto b = copies(init);
  AdamW fused(a, AdamWOptions(1e-2).state_dtype(at::kBFloat16));
  AdamW generic(b, AdamWOptions(1e-2).state_dtype(at::kBFloat16).fused(false));
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < init.size(); ++i) {
      const auto g = at::randn(init[i].sizes(), gen);
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    fused.step();
    generic.step();
  }
  for (size_t i = 0; i < init.size(); ++i) EXPECT_TRUE(same_bits(a[i].detach(), b[i].detach()));
  expect_same_state(fused, generic, a, b);
}

// ---- Muon ----

struct MuonCase {
  std::string name;
  MuonOptions options;
};

std::vector<MuonCase> muon_cases() {
  const auto base = MuonOptions(0.03).momentum(0.9);
  auto with = [&](const std::string& name, MuonOptions o) { return MuonCase{name, std::move(o)}; };
  return {
      with("default", base),
      with("sum momentum", MuonOptions(base).momentum_form(MomentumForm::sum)),
      with("no nesterov", MuonOptions(base).nesterov(false)),
      with("sum, no nesterov", MuonOptions(base).momentum_form(MomentumForm::sum).nesterov(false)),
      with("weight decay, match_rms_adamw",
           MuonOptions(base).weight_decay(0.1).adjust_lr(AdjustLr::match_rms_adamw)),
      with("spectral", MuonOptions(base).adjust_lr(AdjustLr::spectral)),
      with("cautious weight decay",
           MuonOptions(base).weight_decay(0.5).cautious_weight_decay(true)),
      with("cautious", MuonOptions(base).weight_decay(0.1).cautious(true)),
      with("muon+ row_col", MuonOptions(base).post_norm(PostNorm::row_col)),
      with("muon+ col_row", MuonOptions(base).post_norm(PostNorm::col_row)),
      with("muon+ frobenius", MuonOptions(base).post_norm(PostNorm::frobenius)),
      with("normuon", MuonOptions(base).normuon(NorMuonOptions{0.9})),
      with("normuon per column", MuonOptions(base).normuon(NorMuonOptions{0.95, NorMuonAxis::col})),
      with("polar express, nanochat", MuonOptions(base)
                                          .coefficients(CoefficientTable::polar_express())
                                          .normuon(NorMuonOptions{0.9})
                                          .cautious_weight_decay(true)
                                          .weight_decay(0.2)),
      with("dion table, 7 steps",
           MuonOptions(base).coefficients(CoefficientTable::dion()).ns_steps(7)),
  };
}

// Matrices of several shapes: tall, wide, square twice (one batch), an expert stack, a
// transposed view.
std::vector<at::Tensor> matrices(at::ScalarType dtype, at::Generator& gen) {
  std::vector<at::Tensor> out;
  for (auto shape :
       std::vector<std::vector<int64_t>>{{24, 16}, {16, 40}, {20, 20}, {20, 20}, {3, 12, 8}}) {
    out.push_back(at::randn(shape, gen).to(dtype));
  }
  out.push_back(at::randn({18, 10}, gen).to(dtype).t());
  out.push_back(at::randn({2, 40, 64}, gen).to(dtype));  // int8 state: rows of 2560 per expert
  return out;
}

// Steps a fused and a generic Muon on the same gradients; returns both parameter sets.
std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> run_muon(
    const MuonOptions& fused_options, const MuonOptions& generic_options, at::ScalarType dtype,
    uint64_t seed, int steps, std::vector<at::Tensor>* initial = nullptr,
    std::pair<std::unique_ptr<Muon>, std::unique_ptr<Muon>>* keep = nullptr) {
  auto gen = seeded(seed);
  const auto init = matrices(dtype, gen);
  auto a = copies(init);
  auto b = copies(init);
  auto fused = std::make_unique<Muon>(a, fused_options);
  auto generic = std::make_unique<Muon>(b, generic_options);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < init.size(); ++i) {
      const auto g = at::randn(init[i].sizes(), gen).to(dtype);
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    fused->step();
    generic->step();
  }
  if (initial != nullptr) *initial = init;
  if (keep != nullptr) *keep = {std::move(fused), std::move(generic)};
  return {a, b};
}

TEST(Generic, MuonEqualsTheFusedKernelsBitForBitWithThePlainChain) {
  int cases = 0;
  for (const auto& c : muon_cases()) {
    for (auto state : {at::kFloat, at::kBFloat16, at::kChar}) {
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
        if (state == at::kChar && dtype == at::kDouble) continue;  // refused
        SCOPED_TRACE(c.name + " state " + c10::toString(state) + " param " + c10::toString(dtype));
        auto o = MuonOptions(c.options).state_dtype(state);
        std::pair<std::unique_ptr<Muon>, std::unique_ptr<Muon>> optimizers;
        const auto [a, b] =
            run_muon(MuonOptions(o).ns_method(NsMethod::plain), MuonOptions(o).fused(false), dtype,
                     100 + cases++, 3, nullptr, &optimizers);
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(same_bits(a[i].detach(), b[i].detach())) << "matrix " << i;
        }
        expect_same_state(*optimizers.first, *optimizers.second, a, b);
      }
    }
  }
}

TEST(Generic, MuonAgreesWithTheBlisMethodsToTheirPrecision) {
  // Default CPU Muon (symmetric or gram Newton–Schulz on BLIS/CBLAS, fp32) against the generic
  // plain chain: equal to the precision of fp32 orthogonalization, relative to the change.
  for (const auto& c : muon_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<at::Tensor> init;
    const auto [a, b] =
        run_muon(c.options, MuonOptions(c.options).fused(false), at::kFloat, 7, 4, &init);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_LT(testing::max_rel_diff(a[i].detach() - init[i], b[i].detach() - init[i]), 2e-4)
          << "matrix " << i;
    }
  }
}

// ---- Hybrid: groups, schedules, clipping, QK-clip, bf16 state; checkpoints across paths ----

cli::GptConfig tiny() {
  cli::GptConfig c;
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

OptimConfig hybrid_config(const std::string& fused) {
  return OptimConfig::from_yaml(
      "optimizer:\n"
      "  name: muonclip\n"
      "  qk_clip: {tau: 0.001}\n"
      "  adamw_lr: 0.01\n"
      "  weight_decay: 0.05\n"
      "  ns_method: plain\n"
      "  normuon: {beta2: 0.9}\n"
      "  state_dtype: bfloat16\n"
      "  grad_clip: 0.5\n"
      "  cautious: true\n"
      "  fused: " +
      fused +
      "\n"
      "  schedule: {name: warmdown, warmup_steps: 2, warmdown_ratio: 0.5}\n"
      "  momentum_schedule: {start: 0.85, target: 0.95, steps: 4}\n"
      "  weight_decay_schedule: cosine\n"
      "  param_groups:\n"
      "    - {name: attention, patterns: ['*.attn.*'], lr_multiplier: 0.5}\n"
      "    - {name: rest, patterns: ['*']}\n");
}

void train_step(cli::Gpt& model, HybridOptimizer& opt, int64_t step) {
  auto gen = seeded(1000 + static_cast<uint64_t>(step));
  const auto tokens = at::randint(0, 32, {4, 8}, gen, at::kLong);
  opt.zero_grad();
  model->loss(tokens, tokens.roll(1, 1)).backward();
  opt.step();
}

std::vector<at::Tensor> weights(cli::Gpt& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(Generic, HybridWithGroupsSchedulesClippingAndQkClipEqualsTheFusedPath) {
  const int64_t steps = 8;
  std::vector<std::vector<at::Tensor>> results;
  std::vector<double> clip_factors;
  for (const char* fused : {"null", "false"}) {
    SCOPED_TRACE(fused);
    const auto config = hybrid_config(fused);
    EXPECT_NE(config.to_yaml().find(std::string("fused: ") + fused), std::string::npos)
        << config.to_yaml();
    at::manual_seed(3);
    cli::Gpt model(tiny());
    auto opt = build_optimizer(*model, config, steps);
    opt->set_qk_clip_source(model.get());
    bool clipped_qk = false;
    for (int64_t s = 0; s < steps; ++s) {
      train_step(model, *opt, s);
      clipped_qk = clipped_qk || !opt->last_step().qk_clip.empty();
      clip_factors.push_back(opt->last_step().clip_factor);
    }
    EXPECT_TRUE(clipped_qk);  // the test exercises QK-clip
    results.push_back(weights(model));
  }
  for (size_t i = 0; i < results[0].size(); ++i) {
    EXPECT_TRUE(same_bits(results[0][i], results[1][i])) << "parameter " << i;
  }
  bool clipped = false;
  for (size_t s = 0; s < static_cast<size_t>(steps); ++s) {
    EXPECT_EQ(clip_factors[s], clip_factors[s + steps]) << s;
    clipped = clipped || clip_factors[s] < 1;
  }
  EXPECT_TRUE(clipped);  // and gradient clipping
}

TEST(Generic, CheckpointsMoveBetweenTheFusedAndGenericPaths) {
  const int64_t K = 3;
  const auto fused = hybrid_config("null");
  const auto generic = hybrid_config("false");
  at::manual_seed(4);
  cli::Gpt straight(tiny());
  auto straight_opt = build_optimizer(*straight, fused, 2 * K);
  straight_opt->set_qk_clip_source(straight.get());
  for (int64_t s = 0; s < 2 * K; ++s) train_step(straight, *straight_opt, s);
  const auto expected = weights(straight);

  for (const auto& [first_config, second_config] :
       {std::pair{&fused, &generic}, std::pair{&generic, &fused}}) {
    at::manual_seed(4);
    cli::Gpt first(tiny());
    auto first_opt = build_optimizer(*first, *first_config, 2 * K);
    first_opt->set_qk_clip_source(first.get());
    for (int64_t s = 0; s < K; ++s) train_step(first, *first_opt, s);
    const auto path = (std::filesystem::temp_directory_path() / "muon_generic_ckpt.pt").string();
    save_checkpoint(path, *first_opt, first.get(), first_config->to_yaml());
    at::manual_seed(5);
    cli::Gpt second(tiny());
    auto second_opt = build_optimizer(*second, *second_config, 2 * K);
    second_opt->set_qk_clip_source(second.get());
    load_checkpoint(path, *second_opt, second.get());
    for (int64_t s = K; s < 2 * K; ++s) train_step(second, *second_opt, s);
    const auto resumed = weights(second);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(same_bits(resumed[i], expected[i])) << "parameter " << i;
    }
  }
}

TEST(Generic, FusedTrueRefusesTensorsOffTheCpu) {
  // The meta device stands in for any non-CPU device here.
  auto meta = at::empty({4, 4}, at::TensorOptions().device(at::kMeta)).requires_grad_(true);
  expect_error<Error>(
      [&] { AdamW({meta}, AdamWOptions().fused(true)); },
      {"AdamW: parameter 0 of param group 0 is on meta", "fused: true runs the fused CPU kernels"});
  expect_error<Error>([&] { Lamb({meta}, LambOptions().fused(true)); }, {"Lamb:", "is on meta"});
  Muon muon({meta}, MuonOptions().fused(true));
  meta.mutable_grad() = at::empty({4, 4}, at::TensorOptions().device(at::kMeta));
  expect_error<Error>([&] { muon.step(); }, {"Muon: parameter 0 of param group 0 is on meta",
                                             "leave fused unset to pick per device"});
  // Unset, the same tensors are accepted: they take the ATen form.
  AdamW accepted({meta});
  EXPECT_EQ(accepted.param_groups()[0].params()[0].device().type(), at::kMeta);
}

}  // namespace
}  // namespace muon
