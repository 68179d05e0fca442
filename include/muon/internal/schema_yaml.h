// Internal to the recipe and application layers: YAML reading and writing of any struct the
// option schema describes (muon/option_schema.h) — one reader and one writer per field type, the
// range of each numeric field checked with its key path, a schedule's fields checked against its
// kind.
#pragma once

#include <yaml-cpp/yaml.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "muon/internal/config_sections.h"
#include "muon/internal/number_text.h"
#include "muon/error.h"

namespace muon::detail {

template <class E>
using has_enum_names = decltype(EnumNames<E>::table);
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// The dtypes a config names.
constexpr std::array<std::pair<at::ScalarType, const char*>, 4> kDtypeNames{
    {{at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kChar, "int8"}, {at::kDouble, "float64"}}};

// Whether a field of `kinds` ("" all) belongs to the schedule kind `kind` ("" any).
inline bool belongs(const char* kinds, const std::string& kind) {
  if (*kinds == '\0' || kind.empty()) return true;
  const std::string list = std::string(" ") + kinds + " ";
  return list.find(" " + kind + " ") != std::string::npos;
}

// ---- reading: read_value(node, path, value) ----

template <class T>
void read_value(const YAML::Node& n, const std::string& path, std::optional<T>& out);
inline void read_value(const YAML::Node& n, const std::string& path, LrSchedule& out);
template <class S>
void read_fields(Section& s, S& out, const std::string& kind = "");

inline void read_value(const YAML::Node& n, const std::string& path, double& out) {
  out = Section::as_number(n, path);
}
inline void read_value(const YAML::Node& n, const std::string& path, bool& out) {
  out = Section::as_bool(n, path);
}
inline void read_value(const YAML::Node& n, const std::string& path, int64_t& out) {
  out = Section::as_integer(n, path);
}
inline void read_value(const YAML::Node& n, const std::string& path, std::string& out) {
  check(n.IsScalar(), path, ": expected a string, got ", kind_of(n));
  out = n.Scalar();
}
inline void read_value(const YAML::Node& n, const std::string& path,
                       std::vector<std::string>& out) {
  check(n.IsSequence(), path, ": expected a list of strings, got ", kind_of(n));
  out.assign(n.size(), "");
  for (size_t i = 0; i < n.size(); ++i)
    read_value(n[i], path + "[" + std::to_string(i) + "]", out[i]);
}
inline void read_value(const YAML::Node& n, const std::string& path, CoefficientTable& out) {
  out = read_table(n, path);
}
inline void read_value(const YAML::Node& n, const std::string& path, Betas& out) {
  out = read_betas(n, path);
}
inline at::ScalarType dtype_named(const YAML::Node& n, const std::string& path, const char* valid) {
  check(n.IsScalar(), path, ": expected ", valid, ", got ", kind_of(n));
  for (const auto& [dtype, name] : kDtypeNames) {
    if (n.Scalar() == name) return dtype;
  }
  throw Error(path + ": expected " + valid + ", got '" + n.Scalar() + "'");
}
inline void read_value(const YAML::Node& n, const std::string& path, at::ScalarType& out) {
  out = dtype_named(n, path, "float32, bfloat16, int8 or float64");
}
// null: per device.
inline void read_value(const YAML::Node& n, const std::string& path,
                       std::optional<at::ScalarType>& out) {
  out = n.IsNull() ? std::nullopt
                   : std::optional(dtype_named(
                         n, path, "float32, bfloat16 or float64 (or null: per device)"));
}
inline void read_value(const YAML::Node& n, const std::string& path, std::vector<int64_t>& out) {
  check(n.IsSequence(), path, ": expected a list of whole numbers, got ", kind_of(n));
  out.assign(n.size(), 0);
  for (size_t i = 0; i < n.size(); ++i)
    read_value(n[i], path + "[" + std::to_string(i) + "]", out[i]);
}
// true (the defaults), false or null (off), or {beta2, axis}.
inline void read_value(const YAML::Node& n, const std::string& path,
                       std::optional<NorMuonOptions>& out) {
  if (n.IsNull() || (n.IsScalar() && !Section::as_bool(n, path))) {
    out = std::nullopt;
    return;
  }
  NorMuonOptions o;
  if (n.IsMap()) {
    Section s(n, path);
    if (const auto b = s.number("beta2")) {
      require(*b >= 0 && *b < 1, s.key_path("beta2"), "in [0, 1)", *b);
      o.beta2 = *b;
    }
    if (const auto a = s.text("axis")) {
      o.axis = one_of<NorMuonAxis>(s.key_path("axis"), *a, normuon_axis_from_string);
    }
    s.finish();
  }
  out = o;
}
inline void read_value(const YAML::Node& n, const std::string& path, WeightDecaySchedule& out) {
  const auto name = n.IsScalar() ? n.Scalar() : kind_of(n);
  check(name == "constant" || name == "cosine", path, ": expected constant or cosine, got '", name,
        "'");
  out.cosine = name == "cosine";
}
template <class E, class = has_enum_names<E>>
void read_value(const YAML::Node& n, const std::string& path, E& out) {
  check(n.IsScalar(), path, ": expected one of ", enum_name_list<E>(), ", got ", kind_of(n));
  out = one_of<E>(path, n.Scalar(), enum_from_name<E>);
}

// A mapping read field by field after its required keys are checked ({key, message}).
template <class S>
void read_struct(const YAML::Node& n, const std::string& path, S& out,
                 std::initializer_list<std::pair<const char*, const char*>> required) {
  Section s(n, path);
  for (const auto& [key, message] : required) {
    const auto k = s.find(key);
    check(k && !k.IsNull(), s.key_path(key), ": ", message);
  }
  read_fields(s, out);
  s.finish();
}
inline void read_value(const YAML::Node& n, const std::string& path, PowerTail& out) {
  read_struct(n, path, out, {{"start", "a tail needs its start step"}});
}
inline void read_value(const YAML::Node& n, const std::string& path, MomentumSchedule& out) {
  read_struct(n, path, out, {});
  with_context(path, [&] { out.check(); });
}
inline void read_value(const YAML::Node& n, const std::string& path, ParamGroupSpec& out) {
  read_struct(n, path, out,
              {{"name", "a parameter group needs a name"},
               {"patterns", "a parameter group needs patterns, e.g. [\"*\"]"}});
}
// The name first: it decides which other fields belong.
inline void read_value(const YAML::Node& n, const std::string& path, LrSchedule& out) {
  Section s(n, path);
  const auto name = s.text("name");
  check(name.has_value(), s.key_path("name"), ": a schedule needs a name (",
        enum_name_list<ScheduleKind>(), ")");
  out = LrSchedule{};
  out.kind = one_of<ScheduleKind>(s.key_path("name"), *name, schedule_kind_from_string);
  read_fields(s, out, *name);
  s.finish();
}
// null: unset.
template <class T>
void read_value(const YAML::Node& n, const std::string& path, std::optional<T>& out) {
  if (n.IsNull()) {
    out = std::nullopt;
    return;
  }
  T value = out.value_or(T{});
  read_value(n, path, value);
  out = std::move(value);
}

// Throws "<path> must be <range>, got <v>" for a number outside the field's range.
template <class T>
void check_range(const OptionInfo& info, const std::string& path, const T& value) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) {
    require(in_range(info.range, static_cast<double>(value)), path, range_text(info.range),
            static_cast<double>(value));
  } else if constexpr (std::is_same_v<T, std::optional<double>> ||
                       std::is_same_v<T, std::optional<int64_t>>) {
    if (value) check_range(info, path, *value);
  }
}

