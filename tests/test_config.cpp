// The YAML configuration: resolution, aliases, round trip, build_optimizer and a table of invalid
// configs, each asserting the key path its error names (docs/design.md §Configuration,
// docs/config.md).
#include "muon/config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>
#include <filesystem>
#include <map>

#include "demo/gpt.h"
#include "helpers.h"
#include "muon/error.h"
#include "muon/presets.h"

namespace muon {
namespace {

TEST(Config, MappingFormResolvesEveryKey) {
  const auto c = OptimConfig::from_yaml(R"(
optimizer:
  name: muon
  lr: 0.03
  adamw_lr: 0.002
  weight_decay: 0.1
  betas: [0.8, 0.95]
  eps: 1.0e-10
  momentum: 0.9
  nesterov: false
  momentum_form: sum
  ns_steps: 6
  ns_coefficients: polar_express
  adjust_lr: match_rms_adamw
  muon_plus: {mode: col_row, eps: 1.0e-6}
  normuon: {beta2: 0.9, axis: row}
  cautious_weight_decay: true
  state_dtype: bfloat16
  grad_clip: 1.0
  nonfinite: error
  schedule: {name: cosine, warmup_steps: 10, end_value: 0.1}
  momentum_schedule: {start: 0.85, target: 0.95, steps: 100}
  weight_decay_schedule: cosine
  routing: {muon: ["*.experts.*"], higher_rank: flatten}
)");
  const auto& h = c.hybrid;
  EXPECT_EQ(c.name, "muon");
  EXPECT_DOUBLE_EQ(h.matrices.get<MuonOptions>().lr(), 0.03);
  EXPECT_DOUBLE_EQ(h.others.get<AdamWOptions>().lr(), 0.002);
  EXPECT_DOUBLE_EQ(h.matrices.get<MuonOptions>().weight_decay(), 0.1);
  EXPECT_EQ(h.others.get<AdamWOptions>().betas(), (Betas{0.8, 0.95}));
  EXPECT_DOUBLE_EQ(h.others.get<AdamWOptions>().eps(), 1e-10);
  EXPECT_DOUBLE_EQ(h.matrices.get<MuonOptions>().momentum(), 0.9);
  EXPECT_FALSE(h.matrices.get<MuonOptions>().nesterov());
  EXPECT_EQ(h.matrices.get<MuonOptions>().momentum_form(), MomentumForm::sum);
  EXPECT_EQ(h.matrices.get<MuonOptions>().ns_steps(), 6);
  EXPECT_EQ(h.matrices.get<MuonOptions>().coefficients().name, "polar_express");
  EXPECT_EQ(h.matrices.get<MuonOptions>().adjust_lr(), AdjustLr::match_rms_adamw);
  EXPECT_EQ(h.matrices.get<MuonOptions>().post_norm(), PostNorm::col_row);
  EXPECT_DOUBLE_EQ(h.matrices.get<MuonOptions>().post_norm_eps(), 1e-6);
  EXPECT_DOUBLE_EQ(h.matrices.get<MuonOptions>().normuon()->beta2, 0.9);
  EXPECT_EQ(h.matrices.get<MuonOptions>().normuon()->axis, NorMuonAxis::row);
  EXPECT_TRUE(h.matrices.get<MuonOptions>().cautious_weight_decay());
  EXPECT_EQ(h.others.get<AdamWOptions>().state_dtype(), at::kBFloat16);
  EXPECT_EQ(h.matrices.get<MuonOptions>().state_dtype(), at::kBFloat16);
  EXPECT_DOUBLE_EQ(*h.max_grad_norm, 1.0);
  EXPECT_EQ(h.nonfinite, NonfinitePolicy::error);
  EXPECT_EQ(h.schedule->kind, ScheduleKind::cosine);
  EXPECT_DOUBLE_EQ(h.schedule->end_value, 0.1);
  EXPECT_EQ(h.momentum_schedule->steps, 100);
  EXPECT_TRUE(h.weight_decay_schedule->cosine);
  EXPECT_EQ(c.routing.muon_patterns, (std::vector<std::string>{"*.experts.*"}));
  EXPECT_EQ(c.routing.higher_rank, HigherRankPolicy::flatten);
}

TEST(Config, ScalarFormRootFlagsAndSpeedtronicAliases) {
  const auto c = OptimConfig::from_yaml("optimizer: muon\nmuon_plus: true\ncautious: true\n");
  EXPECT_EQ(c.hybrid.matrices.get<MuonOptions>().post_norm(), PostNorm::row_col);
  EXPECT_TRUE(c.cautious);
  EXPECT_TRUE(c.hybrid.matrices.get<MuonOptions>().cautious());
  EXPECT_TRUE(c.hybrid.others.get<AdamWOptions>().cautious());
  const auto aliased = OptimConfig::from_yaml(
      "optimizer: {name: muon, muon_momentum: 0.9, muon_ns_steps: 4, muon_plus: true, "
      "muon_norm_eps: 1.0e-5}\n");
  EXPECT_DOUBLE_EQ(aliased.hybrid.matrices.get<MuonOptions>().momentum(), 0.9);
  EXPECT_EQ(aliased.hybrid.matrices.get<MuonOptions>().ns_steps(), 4);
  EXPECT_DOUBLE_EQ(aliased.hybrid.matrices.get<MuonOptions>().post_norm_eps(), 1e-5);
  const auto adamw = OptimConfig::from_yaml("optimizer: adamw\ncautious: true\n");
  EXPECT_FALSE(adamw.hybrid.matrices);  // no matrices slot
  EXPECT_DOUBLE_EQ(adamw.hybrid.others.get<AdamWOptions>().lr(), 1e-3);
  const auto clip = OptimConfig::from_yaml("optimizer: muonclip\n");
  EXPECT_DOUBLE_EQ(*clip.hybrid.qk_clip_tau, 100.0);
}

TEST(Config, ResolvedConfigRoundTrips) {
  const auto first = OptimConfig::from_yaml(R"(
optimizer:
  name: muonclip
  lr: 0.02
  ns_coefficients: [[3.0, -3.2, 1.2], [2.0, -1.5, 0.5]]
  normuon: true
  ns_dtype: float64
  fused: false
  qk_clip: {tau: 50}
  routing: {split_heads: true, outputs: [head.weight]}
  schedule: {name: power, a: 0.1, warmup_steps: 5, tail: {start: 50, steps: 80, end: 0.0}}
  param_groups:
    - {name: no_decay, patterns: ["*.bias", "*norm*"], weight_decay: 0.0}
    - {name: rest, patterns: ["*"], lr_multiplier: 0.5, schedule: {name: warmdown}}
)");
  const auto text = first.to_yaml();
  const auto second = OptimConfig::from_yaml(text);
  EXPECT_EQ(second.to_yaml(), text);
  EXPECT_EQ(second.hybrid.matrices.get<MuonOptions>().coefficients().rows.size(), 2u);
  EXPECT_EQ(second.hybrid.groups.size(), 2u);
  EXPECT_EQ(second.hybrid.schedule->tail->start, 50);
  EXPECT_DOUBLE_EQ(*second.hybrid.qk_clip_tau, 50.0);
  EXPECT_TRUE(second.routing.split_heads);
  EXPECT_EQ(second.routing.output_names, (std::vector<std::string>{"head.weight"}));
  EXPECT_NE(text.find("name: muonclip"), std::string::npos);
  EXPECT_EQ(second.hybrid.matrices.get<MuonOptions>().ns_dtype(), at::kDouble);
  EXPECT_EQ(second.hybrid.others.get<AdamWOptions>().fused(), false);
  EXPECT_EQ(second.hybrid.matrices.get<MuonOptions>().fused(), false);
}

TEST(Config, KeywordArgumentsMergeIntoTheOptimizerSection) {
  // Python's HybridOptimizer(params, config, lr=..., routing=...) merges its keywords this way.
  const auto merged = with_optimizer_keys(
      "optimizer: muon\ncautious: true\n",
      R"({"lr": 0.01, "routing": {"names": false}, "param_groups": [{"name": "g", "patterns": ["*"],
          "weight_decay": 0.0}]})");
  const auto c = OptimConfig::from_yaml(merged);
  EXPECT_EQ(c.name, "muon");
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().lr(), 0.01);
  EXPECT_FALSE(c.routing.use_names);
  EXPECT_TRUE(c.hybrid.matrices.get<MuonOptions>().cautious());
  ASSERT_EQ(c.hybrid.groups.size(), 1u);
  EXPECT_EQ(OptimConfig::from_yaml(c.to_yaml()).to_yaml(), c.to_yaml());  // names written back
  // Mappings merge key by key; a key both set is an error naming it.
  const auto routed = OptimConfig::from_yaml(with_optimizer_keys(
      "optimizer: {routing: {adamw: ['*.gate']}}", R"({"routing": {"names": false}})"));
  EXPECT_EQ(routed.routing.adamw_patterns, (std::vector<std::string>{"*.gate"}));
  EXPECT_FALSE(routed.routing.use_names);
  testing::expect_error<Error>(
      [] { with_optimizer_keys("optimizer: {lr: 0.02}", R"({"lr": 0.01})"); },
      {"optimizer.lr: set both by the configuration and by a keyword argument"});
  testing::expect_error<Error>([] { with_optimizer_keys("[1, 2]", R"({"lr": 0.01})"); },
                               {"config: expected a mapping at the top"});
  EXPECT_EQ(with_optimizer_keys("optimizer: muon\n", "{}"), "optimizer: muon\n");
}

