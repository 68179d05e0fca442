// Parameter groups (docs/design.md §Parameter groups): which hyperparameters a parameter gets, by
// fnmatch patterns over its dotted name. Orthogonal to routing: the role picks the algorithm, the
// group its settings.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "muon/adam.h"
#include "muon/muon.h"
#include "muon/schedule.h"

namespace muon {

struct ParamGroupSpec {
  std::string name;
  std::vector<std::string> patterns;   // fnmatch; `*` crosses dots; case-sensitive
  double lr_multiplier = 1.0;          // > 0; the group's rate = base rate × multiplier
  std::optional<double> lr;            // an absolute rate instead (presets with fixed rates)
  std::optional<double> weight_decay;  // unset: inherit (biases and norm weights then get 0)
  std::optional<Betas> betas;          // AdamW-routed members
  std::optional<double> eps;           // AdamW-routed members
  std::optional<double> momentum;      // Muon-routed members
  std::optional<LrSchedule> schedule;  // replaces the optimizer's schedule for this group
};

// fnmatch(3) without FNM_PATHNAME: `*` and `?` also match dots.
bool pattern_matches(const std::string& pattern, const std::string& name);

// Throws muon::Error for duplicate group names, a group without patterns (or with an empty one),
// lr_multiplier ≤ 0, a negative weight decay or an invalid absolute lr.
void check_groups(const std::vector<ParamGroupSpec>& groups);

// Index of the first group with a pattern matching `name`; an error naming the parameter (and
// suggesting a catch-all group `patterns: ["*"]`) when none does.
size_t group_of(const std::vector<ParamGroupSpec>& groups, const std::string& name);

// lm-engine's muP groups (configs/param-groups/mup.yml), in its order: `no_weight_decay`
// (*.bias, *.scale, *norm*.weight, *.dt_bias) at weight decay 0; `normal` (token embeddings) at the
// base rate; `mup` (everything else) at base rate / width_multiplier.
std::vector<ParamGroupSpec> mup_groups(double width_multiplier);

// flaxchat/nanochat's table, with d = (d_model/768)^-0.5 and AdamW eps 1e-10 everywhere.
struct NanochatSettings {
  int64_t d_model = 768;
  double embedding_lr = 0.3;
  double unembedding_lr = 0.008;
  double matrix_lr = 0.02;
  double scalar_lr = 0.5;
  double weight_decay = 0.28;
};
struct Preset {
  std::vector<ParamGroupSpec> groups;
  MuonOptions muon;  // the algorithm settings the recipe pairs with its groups
  AdamWOptions adamw;
};
Preset nanochat_preset(const NanochatSettings& settings = {});

}  // namespace muon
