// muon::Dion — a rank-r orthonormal update of matrix parameters from one power iteration per step
// with error feedback (Ahn et al., arXiv 2504.05295; docs/design.md, "Dion"), a
// torch::optim::Optimizer. Its options and defaults are microsoft/dion's.
//
//   auto opt = muon::Dion(params, muon::DionOptions(0.01).rank_fraction(0.25));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "muon/algorithm.h"
#include "muon/muon.h"
#include "muon/option_schema.h"

namespace muon {

// clang-format off
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
// clang-format on

// Dion's settings; their names, defaults, ranges and meanings are the list MUON_DION_OPTIONS
// above. Its momentum is always the summed, error-corrected buffer, without
// Nesterov.
struct DionOptions : public torch::optim::OptimizerCloneableOptions<DionOptions> {
  DionOptions() = default;
  DionOptions(double lr) { lr_ = lr; }  // NOLINT(google-explicit-constructor): libtorch style
  MUON_DION_OPTIONS(MUON_OPTION_MEMBER)

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

// f(OptionInfo, value) for every option of `o`, in the schema's order (value is const when o is).
template <class O, class F,
          std::enable_if_t<std::is_same_v<std::remove_const_t<O>, DionOptions>, int> = 0>
void visit_options(O& o, F&& f) {
  MUON_DION_OPTIONS(MUON_OPTION_VISIT)
}

// The shape of Dion's right factor Q for matrices in `view` (batch..., rows, cols):
// (batch..., min(rows, cols), rank).
std::vector<int64_t> dion_q_shape(const DionOptions& options, const std::vector<int64_t>& view);

// Dion's state per parameter (MUON_PARAM_STATE in muon/algorithm.h):
//   momentum_buffer  M, fp32 (fp64 for fp64 parameters)
//   dion_q           the right factor Q (batch..., min(rows, cols), rank), M's dtype; drawn at
//                    random by the first update
//   mantissa         mantissa_tracking of a bf16 parameter: the low 16 bits of each fp32 weight
// clang-format off
#define MUON_DION_STATE(X)                                                                         \
  X(momentum_buffer, true, p.sizes(), full_precision(p.scalar_type()), zeros)                      \
  X(dion_q, true, dion_q_shape(o, view.vec()), full_precision(p.scalar_type()), by_update)         \
  X(mantissa, tracks_mantissa(o.mantissa_tracking(), p), p.sizes(), at::kShort, zeros)
// clang-format on
MUON_PARAM_STATE(DionParamState, MUON_DION_STATE);

using DionItem = MatrixItem<DionOptions, DionParamState>;
using Dion = MatrixOptimizer<DionOptions>;

// The rank of Dion's update of a (rows × cols) matrix.
int64_t dion_rank(const DionOptions& options, int64_t rows, int64_t cols);
// Throws muon::Error unless `options` are valid (the schema's ranges; cautious weight decay with a
// multiplicative decay).
void check_options(const DionOptions& options);

// The registry's entry (muon/algorithm.h); the rule is src/optim/dion_rule.cpp.
template <>
struct Algorithm<DionOptions> {
  static constexpr const char* name = "dion";
  static constexpr ParamKind kind = ParamKind::matrices;
  using State = DionParamState;
  static constexpr std::array settings{"lr", "weight_decay", "momentum"};

  static void validate(const DionOptions& options) { check_options(options); }
  static void check_item(const at::Tensor& param, const at::Tensor& grad,
                         const DionOptions& options, const std::vector<int64_t>& view,
                         const std::string& where);
  // One Dion step of every item, matrix by matrix.
  static void update(const std::vector<DionItem>& items);
};

}  // namespace muon
