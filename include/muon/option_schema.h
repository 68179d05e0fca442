// The option schema: every setting of every options struct as one declaration — name, type,
// default, range and a line of documentation. From it come the structs' members and defaults, their
// validation messages, the Python keywords and param_groups dicts, YAML reading and writing, and
// the option tables in docs/config.md and docs/python.md. A new option is one line in its list
// (plus, for a new type, its conversions).
//
// The optimizers' lists are here, X(type, name, default, range, doc), in the Python order (the
// first ones are also positional, as in torch.optim). The lists of the plain structs the
// configuration adds (schedules, parameter groups, the hybrid's own settings) stand beside their
// structs, X(type, member, key, alias, default, range, kinds, doc): `key` is the YAML and Python
// name, `alias` another accepted spelling ("" none), `kinds` the schedule kinds a field belongs to
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

#define MUON_MUON_OPTIONS(X)                                                                       \
  X(double, lr, 0.02, nonnegative,                                                                 \
    MUON_MATRIX_LR_DOC)                                                                            \
  X(double, momentum, 0.95, unit_interval, "momentum coefficient β of the buffer")                 \
  X(bool, nesterov, true, any, "orthogonalize the Nesterov look-ahead instead of the buffer")      \
  X(double, weight_decay, 0.0, nonnegative,                                                        \
    MUON_MATRIX_DECAY_DOC)                                                                         \
  X(WeightDecayMethod, weight_decay_method, WeightDecayMethod::decoupled, any,                     \
    MUON_MATRIX_DECAY_METHOD_DOC)                                                                  \
  X(int64_t, ns_steps, 5, iteration_count, "Newton–Schulz iterations")                            \
  X(CoefficientTable, coefficients, CoefficientTable::quintic(), any,                              \
    ::muon::coefficients_option_doc())                                                             \
  X(std::optional<double>, ns_eps, std::nullopt, positive,                                         \
    "eps of the normalization X / (‖X‖_F·safety + eps) before the iterations; unset: none, so the "\
    "update does not depend on the gradient's scale")                                              \
  X(bool, row_equilibration, false, any,                                                           \
    "MuonEq: scale each row of the direction to the matrix's RMS row norm before orthogonalizing") \
  X(std::optional<int64_t>, num_heads, std::nullopt, positive,                                     \
    "orthogonalize each matrix's rows as this many equal heads, each alone (dion's num_heads)")    \
  X(std::optional<std::vector<int64_t>>, split_sizes, std::nullopt, any,                           \
    "orthogonalize each matrix's rows in blocks of these sizes, each alone: a fused QKV "          \
    "projection (dion's split_sizes)")                                                             \
  X(MomentumForm, momentum_form, MomentumForm::ema, any,                                           \
    "ema: B ← β·B + (1−β)·g (Keller Jordan); sum: B ← β·B + g (Moonlight)")                        \
  X(AdjustLr, adjust_lr, AdjustLr::original, any,                                                  \
    "shape factor: original √max(1, rows/cols), match_rms_adamw 0.2·√max(rows, cols), "           \
    "spectral √(rows/cols), none 1")                                                               \
  X(NsMethod, ns_method, NsMethod::automatic, any,                                                 \
    "how the iterations multiply: automatic, plain, symmetric, gram")                              \
  X(std::optional<at::ScalarType>, ns_dtype, std::nullopt, any,                                    \
    "Newton–Schulz dtype; unset: float32 on CPU, bfloat16 on GPUs")                                \
  X(std::optional<std::vector<int64_t>>, gram_restarts, std::nullopt, any,                         \
    "gram: the iteration counts after which the Gram matrix is formed afresh; unset: the table's") \
  X(std::optional<CoefficientTable>, gram_coefficients, std::nullopt, any,                         \
    "non-square matrices iterate by this table instead, one iteration per row (ns_steps then "     \
    "counts for square ones): torch.optim.Muon's Gram Newton–Schulz schedule; unset: coefficients")\
  X(PostNorm, post_norm, PostNorm::none, any,                                                      \
    "Muon+: none, row, col, row_col, col_row or frobenius normalization after orthogonalizing")    \
  X(double, post_norm_eps, 1e-8, positive, "Muon+'s eps")                                          \
  X(std::optional<NorMuonOptions>, normuon, std::nullopt, any,                                     \
    "NorMuon: unset (off) or {beta2, axis}, a per-row or per-column second moment")                \
  X(bool, cautious_weight_decay, false, any, "decay only the entries where U·W ≥ 0")               \
  X(bool, cautious, false, any, MUON_CAUTIOUS_DOC)                                                 \
  X(at::ScalarType, state_dtype, at::kFloat, any,                                                  \
    "momentum storage: float32 (float64 for float64 parameters), bfloat16 (stochastic rounding) "  \
    "or int8 (8-bit blocks, tensors of 4096+ elements in 2+ dims)")                                \
  X(bool, mantissa_tracking, false, any, MUON_MANTISSA_DOC)                                        \
  X(std::optional<bool>, fused, std::nullopt, any, MUON_FUSED_DOC)

