// muon::Dion — a rank-r orthonormal update of matrix parameters from one power iteration per step
// with error feedback (Ahn et al., arXiv 2504.05295; docs/design.md, "Dion"), a
// torch::optim::Optimizer. Its options and defaults are microsoft/dion's.
//
//   auto opt = muon::Dion(params, muon::DionOptions(0.01).rank_fraction(0.25));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "muon/algorithm.h"
#include "muon/muon.h"
#include "muon/option_schema.h"

namespace muon {

// Dion's settings; their names, defaults, ranges and meanings are the list MUON_DION_OPTIONS in
// muon/option_schema.h. Its momentum is always the summed, error-corrected buffer, without
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

struct DionParamState : public torch::optim::OptimizerCloneableParamState<DionParamState> {
  TORCH_ARG(int64_t, step) = 0;
  // M, fp32 (fp64 for fp64 parameters).
  TORCH_ARG(at::Tensor, momentum_buffer);
  // The right factor Q (batch..., min(rows, cols), rank), M's dtype.
  TORCH_ARG(at::Tensor, dion_q);
  // mantissa_tracking: the low 16 bits of each fp32 weight of a bf16 parameter (int16).
  TORCH_ARG(at::Tensor, mantissa);
};

using DionItem = MatrixItem<DionOptions, DionParamState>;
using Dion = MatrixOptimizer<DionOptions>;

// The rank of Dion's update of a (rows × cols) matrix.
int64_t dion_rank(const DionOptions& options, int64_t rows, int64_t cols);
// The shape of Dion's right factor Q for matrices in `view` (batch..., rows, cols):
// (batch..., min(rows, cols), rank).
std::vector<int64_t> dion_q_shape(const DionOptions& options, const std::vector<int64_t>& view);

// Throws muon::Error unless `options` are valid (the schema's ranges; cautious weight decay with a
// multiplicative decay).
void check_options(const DionOptions& options);

// The registry's entry (muon/algorithm.h); the rule is src/optim/dion_rule.cpp.
template <>
struct Algorithm<DionOptions> {
  static constexpr const char* name = "dion";
  static constexpr ParamKind kind = ParamKind::matrices;
  using State = DionParamState;
  using Owner = Dion;
  using Item = DionItem;

  static void validate(const DionOptions& options) { check_options(options); }
  // momentum_buffer and dion_q; mantissa with mantissa_tracking of a bf16 parameter.
  static std::vector<StateSlot> state_slots(const DionOptions& options, const at::Tensor& param,
                                            const std::vector<int64_t>& view);
  template <class F>
  static void visit_state(State& s, F&& f) {
    f("momentum_buffer", s.momentum_buffer());
    f("dion_q", s.dion_q());
    f("mantissa", s.mantissa());
  }
  static SettingValues settings(const DionOptions& o) {
    return {{"lr", o.lr()}, {"weight_decay", o.weight_decay()}, {"momentum", o.momentum()}};
  }
  static void set_settings(DionOptions& o, const SettingValues& v) {
    o.lr(v.at("lr")).weight_decay(v.at("weight_decay")).momentum(v.at("momentum"));
  }

  // The momentum buffer (zeros) on first use; Q is drawn by the first update.
  static State& make_state(std::unique_ptr<torch::optim::OptimizerParamState>& slot,
                           const at::Tensor& param, const DionOptions& options,
                           const std::vector<int64_t>& view);
  static void check_item(const at::Tensor& param, const at::Tensor& grad,
                         const DionOptions& options, const std::vector<int64_t>& view,
                         const std::string& where);
  // One Dion step of every item, matrix by matrix (`workspaces` are Muon's: unused).
  static void update(const std::vector<Item>& items, MuonWorkspaces& workspaces);
};

}  // namespace muon
