// Internal to the recipe layer: readers of the optimizer config's nested sections (betas,
// coefficient tables, schedules, parameter groups and presets, routing, scaling rules).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "muon/config.h"
#include "muon/internal/yaml_section.h"

namespace muon::detail {

// Rewrites the keys earlier versions wrote into their current spelling, in the document `root`
// and its optimizer section `optimizer` (a mapping), before any reader sees them
// (docs/config.md, "Earlier spellings"); both spellings of one key given is an error. Returns the
// rewritten keys of the optimizer section, current → as written (Section::set_written).
std::map<std::string, std::string> rewrite_earlier_spellings(YAML::Node root, YAML::Node optimizer);
// The earlier spelling of the optimizer section's key `key` (muon_momentum for momentum), or "".
std::string earlier_spelling(const std::string& key);
// Counts the earlier spellings as known keys of the document (`top`) and of its optimizer section:
// still valid, an unknown key's message lists them and suggests them.
void know_earlier_spellings(Section& top, Section& optimizer);

// Throws "<path> must be <rule>, got <value>" unless `ok`.
void require(bool ok, const std::string& path, const std::string& rule, double value);

// parse(value), its error prefixed by `path`.
template <class T>
T one_of(const std::string& path, const std::string& value,
         const std::function<T(const std::string&)>& parse) {
  return with_context(path, [&] { return parse(value); });
}

Betas read_betas(const YAML::Node& n, const std::string& path);
CoefficientTable read_table(const YAML::Node& n, const std::string& path);
// One entry of `param_groups`, by its schema (muon/param_groups.h).
ParamGroupSpec read_group(const YAML::Node& n, const std::string& path);
// `param_groups` and `preset` of the optimizer section `s` (a preset that sets groups, mup or
// nanochat, excludes param_groups). Read before the other keys, which override a preset's settings.
void read_groups_or_preset(Section& s, OptimConfig& config);
// The root-level shorthands of `s` (weight_decay, betas, momentum, ...): each sets its option of
// the matrices' algorithm (Muon, Dion) and/or the others' (AdamW unless `others` says). Under name
// adamw (no matrices slot) a Muon key sets AdamW's option of the same name, or is refused when
// AdamW has none.
void read_shorthands(Section& s, HybridOptions& h);
// The matrices' Muon options, or null when they run another algorithm (Dion).
MuonOptions* muon_of(HybridOptions& h);
// Whether Muon's option `option` as `read` holds it says what Dion does anyway — configurations
// written when Dion was a Muon setting state such options: at Muon's default (to_yaml wrote them
// all), and for nesterov and momentum_form at Dion's own momentum (summed, without Nesterov).
bool says_what_dion_does(const MuonOptions& read, const std::string& option);
// Throws "<key>: dion (the matrices' algorithm) has no <option>; ...": a Muon setting under Dion.
[[noreturn]] void refuse_for_matrices(const Section& s, const std::string& key,
                                      const HybridOptions& h, const std::string& option);
// Throws "<key>: <what> would do nothing: name adamw trains every parameter with AdamW ...".
[[noreturn]] void refuse_unused_under_adamw(const Section& s, const std::string& key,
                                            const std::string& what);
// The hybrid's own keys of `s` (grad_clip, nonfinite and the schedules), by their schema.
void read_hybrid_fields(Section& s, HybridOptions& h);
// The sections of the algorithms that run — `muon` (or `dion`) and `adamw` (or the others') — of
// `s`: any option by its schema name (muon/option_schema.h), over what the shorthand keys set.
// Under Dion the `muon` section, written when Dion was a Muon setting, holds Dion's settings.
void read_option_sections(Section& s, HybridOptions& h);
// The sections of the algorithms that run in full, the hybrid's own keys and the groups, for
// to_yaml.
void emit_hybrid(YAML::Emitter& out, const HybridOptions& h);
// `routing` of `s`.
void read_routing(Section& s, OptimConfig& config);
// `scaling` of `s`, applied to the base rates and decay (a note says how).
void read_scaling(Section& s, OptimConfig& config);

}  // namespace muon::detail
