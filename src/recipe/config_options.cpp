// The `muon` and `adamw` sections of the optimizer config: every option of MuonOptions and
// AdamWOptions by its schema name (muon/option_schema.h), read and written by one YAML form per
// option type.
#include <yaml-cpp/yaml.h>

#include <array>
#include <cmath>
#include <utility>

#include "config_sections.h"
#include "muon/error.h"

namespace muon::detail {
namespace {

template <class E>
using has_enum_names = decltype(EnumNames<E>::table);

// The dtypes a config names.
constexpr std::array<std::pair<at::ScalarType, const char*>, 3> kDtypeNames{
    {{at::kFloat, "float32"}, {at::kBFloat16, "bfloat16"}, {at::kDouble, "float64"}}};

// ---- reading: read_value(node, path, value) ----

void read_value(const YAML::Node& n, const std::string& path, double& out) {
  out = Section::as_number(n, path);
}
void read_value(const YAML::Node& n, const std::string& path, bool& out) {
  out = Section::as_bool(n, path);
}
void read_value(const YAML::Node& n, const std::string& path, int64_t& out) {
  const double v = Section::as_number(n, path);
  check(std::floor(v) == v && std::fabs(v) <= Section::kLargestWhole, path,
        ": expected a whole number, got ", n.Scalar());
  out = static_cast<int64_t>(v);
}
void read_value(const YAML::Node& n, const std::string& path, CoefficientTable& out) {
  out = read_table(n, path);
}
void read_value(const YAML::Node& n, const std::string& path, Betas& out) {
  out = read_betas(n, path);
}
void read_value(const YAML::Node& n, const std::string& path, at::ScalarType& out) {
  check(n.IsScalar(), path, ": expected float32, bfloat16 or float64, got ", kind_of(n));
  for (const auto& [dtype, name] : kDtypeNames) {
    if (n.Scalar() == name) {
      out = dtype;
      return;
    }
  }
  throw Error(path + ": expected float32, bfloat16 or float64, got '" + n.Scalar() + "'");
}
void read_value(const YAML::Node& n, const std::string& path, std::vector<int64_t>& out) {
  check(n.IsSequence(), path, ": expected a list of whole numbers, got ", kind_of(n));
  out.assign(n.size(), 0);
  for (size_t i = 0; i < n.size(); ++i)
    read_value(n[i], path + "[" + std::to_string(i) + "]", out[i]);
}
void read_value(const YAML::Node& n, const std::string& path, NorMuonOptions& out) {
  Section s(n, path);
  out = NorMuonOptions{};
  if (const auto b = s.number("beta2")) out.beta2 = *b;
  if (const auto a = s.text("axis")) {
    out.axis = one_of<NorMuonAxis>(s.key_path("axis"), *a, normuon_axis_from_string);
  }
  s.finish();
}
template <class E, class = has_enum_names<E>>
void read_value(const YAML::Node& n, const std::string& path, E& out) {
  check(n.IsScalar(), path, ": expected one of ", enum_name_list<E>(), ", got ", kind_of(n));
  out = one_of<E>(path, n.Scalar(), enum_from_name<E>);
}
// null: unset.
template <class T>
void read_value(const YAML::Node& n, const std::string& path, std::optional<T>& out) {
  if (n.IsNull()) {
    out = std::nullopt;
    return;
  }
  T value{};
  read_value(n, path, value);
  out = std::move(value);
}

// Every option of `options` present in the mapping `s`, each checked against its range.
template <class Options>
void read_options(Section s, Options& options) {
  visit_options(options, [&](const OptionInfo& info, auto& value) {
    const auto n = s.find(info.name);
    if (!n) return;
    using T = std::decay_t<decltype(value)>;
    T read = value;
    read_value(n, s.key_path(info.name), read);
    if constexpr (std::is_same_v<T, double>) {
      require(in_range(info.range, read), s.key_path(info.name), range_text(info.range), read);
    }
    value = std::move(read);
  });
  s.finish();
}

// ---- writing: emit_value(out, value) ----

void emit_value(YAML::Emitter& out, double v) {
  out << v;
}
void emit_value(YAML::Emitter& out, bool v) {
  out << v;
}
void emit_value(YAML::Emitter& out, int64_t v) {
  out << v;
}
void emit_value(YAML::Emitter& out, const CoefficientTable& t) {
  if (t.name != "custom") {
    out << t.name;
    return;
  }
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto& r : t.rows) out << YAML::BeginSeq << r[0] << r[1] << r[2] << YAML::EndSeq;
  out << YAML::EndSeq;
}
void emit_value(YAML::Emitter& out, const Betas& b) {
  out << YAML::Flow << YAML::BeginSeq << std::get<0>(b) << std::get<1>(b) << YAML::EndSeq;
}
void emit_value(YAML::Emitter& out, at::ScalarType dtype) {
  for (const auto& [d, name] : kDtypeNames) {
    if (d == dtype) {
      out << name;
      return;
    }
  }
  out << c10::toString(dtype);
}
void emit_value(YAML::Emitter& out, const std::vector<int64_t>& v) {
  out << YAML::Flow << YAML::BeginSeq;
  for (const auto x : v) out << x;
  out << YAML::EndSeq;
}
void emit_value(YAML::Emitter& out, const NorMuonOptions& n) {
  out << YAML::Flow << YAML::BeginMap << YAML::Key << "beta2" << YAML::Value << n.beta2 << YAML::Key
      << "axis" << YAML::Value << to_string(n.axis) << YAML::EndMap;
}
template <class E, class = has_enum_names<E>>
void emit_value(YAML::Emitter& out, E v) {
  out << enum_name(v);
}
template <class T>
void emit_value(YAML::Emitter& out, const std::optional<T>& v) {
  if (v) {
    emit_value(out, *v);
  } else {
    out << YAML::Null;
  }
}

template <class Options>
void emit_options(YAML::Emitter& out, const Options& options) {
  out << YAML::BeginMap;
  visit_options(options, [&](const OptionInfo& info, const auto& value) {
    out << YAML::Key << info.name << YAML::Value;
    emit_value(out, value);
  });
  out << YAML::EndMap;
}

}  // namespace

void read_option_sections(Section& s, HybridOptions& h) {
  if (const auto n = s.find("muon"); n && !n.IsNull())
    read_options(Section(n, s.key_path("muon")), h.muon);
  if (const auto n = s.find("adamw"); n && !n.IsNull()) {
    read_options(Section(n, s.key_path("adamw")), h.adamw);
  }
}

void emit_option_sections(YAML::Emitter& out, const HybridOptions& h) {
  out << YAML::Key << "muon" << YAML::Value;
  emit_options(out, h.muon);
  out << YAML::Key << "adamw" << YAML::Value;
  emit_options(out, h.adamw);
}

}  // namespace muon::detail
