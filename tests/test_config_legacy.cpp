// The keys earlier versions wrote (docs/config.md, "Earlier spellings"): each reads as its current
// spelling does — the same resolved configuration, field by field — and both spellings given is
// an error.
#include <gtest/gtest.h>

#include <string>

#include "helpers.h"
#include "muon/config.h"
#include "muon/error.h"

namespace muon {
namespace {

using testing::expect_error;

// `earlier` and `current` resolve to the same configuration: every field to_yaml writes (every
// setting, defaults filled), and the ones it does not.
void expect_same(const std::string& earlier, const std::string& current) {
  SCOPED_TRACE(earlier + " vs " + current);
  const auto a = OptimConfig::from_yaml(earlier);
  const auto b = OptimConfig::from_yaml(current);
  EXPECT_EQ(a.to_yaml(), b.to_yaml());
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.cautious, b.cautious);
  EXPECT_EQ(a.preset, b.preset);
  EXPECT_EQ(a.notes, b.notes);
  ASSERT_EQ(static_cast<bool>(a.hybrid.matrices), static_cast<bool>(b.hybrid.matrices));
  if (a.hybrid.matrices) {
    EXPECT_EQ(algorithm_name(*a.hybrid.matrices), algorithm_name(*b.hybrid.matrices));
    EXPECT_EQ(group_settings(*a.hybrid.matrices), group_settings(*b.hybrid.matrices));
  }
}

void expect_refused(const std::string& yaml, const std::string& message) {
  SCOPED_TRACE(yaml);
  expect_error<Error>([&] { OptimConfig::from_yaml(yaml); }, {message});
}

TEST(ConfigLegacy, MuonNsStepsIsNsSteps) {
  expect_same("optimizer: {muon_ns_steps: 7}\n", "optimizer: {ns_steps: 7}\n");
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {muon_ns_steps: 7}\n")
                .hybrid.matrices.get<MuonOptions>()
                .ns_steps(),
            OptimConfig::from_yaml("optimizer: {ns_steps: 7}\n")
                .hybrid.matrices.get<MuonOptions>()
                .ns_steps());
  // Under Dion, Muon's default says what Dion does (configurations of earlier versions).
  expect_same("optimizer: {name: dion, muon_ns_steps: 5}\n", "optimizer: {name: dion}\n");
  expect_refused("optimizer: {muon_ns_steps: 4, ns_steps: 5}\n",
                 "optimizer.muon_ns_steps: both 'ns_steps' and its alias 'muon_ns_steps' are "
                 "set; keep one");
  // A refusal names the key as written.
  expect_refused("optimizer: {name: adamw, muon_ns_steps: 7}\n",
                 "optimizer.muon_ns_steps: Muon's ns_steps would do nothing");
  expect_refused("optimizer: {name: dion, muon_ns_steps: 7}\n",
                 "optimizer.muon_ns_steps: dion (the matrices' algorithm) has no ns_steps");
}

TEST(ConfigLegacy, MuonMomentumIsMomentum) {
  expect_same("optimizer: {muon_momentum: 0.9}\n", "optimizer: {momentum: 0.9}\n");
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {muon_momentum: 0.9}\n")
                .hybrid.matrices.get<MuonOptions>()
                .momentum(),
            OptimConfig::from_yaml("optimizer: {momentum: 0.9}\n")
                .hybrid.matrices.get<MuonOptions>()
                .momentum());
  expect_same("optimizer: {name: dion, muon_momentum: 0.8}\n",
              "optimizer: {name: dion, momentum: 0.8}\n");
  expect_refused("optimizer: {muon_momentum: 0.9, momentum: 0.8}\n",
                 "optimizer.muon_momentum: both 'momentum' and its alias 'muon_momentum' are "
                 "set; keep one");
  expect_refused("optimizer: {name: adamw, muon_momentum: 0.9}\n",
                 "optimizer.muon_momentum: Muon's momentum would do nothing");
}

