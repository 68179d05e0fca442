#include <algorithm>
#include <cmath>
#include <sstream>

#include "muon/error.h"
#include "muon/internal/config_sections.h"
#include "muon/presets.h"

namespace muon::detail {

void require(bool ok, const std::string& path, const std::string& rule, double value) {
  check(ok, path, " must be ", rule, ", got ", value);
}

Betas read_betas(const YAML::Node& n, const std::string& path) {
  check(n.IsSequence() && n.size() == 2, path, ": expected [beta1, beta2], got ", kind_of(n));
  const double b1 = Section::as_number(n[0], path + "[0]");
  const double b2 = Section::as_number(n[1], path + "[1]");
  require(b1 >= 0 && b1 < 1, path + "[0]", "in [0, 1)", b1);
  require(b2 >= 0 && b2 < 1, path + "[1]", "in [0, 1)", b2);
  return {b1, b2};
}

CoefficientTable read_table(const YAML::Node& n, const std::string& path) {
  if (n.IsScalar()) {
    return one_of<CoefficientTable>(path, n.Scalar(), CoefficientTable::by_name);
  }
  check(n.IsSequence() && n.size() > 0, path, ": expected ", CoefficientTable::names(),
        " or a list of [a, b, c] rows, got ", kind_of(n));
  std::vector<Coefficients> rows;
  for (size_t i = 0; i < n.size(); ++i) {
    const auto row_path = path + "[" + std::to_string(i) + "]";
    check(n[i].IsSequence() && n[i].size() == 3, row_path, ": expected [a, b, c], got ",
          kind_of(n[i]));
    rows.push_back({Section::as_number(n[i][0], row_path + "[0]"),
                    Section::as_number(n[i][1], row_path + "[1]"),
                    Section::as_number(n[i][2], row_path + "[2]")});
  }
  return CoefficientTable::custom(std::move(rows));
}

namespace {

// preset: {name: nanochat, ...}: its groups and its Muon and AdamW settings.
void read_nanochat_preset(Section& p, HybridOptions& h, MuonOptions& muon) {
  NanochatSettings n;
  if (const auto v = p.integer("d_model")) n.d_model = *v;
  for (auto [key, field] : {std::pair{"embedding_lr", &n.embedding_lr},
                            {"unembedding_lr", &n.unembedding_lr},
                            {"matrix_lr", &n.matrix_lr},
                            {"scalar_lr", &n.scalar_lr}}) {
    if (const auto v = p.number(key)) {
      require(*v > 0, p.key_path(key), "> 0", *v);
      *field = *v;
    }
  }
  if (const auto v = p.number("weight_decay")) {
    require(*v >= 0, p.key_path("weight_decay"), ">= 0", *v);
    n.weight_decay = *v;
  }
  require(n.d_model > 0, p.key_path("d_model"), "> 0", static_cast<double>(n.d_model));
  const auto built = nanochat_preset(n);
  h.groups = built.groups;
  // The recipe's algorithm settings; storage, clipping and the rest stay as configured.
  muon.lr(built.muon.lr())
      .momentum(built.muon.momentum())
      .coefficients(built.muon.coefficients())
      .normuon(built.muon.normuon())
      .cautious_weight_decay(built.muon.cautious_weight_decay())
      .weight_decay(built.muon.weight_decay());
  // AdamW's recipe (refused with other others)
  h.others.as<AdamWOptions>()->lr(built.adamw.lr()).eps(built.adamw.eps());
}

}  // namespace

void read_groups_or_preset(Section& s, OptimConfig& config) {
  auto& h = config.hybrid;
  const auto preset = s.find("preset");
  const auto groups = s.find("param_groups");
  if (groups && !groups.IsNull()) {
    check(groups.IsSequence(), s.key_path("param_groups"), ": expected a list, got ",
          kind_of(groups));
    for (size_t i = 0; i < groups.size(); ++i) {
      h.groups.push_back(
          read_group(groups[i], s.key_path("param_groups") + "[" + std::to_string(i) + "]"));
    }
    with_context(s.key_path("param_groups"), [&] { check_groups(h.groups); });
  }
  if (!preset || preset.IsNull()) return;
  Section p(preset, s.key_path("preset"));
  config.preset = p.text("name").value_or("");
  const bool sets_groups = config.preset == "mup" || config.preset == "nanochat";
  check(!(sets_groups && groups && !groups.IsNull()), s.key_path("preset"), ": the preset ",
        config.preset, " sets the parameter groups; give either it or param_groups, not both");
  if (config.preset == "mup") {
    const double width = p.number("width_multiplier").value_or(1.0);
    require(width > 0, p.key_path("width_multiplier"), "> 0", width);
    h.groups = mup_groups(width);
  } else {
    const auto& presets = muon_presets();
    const auto entry = std::find_if(presets.begin(), presets.end(),
                                    [&](const MuonPreset& m) { return config.preset == m.name; });
    check(entry != presets.end(), p.key_path("name"), ": unknown preset '", config.preset,
          "'; valid presets are mup, ", muon_preset_names());
    if (!h.matrices) {
      refuse_unused_under_adamw(s, "preset",
                                config.preset == "nanochat"
                                    ? "the nanochat preset (Muon's recipe for the matrices, "
                                      "AdamW's for the rest)"
                                    : "the " + config.preset + " preset (Muon's settings)");
    }
    auto* muon = muon_of(h);
    const bool sets_muon = config.preset == "nanochat" || entry->options.as<MuonOptions>();
    check(!sets_muon || muon != nullptr, s.key_path("preset"), ": the preset ", config.preset,
          " sets Muon's settings, but the matrices run ", algorithm_name(*h.matrices),
          "; choose name muon, or remove the preset");
    if (config.preset == "nanochat") {
      check(h.others.as<AdamWOptions>() != nullptr, s.key_path("preset"),
            ": the nanochat preset is AdamW's recipe for the "
            "parameters Muon does not take (its groups' rates, betas and eps), not ",
            algorithm_name(*h.others),
            "'s; remove others, or give param_groups of your "
            "own");
      read_nanochat_preset(p, h, *muon);
    } else if (sets_muon) {
      apply_muon_preset(entry->muon(), *muon);
    } else {
      h.matrices = entry->options;  // dion: the matrices run it, from its preset
    }
  }
  p.finish();
}

void read_routing(Section& s, OptimConfig& config) {
  if (const auto n = s.find("routing"); n && !n.IsNull()) {
    Section r(n, s.key_path("routing"));
    if (const auto v = r.strings("muon")) config.routing.muon_patterns = *v;
    if (const auto v = r.strings("adamw")) config.routing.adamw_patterns = *v;
    if (const auto v = r.text("higher_rank")) {
      config.routing.higher_rank =
          one_of<HigherRankPolicy>(r.key_path("higher_rank"), *v, higher_rank_policy_from_string);
    }
    if (const auto v = r.boolean("split_heads")) config.routing.split_heads = *v;
    if (const auto v = r.boolean("names")) config.routing.use_names = *v;
    if (const auto v = r.strings("outputs")) config.routing.output_names = *v;
    r.finish();
  }
}

void read_scaling(Section& s, OptimConfig& config) {
  auto& h = config.hybrid;
  if (const auto n = s.find("scaling"); n && !n.IsNull()) {
    Section sc(n, s.key_path("scaling"));
    ScalingRules rules;
    if (const auto v = sc.number("batch_tokens")) rules.batch_tokens = *v;
    if (const auto v = sc.integer("d_model")) rules.d_model = *v;
    if (const auto v = sc.number("training_tokens")) rules.training_tokens = *v;
    if (const auto v = sc.number("reference_tokens")) rules.reference_tokens = *v;
    sc.finish();
    require(rules.batch_tokens > 0, sc.key_path("batch_tokens"), "> 0", rules.batch_tokens);
    require(rules.d_model > 0, sc.key_path("d_model"), "> 0", static_cast<double>(rules.d_model));
    auto scale = [](torch::optim::OptimizerOptions& options, double lr, double weight_decay) {
      auto settings = group_settings(options);
      settings["lr"] *= lr;
      settings["weight_decay"] *= weight_decay;
      set_group_settings(options, settings);
      return settings;
    };
    const double decay = rules.weight_decay_multiplier();
    const auto others = scale(*h.others, rules.adamw_lr_multiplier(), decay);
    // (under name adamw the others' alone)
    const auto matrices =
        h.matrices ? scale(*h.matrices, rules.lr_multiplier(), decay) : SettingValues{};
    std::ostringstream note;
    note << "scaling: ";
    if (h.matrices) {
      note << algorithm_name(*h.matrices) << " lr x " << rules.lr_multiplier()
           << " (sqrt(B/2^19)), ";
    }
    note << algorithm_name(*h.others) << " lr x " << rules.adamw_lr_multiplier()
         << " (also (d_model/768)^-0.5), weight decay x " << decay << " -> ";
    if (h.matrices) note << "lr " << matrices.at("lr") << ", ";
    note << "adamw_lr " << others.at("lr") << ", weight_decay "
         << (h.matrices ? matrices : others).at("weight_decay");
    config.notes.push_back(note.str());
  }
}

}  // namespace muon::detail