// "only the power schedule has a tail", "only the cosine and linear schedules have an end_value".
inline std::string belongs_text(const char* kinds, const char* key) {
  std::string list = kinds;
  const auto space = list.rfind(' ');
  const bool several = space != std::string::npos;
  if (several) list.replace(space, 1, " and ");
  const bool vowel = std::strchr("aeiou", key[0]) != nullptr;
  return "only the " + list + (several ? " schedules have " : " schedule has ") +
         (vowel ? "an " : "a ") + key;
}

// Reads `value` (the field `info` of a struct) from `n` at `path`; null keeps it unset/default.
template <class T>
void read_field(const OptionInfo& info, const YAML::Node& n, const std::string& path, T& value) {
  if (n.IsNull()) {
    if constexpr (is_optional<T>::value) value = std::nullopt;
    return;
  }
  T read = value;
  read_value(n, path, read);
  check_range(info, path, read);
  value = std::move(read);
}

// Every field of `out` present in `s` (by its key or alias), each checked against its range and,
// for a schedule of `kind`, against the kinds it belongs to. Leaves unknown keys to s.finish().
template <class S>
void read_fields(Section& s, S& out, const std::string& kind) {
  visit_options(out, [&](const OptionInfo& info, auto& value) {
    const auto n = *info.alias != '\0' ? s.find(info.name, {info.alias}) : s.find(info.name);
    if (!n) return;
    check(belongs(info.kinds, kind), s.key_path(info.name), ": ",
          belongs_text(info.kinds, info.name));
    read_field(info, n, s.key_path(info.name), value);
  });
}