TEST(ConfigLegacy, MuonNormEpsIsMuonPlusEps) {
  // Alone it sets the eps and leaves Muon+ off.
  expect_same("optimizer: {muon_norm_eps: 1.0e-5}\n",
              "optimizer: {muon_plus: {mode: none, eps: 1.0e-5}}\n");
  expect_same("optimizer: {muon_plus: false, muon_norm_eps: 1.0e-5}\n",
              "optimizer: {muon_plus: {mode: none, eps: 1.0e-5}}\n");
  expect_same("optimizer: {muon_plus: true, muon_norm_eps: 1.0e-5}\n",
              "optimizer: {muon_plus: {eps: 1.0e-5}}\n");
  expect_same("optimizer: {muon_plus: {mode: col}, muon_norm_eps: 1.0e-5}\n",
              "optimizer: {muon_plus: {mode: col, eps: 1.0e-5}}\n");
  const auto earlier = OptimConfig::from_yaml("optimizer: {muon_norm_eps: 1.0e-5}\n");
  const auto current = OptimConfig::from_yaml("optimizer: {muon: {post_norm_eps: 1.0e-5}}\n");
  EXPECT_EQ(earlier.hybrid.matrices.get<MuonOptions>().post_norm_eps(),
            current.hybrid.matrices.get<MuonOptions>().post_norm_eps());
  EXPECT_EQ(earlier.hybrid.matrices.get<MuonOptions>().post_norm(),
            current.hybrid.matrices.get<MuonOptions>().post_norm());
  // Under Dion, at Muon's default (what to_yaml wrote when Dion was a Muon setting).
  expect_same("optimizer: {name: dion, muon_plus: false, muon_norm_eps: 1.0e-8}\n",
              "optimizer: {name: dion}\n");
  expect_refused("optimizer: {muon_plus: {eps: 1.0e-6}, muon_norm_eps: 1.0e-5}\n",
                 "optimizer.muon_norm_eps: both 'muon_plus.eps' and its alias 'muon_norm_eps' "
                 "are set; keep one");
  expect_refused("optimizer: {muon_norm_eps: -1}\n", "optimizer.muon_norm_eps must be > 0, got -1");
  expect_refused("optimizer: {name: dion, muon_norm_eps: 1.0e-5}\n",
                 "optimizer.muon_norm_eps: dion (the matrices' algorithm) has no Muon+");
}

TEST(ConfigLegacy, RootMuonPlusIsTheOptimizerSections) {
  expect_same("optimizer: muon\nmuon_plus: true\n", "optimizer: {name: muon, muon_plus: true}\n");
  expect_same("optimizer: {lr: 0.03}\nmuon_plus: false\n", "optimizer: {lr: 0.03}\n");
  expect_same("muon_plus: true\n", "optimizer: {muon_plus: true}\n");
  // Both, agreeing: once.
  expect_same("optimizer: {muon_plus: {mode: col}}\nmuon_plus: true\n",
              "optimizer: {muon_plus: {mode: col}}\n");
  expect_same("optimizer: {muon_plus: true, muon_norm_eps: 1.0e-6}\nmuon_plus: true\n",
              "optimizer: {muon_plus: {eps: 1.0e-6}}\n");
  expect_refused("optimizer: {muon_plus: false}\nmuon_plus: true\n",
                 "muon_plus: the root value true conflicts with optimizer.muon_plus false; set it "
                 "in one place");
  expect_refused("optimizer: {muon_plus: {mode: none}}\nmuon_plus: true\n",
                 "muon_plus: the root value true conflicts with optimizer.muon_plus false");
  expect_refused("optimizer: adamw\nmuon_plus: true\n",
                 "optimizer.muon_plus: Muon+ needs name muon or muonclip, not 'adamw'");
  expect_refused("optimizer: muon\nmuon_plus: sometimes\n",
                 "muon_plus: expected true or false, got 'sometimes'");
}