TEST(Config, TotalStepsMayBeUnknownWithoutSchedules) {
  const auto plain = OptimConfig::from_yaml("optimizer: {lr: 0.02}");
  plain.check_steps(0);  // unknown: nothing needs it
  const auto scheduled = OptimConfig::from_yaml("optimizer: {schedule: {name: cosine}}");
  testing::expect_error<Error>(
      [&] { scheduled.check_steps(0); },
      {"total_steps must be > 0 (the run's length, which the configuration's schedules need: "
       "pass the number of steps the run takes), got 0"});
  testing::expect_error<Error>([&] { plain.check_steps(-1); },
                               {"total_steps must be > 0, or 0 when unknown"});
}

TEST(Config, DionStartsFromItsDefaultsAndRoundTrips) {
  const auto first = OptimConfig::from_yaml(R"(
optimizer:
  name: dion
  lr: 0.03
  dion: {rank_fraction: 0.25, rank_multiple_of: 8}
)");
  const auto* d = first.hybrid.matrices.as<DionOptions>();
  ASSERT_NE(d, nullptr);
  EXPECT_DOUBLE_EQ(d->lr(), 0.03);
  EXPECT_DOUBLE_EQ(d->weight_decay(), 0.01);  // Dion's default
  EXPECT_EQ(d->adjust_lr(), AdjustLr::spectral);
  EXPECT_DOUBLE_EQ(d->rank_fraction(), 0.25);
  EXPECT_EQ(d->rank_multiple_of(), 8);
  EXPECT_DOUBLE_EQ(d->epsilon(), 1e-8);
  const auto text = first.to_yaml();
  EXPECT_NE(text.find("name: dion"), std::string::npos);
  EXPECT_NE(text.find("dion:\n    lr: 0.03"), std::string::npos) << text;  // Dion's section
  EXPECT_EQ(text.find("ns_steps"), std::string::npos) << text;             // and not Muon's
  const auto second = OptimConfig::from_yaml(text);
  EXPECT_EQ(second.to_yaml(), text);
  EXPECT_EQ(second.hybrid.matrices.as<DionOptions>()->rank_multiple_of(), 8);
  // The key alone turns Dion on from Muon's settings, as when it was a Muon option (`true` takes
  // the rank defaults); the momentum settings such configurations stated are Dion's own.
  const auto plain = OptimConfig::from_yaml(
      "optimizer: {name: muon, nesterov: false, momentum_form: sum, dion: true}\n");
  const auto* p = plain.hybrid.matrices.as<DionOptions>();
  ASSERT_NE(p, nullptr);
  EXPECT_DOUBLE_EQ(p->rank_fraction(), 1.0);
  EXPECT_DOUBLE_EQ(p->lr(), 0.02);  // Muon's
  EXPECT_EQ(p->adjust_lr(), AdjustLr::original);
}

