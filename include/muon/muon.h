// muon::Muon — orthogonalized momentum for matrix parameters (docs/design.md, "Muon update"), a
// torch::optim::Optimizer.
//
//   auto opt = muon::Muon(params, muon::MuonOptions(0.02).momentum(0.95).weight_decay(0.01));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "muon/algorithm.h"
#include "muon/dtypes.h"
#include "muon/enum_names.h"
#include "muon/normalization.h"
#include "muon/option_schema.h"
#include "muon/orthogonalize.h"

namespace muon {

// How the momentum buffer accumulates gradients.
enum class MomentumForm {
  ema,  // B ← β·B + (1−β)·g; Nesterov Q = lerp(g, B, β)  (Keller Jordan, torch.optim.Muon)
  sum,  // B ← β·B + g;       Nesterov Q = g + β·B        (Moonlight, Dion)
};

// Per-matrix learning-rate factor from the matrix shape.
enum class AdjustLr {
  original,         // √max(1, rows/cols)      (Keller Jordan)
  match_rms_adamw,  // 0.2·√max(rows, cols)    (Moonlight, Kimi K2: update RMS matches AdamW's)
  spectral,         // √(rows/cols)
  none,             // 1
};

// The factor `mode` gives a (rows × cols) matrix; rows = out features, cols = in features.
double shape_factor(AdjustLr mode, int64_t rows, int64_t cols);

template <>
struct EnumNames<MomentumForm> {
  static constexpr const char* noun = "momentum form";
  static constexpr const char* plural = "forms";
  static constexpr std::array<std::pair<MomentumForm, const char*>, 2> table{
      {{MomentumForm::ema, "ema"}, {MomentumForm::sum, "sum"}}};
};
template <>
struct EnumNames<AdjustLr> {
  static constexpr const char* noun = "mode";
  static constexpr const char* plural = "modes";
  static constexpr std::array<std::pair<AdjustLr, const char*>, 4> table{
      {{AdjustLr::original, "original"},
       {AdjustLr::match_rms_adamw, "match_rms_adamw"},
       {AdjustLr::spectral, "spectral"},
       {AdjustLr::none, "none"}}};
};
inline std::string to_string(MomentumForm form) {
  return enum_name(form);
}
inline std::string to_string(AdjustLr mode) {
  return enum_name(mode);
}
inline MomentumForm momentum_form_from_string(const std::string& name) {
  return enum_from_name<MomentumForm>(name);
}
inline AdjustLr adjust_lr_from_string(const std::string& name) {
  return enum_from_name<AdjustLr>(name);
}

// NorMuon's settings (nanochat and flaxchat use beta2 0.9).
struct NorMuonOptions {
  double beta2 = 0.95;
  NorMuonAxis axis = NorMuonAxis::automatic;
  bool operator==(const NorMuonOptions& o) const { return beta2 == o.beta2 && axis == o.axis; }
};

// clang-format off
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
// clang-format on

// Muon's settings; their names, defaults, ranges and meanings are the list MUON_MUON_OPTIONS above.
struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions() = default;
  MuonOptions(double lr) { lr_ = lr; }  // NOLINT(google-explicit-constructor): libtorch style
  MUON_MUON_OPTIONS(MUON_OPTION_MEMBER)

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// f(OptionInfo, value) for every option of `o`, in the schema's order (value is const when o is).
template <class O, class F,
          std::enable_if_t<std::is_same_v<std::remove_const_t<O>, MuonOptions>, int> = 0>
void visit_options(O& o, F&& f) {
  MUON_MUON_OPTIONS(MUON_OPTION_VISIT)
}

// Muon's state per parameter (MUON_PARAM_STATE in muon/algorithm.h):
//   momentum_buffer        fp32 (fp64 for fp64 parameters) whatever the parameter dtype, or bf16
//                          by state_dtype; with int8 state, where the tensor takes it,
//                          momentum_buffer_codes and momentum_buffer_absmax (muon/quantize.h)
//   normuon_second_moment  NorMuon's statistic, fp32, normuon_state_shape(view); only with NorMuon
//   mantissa               mantissa_tracking of a bf16 parameter: the low 16 bits of each fp32
//                          weight (int16)
// clang-format off
#define MUON_MUON_STATE(X)                                                                         \
  X(momentum_buffer, !quantized_state(p, o.state_dtype()), p.sizes(),                             \
    state_storage_dtype(p.scalar_type(), o.state_dtype()), zeros)                                  \
  X(momentum_buffer_codes, quantized_state(p, o.state_dtype()), p.sizes(), at::kByte, zeros)     \
  X(momentum_buffer_absmax, quantized_state(p, o.state_dtype()), q8::absmax_shape(p.sizes()),     \
    at::kFloat, zeros)                                                                             \
  X(normuon_second_moment, o.normuon().has_value(), normuon_state_shape(view, o.normuon()->axis),  \
    full_precision(p.scalar_type()), zeros)                                                        \
  X(mantissa, tracks_mantissa(o.mantissa_tracking(), p), p.sizes(), at::kShort, zeros)
// clang-format on
MUON_PARAM_STATE(MuonParamState, MUON_MUON_STATE);

using MuonItem = MatrixItem<MuonOptions, MuonParamState>;

// The buffers of Muon's batched orthogonalizations, kept across steps by the optimizer that owns
// them: one workspace per dtype, device and orthogonalization setting, which the batches of every
// shape share one after the other (its buffers sized for the largest).
class MuonWorkspaces {
 public:
  OrthogonalizeWorkspace& get(at::ScalarType dtype, at::Device device,
                              const OrthogonalizeOptions& options);