TEST(ConfigLegacy, RootCautiousIsTheOptimizerSections) {
  expect_same("optimizer: muon\ncautious: true\n", "optimizer: {name: muon, cautious: true}\n");
  expect_same("optimizer: adamw\ncautious: true\n", "optimizer: {name: adamw, cautious: true}\n");
  expect_same("optimizer: {cautious: true}\ncautious: true\n", "optimizer: {cautious: true}\n");
  const auto earlier = OptimConfig::from_yaml("optimizer: muon\ncautious: true\n");
  const auto current = OptimConfig::from_yaml("optimizer: {name: muon, cautious: true}\n");
  EXPECT_EQ(earlier.hybrid.matrices.get<MuonOptions>().cautious(),
            current.hybrid.matrices.get<MuonOptions>().cautious());
  EXPECT_EQ(earlier.hybrid.others.get<AdamWOptions>().cautious(),
            current.hybrid.others.get<AdamWOptions>().cautious());
  expect_refused("optimizer: {cautious: true}\ncautious: false\n",
                 "cautious: the root value false conflicts with optimizer.cautious true; set it "
                 "in one place");
  expect_refused("optimizer: {others: lion}\ncautious: true\n",
                 "optimizer.cautious: lion (the others' algorithm) has no cautious masking");
}

TEST(ConfigLegacy, DionTrueIsDionsSettings) {
  // true: Dion on, from Muon's settings so far, as an empty mapping of Dion's settings does.
  expect_same("optimizer: {dion: true, lr: 0.05}\n", "optimizer: {dion: {}, lr: 0.05}\n");
  expect_same("optimizer: {name: dion, dion: true}\n", "optimizer: {name: dion}\n");
  expect_same("optimizer: {muon: {lr: 0.03, dion: true}}\n",
              "optimizer: {muon: {lr: 0.03}, dion: {}}\n");
  expect_same("optimizer: {muon: {dion: {rank_fraction: 0.5}}}\n",
              "optimizer: {dion: {rank_fraction: 0.5}}\n");
  EXPECT_EQ(OptimConfig::from_yaml("optimizer: {dion: true}\n").hybrid.matrices.as<DionOptions>() !=
                nullptr,
            OptimConfig::from_yaml("optimizer: {dion: {}}\n").hybrid.matrices.as<DionOptions>() !=
                nullptr);
  // false and null: nothing, as under the current keys.
  expect_same("optimizer: {dion: false, lr: 0.05}\n", "optimizer: {lr: 0.05}\n");
  expect_same("optimizer: {muon: {lr: 0.03, dion: false}}\n", "optimizer: {muon: {lr: 0.03}}\n");
  expect_same("optimizer: {muon: {lr: 0.03, dion: null}}\n", "optimizer: {muon: {lr: 0.03}}\n");
  expect_refused("optimizer: {muon: {dion: {rank_fraction: 0.5}}, dion: {rank_fraction: 0.25}}\n",
                 "optimizer.muon.dion: both 'dion' and its alias 'muon.dion' are set; keep one");
  expect_refused("optimizer: {name: dion, dion: false}\n",
                 "optimizer.dion: false turns Dion off, but name dion runs it; choose name muon");
  expect_refused("optimizer: {name: dion, muon: {dion: false}}\n",
                 "optimizer.muon.dion: false turns Dion off, but name dion runs it");
  expect_refused("optimizer: {name: adamw, dion: true}\n",
                 "optimizer.dion: Dion's settings would do nothing: name adamw");
  expect_refused("optimizer: {name: adamw, muon: {dion: {rank_fraction: 0.5}}}\n",
                 "optimizer.muon.dion: Dion's settings would do nothing: name adamw");
  expect_refused("optimizer: {muon: {dion: {rank: 2}}}\n", "optimizer.muon.dion.rank: unknown key");
}

}  // namespace
}  // namespace muon
