#include "muon/param_groups.h"

#include <fnmatch.h>

#include <cmath>
#include <set>

#include "muon/error.h"
#include "muon/presets.h"

namespace muon {

bool pattern_matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

void check_groups(const std::vector<ParamGroupSpec>& groups) {
  std::set<std::string> names;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    const auto label = "param_groups[" + std::to_string(i) + "] ('" + g.name + "')";
    check(!g.name.empty(), "param_groups[", i, "]: a group needs a name");
    check(names.insert(g.name).second, label, ": duplicate group name '", g.name,
          "'; group names must be unique");
    check(!g.patterns.empty(), label, ": patterns is empty; give at least one fnmatch pattern ",
          "(\"*\" matches everything)");
    for (const auto& p : g.patterns) {
      check(!p.empty(), label, ": an empty pattern matches no parameter name");
    }
    check(std::isfinite(g.lr_multiplier) && g.lr_multiplier > 0, label,
          ": lr_multiplier must be > 0, got ", g.lr_multiplier);
    if (g.lr) check(std::isfinite(*g.lr) && *g.lr >= 0, label, ": lr must be >= 0, got ", *g.lr);
    if (g.weight_decay) {
      check(std::isfinite(*g.weight_decay) && *g.weight_decay >= 0, label,
            ": weight_decay must be >= 0, got ", *g.weight_decay);
    }
    if (g.momentum) {
      check(*g.momentum >= 0 && *g.momentum < 1, label, ": momentum must be in [0, 1), got ",
            *g.momentum);
    }
  }
}

size_t group_of(const std::vector<ParamGroupSpec>& groups, const std::string& name) {
  for (size_t i = 0; i < groups.size(); ++i) {
    for (const auto& pattern : groups[i].patterns) {
      if (pattern_matches(pattern, name)) return i;
    }
  }
  std::string names;
  for (const auto& g : groups) names += (names.empty() ? "" : ", ") + g.name;
  throw Error("parameter '" + name + "' matches no parameter group (groups: " + names +
              "); add a catch-all group last, e.g. {name: rest, patterns: [\"*\"]}");
}

std::vector<ParamGroupSpec> mup_groups(double width_multiplier) {
  check(std::isfinite(width_multiplier) && width_multiplier > 0,
        "mup: width_multiplier must be > 0, got ", width_multiplier);
  ParamGroupSpec no_decay{"no_weight_decay", {"*.bias", "*.scale", "*norm*.weight", "*.dt_bias"}};
  no_decay.weight_decay = 0.0;
  ParamGroupSpec normal{"normal", {"*wte.weight", "*embed*.weight", "*embedding*.weight"}};
  ParamGroupSpec mup{"mup", {"*"}, 1.0 / width_multiplier};
  return {no_decay, normal, mup};
}

Preset nanochat_preset(const NanochatSettings& s) {
  check(s.d_model > 0, "nanochat: d_model must be > 0, got ", s.d_model);
  const double d = std::pow(static_cast<double>(s.d_model) / 768.0, -0.5);
  auto adamw_group = [](std::string name, std::vector<std::string> patterns, double lr, Betas betas,
                        double wd) {
    ParamGroupSpec g{std::move(name), std::move(patterns)};
    g.lr = lr;
    g.betas = betas;
    g.eps = 1e-10;
    g.weight_decay = wd;
    return g;
  };
  Preset p;
  p.groups = {
      adamw_group("lm_head", {"lm_head.*", "*.lm_head.*"}, s.unembedding_lr * d, {0.8, 0.96}, 0.01),
      adamw_group("value_embeds", {"*value_embed*"}, 0.5 * s.embedding_lr * d, {0.8, 0.995}, 0.01),
      adamw_group("embeddings", {"*wte*", "*embed*"}, s.embedding_lr * d, {0.8, 0.995}, 0.001),
      adamw_group("resid_scalars", {"*resid_lambda*"}, 0.01 * s.scalar_lr, {0.8, 0.95}, 0.05),
      adamw_group("x0_scalars", {"*x0_lambda*"}, s.scalar_lr, {0.96, 0.95}, 0.0),
      adamw_group("smear_backout", {"*smear*", "*backout*"}, 0.2, {0.8, 0.95}, 0.0),
  };
  ParamGroupSpec matrices{"matrices", {"*"}};
  matrices.lr = s.matrix_lr;
  matrices.momentum = 0.95;
  matrices.weight_decay = s.weight_decay;
  p.groups.push_back(matrices);
  p.muon = MuonOptions(muon_preset("nanochat").muon()).lr(s.matrix_lr).weight_decay(s.weight_decay);
  p.adamw = AdamWOptions(s.embedding_lr * d).eps(1e-10);
  return p;
}

}  // namespace muon
