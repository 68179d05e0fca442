#include "muon/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <type_traits>

#include "muon/dtypes.h"
#include "muon/error.h"
#include "muon/internal/config_sections.h"
#include "muon/internal/read_file.h"
#include "muon/internal/yaml_section.h"
#include "muon/presets.h"

namespace muon {

const std::vector<OptimizerName>& optimizer_names() {
  static const std::vector<OptimizerName> names{
      {"muon", "Muon for routed matrices, AdamW for the rest"},
      {"muonclip", "the same plus QK-clip (tau 100)"},
      {"dion", "Dion for routed matrices, from the preset dion's settings, AdamW for the rest"},
      {"adamw", "every trainable parameter in AdamW"},
  };
  return names;
}

std::string optimizer_name_list() {
  std::string out;
  for (const auto& n : optimizer_names()) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

void apply_optimizer_name(const std::string& name, HybridOptions& h) {
  const auto& names = optimizer_names();
  check(std::any_of(names.begin(), names.end(), [&](const auto& n) { return name == n.name; }),
        "unknown optimizer '", name, "'; valid optimizers are ", optimizer_name_list());
  // The matrices slot: kept where it already runs the named algorithm.
  if (name == "adamw") {
    h.matrices = AlgorithmOptions();
  } else if (name == "dion") {
    if (!h.matrices.as<DionOptions>()) h.matrices = muon_preset("dion").options;
  } else if (!h.matrices.as<MuonOptions>()) {
    h.matrices = MuonOptions();
  }
  if (name == "muonclip" && !h.qk_clip_tau) h.qk_clip_tau = 100.0;
}

namespace {

using detail::kind_of;
using detail::muon_of;
using detail::one_of;
using detail::refuse_for_matrices;
using detail::refuse_unused_under_adamw;
using detail::require;
using detail::Section;

// matrices: muon or dion (what name says, said as the partition); others: the elementwise
// algorithm of every other parameter (adamw unless set).
void read_partition(Section& s, OptimConfig& config) {
  if (const auto matrices = s.text("matrices")) {
    check(!s.has("name"), s.key_path("matrices"),
          ": name sets the matrices' algorithm too; give one of them");
    bool known = false;
    for_each_algorithm([&](auto* tag) {
      using Entry = Algorithm<std::remove_pointer_t<decltype(tag)>>;
      known = known || (Entry::kind == ParamKind::matrices && *matrices == Entry::name);
    });
    check(known, s.key_path("matrices"), ": '", *matrices,
          "' does not orthogonalize matrices; valid are ",
          algorithm_names_text(ParamKind::matrices));
    config.name = *matrices;
  }
  const auto others = s.text("others");
  if (!others) return;
  if (config.name == "adamw") refuse_unused_under_adamw(s, "others", "the others' algorithm");
  auto options = default_options_of(*others, ParamKind::any, s.key_path("others").c_str());
  // The others keep their settings so far when the name is the one they run.
  if (algorithm_name(*options) != algorithm_name(*config.hybrid.others)) {
    config.hybrid.others = AlgorithmOptions(std::move(options));
  }
}

// `dion` — Dion's settings, a mapping (earlier spellings are rewritten to it: config_legacy.cpp)
// — under name muon turns Dion on for the matrices, as when Dion was a Muon setting. Dion's options
// start from Muon's shared ones (lr, momentum, weight decay, ...) as the configuration has them so
// far; its settings are read with the sections (read_option_sections).
void read_dion_switch(Section& s, OptimConfig& config) {
  if (const auto n = s.find("dion"); !n || n.IsNull()) return;
  auto& h = config.hybrid;
  if (!h.matrices) refuse_unused_under_adamw(s, s.as_written("dion"), "Dion's settings");
  if (const auto* muon = muon_of(h)) {
    DionOptions dion;
    copy_shared_options(*muon, dion);
    h.matrices = dion;
  }
}

void read_rates(Section& s, OptimConfig& config) {
  const bool muon_family = config.name != "adamw";
  auto& h = config.hybrid;
  auto& others = *h.others;
  // Unset keys keep the options' own defaults (muon/option_schema.h); `lr` is AdamW's under
  // name adamw.
  const double lr = s.number("lr").value_or(muon_family ? h.matrices->get_lr() : others.get_lr());
  require(lr > 0, s.key_path("lr"), "> 0", lr);
  if (!muon_family && s.has("lr") && s.has("adamw_lr")) {
    refuse_unused_under_adamw(s, "lr",
                              "Muon's rate (adamw_lr is AdamW's, and lr is too when "
                              "alone)");
  }
  const double adamw_lr = s.number("adamw_lr").value_or(muon_family ? others.get_lr() : lr);
  require(adamw_lr > 0, s.key_path("adamw_lr"), "> 0", adamw_lr);
  if (h.matrices) h.matrices->set_lr(lr);
  others.set_lr(adamw_lr);
}

// ns_steps: in its option's range, checked on the number read (before it becomes an integer).
void read_ns_steps(Section& s, HybridOptions& h) {
  const auto written = s.as_written("ns_steps");
  if (!h.matrices && s.has("ns_steps")) refuse_unused_under_adamw(s, written, "Muon's ns_steps");
  if (const auto v = s.number("ns_steps")) {
    require(in_range(Range::iteration_count, *v), s.key_path("ns_steps"),
            range_text(Range::iteration_count), *v);
    const auto steps = static_cast<int64_t>(*v);
    if (!set_option(*h.matrices, "ns_steps", steps) &&
        steps != MuonOptions().ns_steps()) {  // Muon's default says what Dion does
      refuse_for_matrices(s, written, h, "ns_steps");
    }
  }
}

// muon_plus: true/false or {mode, eps}.
void read_muon_plus(Section& s, OptimConfig& config) {
  const bool muon_family = config.name != "adamw";
  auto& h = config.hybrid;
  // Muon+ normalizes Muon's orthogonalized update: under Dion the keys may only say it is off.
  MuonOptions unused;
  auto& muon = muon_of(h) != nullptr ? *muon_of(h) : unused;
  const auto plus = s.find("muon_plus");
  std::optional<bool> plus_on;
  if (plus && plus.IsMap()) {
    Section p(plus, s.key_path("muon_plus"));
    muon.post_norm(PostNorm::row_col);
    if (const auto mode = p.text("mode")) {
      muon.post_norm(one_of<PostNorm>(p.key_path("mode"), *mode, post_norm_from_string));
    }
    if (const auto eps = p.number("eps")) {
      muon.post_norm_eps(*eps);
      require(*eps > 0, s.key_path(s.as_written("muon_plus.eps")), "> 0", *eps);
    }
    p.finish();
    plus_on = muon.post_norm() != PostNorm::none;
  } else if (plus && !plus.IsNull()) {
    plus_on = Section::as_bool(plus, s.key_path("muon_plus"));
    if (*plus_on) muon.post_norm(PostNorm::row_col);
  }
  check(!plus_on.value_or(false) || muon_family, s.key_path("muon_plus"),
        ": Muon+ needs name muon or muonclip, not '", config.name, "'");
  for (const char* option : {"post_norm", "post_norm_eps"}) {
    if (&muon == &unused && !detail::says_what_dion_does(unused, option)) {
      refuse_for_matrices(s, s.as_written("muon_plus"), h, "Muon+ (post_norm)");
    }
  }
}

// Cautious masking and the state dtype, of both algorithms.
void read_masking_and_storage(Section& s, OptimConfig& config) {
  auto& h = config.hybrid;
  config.cautious = s.boolean("cautious").value_or(false);
  if (h.matrices) set_option(*h.matrices, "cautious", config.cautious);  // Muon and Dion have it
  const bool others_cautious = set_option(*h.others, "cautious", config.cautious);
  check(others_cautious || !config.cautious, s.key_path("cautious"), ": ",
        algorithm_name(*h.others),
        " (the others' algorithm) has no cautious masking; remove it, or choose others adamw");

  if (const auto v = s.text("state_dtype")) {
    const auto named = state_dtype_named(*v);
    check(named.has_value(), s.key_path("state_dtype"), ": expected ", kStateDtypeChoices,
          ", got '", *v, "'");
    const auto dtype = *named;
    // Dion keeps its momentum in full precision: float32 is what it does, the others refused.
    if (h.matrices && !set_option(*h.matrices, "state_dtype", dtype) && dtype != at::kFloat) {
      refuse_for_matrices(s, "state_dtype", h,
                          state_dtype_name(dtype) +
                              " state (its momentum M and the power iteration on it need full "
                              "precision: it keeps float32)");
    }
    set_option(*h.others, "state_dtype", dtype);  // every elementwise algorithm has one
  }
}

// QK-clip: {tau} (default 100 under name muonclip).
void read_qk_clip(Section& s, OptimConfig& config) {
  const bool muon_family = config.name != "adamw";
  auto& h = config.hybrid;
  const auto qk = s.find("qk_clip");
  if (qk && !qk.IsNull()) {
    Section q(qk, s.key_path("qk_clip"));
    const double tau = q.number("tau").value_or(100.0);
    require(tau > 0, q.key_path("tau"), "> 0", tau);
    q.finish();
    check(muon_family, s.key_path("qk_clip"), ": QK-clip needs name muon or muonclip");
    h.qk_clip_tau = tau;
  }
}

// Under name adamw Muon's section, its momentum schedule, the routing between Muon and AdamW and
// the groups' Muon settings have nothing to act on: refused, never dropped.
void refuse_muon_sections_under_adamw(const Section& s, const HybridOptions& h) {
  if (h.matrices) return;
  for (const auto& [key, what] : {std::pair{"muon", "Muon's section"},
                                  {"momentum_schedule", "Muon's momentum schedule"},
                                  {"routing", "routing between Muon and AdamW"}}) {
    if (s.has(key)) refuse_unused_under_adamw(s, key, what);
  }
  for (size_t i = 0; i < h.groups.size(); ++i) {
    const auto& g = h.groups[i];
    const char* muon_only = g.momentum      ? "momentum"
                            : g.num_heads   ? "num_heads"
                            : g.split_sizes ? "split_sizes"
                                            : nullptr;
    if (muon_only) {
      refuse_unused_under_adamw(s, "param_groups[" + std::to_string(i) + "]." + muon_only,
                                std::string("Muon's ") + muon_only);
    }
  }
}

// Reads the `optimizer` mapping, its keys in their current spelling, into `config`. The order is
// what precedence needs, in four steps: (1) what the matrices and the others run — the name, the
// partition, the dion switch, a preset — since every later key writes into those algorithms'
// options and overrides the preset's; (2) the flat keys, each read once and setting options of
// its own, so in any order among themselves; (3) the algorithms' sections, whose settings override
// the flat keys' (muon: {lr} over lr); (4) the scaling rules, which multiply the rates and decay as
// they stand at the end.
void read_optimizer(Section& s, OptimConfig& config) {
  if (const auto name = s.text("name")) config.name = *name;
  auto& h = config.hybrid;
  read_partition(s, config);  // before the name's settings: `matrices` says the name
  with_context(s.key_path("name"), [&] { apply_optimizer_name(config.name, h); });
  read_dion_switch(s, config);  // before the preset, which may set Dion from its own defaults
  read_groups_or_preset(s, config);
  read_rates(s, config);  // (2)
  detail::read_shorthands(s, h);
  read_ns_steps(s, h);
  read_muon_plus(s, config);
  read_masking_and_storage(s, config);
  read_qk_clip(s, config);
  detail::read_hybrid_fields(s, h);
  refuse_muon_sections_under_adamw(s, h);
  read_routing(s, config);
  detail::read_option_sections(s, h);  // (3)
  read_scaling(s, config);             // (4)
  s.finish();
  if (h.matrices) check_group_options(*h.matrices);
  with_context(s.key_path(algorithm_name(*h.others)), [&] { check_group_options(*h.others); });
}

OptimConfig read_config(const YAML::Node& root);

}  // namespace

std::vector<std::string> optimizer_keys() {  // those of an empty section, and every algorithm's
  Section top(YAML::Node(YAML::NodeType::Map), "");
  Section optimizer(YAML::Node(YAML::NodeType::Map), "optimizer");
  detail::know_earlier_spellings(top, optimizer);
  OptimConfig config;
  read_optimizer(optimizer, config);
  for_each_algorithm([&](auto* tag) {
    optimizer.know(Algorithm<std::remove_pointer_t<decltype(tag)>>::name);
  });
  return optimizer.known();
}

namespace {

// `text` as a YAML node; an empty document is an empty mapping. `what` names it in errors.
YAML::Node parse_yaml(const std::string& text, const char* what) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(std::string(what) + ": invalid YAML at line " + std::to_string(e.mark.line + 1) +
                ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  return root;
}

// Sets every key of the mapping `keys` in the mapping `into`, merging mappings key by key; a key
// both set (anything but a mapping on both sides) is an error naming its path.
void merge_keys(YAML::Node into, const YAML::Node& keys, const std::string& path) {
  for (const auto& item : keys) {
    const auto key = item.first.as<std::string>();
    const auto key_path = path + "." + key;
    const YAML::Node& existing = static_cast<const YAML::Node&>(into)[key];
    if (existing && !existing.IsNull() && existing.IsMap() && item.second.IsMap()) {
      merge_keys(existing, item.second, key_path);
      continue;
    }
    check(!existing || existing.IsNull(), key_path,
          ": set both by the configuration and by a keyword argument; give it once");
    into[key] = item.second;
  }
}

}  // namespace

std::string with_optimizer_keys(const std::string& yaml, const std::string& keys) {
  const auto extra = parse_yaml(keys, "optimizer keys");
  check(extra.IsMap(), "optimizer keys: expected a mapping of keys, got YAML of another kind");
  if (extra.size() == 0) return yaml;
  auto root = parse_yaml(yaml, "config");
  check(root.IsMap(), "config: expected a mapping at the top (optimizer: ...)");
  YAML::Node optimizer = root["optimizer"];
  if (!optimizer || optimizer.IsNull()) {
    optimizer = YAML::Node(YAML::NodeType::Map);
  } else if (optimizer.IsScalar()) {  // the scalar form `optimizer: muon` as a mapping
    YAML::Node mapping(YAML::NodeType::Map);
    mapping["name"] = optimizer.Scalar();
    optimizer = mapping;
  }
  check(optimizer.IsMap(), "config: optimizer must be a mapping or a name");
  merge_keys(optimizer, extra, "optimizer");
  root["optimizer"] = optimizer;
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

OptimConfig OptimConfig::from_yaml(const std::string& text) {
  auto root = parse_yaml(text, "config");
  try {
    return read_config(root);
  } catch (const YAML::Exception& e) {  // a node of a shape no reader above expected
    throw Error("config: unexpected YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

namespace {

// Keys of the optimizer section written at the top level (a config without `optimizer:`, or
// keys beside it): refused naming them and where they go, before the top level's own check would
// call them unknown.
void refuse_misplaced_keys(const YAML::Node& root, const Section& top, const Section& optimizer) {
  std::vector<std::string> misplaced;
  for (const auto& item : root) {
    if (!item.first.IsScalar()) continue;  // top.finish() words that
    const auto key = item.first.Scalar();
    if (!top.knows(key) && optimizer.knows(key)) misplaced.push_back(key);
  }
  if (misplaced.empty()) return;
  std::string keys;
  for (const auto& k : misplaced) keys += (keys.empty() ? "" : ", ") + k;
  throw Error("config: " + keys + (misplaced.size() == 1 ? " is a key" : " are keys") +
              " of the optimizer section, found at the top level; put " +
              (misplaced.size() == 1 ? "it" : "them") +
              " under `optimizer:` (optimizer: {name: muon, lr: 0.02}; docs/config.md)");
}

// The optimizer section as a mapping: `optimizer: muon` is {name: muon}; none is an empty one.
YAML::Node optimizer_mapping(const YAML::Node& given) {
  if (given && given.IsScalar()) {
    YAML::Node mapping(YAML::NodeType::Map);
    mapping["name"] = given.Scalar();
    return mapping;
  }
  if (given && !given.IsNull()) return given;
  return YAML::Node(YAML::NodeType::Map);
}

OptimConfig read_config(const YAML::Node& root) {
  Section top(root, "");
  OptimConfig config;
  const auto mapping = optimizer_mapping(top.find("optimizer"));
  // Before any reader: the keys earlier versions wrote, in their current spelling.
  auto written = detail::rewrite_earlier_spellings(root, mapping);
  Section optimizer(mapping, "optimizer");
  optimizer.set_written(std::move(written));
  detail::know_earlier_spellings(top, optimizer);
  read_optimizer(optimizer, config);
  refuse_misplaced_keys(root, top, optimizer);
  top.finish();
  return config;
}

}  // namespace

OptimConfig OptimConfig::from_yaml_file(const std::string& path) {
  const auto text = detail::read_file(path, "config");
  return with_context(path, [&] { return from_yaml(text); });
}

}  // namespace muon
