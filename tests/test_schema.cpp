// One option schema (include/muon/option_schema.h): YAML reaches every option of Muon and AdamW
// by its C++ name, with the C++ defaults, and validates them with the key path; a written config
// reads back to the same settings. (python/tests/test_schema.py checks the Python side.)
#include <gtest/gtest.h>

#include <algorithm>
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
  EXPECT_DOUBLE_EQ(c.hybrid.adamw.weight_decay(), 1e-2);
  EXPECT_DOUBLE_EQ(c.hybrid.muon.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(
      OptimConfig::from_yaml("optimizer: {weight_decay: 0.1}").hybrid.adamw.weight_decay(), 0.1);
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
    fused: true
)");
  const auto& m = c.hybrid.muon;
  EXPECT_EQ(m.ns_steps(), 6);
  EXPECT_EQ(m.ns_method(), NsMethod::gram);
  EXPECT_EQ(*m.gram_restarts(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(*m.ns_dtype(), at::kDouble);
  EXPECT_EQ(m.coefficients().rows.size(), 1u);
  EXPECT_EQ(m.post_norm(), PostNorm::col_row);
  EXPECT_DOUBLE_EQ(m.post_norm_eps(), 1e-6);
  EXPECT_DOUBLE_EQ(m.normuon()->beta2, 0.9);
  EXPECT_EQ(m.normuon()->axis, NorMuonAxis::row);
  EXPECT_EQ(m.adjust_lr(), AdjustLr::spectral);
  EXPECT_EQ(m.momentum_form(), MomentumForm::sum);
  EXPECT_EQ(m.state_dtype(), at::kBFloat16);
  EXPECT_EQ(m.fused(), false);
  const auto& a = c.hybrid.adamw;
  EXPECT_TRUE(a.nesterov());
  EXPECT_EQ(a.betas(), Betas(0.8, 0.9));
  EXPECT_DOUBLE_EQ(a.eps(), 1e-10);
  EXPECT_TRUE(a.cautious());
  EXPECT_EQ(a.fused(), true);
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
  EXPECT_EQ(c.hybrid.muon.coefficients().name, "dion");
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
       "optimizer.muon.ns_dtype: expected float32, bfloat16 or float64, got 'half'"},
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

}  // namespace
}  // namespace muon
