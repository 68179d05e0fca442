// One option schema (include/muon/option_schema.h): YAML reaches every option of Muon and AdamW
// by its C++ name, with the C++ defaults, and validates them with the key path; a written config
// reads back to the same settings. (python/tests/test_schema.py checks the Python side.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "helpers.h"
#include "muon/config.h"
#include "muon/error.h"

namespace muon {
namespace {

using testing::expect_error;

template <class Options>
std::vector<std::string> names_of(const Options& options) {
  std::vector<std::string> out;
  visit_options(options, [&](const OptionInfo& info, const auto&) { out.push_back(info.name); });
  return out;
}

TEST(Schema, TheOptionsStructsHaveEveryOptionOnceWithItsDoc) {
  for (const auto& names : {names_of(MuonOptions()), names_of(AdamWOptions())}) {
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  }
  // The ones YAML could not set before the schema, among the rest.
  const auto muon = names_of(MuonOptions());
  for (const char* name : {"gram_restarts", "ns_dtype", "post_norm", "fused"}) {
    EXPECT_NE(std::find(muon.begin(), muon.end(), name), muon.end()) << name;
  }
  const auto adamw = names_of(AdamWOptions());
  EXPECT_NE(std::find(adamw.begin(), adamw.end(), "nesterov"), adamw.end());
  const MuonOptions defaults;
  visit_options(defaults, [](const OptionInfo& info, const auto&) {
    EXPECT_GT(std::string(info.doc).size(), 10u) << info.name;
  });
}

TEST(Schema, YamlDefaultsAreTheCppDefaults) {
  OptimConfig from_cpp;  // HybridOptions' MuonOptions() and AdamWOptions()
  EXPECT_EQ(OptimConfig::from_yaml("").to_yaml(), from_cpp.to_yaml());
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {muon: {}, adamw: {}}").to_yaml(),
            from_cpp.to_yaml());
  // AdamW decays by torch.optim.AdamW's 1e-2 unless weight_decay is set; Muon by 0.
  const auto c = OptimConfig::from_yaml("optimizer: {name: muon}");
  EXPECT_DOUBLE_EQ(c.hybrid.others.get<AdamWOptions>().weight_decay(), 1e-2);
  EXPECT_DOUBLE_EQ(c.hybrid.matrices.get<MuonOptions>().weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(OptimConfig::from_yaml("optimizer: {weight_decay: 0.1}")
                       .hybrid.others.get<AdamWOptions>()
                       .weight_decay(),
                   0.1);
}

TEST(Schema, TheNestedSectionsReachEveryOptionAndWinOverTheShorthand) {
  const auto c = OptimConfig::from_yaml(R"(
optimizer:
  name: muon
  ns_steps: 4
  muon:
    ns_steps: 6
    ns_method: gram
    gram_restarts: [2, 4]
    ns_dtype: float64
    coefficients: [[3.0, -3.2, 1.2]]
    ns_eps: 1.0e-5
    row_equilibration: true
    weight_decay_method: palm
    post_norm: col_row
    post_norm_eps: 1.0e-6
    normuon: {beta2: 0.9, axis: row}
    adjust_lr: spectral
    momentum_form: sum
    state_dtype: bfloat16
    fused: false
  adamw:
    nesterov: true
    betas: [0.8, 0.9]
    eps: 1.0e-10
    cautious: true
    weight_decay_method: independent
    fused: true
)");
  const auto& m = c.hybrid.matrices.get<MuonOptions>();
  EXPECT_EQ(m.ns_steps(), 6);
  EXPECT_EQ(m.ns_method(), NsMethod::gram);
  EXPECT_EQ(*m.gram_restarts(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(*m.ns_dtype(), at::kDouble);
  EXPECT_EQ(m.coefficients().rows.size(), 1u);
  EXPECT_DOUBLE_EQ(*m.ns_eps(), 1e-5);
  EXPECT_TRUE(m.row_equilibration());
  EXPECT_EQ(m.weight_decay_method(), WeightDecayMethod::palm);
  EXPECT_EQ(m.post_norm(), PostNorm::col_row);
  EXPECT_DOUBLE_EQ(m.post_norm_eps(), 1e-6);
  EXPECT_DOUBLE_EQ(m.normuon()->beta2, 0.9);
  EXPECT_EQ(m.normuon()->axis, NorMuonAxis::row);
  EXPECT_EQ(m.adjust_lr(), AdjustLr::spectral);
  EXPECT_EQ(m.momentum_form(), MomentumForm::sum);
  EXPECT_EQ(m.state_dtype(), at::kBFloat16);
  EXPECT_EQ(m.fused(), false);
  const auto& a = c.hybrid.others.get<AdamWOptions>();
  EXPECT_TRUE(a.nesterov());
  EXPECT_EQ(a.betas(), Betas(0.8, 0.9));
  EXPECT_DOUBLE_EQ(a.eps(), 1e-10);
  EXPECT_TRUE(a.cautious());
  EXPECT_EQ(a.fused(), true);
  EXPECT_EQ(a.weight_decay_method(), WeightDecayMethod::independent);
  EXPECT_FALSE(m.cautious());  // the nested sections set one algorithm each

  // Written out, every option is there by name and reads back to the same settings.
  const auto text = c.to_yaml();
  for (const auto& name : names_of(m)) {
    EXPECT_NE(text.find(name + ":"), std::string::npos) << name << "\n" << text;
  }
  EXPECT_EQ(OptimConfig::from_yaml(text).to_yaml(), text);
}

TEST(Schema, TheShorthandAcceptsTheCppNames) {
  const auto c = OptimConfig::from_yaml("optimizer: {max_grad_norm: 1.5, coefficients: dion}");
  EXPECT_DOUBLE_EQ(*c.hybrid.max_grad_norm, 1.5);
  EXPECT_EQ(c.hybrid.matrices.get<MuonOptions>().coefficients().name, "dion");
  expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {max_grad_norm: 1.5, grad_clip: 1.0}"); },
      {"both 'grad_clip' and its alias 'max_grad_norm' are set"});
}

TEST(Schema, NestedValuesAreCheckedWithTheirKeyPath) {
  const std::pair<const char*, const char*> cases[] = {
      {"optimizer: {muon: {post_norm_eps: 0}}", "optimizer.muon.post_norm_eps must be > 0, got 0"},
      {"optimizer: {muon: {momentum: 1}}", "optimizer.muon.momentum must be in [0, 1), got 1"},
      {"optimizer: {adamw: {lr: -1}}", "optimizer.adamw.lr must be >= 0, got -1"},
      {"optimizer: {adamw: {betas: [0.9, 1]}}", "optimizer.adamw.betas[1] must be in [0, 1)"},
      {"optimizer: {muon: {ns_stepz: 3}}",
       "optimizer.muon.ns_stepz: unknown key; did you mean 'ns_steps'?"},
      {"optimizer: {muon: {ns_method: fastest}}",
       "optimizer.muon.ns_method: unknown orthogonalization method 'fastest'"},
      {"optimizer: {muon: {gram_restarts: [2, 1.5]}}",
       "optimizer.muon.gram_restarts[1]: expected a whole number, got 1.5"},
      {"optimizer: {muon: {ns_dtype: half}}",
       "optimizer.muon.ns_dtype: expected float32, bfloat16 or float64 (or null: per device), got "
       "'half'"},
      {"optimizer: {adamw: {nesterov: maybe}}",
       "optimizer.adamw.nesterov: expected true or false, got 'maybe'"},
      {"optimizer: {adamw: {state_dtype: float64}}", "AdamW: state_dtype Double is not supported"},
      {"optimizer: {muon: [1, 2]}", "optimizer.muon: expected a mapping, got a list"},
  };
  for (const auto& [text, fragment] : cases) {
    SCOPED_TRACE(text);
    const std::string yaml = text;  // a lambda cannot capture a structured binding in C++17
    expect_error<Error>([&] { OptimConfig::from_yaml(yaml); }, {fragment});
  }
}

// A value unlike the default of each field type a schedule or group has.
struct Perturb {
  void operator()(double& v) const { v = v * 0.5 + 0.375; }
  void operator()(int64_t& v) const { v += 7; }
  void operator()(bool& v) const { v = !v; }
  void operator()(std::optional<int64_t>& v) const { v = 11; }
  void operator()(std::optional<PowerTail>& v) const { v = PowerTail{13, 17, 0.25}; }
  void operator()(WarmdownShape& v) const { v = WarmdownShape::cosine; }
  void operator()(ScheduleKind&) const {}  // set by the caller
};

TEST(Schema, EveryScheduleFieldOfEveryKindRoundTripsAndOthersAreRefused) {
  for (const auto& [kind, name] : EnumNames<ScheduleKind>::table) {
    SCOPED_TRACE(name);
    const std::string kind_text = name;  // a lambda cannot capture a structured binding in C++17
    OptimConfig config;
    LrSchedule s;
    s.kind = kind;
    std::vector<std::string> own, foreign;
    visit_options(s, [&](const OptionInfo& info, auto& value) {
      const std::string kinds = std::string(" ") + info.kinds + " ";
      if (*info.kinds != '\0' && kinds.find(" " + kind_text + " ") == std::string::npos) {
        foreign.push_back(info.name);
        return;
      }
      own.push_back(info.name);
      Perturb{}(value);
    });
    config.hybrid.schedule = s;
    const auto text = config.to_yaml();
    const auto back = OptimConfig::from_yaml(text);
    EXPECT_EQ(back.to_yaml(), text);
    const auto& r = *back.hybrid.schedule;
    EXPECT_EQ(r.kind, kind);
    EXPECT_EQ(r.warmup_steps, s.warmup_steps);
    EXPECT_EQ(r.decay_steps, s.decay_steps);
    EXPECT_DOUBLE_EQ(r.end_value, s.end_value);
    EXPECT_DOUBLE_EQ(r.power_a, s.power_a);
    EXPECT_EQ(r.tail.has_value(), s.tail.has_value());
    EXPECT_EQ(r.shape, s.shape);
    EXPECT_DOUBLE_EQ(r.pct_start, s.pct_start);
    EXPECT_EQ(r.transition_steps, s.transition_steps);
    for (const auto& key : own) EXPECT_NE(text.find(key + ":"), std::string::npos) << key;
    for (const auto& key : foreign) {
      SCOPED_TRACE(key);
      EXPECT_EQ(text.find(" " + key + ":"), std::string::npos) << text;
      expect_error<Error>(
          [&] {
            OptimConfig::from_yaml("optimizer: {schedule: {name: " + kind_text + ", " + key +
                                   ": 1}}");
          },
          {"optimizer.schedule." + key + ": only the "});
    }
  }
  expect_error<Error>(
      [] { OptimConfig::from_yaml("optimizer: {schedule: {name: warmdown, end_value: 0.1}}"); },
      {"optimizer.schedule.end_value: only the cosine and linear schedules have an end_value"});
}

TEST(Schema, GroupsAndTheHybridKeysRoundTripByTheirSchema) {
  const auto c = OptimConfig::from_yaml(R"(
optimizer:
  max_grad_norm: 2.0
  nonfinite: error
  momentum_schedule: {start: 0.8, target: 0.9, steps: 50, cool_down: true}
  weight_decay_schedule: cosine
  param_groups:
    - {name: a, patterns: ["*.bias"], lr: 0.5, weight_decay: 0.0, betas: [0.8, 0.9], eps: 1.0e-9,
       momentum: 0.5, schedule: {name: exponential, decay_rate: 0.25}}
    - {name: b, patterns: ["*"], lr_multiplier: 0.5}
)");
  const auto& h = c.hybrid;
  EXPECT_DOUBLE_EQ(*h.max_grad_norm, 2.0);
  EXPECT_EQ(h.nonfinite, NonfinitePolicy::error);
  EXPECT_TRUE(h.momentum_schedule->cool_down);
  EXPECT_EQ(h.momentum_schedule->steps, 50);
  EXPECT_TRUE(h.weight_decay_schedule->cosine);
  ASSERT_EQ(h.groups.size(), 2u);
  EXPECT_EQ(h.groups[0].patterns, std::vector<std::string>{"*.bias"});
  EXPECT_DOUBLE_EQ(*h.groups[0].lr, 0.5);
  EXPECT_EQ(*h.groups[0].betas, Betas(0.8, 0.9));
  EXPECT_DOUBLE_EQ(h.groups[0].schedule->decay_rate, 0.25);
  EXPECT_FALSE(h.groups[1].lr.has_value());
  const auto text = c.to_yaml();
  EXPECT_EQ(OptimConfig::from_yaml(text).to_yaml(), text);
  for (const auto& row : config_schema("param_group")) {
    EXPECT_NE(text.find(row.key + ":"), std::string::npos) << row.key;
  }
  for (const auto& row : config_schema("optimizer")) {
    EXPECT_NE(text.find(row.key + ":"), std::string::npos) << row.key;
  }
}

// Each root-level shorthand sets what the schema says it sets: the same config as the nested form.
TEST(Schema, EveryShorthandEqualsItsNestedForm) {
  const std::map<std::string, std::string> values = {{"weight_decay", "0.3"},
                                                     {"weight_decay_method", "palm"},
                                                     {"ns_eps", "1.0e-5"},
                                                     {"row_equilibration", "true"},
                                                     {"betas", "[0.8, 0.85]"},
                                                     {"eps", "1.0e-9"},
                                                     {"momentum", "0.5"},
                                                     {"nesterov", "false"},
                                                     {"momentum_form", "sum"},
                                                     {"ns_coefficients", "dion"},
                                                     {"ns_dtype", "float64"},
                                                     {"ns_method", "gram"},
                                                     {"gram_restarts", "[2]"},
                                                     {"gram_coefficients", "[[2, -1.5, 0.5]]"},
                                                     {"adjust_lr", "spectral"},
                                                     {"normuon", "{beta2: 0.5}"},
                                                     {"cautious_weight_decay", "true"},
                                                     {"fused", "false"}};
  const auto rows = config_schema("shorthand");
  EXPECT_EQ(rows.size(), values.size());
  for (const auto& row : rows) {
    SCOPED_TRACE(row.key);
    ASSERT_EQ(values.count(row.key), 1u) << "a test value for the new shorthand";
    const auto& v = values.at(row.key);
    std::string nested;
    for (const char* algorithm : {"muon", "adamw"}) {
      const auto at = row.doc.find(std::string(algorithm) + ".");
      if (at == std::string::npos) continue;
      const auto option = row.doc.substr(at + std::strlen(algorithm) + 1,
                                         row.doc.find(' ', at) - at - std::strlen(algorithm) - 1);
      nested +=
          std::string(nested.empty() ? "" : ", ") + algorithm + ": {" + option + ": " + v + "}";
    }
    const auto config = [&](const std::string& keys) {
      return OptimConfig::from_yaml("optimizer: {" + keys + "}").to_yaml();
    };
    const auto shorthand = config(row.key + ": " + v);
    EXPECT_EQ(shorthand, config(nested));
    EXPECT_NE(shorthand, config(""));
    if (!row.alias.empty()) EXPECT_EQ(config(row.alias + ": " + v), shorthand);
  }
}

TEST(Schema, ConfigSchemaNamesItsSections) {
  expect_error<Error>([] { config_schema("model"); },
                      {"config_schema: unknown section 'model'; valid sections are optimizer"});
  const auto schedule = config_schema("schedule");
  ASSERT_FALSE(schedule.empty());
  EXPECT_EQ(schedule[0].key, "name");
  EXPECT_EQ(config_schema("muon").size(), names_of(MuonOptions()).size());
}

}  // namespace
}  // namespace muon