// Dion's (microsoft/dion's names and defaults; Ahn et al., arXiv 2504.05295): the update's rank
// is r = min(⌈rank_fraction·min(rows, cols) / rank_multiple_of⌉·rank_multiple_of, rows, cols).
#define MUON_DION_OPTIONS(X)                                                                       \
  X(double, lr, 0.01, nonnegative,                                                                 \
    MUON_MATRIX_LR_DOC)                                                                            \
  X(double, momentum, 0.95, unit_interval,                                                         \
    "μ: the buffer M ← M + g keeps μ of the part the update took (M −= (1 − μ)·P·Rᵀ)")             \
  X(double, weight_decay, 0.01, nonnegative,                                                       \
    MUON_MATRIX_DECAY_DOC)                                                                         \
  X(WeightDecayMethod, weight_decay_method, WeightDecayMethod::decoupled, any,                     \
    MUON_MATRIX_DECAY_METHOD_DOC)                                                                  \
  X(double, rank_fraction, 1.0, share, "the update's rank as a share of min(rows, cols)")          \
  X(int64_t, rank_multiple_of, 1, positive, "the rank is rounded up to a multiple of this")        \
  X(double, epsilon, 1e-8, positive, "guards the column normalization of R")                      \
  X(AdjustLr, adjust_lr, AdjustLr::spectral, any,                                                  \
    "shape factor: spectral √(rows/cols) (Dion's), original √max(1, rows/cols), "                  \
    "match_rms_adamw 0.2·√max(rows, cols), none 1")                                                \
  X(bool, cautious_weight_decay, false, any, "decay only the entries where U·W ≥ 0")               \
  X(bool, cautious, false, any, MUON_CAUTIOUS_DOC)                                                 \
  X(bool, mantissa_tracking, false, any, MUON_MANTISSA_DOC)                                        \
  X(std::optional<bool>, fused, std::nullopt, any, MUON_FUSED_DOC)

#define MUON_ADAM_OPTIONS(X)                                                                       \
  X(double, lr, 1e-3, nonnegative, "learning rate")                                                \
  X(Betas, betas, default_betas(), unit_interval, "(β1, β2) of the first and second moments")      \
  X(double, eps, AdamDefaults<R>::eps, positive, "added to the denominator")                      \
  X(double, weight_decay, AdamDefaults<R>::weight_decay, nonnegative,                              \
    "weight decay λ, applied as weight_decay_method says (LAMB: inside the trust ratio)")          \
  X(WeightDecayMethod, weight_decay_method, AdamDefaults<R>::weight_decay_method, any,             \
    "decoupled W·(1 − lr·λ) (AdamW's default), independent W·(1 − λ), l2 g + λ·W (Adam's "         \
    "default), palm W·(1 − lr²·λ); LAMB: decoupled only")                                          \
  X(bool, nesterov, false, any, "NAdam's look-ahead first moment (optax's form); not for LAMB")    \
  X(at::ScalarType, state_dtype, at::kFloat, any,                                                  \
    "moment storage: float32 (float64 for float64 parameters), bfloat16 or int8 (8-bit blocks, "   \
    "tensors of 4096+ elements in 2+ dims); LAMB: float32 only")                                   \
  X(bool, mantissa_tracking, false, any, MUON_MANTISSA_DOC)                                        \
  X(bool, cautious, false, any, MUON_CAUTIOUS_DOC "; not for LAMB")                               \
  X(std::optional<bool>, fused, std::nullopt, any, MUON_FUSED_DOC)
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