 private:
  struct Entry {
    at::ScalarType dtype;
    at::Device device;
    OrthogonalizeOptions options;
    OrthogonalizeWorkspace workspace;
  };
  std::deque<Entry> entries_;  // a deque: get()'s references stay valid as entries are added
};

// Muon's owner: matrices of one shape and settings are orthogonalized together in one batched
// call, in buffers kept across steps.
using Muon = MatrixOptimizer<MuonOptions>;

// Throws muon::Error unless `options` are valid (lr ≥ 0, momentum in [0, 1), weight_decay ≥ 0,
// ns_steps ≥ 1, a usable coefficient table, state_dtype Float or BFloat16).
void check_options(const MuonOptions& options);

// The orthogonalization settings of `options` for a rows × cols matrix: gram_coefficients (one
// iteration per row) when set and the matrix is not square, coefficients and ns_steps otherwise
// (torch.optim.Muon's Gram schedule); fused: false makes `automatic` mean plain.
OrthogonalizeOptions orthogonalize_options(const MuonOptions& options, int64_t rows, int64_t cols);

// Throws muon::Error, prefixed by `who`, unless `view` is a (batch..., rows, cols) view of `param`:
// at least 2 dims, all positive, the parameter's element count.
void check_matrix_view(const at::Tensor& param, const std::vector<int64_t>& view,
                       const std::string& who);

// Throws muon::Error unless `p` can be optimized by Muon (or the algorithm `who`): a real
// floating-point tensor of rank ≥ 2. `name` is used in the message.
void check_muon_param(const at::Tensor& p, const std::string& name = "parameter",
                      const char* who = "Muon");

// The registry's entry (muon/algorithm.h); the rule is src/optim/muon_rule.cpp.
template <>
struct Algorithm<MuonOptions> {
  static constexpr const char* name = "muon";
  static constexpr ParamKind kind = ParamKind::matrices;
  using State = MuonParamState;
  using Scratch = MuonWorkspaces;
  static constexpr std::array settings{"lr", "weight_decay", "momentum"};

  static void validate(const MuonOptions& options) { check_options(options); }
  // Throws muon::Error, naming `where` (e.g. "parameter 2 of param group 0"), unless `param` with
  // gradient `grad` can take a Muon update under `options` in `view` — before anything changes.
  static void check_item(const at::Tensor& param, const at::Tensor& grad,
                         const MuonOptions& options, const std::vector<int64_t>& view,
                         const std::string& where);
  // One Muon step of every item: matrices of one shape, dtype, device and orthogonalization
  // setting are orthogonalized together in one batched call, in `workspaces`.
  static void update(const std::vector<MuonItem>& items, MuonWorkspaces& workspaces);
};

}  // namespace muon
