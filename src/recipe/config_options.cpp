// The optimizer config's schema-driven keys: the `muon` section and the others' (`adamw`, `lion`,
// ...), the hybrid's own
// keys, schedules and parameter groups through the generic reader and writer (schema_yaml.h), the
// root-level shorthands, and config_schema for the docs and tests.
#include "muon/internal/schema_yaml.h"

#include <set>
#include <string>

namespace muon::detail {
namespace {

// The root-level shorthands of the optimizer section: `key` (or `alias`) sets the option
// `option` of the matrices' algorithm (Muon unless Dion) and/or of the others' (AdamW unless
// `others` says), with that option's type and range. (An earlier spelling of a key is rewritten
// before reading: config_legacy.cpp.)
struct Shorthand {
  const char* key;
  const char* alias;
  const char* option;
  bool muon;
  bool others;
};
constexpr Shorthand kShorthands[] = {
    {"weight_decay", "", "weight_decay", true, true},
    {"weight_decay_method", "", "weight_decay_method", true, true},
    {"betas", "", "betas", false, true},
    {"eps", "", "eps", false, true},
    {"momentum", "", "momentum", true, false},
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

// The YAML text of option `name` of `o`.
template <class Options>
std::string option_text(const Options& o, const std::string& name) {
  std::string out;
  visit_options(o, [&](const OptionInfo& info, const auto& value) {
    if (name != info.name) return;
    YAML::Emitter text;
    text.SetNullFormat(YAML::LowerNull);
    text << YAML::Flow;
    emit_value(text, value);
    out = text.c_str();
  });
  return out;
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

bool says_what_dion_does(const MuonOptions& read, const std::string& option) {
  if (option == "nesterov") return !read.nesterov();
  if (option == "momentum_form") return read.momentum_form() == MomentumForm::sum;
  return option_text(read, option) == option_text(MuonOptions(), option);
}

MuonOptions* muon_of(HybridOptions& h) {
  return h.matrices.as<MuonOptions>();
}

void refuse_for_matrices(const Section& s, const std::string& key, const HybridOptions& h,
                         const std::string& option) {
  if (!h.matrices) refuse_unused_under_adamw(s, key, "Muon's " + option);
  throw Error(s.key_path(key) + ": " + algorithm_name(*h.matrices) +
              " (the matrices' algorithm) has no " + option + "; remove it, or choose name muon");
}

void read_shorthands(Section& s, HybridOptions& h) {
  auto read_others = [&](const Shorthand& sh) {
    return visit_algorithm(*h.others,
                           [&](auto& options) { return read_shorthand(s, sh, options); });
  };
  auto read_matrices = [&](const Shorthand& sh) {
    return visit_algorithm(*h.matrices,
                           [&](auto& options) { return read_shorthand(s, sh, options); });
  };
  const std::string matrices = h.matrices ? algorithm_name(*h.matrices) : "";
  const std::string matrices_title = algorithm_title(matrices);
  for (const auto& sh : kShorthands) {
    const std::string given = s.has(sh.key)                  ? s.as_written(sh.key)
                              : *sh.alias && s.has(sh.alias) ? sh.alias
                                                             : "";
    if (!h.matrices && !sh.others) {
      // No parameter is Muon's under name adamw: a Muon key sets AdamW's option of that name
      // where AdamW has one (nesterov), and is refused where nothing would read it.
      if (!read_others(sh) && !given.empty()) {
        refuse_unused_under_adamw(s, given, std::string("Muon's ") + sh.option);
      }
      continue;
    }
    const bool by_muon = sh.muon && h.matrices && read_matrices(sh);
    if (sh.muon && !sh.others && !by_muon) {  // a Muon setting the matrices' algorithm lacks
      MuonOptions read;
      read_shorthand(s, sh, read);
      if (!given.empty() && !says_what_dion_does(read, sh.option)) {
        refuse_for_matrices(s, given, h, sh.option);
      }
    }
    const bool by_others = sh.others && read_others(sh);
    // Meant for both, read by one, would silently miss the other: refused.
    check(given.empty() || !sh.others || by_others, s.key_path(given), ": ",
          algorithm_name(*h.others), " (the others' algorithm) has no ", sh.option,
          by_muon ? "; set " + matrices_title + "'s alone in the " + matrices + " section (" +
                        matrices + ": {" + sh.option + ": ...})"
                  : std::string("; remove it"));
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
    Section section(n, s.key_path(s.as_written(key)));
    read_fields(section, options);
    section.finish();
  }
}

// The muon section under Dion, as configurations and runs written when Dion was a Muon setting
// have it: Dion's settings; a Muon setting Dion lacks is accepted when it says what Dion does
// (says_what_dion_does), refused otherwise.
void read_muon_section_as_dion(Section& s, HybridOptions& h) {
  const auto n = s.find("muon");
  if (!n || n.IsNull()) return;
  Section section(n, s.key_path("muon"));
  std::set<std::string> own;
  visit_algorithm(*h.matrices, [&](auto& options) {
    read_fields(section, options);
    visit_options(options, [&](const OptionInfo& info, const auto&) { own.insert(info.name); });
  });
  MuonOptions read;
  read_fields(section, read);
  visit_options(read, [&](const OptionInfo& info, const auto&) {
    if (own.count(info.name) == 0 && section.has(info.name) &&
        !says_what_dion_does(read, info.name)) {
      refuse_for_matrices(section, info.name, h, info.name);
    }
  });
  section.finish();
}

}  // namespace

void read_option_sections(Section& s, HybridOptions& h) {
  if (auto* muon = muon_of(h)) {
    read_section(s, "muon", *muon);
  } else if (h.matrices) {
    read_muon_section_as_dion(s, h);
    visit_algorithm(*h.matrices,
                    [&](auto& options) { read_section(s, algorithm_name(options), options); });
  }  // (no matrices slot: their sections were refused with the name)
  const std::string others = algorithm_name(*h.others);
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    const std::string name = Algorithm<Options>::name;
    if (Algorithm<Options>::kind != ParamKind::any || name == others || !s.has(name)) return;
    throw Error(s.key_path(name) + ": " + name + " trains nothing here: the parameters Muon " +
                "does not take run " + others + "; set others: " + name + " to train them with " +
                name + " (docs/config.md, \"The partition\")");
  });
  visit_algorithm(*h.others, [&](auto& options) { read_section(s, others.c_str(), options); });
}

ParamGroupSpec read_group(const YAML::Node& n, const std::string& path) {
  ParamGroupSpec g;
  read_value(n, path, g);
  return g;
}

void emit_hybrid(YAML::Emitter& out, const HybridOptions& h) {
  if (h.matrices) {  // under name adamw no parameter is Muon's
    out << YAML::Key << algorithm_name(*h.matrices) << YAML::Value;
    visit_algorithm(*h.matrices, [&](const auto& options) { emit_fields(out, options); });
  }
  const std::string others = algorithm_name(*h.others);
  if (others != "adamw") out << YAML::Key << "others" << YAML::Value << others;
  out << YAML::Key << others << YAML::Value;
  visit_algorithm(*h.others, [&](const auto& options) { emit_fields(out, options); });
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
  std::vector<ConfigKey> algorithm_rows;
  bool is_algorithm = false;
  for_each_algorithm([&](auto* tag) {
    using Options = std::remove_pointer_t<decltype(tag)>;
    if (section != Algorithm<Options>::name) return;
    algorithm_rows = rows_of(Options{});
    is_algorithm = true;
  });
  if (is_algorithm) return algorithm_rows;
  if (section == "optimizer") return rows_of(HybridOptions{});
  if (section == "schedule") return rows_of(LrSchedule{}, true);
  if (section == "schedule.tail") return rows_of(PowerTail{});
  if (section == "momentum_schedule") return rows_of(MomentumSchedule{});
  if (section == "param_group") return rows_of(ParamGroupSpec{});
  check(section == "shorthand", "config_schema: unknown section '", section,
        "'; valid sections are optimizer, shorthand, ", algorithm_names_text(),
        ", schedule, schedule.tail, momentum_schedule, param_group");
  std::vector<ConfigKey> rows;
  for (const auto& sh : detail::kShorthands) {
    const std::string muon = std::string("muon.") + sh.option;
    const std::string others =
        std::string("the others' ") + sh.option + " (adamw." + sh.option + " by default)";
    const std::string sets = sh.muon && sh.others ? muon + " and " + others
                             : sh.muon            ? muon
                                                  : others;
    const std::string alias = *sh.alias != '\0' ? sh.alias : detail::earlier_spelling(sh.key);
    rows.push_back({sh.key, alias, "", "sets " + sets, "", ""});
  }
  return rows;
}

}  // namespace muon
