// Internal to the recipe and application layers: reading a YAML mapping with typed accessors that
// name the key path in every error, and a final check that rejects unknown keys with the closest
// valid one.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "muon/error.h"

namespace muon::detail {

// Edit distance, for "did you mean" suggestions.
inline size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

inline std::string kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "'" + n.Scalar() + "'";
    default:
      return "nothing";
  }
}

// A mapping being read: typed accessors that name the key path in every error, and a final check
// that rejects keys nobody read (suggesting the closest valid one).
class Section {
 public:
  Section(YAML::Node node, std::string path) : node_(std::move(node)), path_(std::move(path)) {
    check(node_.IsMap(), path_, ": expected a mapping, got ", kind_of(node_));
  }

  std::string key_path(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }

  // Counts `key` as known without reading it: a valid key that another step reads.
  void know(const std::string& key) { known_.insert(key); }

  // Whether a reader asked for `key` (or has it as an alias).
  bool knows(const std::string& key) const { return known_.count(key) != 0; }

  // Every key a reader asked for so far, sorted.
  std::vector<std::string> known() const { return {known_.begin(), known_.end()}; }

  // The node at `key` or an alias of it (the first present), marking all as known.
  YAML::Node find(const std::string& key, std::initializer_list<const char*> aliases = {}) {
    known_.insert(key);
    YAML::Node found;  // an invalid (absent) node unless a name is present
    std::string found_as;
    std::vector<std::string> names{key};
    for (const char* a : aliases) names.emplace_back(a);
    for (const auto& name : names) {
      known_.insert(name);
      if (node_[name]) {
        check(found_as.empty(), key_path(name), ": both '", found_as, "' and its alias '", name,
              "' are set; keep one");
        found = node_[name];
        found_as = name;
      }
    }
    return found_as.empty() ? YAML::Node(YAML::NodeType::Undefined) : found;
  }

  // Whether `key` is set (null counts as unset); does not mark it as known.
  bool has(const std::string& key) const {
    const YAML::Node& node = node_;
    return node[key] && !node[key].IsNull();
  }

  std::optional<double> number(const std::string& key,
                               std::initializer_list<const char*> aliases = {}) {
    const auto n = find(key, aliases);
    if (!n || n.IsNull()) return std::nullopt;
    return as_number(n, key_path(key));
  }
  static constexpr double kLargestWhole = 9007199254740992.0;  // 2^53: exact in a double

  std::optional<int64_t> integer(const std::string& key) {
    const auto n = find(key);
    if (!n || n.IsNull()) return std::nullopt;
    return as_integer(n, key_path(key));
  }
  // Sets `field` from the whole number > 0 at `key`, when present.
  void read_positive(const std::string& key, int64_t& field) {
    if (const auto v = integer(key)) {
      check(*v > 0, key_path(key), " must be > 0, got ", *v);
      field = *v;
    }
  }
  std::optional<bool> boolean(const std::string& key) {
    const auto n = find(key);
    if (!n || n.IsNull()) return std::nullopt;
    return as_bool(n, key_path(key));
  }
  std::optional<std::string> text(const std::string& key) {
    const auto n = find(key);
    if (!n || n.IsNull()) return std::nullopt;
    check(n.IsScalar(), key_path(key), ": expected a string, got ", kind_of(n));
    return n.Scalar();
  }
  std::optional<std::vector<std::string>> strings(const std::string& key) {
    const auto n = find(key);
    if (!n || n.IsNull()) return std::nullopt;
    check(n.IsSequence(), key_path(key), ": expected a list of strings, got ", kind_of(n));
    std::vector<std::string> out;
    for (size_t i = 0; i < n.size(); ++i) {
      check(n[i].IsScalar(), key_path(key), "[", i, "]: expected a string, got ", kind_of(n[i]));
      out.push_back(n[i].Scalar());
    }
    return out;
  }

  // Rejects keys that were never asked for, suggesting the closest known one: a common synonym
  // from other frameworks, else the nearest by edit distance.
  void finish() const {
    static const std::map<std::string, std::string> synonyms = {
        {"learning_rate", "lr"},         {"epsilon", "eps"}, {"wd", "weight_decay"},
        {"clip_grad_norm", "grad_clip"}, {"beta", "betas"},  {"groups", "param_groups"},
        {"lr_scheduler", "schedule"}};
    for (const auto& item : node_) {
      check(item.first.IsScalar(), path_.empty() ? "config" : path_, ": a key must be a name, got ",
            kind_of(item.first));
      const auto key = item.first.as<std::string>();
      if (known_.count(key) != 0) continue;
      const auto synonym = synonyms.find(key);
      if (synonym != synonyms.end() && known_.count(synonym->second) != 0) {
        throw Error(key_path(key) + ": unknown key; did you mean '" + synonym->second + "'?");
      }
      std::string best;
      size_t best_distance = 1000;
      for (const auto& k : known_) {
        const auto d = distance(key, k);
        if (d < best_distance) best_distance = d, best = k;
      }
      std::string valid;
      for (const auto& k : known_) valid += (valid.empty() ? "" : ", ") + k;
      throw Error(key_path(key) + ": unknown key" +
                  (best_distance <= std::max<size_t>(2, key.size() / 3)
                       ? "; did you mean '" + best + "'?"
                       : "; valid keys: " + valid));
    }
  }

  static double as_number(const YAML::Node& n, const std::string& path) {
    check(n.IsScalar(), path, ": expected a number, got ", kind_of(n));
    double v = 0;
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      throw Error(path + ": expected a number, got '" + n.Scalar() + "'");
    }
    check(std::isfinite(v), path, ": must be finite, got ", n.Scalar());
    return v;
  }
  static int64_t as_integer(const YAML::Node& n, const std::string& path) {
    const double v = as_number(n, path);
    check(std::floor(v) == v, path, ": expected a whole number, got ", n.Scalar());
    check(std::fabs(v) <= kLargestWhole, path, ": ", n.Scalar(),
          " is too large (whole numbers up to 2^53 are valid)");
    return static_cast<int64_t>(v);
  }
  static bool as_bool(const YAML::Node& n, const std::string& path) {
    check(n.IsScalar(), path, ": expected true or false, got ", kind_of(n));
    try {
      return n.as<bool>();
    } catch (const YAML::Exception&) {
      throw Error(path + ": expected true or false, got '" + n.Scalar() + "'");
    }
  }

  const YAML::Node& node() const { return node_; }
  const std::string& path() const { return path_; }

  // The keys below this section that the configuration wrote in an earlier spelling, rewritten
  // before reading (src/recipe/config_legacy.cpp): current key → the key as written.
  void set_written(std::map<std::string, std::string> written) { written_ = std::move(written); }
  // `key` as the configuration wrote it — its earlier spelling where it had one — for a message
  // that quotes the file.
  std::string as_written(const std::string& key) const {
    const auto found = written_.find(key);
    return found == written_.end() ? key : found->second;
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> known_;
  std::map<std::string, std::string> written_;
};

}  // namespace muon::detail
