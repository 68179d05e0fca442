// Same bits at any thread count (docs/algorithms.md §Same bits at any thread count): every
// algorithm of the registry, run by the hybrid optimizer with clipping (and QK-clip), on tensors
// large enough that ATen would split their reductions between threads (over 2^15 elements an
// output), gives the parameters, state and gradient norm of one thread on 2 and 4 threads, on
// both kernel paths.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/adam.h"
#include "muon/algorithms.h"
#include "muon/dion.h"
#include "muon/hybrid.h"
#include "muon/lion.h"
#include "muon/orthogonalize.h"
#include "muon/param_state.h"
#include "muon/reduction.h"

namespace muon {
namespace {

using testing::seeded;

// A block's worth of named tensors: three 512² projections (a batch of three: in lanes and split
// between threads, each matrix's normalization one reduction of 2^18 elements), a tall matrix
// alone in its shape, an expert stack declared by its axes, a norm weight, and an embedding of
// 1024 × 4096 for the others' algorithm (LAMB's trust ratio, clipping's norm: 2^22 elements).
std::vector<NamedParameter> parameters() {
  auto gen = seeded(91);
  const auto make = [&](std::vector<int64_t> shape) {
    return (at::randn(shape, gen) * 0.02).requires_grad_(true);
  };
  return {{"wte.weight", make({1024, 4096}), ""},
          {"blocks.0.attn.q_proj.weight", make({512, 512}), ""},
          {"blocks.0.attn.k_proj.weight", make({512, 512}), ""},
          {"blocks.0.attn.v_proj.weight", make({512, 512}), ""},
          {"blocks.0.mlp.down.weight", make({1024, 256}), ""},
          {"blocks.0.mlp.experts", make({4, 128, 256}), ""},
          {"blocks.0.norm.weight", make({512}), ""}};
}

struct Outcome {
  std::vector<at::Tensor> values;  // each parameter, then its state tensors by name
  std::vector<double> grad_norms;  // of each step
};

// Two steps of `options` on `threads` threads, from the same parameters and gradients.
Outcome run(const HybridOptions& options, int threads) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  const auto named = parameters();
  RoutingRules rules;
  rules.declare_axes("blocks.0.mlp.experts", {"exp", "mlp", "embed"});
  HybridOptimizer opt(route(named, rules), options);
  auto gen = seeded(92);
  Outcome out;
  for (int step = 0; step < 2; ++step) {
    for (const auto& p : named) p.tensor.mutable_grad() = at::randn(p.tensor.sizes(), gen);
    opt.step();
    out.grad_norms.push_back(opt.last_step().grad_norm);
  }
  at::set_num_threads(before);
  for (const auto& p : named) {
    out.values.push_back(p.tensor.detach().clone());
    const auto state = read_param_state(opt, p.tensor).value();
    for (const auto& [name, tensor] : state.tensors) out.values.push_back(tensor.clone());
  }
  return out;
}

// The slot's options on the kernel path `fused` picks.
AlgorithmOptions with_fused(const AlgorithmOptions& slot, const std::optional<bool>& fused) {
  AlgorithmOptions out = slot;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    if (auto* options = out.as<Options>()) options->fused(fused);
  });
  return out;
}

void expect_the_bits_of_one_thread(const std::string& name, HybridOptions options) {
  options.max_grad_norm = 1.0;  // the gradients' norm is ~2000: every step clips
  for (const auto& fused : testing::kernel_paths()) {
    SCOPED_TRACE(name + ", " + testing::path_name(fused));
    auto on_path = options;
    on_path.matrices = with_fused(options.matrices, fused);
    on_path.others = with_fused(options.others, fused);
    const auto one = run(on_path, 1);
    for (const int threads : {2, 4}) {
      SCOPED_TRACE(std::to_string(threads) + " threads");
      const auto many = run(on_path, threads);
      ASSERT_EQ(one.values.size(), many.values.size());
      for (size_t i = 0; i < one.values.size(); ++i) {
        EXPECT_TRUE(at::equal(one.values[i], many.values[i])) << "tensor " << i;
      }
      EXPECT_EQ(one.grad_norms, many.grad_norms);
    }
  }
}

TEST(Threads, EveryAlgorithmAndTheHybridGiveTheBitsOfOneThread) {
  expect_the_bits_of_one_thread("muon, adamw", {MuonOptions(0.02), AdamWOptions(3e-3)});
  expect_the_bits_of_one_thread(
      "muon in bf16 with MuonEq, NorMuon and Muon+; lamb",
      {MuonOptions(0.02)
           .ns_dtype(at::kBFloat16)
           .row_equilibration(true)
           .normuon(NorMuonOptions{})
           .post_norm(PostNorm::row_col)
           .state_dtype(at::kBFloat16)
           .weight_decay(0.1)
           .cautious_weight_decay(true),
       LambOptions(1e-3).weight_decay(0.01)});
  expect_the_bits_of_one_thread(
      "muon with Muon+ frobenius, nadam",
      {MuonOptions(0.02).post_norm(PostNorm::frobenius), AdamOptions(1e-3).nesterov(true)});
  expect_the_bits_of_one_thread(
      "dion, lion in bf16",
      {DionOptions(0.01), LionOptions(1e-4).state_dtype(at::kBFloat16).weight_decay(0.1)});
  expect_the_bits_of_one_thread(
      "muon, adamw, both with int8 state",
      {MuonOptions(0.02).state_dtype(at::kChar), AdamWOptions(3e-3).state_dtype(at::kChar)});
  expect_the_bits_of_one_thread(
      "muon with int8 state, lion with int8 state",
      {MuonOptions(0.02).state_dtype(at::kChar).nesterov(false),
       LionOptions(1e-4).state_dtype(at::kChar).weight_decay(0.1)});
}

