// The keys earlier versions wrote, rewritten into their current spelling before anything else
// reads the document (docs/config.md, "Earlier spellings"): the readers of the optimizer section
// (config.cpp, config_sections.cpp, config_options.cpp) know the current keys only, and read each
// section once.
#include <utility>

#include "muon/internal/config_sections.h"

namespace muon::detail {
namespace {

// Keys of the optimizer section renamed: the earlier spelling, the current one.
constexpr std::pair<const char*, const char*> kRenamed[] = {
    {"muon_ns_steps", "ns_steps"},
    {"muon_momentum", "momentum"},
};

// The value at `key` of the mapping `m`, read without adding the key.
YAML::Node at(const YAML::Node& m, const std::string& key) {
  return m[key];
}

bool given(const YAML::Node& n) {  // set: null counts as unset
  return n && !n.IsNull();
}

// Both spellings of one key are set: today's message for an alias given beside its key.
[[noreturn]] void both_given(const std::string& earlier, const std::string& current) {
  throw Error("optimizer." + earlier + ": both '" + current + "' and its alias '" + earlier +
              "' are set; keep one");
}

// Whether the optimizer section's `muon_plus` turns Muon+ on: true/false, or a mapping whose mode
// (row_col unless given) is not none.
bool muon_plus_on(const YAML::Node& plus) {
  if (!plus.IsMap()) return Section::as_bool(plus, "optimizer.muon_plus");
  const YAML::Node mode = at(plus, "mode");
  return !given(mode) || !mode.IsScalar() || mode.Scalar() != "none";
}

bool cautious_on(const YAML::Node& cautious) {
  return Section::as_bool(cautious, "optimizer.cautious");
}

// `key` at the root (true or false; the scalar form `optimizer: muon` leaves no other place for
// it), moved into the optimizer section; given in both places, the two must agree.
void move_root_switch(YAML::Node root, YAML::Node optimizer, const std::string& key,
                      bool (*on)(const YAML::Node&)) {
  const YAML::Node value = at(root, key);
  if (!value) return;
  if (!value.IsNull()) {
    const bool root_on = Section::as_bool(value, key);
    const YAML::Node nested = at(optimizer, key);
    if (given(nested)) {
      const bool nested_on = on(nested);
      check(nested_on == root_on, key, ": the root value ", root_on ? "true" : "false",
            " conflicts with optimizer.", key, " ", nested_on ? "true" : "false",
            "; set it in one place");
    } else {
      optimizer[key] = root_on;
    }
  }
  root.remove(key);
}

// `muon_norm_eps`, Muon+'s eps on its own, which does not turn Muon+ on: muon_plus's `eps`, with
// mode none where muon_plus is off or unset.
void move_norm_eps(YAML::Node optimizer, std::map<std::string, std::string>& written) {
  const YAML::Node eps = at(optimizer, "muon_norm_eps");
  if (!eps) return;
  if (!eps.IsNull()) {
    const YAML::Node plus = at(optimizer, "muon_plus");
    if (given(plus) && plus.IsMap()) {
      if (at(plus, "eps")) both_given("muon_norm_eps", "muon_plus.eps");
      optimizer["muon_plus"]["eps"] = eps;
    } else {
      YAML::Node mapping(YAML::NodeType::Map);
      if (!given(plus) || !Section::as_bool(plus, "optimizer.muon_plus")) mapping["mode"] = "none";
      mapping["eps"] = eps;
      if (!given(plus)) written["muon_plus"] = "muon_norm_eps";
      optimizer["muon_plus"] = mapping;
    }
    written["muon_plus.eps"] = "muon_norm_eps";
  }
  optimizer.remove("muon_norm_eps");
}

// The optimizer name as the partition reads it: `matrices`, else `name`, else muon.
std::string name_of(const YAML::Node& optimizer) {
  for (const char* key : {"matrices", "name"}) {
    const YAML::Node n = at(optimizer, key);
    if (given(n) && n.IsScalar()) return n.Scalar();
  }
  return "muon";
}

// `dion` as a Muon setting: true or false, at the top of the section or in its `muon` section.
// The current key is Dion's settings at the top — a mapping, which turns Dion on ({} for true) —
// and false (Dion off) is what every name but dion does anyway.
void rewrite_dion(YAML::Node optimizer, std::map<std::string, std::string>& written) {
  const YAML::Node muon = at(optimizer, "muon");
  if (muon && muon.IsMap() && at(muon, "dion")) {
    const YAML::Node nested = at(muon, "dion");
    if (given(nested)) {
      if (given(at(optimizer, "dion"))) both_given("muon.dion", "dion");
      optimizer["dion"] = nested;
      written["dion"] = "muon.dion";
    }
    optimizer["muon"].remove("dion");
  }
  const YAML::Node dion = at(optimizer, "dion");
  if (!given(dion) || !dion.IsScalar()) return;
  const auto found = written.find("dion");
  const std::string key = found == written.end() ? "dion" : found->second;
  const std::string name = name_of(optimizer);
  if (name == "adamw") {
    refuse_unused_under_adamw(Section(optimizer, "optimizer"), key, "Dion's settings");
  }
  if (Section::as_bool(dion, "optimizer." + key)) {
    optimizer["dion"] = YAML::Node(YAML::NodeType::Map);
    return;
  }
  check(name != "dion", "optimizer.", key,
        ": false turns Dion off, but name dion runs it; choose name muon");
  optimizer.remove("dion");
  written.erase("dion");
}

}  // namespace

std::map<std::string, std::string> rewrite_earlier_spellings(YAML::Node root,
                                                             YAML::Node optimizer) {
  std::map<std::string, std::string> written;
  if (!root.IsMap() || !optimizer.IsMap()) return written;  // the readers refuse either
  // The root's switches first: muon_norm_eps below merges into the muon_plus they may set.
  move_root_switch(root, optimizer, "muon_plus", muon_plus_on);
  move_root_switch(root, optimizer, "cautious", cautious_on);
  for (const auto& [earlier, current] : kRenamed) {
    if (!at(optimizer, earlier)) continue;
    if (at(optimizer, current)) both_given(earlier, current);
    optimizer[current] = at(optimizer, earlier);
    optimizer.remove(earlier);
    written[current] = earlier;
  }
  move_norm_eps(optimizer, written);
  rewrite_dion(optimizer, written);
  return written;
}

void know_earlier_spellings(Section& top, Section& optimizer) {
  for (const char* key : {"muon_plus", "cautious"}) top.know(key);
  for (const auto& renamed : kRenamed) optimizer.know(renamed.first);
  optimizer.know("muon_norm_eps");
}

std::string earlier_spelling(const std::string& key) {
  for (const auto& [earlier, current] : kRenamed) {
    if (key == current) return earlier;
  }
  return "";
}

}  // namespace muon::detail
