// The optimizer config's schema-driven keys: the `muon` and `adamw` sections, the hybrid's own
// keys, schedules and parameter groups through the generic reader and writer (schema_yaml.h), the
// root-level shorthands, and config_schema for the docs and tests.
#include "muon/internal/schema_yaml.h"

namespace muon::detail {
namespace {

// The root-level shorthands of the optimizer section: `key` (or `alias`) sets the option
// `option` of MuonOptions and/or AdamWOptions, with that option's type and range.
struct Shorthand {
  const char* key;
  const char* alias;
  const char* option;
  bool muon;
  bool adamw;
};
constexpr Shorthand kShorthands[] = {
    {"weight_decay", "", "weight_decay", true, true},
    {"weight_decay_method", "", "weight_decay_method", true, true},
    {"betas", "", "betas", false, true},
    {"eps", "", "eps", false, true},
    {"momentum", "muon_momentum", "momentum", true, false},
    {"nesterov", "", "nesterov", true, false},
    {"momentum_form", "", "momentum_form", true, false},
    {"ns_coefficients", "coefficients", "coefficients", true, false},
    {"ns_eps", "", "ns_eps", true, false},
    {"row_equilibration", "", "row_equilibration", true, false},
    {"ns_dtype", "", "ns_dtype", true, false},
    {"ns_method", "", "ns_method", true, false},
    {"gram_restarts", "", "gram_restarts", true, false},
    {"gram_coefficients", "", "gram_coefficients", true, false},
    {"adjust_lr", "", "adjust_lr", true, false},
    {"normuon", "", "normuon", true, false},
    {"dion", "", "dion", true, false},
    {"cautious_weight_decay", "", "cautious_weight_decay", true, false},
    {"fused", "", "fused", true, true},
};

// Reads `sh` into `options`; false when Options has no option of that name.
template <class Options>
bool read_shorthand(Section& s, const Shorthand& sh, Options& options) {
  bool has_option = false;
  visit_options(options, [&](const OptionInfo& info, auto& value) {
    if (std::strcmp(info.name, sh.option) != 0) return;
    has_option = true;
    const auto n = *sh.alias != '\0' ? s.find(sh.key, {sh.alias}) : s.find(sh.key);
    if (n) read_field(info, n, s.key_path(sh.key), value);
  });
  return has_option;
}

// One row of config_schema per field of `defaults`, the default written as YAML.
template <class S>
std::vector<ConfigKey> rows_of(const S& defaults, bool with_kinds = false) {
  std::vector<ConfigKey> rows;
  visit_options(defaults, [&](const OptionInfo& info, const auto& value) {
    YAML::Emitter text;
    text.SetNullFormat(YAML::LowerNull);
    text << YAML::Flow;
    emit_value(text, value);
    rows.push_back({info.name, info.alias, text.c_str(), info.doc, range_text(info.range),
                    with_kinds ? info.kinds : ""});
  });
  return rows;
}

}  // namespace

void read_shorthands(Section& s, HybridOptions& h) {
  for (const auto& sh : kShorthands) {
    if (h.all_adamw && !sh.adamw) {
      // No parameter is Muon's under name adamw: a Muon key sets AdamW's option of that name
      // where AdamW has one (nesterov), and is refused where nothing would read it.
      const char* given = s.has(sh.key) ? sh.key : *sh.alias && s.has(sh.alias) ? sh.alias : "";
      if (!read_shorthand(s, sh, h.adamw) && *given) {
        refuse_unused_under_adamw(s, given, std::string("Muon's ") + sh.option);
      }
      continue;
    }
    if (sh.muon) read_shorthand(s, sh, h.muon);
    if (sh.adamw) read_shorthand(s, sh, h.adamw);
  }
}

void refuse_unused_under_adamw(const Section& s, const std::string& key, const std::string& what) {
  throw Error(s.key_path(key) + ": " + what +
              " would do nothing: name adamw trains every parameter with AdamW. Remove it, or "
              "choose name muon to train the hidden matrices with Muon");
}

void read_hybrid_fields(Section& s, HybridOptions& h) {
  read_fields(s, h);
}

namespace {
template <class Options>
void read_section(Section& s, const char* key, Options& options) {
  if (const auto n = s.find(key); n && !n.IsNull()) {
    Section section(n, s.key_path(key));
    read_fields(section, options);
    section.finish();
  }
}
}  // namespace

void read_option_sections(Section& s, HybridOptions& h) {
  read_section(s, "muon", h.muon);
  read_section(s, "adamw", h.adamw);
}

ParamGroupSpec read_group(const YAML::Node& n, const std::string& path) {
  ParamGroupSpec g;
  read_value(n, path, g);
  return g;
}

void emit_hybrid(YAML::Emitter& out, const HybridOptions& h) {
  if (!h.all_adamw) {  // under name adamw no parameter is Muon's
    out << YAML::Key << "muon" << YAML::Value;
    emit_fields(out, h.muon);
  }
  out << YAML::Key << "adamw" << YAML::Value;
  emit_fields(out, h.adamw);
  emit_pairs(out, h);
  if (!h.groups.empty()) {
    out << YAML::Key << "param_groups" << YAML::Value << YAML::BeginSeq;
    for (const auto& g : h.groups) emit_value(out, g);
    out << YAML::EndSeq;
  }
}

}  // namespace muon::detail

namespace muon {

std::vector<ConfigKey> config_schema(const std::string& section) {
  using detail::rows_of;
  if (section == "muon") return rows_of(MuonOptions{});
  if (section == "adamw") return rows_of(AdamWOptions{});
  if (section == "optimizer") return rows_of(HybridOptions{});
  if (section == "schedule") return rows_of(LrSchedule{}, true);
  if (section == "schedule.tail") return rows_of(PowerTail{});
  if (section == "momentum_schedule") return rows_of(MomentumSchedule{});
  if (section == "param_group") return rows_of(ParamGroupSpec{});
  check(section == "shorthand", "config_schema: unknown section '", section,
        "'; valid sections are optimizer, shorthand, muon, adamw, schedule, schedule.tail, "
        "momentum_schedule, param_group");
  std::vector<ConfigKey> rows;
  for (const auto& sh : detail::kShorthands) {
    const std::string muon = std::string("muon.") + sh.option;
    const std::string adamw = std::string("adamw.") + sh.option;
    const std::string sets = sh.muon && sh.adamw ? muon + " and " + adamw : sh.muon ? muon : adamw;
    rows.push_back({sh.key, sh.alias, "", "sets " + sets, "", ""});
  }
  return rows;
}

}  // namespace muon