// Configurations and runs written when Dion was a Muon setting: the muon section holds Dion's
// settings beside Muon's at their defaults (what to_yaml wrote then), its `dion` key the rank's.
TEST(Config, DionAsTheMuonSettingOfEarlierVersionsReads) {
  const auto old = OptimConfig::from_yaml(R"(
optimizer:
  name: dion
  muon: {lr: 0.02, momentum: 0.9, nesterov: false, weight_decay: 0.0, ns_steps: 5,
         coefficients: quintic, momentum_form: sum, adjust_lr: spectral, normuon: null,
         state_dtype: float32, dion: {rank_fraction: 0.5, rank_multiple_of: 1, epsilon: 1.0e-8}}
)");
  const auto* d = old.hybrid.matrices.as<DionOptions>();
  ASSERT_NE(d, nullptr);
  EXPECT_DOUBLE_EQ(d->lr(), 0.02);
  EXPECT_DOUBLE_EQ(d->momentum(), 0.9);
  EXPECT_DOUBLE_EQ(d->weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(d->rank_fraction(), 0.5);
  // At the top of the section too: what says what Dion does reads, naming nothing.
  const auto top = OptimConfig::from_yaml(
      "optimizer: {name: dion, ns_steps: 5, coefficients: quintic, row_equilibration: false, "
      "muon_plus: false, muon_norm_eps: 1.0e-8, normuon: null, ns_eps: null, gram_restarts: null, "
      "nesterov: false, momentum_form: sum, state_dtype: float32}\n");
  EXPECT_EQ(top.to_yaml(), OptimConfig::from_yaml("optimizer: dion\n").to_yaml());
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: dion, coefficients: polar_express}\n"); },
      {"optimizer.coefficients: dion (the matrices' algorithm) has no coefficients"});
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: dion, muon_plus: {mode: row}}\n"); },
      {"optimizer.muon_plus: dion (the matrices' algorithm) has no Muon+ (post_norm)"});
  // Under Muon, earlier versions wrote `dion: null` in the muon section.
  const auto muon = OptimConfig::from_yaml("optimizer: {muon: {lr: 0.03, dion: null}}\n");
  EXPECT_DOUBLE_EQ(muon.hybrid.matrices.get<MuonOptions>().lr(), 0.03);
  // A Muon setting Dion would not read, at another value than Muon's default: refused.
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: dion, muon: {ns_steps: 7}}\n"); },
      {"optimizer.muon.ns_steps: dion (the matrices' algorithm) has no ns_steps"});
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: dion, muon: {nesterov: true}}\n"); },
      {"optimizer.muon.nesterov: dion (the matrices' algorithm) has no nesterov"});
}

// The presets are one table (muon/presets.h): torch.optim.Muon's constructor defaults
// (torch/optim/_muon.py: lr 1e-3, weight_decay 0.1, eps 1e-7), Dion's (its own defaults) and
// nanochat's, read by the optimizer name dion and `preset:`, whose settings the keys given then
// override.
TEST(Config, PresetsAreOneTableThatTheKeysOverride) {
  const auto& torch = muon_preset("torch").muon();
  EXPECT_DOUBLE_EQ(torch.lr(), 1e-3);
  EXPECT_DOUBLE_EQ(torch.weight_decay(), 0.1);
  EXPECT_EQ(torch.ns_eps(), std::optional<double>(1e-7));
  EXPECT_TRUE(torch.nesterov());
  EXPECT_EQ(torch.coefficients(), CoefficientTable::quintic());
  EXPECT_EQ(muon_preset_names(), "torch, dion, nanochat");
  testing::expect_error<Error>(
      [] { muon_preset("jax"); },
      {"unknown Muon preset 'jax'; valid presets are torch, dion, nanochat"});
  testing::expect_error<Error>([] { muon_preset("dion").muon(); },
                               {"the preset dion runs dion, not Muon"});

  // A preset sets what differs from the defaults and leaves the rest as it was.
  auto mine = MuonOptions().state_dtype(at::kBFloat16).ns_steps(7);
  apply_muon_preset(muon_preset("torch").muon(), mine);
  EXPECT_EQ(mine.state_dtype(), at::kBFloat16);
  EXPECT_EQ(mine.ns_steps(), 7);
  EXPECT_DOUBLE_EQ(mine.lr(), 1e-3);
  // The preset dion is Dion's defaults, which `preset: {name: dion}` puts on the matrices.
  const auto dion = OptimConfig::from_yaml("optimizer: {preset: {name: dion}, lr: 0.05}\n");
  ASSERT_NE(dion.hybrid.matrices.as<DionOptions>(), nullptr);
  EXPECT_DOUBLE_EQ(dion.hybrid.matrices->get_lr(), 0.05);
  EXPECT_DOUBLE_EQ(group_settings(*dion.hybrid.matrices).at("weight_decay"), 0.01);
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: dion, preset: {name: torch}}\n"); },
      {"optimizer.preset: the preset torch sets Muon's settings, but the matrices run dion"});

  // In a configuration: the preset's settings, then the keys given; param_groups may stand beside
  // a preset that sets no groups.
  const auto c = OptimConfig::from_yaml(R"(
optimizer:
  preset: {name: torch}
  momentum: 0.9
  param_groups: [{name: all, patterns: ['*']}]
)");
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().lr(), 1e-3);
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().weight_decay(), 0.1);
  EXPECT_EQ(c.hybrid.matrices.get<MuonOptions>().ns_eps(), std::optional<double>(1e-7));
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().momentum(), 0.9);
  EXPECT_DOUBLE_EQ(c.hybrid.others.get<AdamWOptions>().lr(),
                   AdamWOptions().lr());  // Muon's settings only
  EXPECT_EQ(c.hybrid.groups.size(), 1u);
  const auto overridden = OptimConfig::from_yaml("optimizer: {preset: {name: torch}, lr: 0.05}\n");
  EXPECT_DOUBLE_EQ(overridden.hybrid.matrices.get<MuonOptions>().lr(), 0.05);
  // nanochat's matrices: the table's entry, scaled by nanochat_preset's settings.
  const auto n = OptimConfig::from_yaml("optimizer: {preset: {name: nanochat}}\n");
  const auto& table = muon_preset("nanochat").muon();
  EXPECT_DOUBLE_EQ(n.hybrid.matrices.get<MuonOptions>().lr(), table.lr());
  EXPECT_DOUBLE_EQ(n.hybrid.matrices.get<MuonOptions>().weight_decay(), table.weight_decay());
  EXPECT_EQ(n.hybrid.matrices.get<MuonOptions>().coefficients(), CoefficientTable::polar_express());
  EXPECT_TRUE(n.hybrid.matrices.get<MuonOptions>().cautious_weight_decay());
  EXPECT_DOUBLE_EQ(n.hybrid.matrices.get<MuonOptions>().normuon()->beta2, 0.9);
  EXPECT_DOUBLE_EQ(OptimConfig::from_yaml("optimizer: {preset: {name: nanochat}, lr: 0.04}\n")
                       .hybrid.matrices.get<MuonOptions>()
                       .lr(),
                   0.04);
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {name: adamw, preset: {name: torch}}\n"); },
      {"optimizer.preset: the torch preset (Muon's settings)"});
}

