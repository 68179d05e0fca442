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
#include "muon/presets.h"
#include "muon/schedule.h"

namespace muon {

// clang-format off
#define MUON_PARAM_GROUP_FIELDS(X)                                                                 \
  X(std::string, name, name, "", "", any, "", "the group's name, unique (required)")               \
  X(std::vector<std::string>, patterns, patterns, "", {}, any, "",                                 \
    "fnmatch patterns over dotted names; * crosses dots; case-sensitive (required)")               \
  X(double, lr_multiplier, lr_multiplier, "", 1.0, positive, "",                                   \
    "the group's rate = the base rate × this")                                                     \
  X(std::optional<double>, lr, lr, "", std::nullopt, positive, "",                                 \
    "an absolute rate instead (presets with fixed rates)")                                         \
  X(std::optional<double>, weight_decay, weight_decay, "", std::nullopt, nonnegative, "",          \
    "unset: the algorithm's (biases and norm weights then get 0)")                                 \
  X(std::optional<Betas>, betas, betas, "", std::nullopt, unit_interval, "",                       \
    "the non-Muon members' (β1, β2): AdamW's, or the others' algorithm's")                         \
  X(std::optional<double>, eps, eps, "", std::nullopt, positive, "", "the non-Muon members' eps")  \
  X(std::optional<double>, momentum, momentum, "", std::nullopt, unit_interval, "",                \
    "Muon-routed members' momentum")                                                               \
  X(std::optional<int64_t>, num_heads, num_heads, "", std::nullopt, positive, "",                  \
    "Muon-routed members' rows orthogonalized as this many equal heads")                           \
  X(std::optional<std::vector<int64_t>>, split_sizes, split_sizes, "", std::nullopt, any, "",      \
    "Muon-routed members' rows orthogonalized in blocks of these sizes (a fused QKV projection)")   \
  X(std::optional<LrSchedule>, schedule, schedule, "", std::nullopt, any, "",                      \
    "replaces the optimizer's schedule for this group")
// clang-format on
struct ParamGroupSpec {
  MUON_PARAM_GROUP_FIELDS(MUON_FIELD_MEMBER)
};
MUON_DEFINE_VISIT(ParamGroupSpec, MUON_PARAM_GROUP_FIELDS)

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
  double matrix_lr = muon_preset("nanochat").muon().lr();  // the matrices' Muon settings: the preset
  double scalar_lr = 0.5;
  double weight_decay = muon_preset("nanochat").muon().weight_decay();
};
struct Preset {
  std::vector<ParamGroupSpec> groups;
  MuonOptions muon;  // the algorithm settings the recipe pairs with its groups
  AdamWOptions adamw;
};
Preset nanochat_preset(const NanochatSettings& settings = {});

}  // namespace muon