// ---- writing: emit_value(out, value) ----

template <class T>
void emit_value(YAML::Emitter& out, const std::optional<T>& v);
template <class S>
void emit_fields(YAML::Emitter& out, const S& o, const std::string& kind = "");

inline void emit_value(YAML::Emitter& out, double v) {
  out << shortest_text(v);
}
inline void emit_value(YAML::Emitter& out, bool v) {
  out << v;
}
inline void emit_value(YAML::Emitter& out, int64_t v) {
  out << v;
}
inline void emit_value(YAML::Emitter& out, const std::string& v) {
  out << v;
}
inline void emit_value(YAML::Emitter& out, const std::vector<std::string>& v) {
  out << YAML::Flow << v;
}
inline void emit_value(YAML::Emitter& out, const CoefficientTable& t) {
  if (t.name != "custom") {
    out << t.name;
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& r : t.rows) {
    out << YAML::BeginSeq;
    for (const double c : r) emit_value(out, c);
    out << YAML::EndSeq;
  }
  out << YAML::EndSeq;
}
inline void emit_value(YAML::Emitter& out, const Betas& b) {
  out << YAML::Flow << YAML::BeginSeq;
  emit_value(out, std::get<0>(b));
  emit_value(out, std::get<1>(b));
  out << YAML::EndSeq;
}
inline void emit_value(YAML::Emitter& out, at::ScalarType dtype) {
  for (const auto& [d, name] : kDtypeNames) {
    if (d == dtype) {
      out << name;
      return;
    }
  }
  out << c10::toString(dtype);
}
inline void emit_value(YAML::Emitter& out, const std::vector<int64_t>& v) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto x : v) out << x;
  out << YAML::EndSeq;
}
inline void emit_value(YAML::Emitter& out, const NorMuonOptions& n) {
  out << YAML::Flow << YAML::BeginMap << YAML::Key << "beta2" << YAML::Value;
  emit_value(out, n.beta2);
  out << YAML::Key << "axis" << YAML::Value << to_string(n.axis) << YAML::EndMap;
}
inline void emit_value(YAML::Emitter& out, const WeightDecaySchedule& w) {
  out << (w.cosine ? "cosine" : "constant");
}
template <class E, class = has_enum_names<E>>
void emit_value(YAML::Emitter& out, E v) {
  out << enum_name(v);
}
inline void emit_value(YAML::Emitter& out, const PowerTail& t) {
  out << YAML::Flow;
  emit_fields(out, t);
}
inline void emit_value(YAML::Emitter& out, const MomentumSchedule& m) {
  out << YAML::Flow;
  emit_fields(out, m);
}
inline void emit_value(YAML::Emitter& out, const LrSchedule& s) {  // the fields of its kind
  out << YAML::Flow;
  emit_fields(out, s, enum_name(s.kind));
}
inline void emit_value(YAML::Emitter& out, const ParamGroupSpec& g) {
  emit_fields(out, g);
}
template <class T>
void emit_value(YAML::Emitter& out, const std::optional<T>& v) {
  if (v) {
    emit_value(out, *v);
  } else {
    out << YAML::Null;
  }
}

// Every field of `o` (of a schedule, those of its kind) as key: value pairs of an open mapping.
template <class S>
void emit_pairs(YAML::Emitter& out, const S& o, const std::string& kind = "") {
  visit_options(o, [&](const OptionInfo& info, const auto& value) {
    if (!belongs(info.kinds, kind)) return;
    out << YAML::Key << info.name << YAML::Value;
    emit_value(out, value);
  });
}
template <class S>
void emit_fields(YAML::Emitter& out, const S& o, const std::string& kind) {
  out << YAML::BeginMap;
  emit_pairs(out, o, kind);
  out << YAML::EndMap;
}

}  // namespace muon::detail