// The optimizer names are one list: each is accepted and means what apply_optimizer_name says;
// an unknown one is refused naming all of them.
TEST(Config, OptimizerNamesAreOneList) {
  std::string listed;
  for (const auto& n : optimizer_names()) {
    const auto c = OptimConfig::from_yaml(std::string("optimizer: ") + n.name + "\n");
    EXPECT_EQ(c.name, n.name);
    EXPECT_EQ(!c.hybrid.matrices, c.name == "adamw");
    EXPECT_EQ(c.hybrid.matrices.as<DionOptions>() != nullptr, c.name == "dion");
    EXPECT_EQ(c.hybrid.qk_clip_tau,
              c.name == "muonclip" ? std::optional<double>(100.0) : std::nullopt);
    listed += (listed.empty() ? "" : ", ") + std::string(n.name);
  }
  EXPECT_EQ(optimizer_name_list(), listed);
  testing::expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: lion\n"); },
      {"optimizer.name: unknown optimizer 'lion'; valid optimizers are " + listed});
  // muonclip's tau is its default only: a qk_clip key sets it.
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {name: muonclip, qk_clip: {tau: 30}}\n")
                .hybrid.qk_clip_tau,
            std::optional<double>(30.0));
}

TEST(Config, BuildOptimizerAppliesGroupsRoutingAndSchedule) {
  cli::GptConfig g;
  g.n_layers = 1;
  g.d_model = 16;
  g.n_heads = 2;
  g.n_kv_heads = 1;
  g.seq_len = 8;
  g.vocab_size = 32;
  cli::Gpt model(g);
  const auto config = OptimConfig::from_yaml(R"(
optimizer:
  name: muon
  lr: 0.02
  adamw_lr: 0.004
  preset: {name: mup, width_multiplier: 2}
  routing: {adamw: ["*.mlp.*"]}
  schedule: {name: linear, warmup_steps: 4}
)");
  auto opt = build_optimizer(*model, config, 20);
  for (const auto& row : opt->report()) {
    if (row.name == "blocks.0.mlp.up_proj.weight") {
      EXPECT_EQ(row.role, Role::others);
      EXPECT_EQ(row.group, "mup");
      EXPECT_DOUBLE_EQ(row.lr, 0.002);
    }
    if (row.name == "blocks.0.attn.q_proj.weight") EXPECT_DOUBLE_EQ(row.lr, 0.01);
  }
  for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
  opt->step();  // step 0 of a 4-step warmup: rate 0
  for (const auto& group : opt->param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.0);
  testing::expect_error<Error>([&] { build_optimizer(*model, config, 0); },
                               {"total_steps must be > 0"});
}

TEST(Config, ScalingRulesMultiplyRatesAndDecay) {
  const auto c = OptimConfig::from_yaml(R"(
optimizer:
  lr: 0.02
  adamw_lr: 0.004
  weight_decay: 0.2
  scaling: {batch_tokens: 2097152, d_model: 3072, training_tokens: 2.0e9, reference_tokens: 1.0e9}
)");
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().lr(), 0.04);  // × √4
  EXPECT_DOUBLE_EQ(c.hybrid.others.get<AdamWOptions>().lr(), 0.004);  // × √4 × (3072/768)^-0.5
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().weight_decay(), 0.2);  // × √4 × 1e9/2e9
}

struct Invalid {
  const char* yaml;
  const char* fragment;  // the key path and rule the message must contain
};