// QK-clip after the hybrid's step, on the demo GPT at width 256 (each projection 2^16 elements):
// the model's forward and backward run on one thread, the step on 1, 2 and 4; the maxima the
// model reports and the heads' rescaling give the same bits, as the clipped heads do.
TEST(Threads, QkClipGivesTheBitsOfOneThread) {
  cli::GptConfig config;
  config.n_layers = 1;
  config.d_model = 256;
  config.n_heads = 4;
  config.n_kv_heads = 2;
  config.seq_len = 16;
  config.vocab_size = 64;
  const auto tokens = at::randint(0, 64, {2, 16}, seeded(95));
  const auto run = [&](int threads) {
    at::manual_seed(96);
    cli::Gpt model(config);
    HybridOptions options;
    options.qk_clip_tau = 1e-3;  // every head with statistics is clipped
    options.max_grad_norm = 1.0;
    HybridOptimizer opt(route(*model), options);
    opt.set_qk_clip_source(model.get());
    const int before = at::get_num_threads();
    size_t clipped = 0;
    for (int step = 0; step < 2; ++step) {
      at::set_num_threads(1);
      opt.zero_grad();
      model->loss(tokens, tokens).backward();
      at::set_num_threads(threads);
      opt.step();
      clipped += opt.last_step().qk_clip.size();
    }
    at::set_num_threads(before);
    std::vector<at::Tensor> values;
    for (const auto& p : model->parameters()) values.push_back(p.detach().clone());
    return std::make_pair(values, clipped);
  };
  const auto one = run(1);
  EXPECT_EQ(one.second, 8u);  // 4 query heads, 2 steps
  for (const int threads : {2, 4}) {
    const auto many = run(threads);
    EXPECT_EQ(many.second, one.second);
    for (size_t i = 0; i < one.first.size(); ++i) {
      EXPECT_TRUE(at::equal(one.first[i], many.first[i])) << threads << " threads, tensor " << i;
    }
  }
}

// The reductions themselves: a single output over many blocks (split by ATen on several threads)
// and many outputs (each on one thread in ATen), against fp64 sums written out here.
TEST(Threads, NormsSumInAnOrderFixedByTheData) {
  auto gen = seeded(93);
  const auto x = at::randn({1, 1000, 333}, gen);  // 333000 elements: 20 blocks and a rest
  const auto exact = x.to(at::kDouble).square().sum().sqrt();
  const auto before = at::get_num_threads();
  std::vector<at::Tensor> norms, rows, squares;
  for (const int threads : {1, 2, 4}) {
    at::set_num_threads(threads);
    norms.push_back(vector_norm(x, {-2, -1}, /*keepdim=*/true, at::kFloat));
    rows.push_back(vector_norm(x, {-1}, false, at::kFloat));
    squares.push_back(sum_of_squares(x.flatten(), {0}, false, at::kDouble));
  }
  at::set_num_threads(before);
  EXPECT_EQ(norms[0].sizes(), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(squares[0].dim(), 0);
  EXPECT_NEAR(norms[0].item<double>(), exact.item<double>(), 1e-6 * exact.item<double>());
  EXPECT_NEAR(squares[0].item<double>(), exact.square().item<double>(),
              1e-6 * exact.square().item<double>());
  EXPECT_TRUE(at::allclose(rows[0].to(at::kDouble), x.to(at::kDouble).square().sum(-1).sqrt(),
                           1e-6, 0));
  for (size_t i = 1; i < norms.size(); ++i) {
    EXPECT_TRUE(at::equal(norms[0], norms[i])) << i;
    EXPECT_TRUE(at::equal(rows[0], rows[i])) << i;
    EXPECT_TRUE(at::equal(squares[0], squares[i])) << i;
  }
}

// Newton–Schulz alone on shapes whose products are split between threads — a single 512²
// matrix, an expert stack (lanes and split products), 1024 × 4096 wide and tall — in fp32 and
// bf16 (on bf16 dot products or their emulation).
TEST(Threads, OrthogonalizeGivesTheBitsOfOneThread) {
  auto gen = seeded(94);
  const auto square = at::randn({512, 512}, gen), stack = at::randn({3, 128, 640}, gen);
  const auto wide = at::randn({1024, 4096}, gen);
  const std::vector<std::pair<at::Tensor, NsMethod>> cases{
      {square, NsMethod::symmetric}, {square, NsMethod::plain},   {stack, NsMethod::automatic},
      {stack, NsMethod::symmetric},  {wide, NsMethod::automatic}, {wide.t(), NsMethod::automatic}};
  const auto before = at::get_num_threads();
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const auto& [input, method] : cases) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " + to_string(method) + ", " +
                   c10::str(input.sizes()));
      const auto options = OrthogonalizeOptions().dtype(dtype).method(method);
      at::set_num_threads(1);
      const auto one = orthogonalize(input, options);
      for (const int threads : {2, 4}) {
        at::set_num_threads(threads);
        EXPECT_TRUE(at::equal(one, orthogonalize(input, options))) << threads << " threads";
      }
    }
  }
  at::set_num_threads(before);
}

}  // namespace
}  // namespace muon
