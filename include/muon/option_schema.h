// The option schema: every setting of every options struct as one declaration — name, type,
// default, range and a line of documentation. From it come the structs' members and defaults, their
// validation messages, the Python keywords and param_groups dicts, YAML reading and writing, and
// the option tables in docs/config.md and docs/python.md. A new option is one line in its list
// (plus, for a new type, its conversions).
//
// Each algorithm's list stands in its own header beside its options struct (MUON_MUON_OPTIONS in
// muon/muon.h, MUON_LION_OPTIONS in muon/lion.h, ...), X(type, name, default, range, doc), in the
// Python order (the first ones are also positional, as in torch.optim); the documentation lines
// several algorithms share are here. The lists of the plain structs the configuration adds
// (schedules, parameter groups, the hybrid's own settings) stand beside their structs too,
// X(type, member, key, alias, default, range, kinds, doc): `key` is the YAML and Python name,
// `alias` another accepted spelling ("" none), `kinds` the schedule kinds a field belongs to
// ("" all).
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "muon/error.h"
#include "muon/weight_decay.h"

namespace muon {

// What a numeric option accepts (checked with its name in the message).
enum class Range {
  any,
  nonnegative,         // finite, >= 0
  positive,            // finite, > 0
  unit_interval,       // in [0, 1)
  open_unit_interval,  // in (0, 1)
  share,               // in (0, 1]
  iteration_count,     // a whole number in [1, 1000]: more iterations would only stall a run
};

inline const char* range_text(Range range) {
  switch (range) {
    case Range::any:
      return "";
    case Range::nonnegative:
      return ">= 0";
    case Range::positive:
      return "> 0";
    case Range::unit_interval:
      return "in [0, 1)";
    case Range::open_unit_interval:
      return "in (0, 1)";
    case Range::share:
      return "in (0, 1]";
    case Range::iteration_count:
      return "a whole number in [1, 1000]";
  }
  return "";
}

// Whether `value` is in `range` (NaN and infinities never are, except under `any`).
inline bool in_range(Range range, double value) {
  switch (range) {
    case Range::any:
      return true;
    case Range::nonnegative:
      return std::isfinite(value) && value >= 0;
    case Range::positive:
      return std::isfinite(value) && value > 0;
    case Range::unit_interval:
      return value >= 0 && value < 1;
    case Range::open_unit_interval:
      return value > 0 && value < 1;
    case Range::share:
      return value > 0 && value <= 1;
    case Range::iteration_count:
      return value >= 1 && value <= 1000 && std::floor(value) == value;
  }
  return false;
}

// One option as the visitors of an options struct see it.
struct OptionInfo {
  const char* name;
  const char* doc;
  Range range;
  const char* alias = "";  // another spelling YAML accepts
  const char* kinds = "";  // the schedule kinds a field belongs to, space-separated; "" all
};

// The documentation of Muon's `coefficients`, naming every table (CoefficientTable::names()).
const char* coefficients_option_doc();

// clang-format off
#define MUON_MANTISSA_DOC                                                                          \
  "bfloat16 parameters: keep the low 16 bits of each fp32 weight in the state tensor mantissa, "   \
  "so updates act on the exact fp32 value (modded-nanogpt); other dtypes are unaffected"
#define MUON_FUSED_DOC                                                                             \
  "kernels: unset picks per device (fused on CPU), true fused only, false the ATen form"
#define MUON_CAUTIOUS_DOC                                                                          \
  "cautious mask: keep only the changes that agree in sign with the gradient"
// The settings Muon and Dion share: each matrix's rate and its decay.
#define MUON_MATRIX_LR_DOC                                                                         \
  "base learning rate; each matrix steps by lr × its shape factor (adjust_lr)"
#define MUON_MATRIX_DECAY_DOC                                                                      \
  "weight decay λ, applied as weight_decay_method says; the shape factor never applies"
#define MUON_MATRIX_DECAY_METHOD_DOC                                                               \
  "decoupled W·(1 − lr·λ), independent W·(1 − λ), l2 g + λ·W before the momentum, "                \
  "palm W·(1 − lr²·λ)"

// clang-format on

// Throws "<who>: <name> must be <range>, got <value>" for the first numeric option of `options`
// (or element of a pair such as betas) outside its range.
template <class Options>
void check_ranges(const char* who, const Options& options) {
  visit_options(options, [&](const OptionInfo& info, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    const auto in = [&](double v, const std::string& name) {
      check(in_range(info.range, v), who, ": ", name, " must be ", range_text(info.range), ", got ",
            v);
    };
    if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) {
      in(static_cast<double>(value), info.name);
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      if (value) in(*value, info.name);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      if (value) in(static_cast<double>(*value), info.name);
    } else if constexpr (std::is_same_v<T, std::tuple<double, double>>) {
      in(std::get<0>(value), std::string(info.name) + "[0]");
      in(std::get<1>(value), std::string(info.name) + "[1]");
    }
  });
}

// Inside an options struct: one TORCH_ARG member per option, initialized to its default.
#define MUON_OPTION_MEMBER(T, name, def, range, doc) TORCH_ARG(T, name) = def;

// Inside visit_options(o, f): f(info, o.name()) per option, in list order.
#define MUON_OPTION_VISIT(T, name, def, range, doc) \
  f(::muon::OptionInfo{#name, doc, ::muon::Range::range}, o.name());

// Inside a plain struct: one member per field, initialized to its default.
#define MUON_FIELD_MEMBER(T, member, key, alias, def, range, kinds, doc) T member = def;

// Inside visit_options(o, f) of a plain struct: f(info, o.member) per field, in list order.
#define MUON_FIELD_VISIT(T, member, key, alias, def, range, kinds, doc) \
  f(::muon::OptionInfo{#key, doc, ::muon::Range::range, alias, kinds}, o.member);

// visit_options(o, f) for the plain struct S whose field list is LIST (const and not).
#define MUON_DEFINE_VISIT(S, LIST)                                                \
  template <class O, class F,                                                     \
            std::enable_if_t<std::is_same_v<std::remove_const_t<O>, S>, int> = 0> \
  void visit_options(O& o, F&& f) {                                               \
    LIST(MUON_FIELD_VISIT)                                                        \
  }

}  // namespace muon