TEST(Config, InvalidConfigsNameTheirKeyPath) {
  const Invalid cases[] = {
      {"optimizer: {learning_rate: 0.1}",
       "optimizer.learning_rate: unknown key; did you mean 'lr'?"},
      {"optimizer: {nestrov: true}", "optimizer.nestrov: unknown key; did you mean 'nesterov'?"},
      {"optimizer: {lr: [1, 2]}", "optimizer.lr: expected a number, got a list"},
      {"optimizer: {lr: fast}", "optimizer.lr: expected a number, got 'fast'"},
      {"optimizer: {lr: 0}", "optimizer.lr must be > 0, got 0"},
      {"optimizer: {lr: -0.1}", "optimizer.lr must be > 0"},
      {"optimizer: {lr: .nan}", "optimizer.lr: must be finite"},
      {"optimizer: {adamw_lr: .inf}", "optimizer.adamw_lr: must be finite"},
      {"optimizer: {betas: [0.9, 1.0]}", "optimizer.betas[1] must be in [0, 1), got 1"},
      {"optimizer: {betas: [-0.1, 0.9]}", "optimizer.betas[0] must be in [0, 1)"},
      {"optimizer: {betas: [0.9]}", "optimizer.betas: expected [beta1, beta2]"},
      {"optimizer: {eps: 0}", "optimizer.eps must be > 0, got 0"},
      {"optimizer: {weight_decay: -1}", "optimizer.weight_decay must be >= 0, got -1"},
      {"optimizer: {grad_clip: 0}", "optimizer.grad_clip must be > 0"},
      {"optimizer: {momentum: 1.0}", "optimizer.momentum must be in [0, 1), got 1"},
      {"optimizer: {muon_momentum: -0.5}", "optimizer.momentum must be in [0, 1)"},
      {"optimizer: {ns_steps: 0}", "optimizer.ns_steps must be a whole number in [1, 1000]"},
      {"optimizer: {ns_steps: 2.5}", "optimizer.ns_steps must be a whole number in [1, 1000]"},
      {"optimizer: {preset: {name: nanochat, d_model: 8, embedding_lr: 0}}",
       "optimizer.preset.embedding_lr must be > 0, got 0"},
      {"optimizer: {routing: {[a]: 1}}", "optimizer.routing: a key must be a name, got a list"},
      {"optimizer: {ns_steps: 1.0e20}",
       "optimizer.ns_steps must be a whole number in [1, 1000], got 1e+20"},
      {"optimizer: {momentum_schedule: {steps: 1.0e21}}",
       "optimizer.momentum_schedule.steps: 1.0e21 is too large (whole numbers up to 2^53 are "
       "valid)"},
      {"optimizer: {name: adamw, muon_plus: true}",
       "optimizer.muon_plus: Muon+ needs name muon or muonclip"},
      {"optimizer: adamw\nmuon_plus: true", "Muon+ needs name muon or muonclip, not 'adamw'"},
      {"optimizer: {name: sgd}",
       "optimizer.name: unknown optimizer 'sgd'; valid optimizers are muon, muonclip, dion, "
       "adamw"},
      {"optimizer: lion", "unknown optimizer 'lion'"},
      {"optimizer: {muon_plus: false}\nmuon_plus: true",
       "muon_plus: the root value true conflicts with optimizer.muon_plus false"},
      {"optimizer: {cautious: true}\ncautious: false",
       "cautious: the root value false conflicts with optimizer.cautious true"},
      {"optimizer: {state_dtype: float16}",
       "optimizer.state_dtype: expected float32, bfloat16 or int8, got 'float16'"},
      {"optimizer: {ns_dtype: float16}",
       "optimizer.ns_dtype: expected float32, bfloat16 or float64 (or null: per device), got "
       "'float16'"},
      {"optimizer: {nonfinite: drop}",
       "optimizer.nonfinite: unknown nonfinite policy 'drop'; valid policies are skip, error, "
       "ignore"},
      {"optimizer: {momentum_form: adam}", "optimizer.momentum_form: expected ema or sum"},
      {"optimizer: {adjust_lr: sqrt}", "optimizer.adjust_lr: unknown mode 'sqrt'"},
      {"optimizer: {ns_coefficients: cubic}",
       "optimizer.ns_coefficients: unknown coefficient table 'cubic'"},
      {"optimizer: {ns_coefficients: [[1, 2]]}",
       "optimizer.ns_coefficients[0]: expected [a, b, c]"},
      {"optimizer: {ns_method: fastest}",
       "optimizer.ns_method: unknown orthogonalization method 'fastest'"},
      {"optimizer: {muon_plus: {mode: rows}}",
       "optimizer.muon_plus.mode: unknown muon_plus mode 'rows'"},
      {"optimizer: {muon_plus: {mode: row, epsilon: 1}}",
       "optimizer.muon_plus.epsilon: unknown key; did you mean 'eps'?"},
      {"optimizer: {normuon: {beta2: 1.5}}", "optimizer.normuon.beta2 must be in [0, 1)"},
      {"optimizer: {normuon: {axis: diagonal}}",
       "optimizer.normuon.axis: unknown NorMuon axis 'diagonal'"},
      {"optimizer: {name: dion, dion: {rank_fraction: 2}}",
       "optimizer.dion.rank_fraction must be in (0, 1]"},
      {"optimizer: {name: dion, dion: {rank: 2}}", "optimizer.dion.rank: unknown key"},
      {"optimizer: {dion: true, nesterov: true}",
       "optimizer.nesterov: dion (the matrices' algorithm) has no nesterov"},
      {"optimizer: {name: dion, normuon: true}",
       "optimizer.normuon: dion (the matrices' algorithm) has no normuon"},
      {"optimizer: {name: dion, dion: false}",
       "optimizer.dion: false turns Dion off, but name dion runs it"},
      {"optimizer: {name: dion, state_dtype: bfloat16}",
       "optimizer.state_dtype: dion (the matrices' algorithm) has no bfloat16 state"},
      {"optimizer: {name: dion, muon_plus: true}",
       "optimizer.muon_plus: dion (the matrices' algorithm) has no Muon+ (post_norm)"},
      {"optimizer: {qk_clip: {tau: 0}}", "optimizer.qk_clip.tau must be > 0"},
      {"optimizer: {name: adamw, qk_clip: {tau: 10}}",
       "optimizer.qk_clip: QK-clip needs name muon or muonclip"},
      {"optimizer: {schedule: {warmup_steps: 5}}",
       "optimizer.schedule.name: a schedule needs a name"},
      {"optimizer: {schedule: {name: step}}", "optimizer.schedule.name: unknown schedule 'step'"},
      {"optimizer: {schedule: {name: cosine, warmup_steps: -1}}",
       "optimizer.schedule.warmup_steps must be >= 0"},
      {"optimizer: {schedule: {name: cosine, tail: {start: 3}}}",
       "optimizer.schedule.tail: only the power schedule has a tail"},
      {"optimizer: {schedule: {name: warmdown, shape: square}}",
       "optimizer.schedule.shape: expected linear or cosine"},
      {"optimizer: {momentum_schedule: {target: 1.2}}",
       "optimizer.momentum_schedule: momentum schedule: start and target must be in [0, 1)"},
      {"optimizer: {weight_decay_schedule: linear}",
       "optimizer.weight_decay_schedule: expected constant or cosine"},
      {"optimizer: {param_groups: {name: a}}",
       "optimizer.param_groups: expected a list, got a mapping"},
      {"optimizer: {param_groups: [{patterns: ['*']}]}",
       "optimizer.param_groups[0].name: a parameter group needs a name"},
      {"optimizer: {param_groups: [{name: a}]}",
       "optimizer.param_groups[0].patterns: a parameter group needs patterns"},
      {"optimizer: {param_groups: [{name: a, patterns: ['*'], lr_multiplier: 0}]}",
       "optimizer.param_groups[0].lr_multiplier must be > 0"},
      {"optimizer: {param_groups: [{name: a, patterns: ['*']}, {name: a, patterns: ['*']}]}",
       "optimizer.param_groups: param_groups[1] ('a'): duplicate group name 'a'"},
      {"optimizer: {param_groups: [{name: a, patterns: ['*'], momentun: 0.9}]}",
       "optimizer.param_groups[0].momentun: unknown key; did you mean 'momentum'?"},
      {"optimizer: {preset: {name: mup}, param_groups: [{name: a, patterns: ['*']}]}",
       "optimizer.preset: the preset mup sets the parameter groups; give either it or "
       "param_groups, not both"},
      {"optimizer: {preset: {name: gpt3}}",
       "optimizer.preset.name: unknown preset 'gpt3'; valid presets are mup, torch, dion, "
       "nanochat"},
      {"optimizer: {preset: {name: mup, width_multiplier: 0}}",
       "optimizer.preset.width_multiplier must be > 0"},
      {"optimizer: {preset: {name: nanochat, d_model: 0}}", "optimizer.preset.d_model must be > 0"},
      {"optimizer: {routing: {muon: '*'}}", "optimizer.routing.muon: expected a list of strings"},
      {"optimizer: {routing: {higher_rank: reshape}}",
       "optimizer.routing.higher_rank: unknown higher_rank policy 'reshape'"},
      {"optimizer: {scaling: {batch_tokens: 0}}", "optimizer.scaling.batch_tokens must be > 0"},
      {"optimizer: {nesterov: maybe}", "optimizer.nesterov: expected true or false, got 'maybe'"},
      {"optimiser: muon", "optimiser: unknown key; did you mean 'optimizer'?"},
      {"name: muon\nlr: 0.02\n",
       "config: name, lr are keys of the optimizer section, found at the top level; put them "
       "under `optimizer:` (optimizer: {name: muon, lr: 0.02}; docs/config.md)"},
      {"optimizer: muon\nadamw_lr: 0.003\n",
       "config: adamw_lr is a key of the optimizer section, found at the top level; put it under "
       "`optimizer:`"},
      {"optimizer: {routing: {outputs: head}}",
       "optimizer.routing.outputs: expected a list of strings"},
      {"- just\n- a list", ": expected a mapping, got a list"},
      {"optimizer: {lr: 0.1\n", "config: invalid YAML at line"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    testing::expect_error<Error>([&] { OptimConfig::from_yaml(c.yaml); }, {c.fragment});
  }
  EXPECT_GE(std::size(cases), 30u);
}

// What the optimizer reads of `c`: all of it, but under name adamw Muon's section and the routing.
std::string used_settings(const OptimConfig& c) {
  auto root = YAML::Load(c.to_yaml());
  if (!c.hybrid.matrices) {
    root["optimizer"].remove("muon");
    root["optimizer"].remove("routing");
  }
  return YAML::Dump(root);
}

// Every flat key under every optimizer name: of two different values, each is refused naming
// the key (or the option it sets), or the two resolve to different configs. A key both values
// leave at the same resolved config would be silently dropped.
TEST(Config, NoKeyIsSilentlyDropped) {
  const std::map<std::string, std::pair<std::string, std::string>> values = {
      {"weight_decay", {"0.3", "0.4"}},
      {"weight_decay_method", {"independent", "palm"}},
      {"betas", {"[0.5, 0.6]", "[0.7, 0.8]"}},
      {"eps", {"1e-5", "1e-6"}},
      {"momentum", {"0.5", "0.6"}},
      {"nesterov", {"true", "false"}},
      {"momentum_form", {"sum", "ema"}},
      {"ns_coefficients", {"quintic", "polar_express"}},
      {"ns_eps", {"1e-6", "1e-5"}},
      {"row_equilibration", {"true", "false"}},
      {"ns_dtype", {"float64", "bfloat16"}},
      {"ns_method", {"plain", "symmetric"}},
      {"gram_restarts", {"[2]", "[3]"}},
      {"gram_coefficients", {"[[3, -3.2, 1.2]]", "[[2, -1.5, 0.5]]"}},
      {"adjust_lr", {"spectral", "none"}},
      {"normuon", {"true", "false"}},
      {"dion", {"{rank_fraction: 0.5}", "{rank_fraction: 0.25}"}},  // Dion's settings
      {"cautious_weight_decay", {"true", "false"}},
      {"fused", {"true", "false"}},
      {"ns_steps", {"3", "7"}},
  };
  auto keys = config_schema("shorthand");
  keys.push_back({"ns_steps", "muon_ns_steps", "", "sets muon.ns_steps", "", ""});
  keys.push_back({"dion", "", "", "sets dion.rank_fraction", "", ""});
  int refused = 0, applied = 0;
  for (const char* name : {"muon", "muonclip", "dion", "adamw"}) {
    for (const auto& row : keys) {
      ASSERT_TRUE(values.count(row.key)) << "no test values for the shorthand " << row.key;
      // "sets muon.X[ and adamw.X]": X, the option an error may name instead of the key.
      const auto dot = row.doc.find('.') + 1;
      const auto option = row.doc.substr(dot, row.doc.find(' ', dot) - dot);
      for (const auto& key : {row.key, row.alias}) {
        if (key.empty()) continue;
        SCOPED_TRACE(std::string(name) + " × " + key);
        std::vector<std::string> resolved;
        for (const auto& value : {values.at(row.key).first, values.at(row.key).second}) {
          const auto yaml =
              "optimizer: {name: " + std::string(name) + ", " + key + ": " + value + "}\n";
          try {
            resolved.push_back(used_settings(OptimConfig::from_yaml(yaml)));
          } catch (const Error& e) {
            const std::string message = e.what();
            EXPECT_TRUE(message.find(key) != std::string::npos ||
                        message.find(option) != std::string::npos)
                << yaml << message;
            ++refused;
          }
        }
        if (resolved.size() == 2) {
          EXPECT_NE(resolved[0], resolved[1]) << "silently dropped";
          ++applied;
        }
      }
    }
  }
  EXPECT_GT(refused, 20);
  EXPECT_GT(applied, 40);
}

TEST(Config, WhatNameAdamwCannotUseIsRefusedOrAppliedToAdamW) {
  // AdamW has a nesterov of its own (NAdam's look-ahead): under name adamw the flat key sets it.
  const auto nadam = OptimConfig::from_yaml("optimizer: {name: adamw, nesterov: true}\n");
  EXPECT_TRUE(nadam.hybrid.others.get<AdamWOptions>().nesterov());
  EXPECT_FALSE(OptimConfig::from_yaml("optimizer: {name: muon, nesterov: true}\n")
                   .hybrid.others.get<AdamWOptions>()
                   .nesterov());  // under muon it stays Muon's, as it always was
  const auto adamw = OptimConfig::from_yaml("optimizer: {name: adamw, adamw_lr: 0.004}\n");
  EXPECT_DOUBLE_EQ(adamw.hybrid.others.get<AdamWOptions>().lr(), 0.004);
  const auto written = adamw.to_yaml();
  EXPECT_EQ(written.find("muon:"), std::string::npos) << written;
  EXPECT_EQ(written.find("routing:"), std::string::npos) << written;
  EXPECT_EQ(OptimConfig::from_yaml(written).to_yaml(), written);
  const std::string tail =
      " would do nothing: name adamw trains every parameter with AdamW. Remove it, or choose "
      "name muon to train the hidden matrices with Muon";
  const struct {
    const char* yaml;
    std::string message;
  } cases[] = {
      {"optimizer: {name: adamw, momentum: 0.9}", "optimizer.momentum: Muon's momentum" + tail},
      {"optimizer: {name: adamw, muon_momentum: 0.9}", "optimizer.muon_momentum: Muon's momentum"},
      {"optimizer: {name: adamw, ns_steps: 7}", "optimizer.ns_steps: Muon's ns_steps" + tail},
      {"optimizer: {name: adamw, coefficients: quintic}",
       "optimizer.coefficients: Muon's coefficients"},
      {"optimizer: {name: adamw, lr: 0.01, adamw_lr: 0.002}",
       "optimizer.lr: Muon's rate (adamw_lr is AdamW's, and lr is too when alone)" + tail},
      {"optimizer: {name: adamw, muon: {lr: 0.05}}", "optimizer.muon: Muon's section" + tail},
      {"optimizer: {name: adamw, momentum_schedule: {start: 0.85}}",
       "optimizer.momentum_schedule: Muon's momentum schedule" + tail},
      {"optimizer: {name: adamw, routing: {muon: ['*']}}",
       "optimizer.routing: routing between Muon and AdamW" + tail},
      {"optimizer: {name: adamw, param_groups: [{name: a, patterns: ['*'], momentum: 0.9}]}",
       "optimizer.param_groups[0].momentum: Muon's momentum" + tail},
      {"optimizer: {name: adamw, preset: {name: nanochat}}",
       "optimizer.preset: the nanochat preset (Muon's recipe for the matrices, AdamW's for the "
       "rest)" +
           tail},
      {"optimizer: {name: dion, ns_steps: 7}",
       "optimizer.ns_steps: dion (the matrices' algorithm) has no ns_steps; remove it, or choose "
       "name muon"},
      {"optimizer: {name: dion, muon: {coefficients: polar_express}}",
       "optimizer.muon.coefficients: dion (the matrices' algorithm) has no coefficients"},
      {"optimizer: {name: muon, ns_method: plain, gram_restarts: [2]}",
       "Muon: gram_restarts would do nothing: ns_method plain never runs the Gram iteration; "
       "choose gram or automatic, or leave gram_restarts unset"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    testing::expect_error<Error>([&] { OptimConfig::from_yaml(c.yaml); }, {c.message});
  }
}

// The partition: `matrices` (muon or dion) and `others` (any elementwise algorithm) with its own
// section; the keys that set the other parameters' settings (adamw_lr, shorthands, state_dtype)
// reach that algorithm; the resolved config round-trips.
TEST(Config, PartitionChoosesTheOthersAlgorithm) {
  const auto first = OptimConfig::from_yaml(R"(
optimizer:
  matrices: dion
  others: lion
  adamw_lr: 3.0e-5
  betas: [0.95, 0.98]
  weight_decay: 0.2
  lion: {fused: false, state_dtype: bfloat16}
)");
  EXPECT_EQ(first.name, "dion");
  EXPECT_NE(first.hybrid.matrices.as<DionOptions>(), nullptr);
  ASSERT_TRUE(first.hybrid.others);
  const auto* lion = dynamic_cast<const LionOptions*>(&*first.hybrid.others);
  ASSERT_NE(lion, nullptr);
  EXPECT_DOUBLE_EQ(lion->lr(), 3e-5);
  EXPECT_EQ(lion->betas(), Betas(0.95, 0.98));
  EXPECT_DOUBLE_EQ(lion->weight_decay(), 0.2);
  EXPECT_DOUBLE_EQ(group_settings(*first.hybrid.matrices).at("weight_decay"), 0.2);
  EXPECT_EQ(lion->state_dtype(), at::kBFloat16);
  EXPECT_EQ(lion->fused(), false);
  const auto text = first.to_yaml();
  EXPECT_NE(text.find("others: lion"), std::string::npos) << text;
  EXPECT_EQ(text.find("\n  adamw:"), std::string::npos) << text;  // routing has its own key
  const auto second = OptimConfig::from_yaml(text);
  EXPECT_EQ(second.to_yaml(), text);
  // Lion's own defaults where nothing sets them; adam and lamb likewise.
  const auto defaults = OptimConfig::from_yaml("optimizer: {others: lion}\n");
  EXPECT_DOUBLE_EQ(defaults.hybrid.others->get_lr(), LionOptions().lr());
  EXPECT_EQ(defaults.name, "muon");
  const auto bf16 = OptimConfig::from_yaml("optimizer: {others: lion, state_dtype: bfloat16}\n");
  EXPECT_EQ(dynamic_cast<const LionOptions&>(*bf16.hybrid.others).state_dtype(), at::kBFloat16);
  EXPECT_EQ(bf16.hybrid.matrices.get<MuonOptions>().state_dtype(), at::kBFloat16);
  for (const char* name : {"adam", "lamb"}) {
    const auto c = OptimConfig::from_yaml(std::string("optimizer: {others: ") + name + "}\n");
    EXPECT_STREQ(algorithm_name(*c.hybrid.others), name);
  }
  // others: adamw is the default, said out loud: nothing changes.
  const auto adamw = OptimConfig::from_yaml("optimizer: {matrices: muon, others: adamw}\n");
  EXPECT_STREQ(algorithm_name(*adamw.hybrid.others), "adamw");
  EXPECT_EQ(adamw.to_yaml(), OptimConfig::from_yaml("optimizer: muon\n").to_yaml());
}

TEST(Config, PartitionErrorsNameTheKey) {
  const struct {
    const char* yaml;
    std::string message;
  } cases[] = {
      {"optimizer: {others: muon}",
       "optimizer.others: 'muon' is not an algorithm that can run here; valid are adamw, adam, "
       "lamb, lion"},
      {"optimizer: {others: sgd}", "optimizer.others: 'sgd' is not an algorithm"},
      {"optimizer: {matrices: lion}",
       "optimizer.matrices: 'lion' does not orthogonalize matrices; valid are muon, dion"},
      {"optimizer: {name: muon, matrices: dion}",
       "optimizer.matrices: name sets the matrices' algorithm too; give one of them"},
      {"optimizer: {name: adamw, others: lion}",
       "optimizer.others: the others' algorithm would do nothing: name adamw trains every "
       "parameter with AdamW"},
      {"optimizer: {others: lion, adamw: {lr: 0.001}}",
       "optimizer.adamw: adamw trains nothing here: the parameters Muon does not take run lion; "
       "set others: adamw to train them with adamw"},
      {"optimizer: {lion: {lr: 0.001}}", "optimizer.lion: lion trains nothing here"},
      {"optimizer: {others: lion, eps: 1.0e-6}",
       "optimizer.eps: lion (the others' algorithm) has no eps; remove it"},
      {"optimizer: {others: lion, weight_decay_method: independent}",
       "optimizer.weight_decay_method: lion (the others' algorithm) has no weight_decay_method; "
       "set Muon's alone in the muon section (muon: {weight_decay_method: ...})"},
      {"optimizer: {others: lion, cautious: true}",
       "optimizer.cautious: lion (the others' algorithm) has no cautious masking"},
      {"optimizer: {others: lion, lion: {lr: -1}}", "optimizer.lion.lr"},
      {"optimizer: {others: lion, preset: {name: nanochat}}",
       "optimizer.preset: the nanochat preset is AdamW's recipe for the parameters Muon does not "
       "take (its groups' rates, betas and eps), not lion's; remove others, or give param_groups "
       "of your own"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    testing::expect_error<Error>([&] { OptimConfig::from_yaml(c.yaml); }, {c.message});
  }
}

// Values quoted in messages come from users' files: a control character or a byte that is not
// UTF-8 is written escaped, so the message is neither cut at a NUL nor undecodable.
TEST(Config, ValuesInMessagesAreWrittenReadably) {
  const Invalid cases[] = {
      {"optimizer: \"\\x85\"", "optimizer.name: unknown optimizer '\\u0085'; valid optimizers"},
      {"optimizer: \"a\\0b\"", "optimizer.name: unknown optimizer 'a\\x00b'; valid optimizers"},
      {"optimizer: \"\\e[2J\\a\"", "unknown optimizer '\\x1b[2J\\x07'"},
      {"optimizer: \"caf\u00e9 \u2013 \u03b7\"", "unknown optimizer 'caf\u00e9 \u2013 \u03b7'"},
      {"optimizer: {lr: \"\\x7f\\t\"}", "optimizer.lr: expected a number, got '\\x7f\t'"},
  };
  for (const auto& c : cases) {
    testing::expect_error<Error>([&] { OptimConfig::from_yaml(c.yaml); }, {c.fragment});
  }
  // Bytes that are not UTF-8 (a cut sequence, a stray continuation byte, an encoded surrogate) are
  // written as bytes; the escaping is idempotent, so a message wrapped in context stays the same.
  EXPECT_EQ(readable("\xc3 \x80 \xed\xa0\x80 ok \xf0\x9f\x98\x80"),
            "\\xc3 \\x80 \\xed\\xa0\\x80 ok \xf0\x9f\x98\x80");
  EXPECT_EQ(readable(readable(std::string("a\0\x85\xc2\x85", 5))), "a\\x00\\x85\\u0085");
}

TEST(Config, FileErrorsNameTheFile) {
  testing::expect_error<Error>([] { OptimConfig::from_yaml_file("/nonexistent/optim.yaml"); },
                               {"config: cannot read '/nonexistent/optim.yaml'"});
  // A directory opens as a stream that reads nothing: refused, not read as an empty config.
  const auto dir = std::filesystem::temp_directory_path().string();
  testing::expect_error<Error>([&] { OptimConfig::from_yaml_file(dir); },
                               {"config: cannot read '", "': it is not a regular file"});
}

}  // namespace
}  // namespace muon
