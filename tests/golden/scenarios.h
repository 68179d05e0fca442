// Scenarios whose results were recorded from the code before the optimizers were restructured
// into update rules and one owner of state (tests/golden/record.sh writes tests/data/golden.pt;
// Golden.* compares the current code against it). Each runs a default path a few steps from
// fixed seeds and returns every tensor it produced, by name.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "demo/gpt.h"
#include "muon/adam.h"
#include "muon/config.h"
#include "muon/hybrid.h"
#include "muon/muon.h"
#include "muon/param_state.h"
#include "muon/routing.h"

namespace muon::golden {

using Results = std::map<std::string, at::Tensor>;

inline at::Generator generator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

// Parameters and state of `optimizer` after `steps` steps on fixed random gradients.
inline void record_optimizer(Results& out, const std::string& name,
                             torch::optim::Optimizer& optimizer, std::vector<at::Tensor>& params,
                             int steps, uint64_t seed) {
  auto gen = generator(seed);
  for (int s = 0; s < steps; ++s) {
    for (auto& p : params) p.mutable_grad() = at::randn(p.sizes(), gen).to(p.scalar_type());
    optimizer.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto key = name + "/" + std::to_string(i);
    out[key + "/param"] = params[i].detach().clone();
    if (const auto state = read_param_state(optimizer, params[i])) {
      for (const auto& [tensor, value] : state->tensors) out[key + "/" + tensor] = value.clone();
    }
  }
}

inline std::vector<at::Tensor> matrices(uint64_t seed, at::ScalarType dtype = at::kFloat) {
  auto gen = generator(seed);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{24, 16}, {16, 40}, {32, 32}, {32, 32}}) {
    out.push_back((at::randn(shape, gen) * 0.1).to(dtype).requires_grad_(true));
  }
  return out;
}

inline std::vector<at::Tensor> assorted(uint64_t seed) {
  auto gen = generator(seed);
  std::vector<at::Tensor> out;
  for (auto shape : std::vector<std::vector<int64_t>>{{7}, {3, 5}, {64, 33}, {2, 3, 4}}) {
    out.push_back(at::randn(shape, gen).requires_grad_(true));
  }
  return out;
}

inline cli::GptConfig tiny_gpt() {
  cli::GptConfig c;
  c.n_layers = 2;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.seq_len = 8;
  c.vocab_size = 32;
  return c;
}

// The demo GPT trained `steps` steps by `optimizer` on batches that depend only on the step.
inline void record_training(Results& out, const std::string& name, cli::Gpt& model,
                            HybridOptimizer& optimizer, int steps) {
  for (int s = 0; s < steps; ++s) {
    auto gen = generator(100 + static_cast<uint64_t>(s));
    const auto tokens = at::randint(0, 32, {4, 8}, gen, at::kLong);
    optimizer.zero_grad();
    model->loss(tokens, tokens.roll(1, 1)).backward();
    optimizer.step();
  }
  for (const auto& item : model->named_parameters()) {
    out[name + "/" + item.key()] = item.value().detach().clone();
  }
}

inline Results run_all() {
  Results out;
  {
    auto params = matrices(1);
    Muon opt(params);
    record_optimizer(out, "muon_default", opt, params, 4, 2);
  }
  {
    auto params = matrices(3);
    Muon opt(params, MuonOptions(0.03)
                         .weight_decay(0.1)
                         .coefficients(CoefficientTable::polar_express())
                         .normuon(NorMuonOptions{0.9})
                         .post_norm(PostNorm::row_col)
                         .cautious_weight_decay(true)
                         .state_dtype(at::kBFloat16));
    record_optimizer(out, "muon_variants", opt, params, 4, 4);
  }
  {
    auto params = matrices(5, at::kBFloat16);
    Muon opt(params, MuonOptions().momentum_form(MomentumForm::sum).cautious(true));
    record_optimizer(out, "muon_bf16_params", opt, params, 3, 6);
  }
  {
    auto params = assorted(7);
    AdamW opt(params);
    record_optimizer(out, "adamw_default", opt, params, 4, 8);
  }
  {
    auto params = assorted(9);
    AdamW opt(params, AdamWOptions(3e-3).state_dtype(at::kBFloat16).nesterov(true));
    record_optimizer(out, "adamw_bf16_nadam", opt, params, 4, 10);
  }
  {
    auto params = assorted(11);
    Adam opt(params, AdamOptions(1e-2).weight_decay(0.05).cautious(true));
    record_optimizer(out, "adam_l2_cautious", opt, params, 4, 12);
  }
  {
    auto params = assorted(13);
    Lamb opt(params, LambOptions(1e-2).weight_decay(0.01));
    record_optimizer(out, "lamb", opt, params, 4, 14);
  }
  {
    at::manual_seed(15);
    cli::Gpt model(tiny_gpt());
    HybridOptimizer opt(route(*model), HybridOptions{});
    record_training(out, "hybrid_default", model, opt, 4);
  }
  {
    at::manual_seed(16);
    cli::Gpt model(tiny_gpt());
    const auto config = OptimConfig::from_yaml(
        "optimizer:\n  name: muonclip\n  qk_clip: {tau: 0.001}\n  grad_clip: 0.5\n"
        "  weight_decay: 0.05\n  normuon: true\n  state_dtype: bfloat16\n"
        "  schedule: {name: warmdown, warmup_steps: 2}\n"
        "  momentum_schedule: {start: 0.85, target: 0.95, steps: 3}\n"
        "  param_groups:\n    - {name: attention, patterns: ['*.attn.*'], lr_multiplier: 0.5}\n"
        "    - {name: rest, patterns: ['*']}\n");
    auto opt = build_optimizer(*model, config, 6);
    opt->set_qk_clip_source(model.get());
    record_training(out, "hybrid_config", model, *opt, 5);
  }
  return out;
}

}  // namespace muon::golden
