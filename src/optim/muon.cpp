#include "muon/muon.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "in_place.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/param_state.h"
#include "muon/presets.h"
#include "muon/rules.h"

namespace muon {

double shape_factor(AdjustLr mode, int64_t rows, int64_t cols) {
  const auto r = static_cast<double>(rows);
  const auto c = static_cast<double>(cols);
  switch (mode) {
    case AdjustLr::original:
      return std::sqrt(std::max(1.0, r / c));
    case AdjustLr::match_rms_adamw:
      return 0.2 * std::sqrt(std::max(r, c));
    case AdjustLr::spectral:
      return std::sqrt(r / c);
    case AdjustLr::none:
      return 1.0;
  }
  throw Error("unknown adjust_lr mode");
}

int64_t dion_rank(const DionOptions& dion, int64_t rows, int64_t cols) {
  const auto short_side = std::min(rows, cols);
  const auto multiple = dion.rank_multiple_of;
  const auto wanted = static_cast<int64_t>(
      std::ceil(dion.rank_fraction * static_cast<double>(short_side) / static_cast<double>(multiple)));
  return std::min(wanted * multiple, short_side);
}

std::vector<int64_t> dion_q_shape(const DionOptions& dion, const std::vector<int64_t>& view) {
  const auto rows = view[view.size() - 2];
  const auto cols = view.back();
  std::vector<int64_t> shape(view.begin(), view.end() - 2);
  shape.push_back(std::min(rows, cols));
  shape.push_back(dion_rank(dion, rows, cols));
  return shape;
}

MuonOptions dion_options(DionOptions dion) {
  return MuonOptions(muon_preset("dion").muon).dion(dion);
}

namespace {

// Dion replaces the momentum direction and its orthogonalization; the Muon settings that act
// there have no meaning in it.
void check_dion(const MuonOptions& o) {
  const auto& d = *o.dion();
  check(d.rank_fraction > 0 && d.rank_fraction <= 1,
        "Muon: dion rank_fraction must be in (0, 1], got ", d.rank_fraction);
  check(d.rank_multiple_of >= 1, "Muon: dion rank_multiple_of must be a whole number >= 1, got ",
        d.rank_multiple_of);
  check(std::isfinite(d.epsilon) && d.epsilon > 0, "Muon: dion epsilon must be > 0, got ",
        d.epsilon);
  check(!o.nesterov() && o.momentum_form() == MomentumForm::sum,
        "Muon: dion keeps a summed momentum with error feedback (M ← M + g, then M −= (1 − μ)·P·Rᵀ), "
        "without Nesterov; set nesterov false and momentum_form sum (muon::dion_options(), "
        "optimizer name dion and preset \"dion\" do)");
  check(o.state_dtype() == at::kFloat, "Muon: dion keeps its momentum in float32 (float64 for "
        "float64 parameters); state_dtype bfloat16 is not supported with it");
  const char* other = o.normuon()                        ? "normuon"
                      : o.post_norm() != PostNorm::none  ? "post_norm"
                      : o.row_equilibration()            ? "row_equilibration"
                      : (o.num_heads() || o.split_sizes()) ? "num_heads / split_sizes"
                                                           : nullptr;
  check(other == nullptr, "Muon: dion makes its own orthonormal update; it cannot be combined with ",
        other ? other : "");
  const MuonOptions plain;
  const char* newton_schulz = o.ns_steps() != plain.ns_steps()                 ? "ns_steps"
                              : !(o.coefficients() == plain.coefficients())    ? "coefficients"
                              : o.ns_eps()                                     ? "ns_eps"
                              : o.ns_method() != plain.ns_method()             ? "ns_method"
                              : o.ns_dtype()                                   ? "ns_dtype"
                              : o.gram_restarts()                              ? "gram_restarts"
                              : o.gram_coefficients()                          ? "gram_coefficients"
                                                                               : nullptr;
  check(newton_schulz == nullptr, "Muon: dion would not read ", newton_schulz ? newton_schulz : "",
        ": its update comes from a power iteration and a QR, not Newton–Schulz; leave the "
        "Newton–Schulz settings at their defaults");
}

}  // namespace

void check_options(const MuonOptions& o) {
  check_ranges("Muon", o);
  check(o.state_dtype() == at::kFloat || o.state_dtype() == at::kBFloat16, "Muon: state_dtype ",
        o.state_dtype(), " is not supported; use Float (full precision) or BFloat16");
  if (o.normuon()) {
    check(o.normuon()->beta2 >= 0 && o.normuon()->beta2 < 1,
          "Muon: normuon beta2 must be in [0, 1), got ", o.normuon()->beta2);
  }
  check(!(o.num_heads() && o.split_sizes()),
        "Muon: num_heads and split_sizes both split the rows; set one of them");
  if (o.split_sizes()) {
    const auto& sizes = *o.split_sizes();
    check(!sizes.empty() && std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n > 0; }),
          "Muon: split_sizes must be row counts > 0, got ", at::IntArrayRef(sizes));
  }
  check(!(o.normuon() && (o.num_heads() || o.split_sizes())),
        "Muon: normuon keeps statistics of whole matrices; it cannot be combined with num_heads "
        "or split_sizes");
  check(!(o.cautious_weight_decay() && o.weight_decay_method() == WeightDecayMethod::l2),
        "Muon: cautious_weight_decay needs a multiplicative weight_decay_method (decoupled, "
        "independent or palm); l2 adds its decay to the gradient instead");
  if (o.dion()) check_dion(o);
  check_options(orthogonalize_options(o, 1, 1), kMuonOrthogonalizeNames);
  if (const auto& gram = o.gram_coefficients()) {
    check(!gram->rows.empty() && gram->rows.size() <= 1000,
          "Muon: gram_coefficients must have 1 to 1000 rows [a, b, c] (one per iteration), got ",
          gram->rows.size());
    for (const auto& row : gram->rows) {
      check(std::isfinite(row[0]) && std::isfinite(row[1]) && std::isfinite(row[2]),
            "Muon: gram_coefficients has a non-finite coefficient");
    }
  }
}

void check_matrix_view(const at::Tensor& param, const std::vector<int64_t>& view,
                       const std::string& who) {
  check(view.size() >= 2, who, ": a view needs (batch..., rows, cols), got ",
        at::IntArrayRef(view));
  int64_t numel = 1;
  for (auto d : view) {
    check(d > 0, who, ": view ", at::IntArrayRef(view), " has a non-positive dim");
    numel *= d;
  }
  check(numel == param.numel(), who, ": view ", at::IntArrayRef(view), " holds ", numel,
        " elements, the parameter of shape ", param.sizes(), " ", param.numel());
}

void check_muon_param(const at::Tensor& p, const std::string& name) {
  check(!p.is_complex(), "Muon: ", name, " is complex (", p.scalar_type(),
        "); Muon supports real floating-point matrices only");
  check(p.is_floating_point(), "Muon: ", name, " has dtype ", p.scalar_type(),
        "; Muon needs a floating-point matrix (float32, float64, bfloat16 or float16)");
  check(p.dim() >= 2, "Muon: ", name, " has shape ", p.sizes(),
        "; Muon optimizes matrices (out, in), or stacks of them — give vectors and scalars to "
        "AdamW");
}

namespace {

std::string param_label(size_t group, size_t index) {
  return detail::concat("parameter ", index, " of param group ", group);
}

}  // namespace

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Optimizer(param_groups, std::make_unique<MuonOptions>(defaults)) {
  compat::keep_group_options(param_groups_, 0, param_groups);
  check_options(defaults);
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    check_options(static_cast<const MuonOptions&>(param_groups_[gi].options()));
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) check_muon_param(params[i], param_label(gi, i));
  }
}

Muon::Muon(std::vector<at::Tensor> params, MuonOptions defaults)
    : Muon(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

void Muon::add_param_group(const torch::optim::OptimizerParamGroup& group) {
  Optimizer::add_param_group(group);
  compat::keep_group_options(param_groups_, param_groups_.size() - 1, {group});
}

void Muon::set_matrix_view(const at::Tensor& param, std::vector<int64_t> view) {
  bool known = false;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) known = known || p.is_same(param);
  }
  check(known, "Muon::set_matrix_view: the tensor of shape ", param.sizes(),
        " is not a parameter of this optimizer");
  check_matrix_view(param, view, "Muon::set_matrix_view");
  check(state_.count(compat::param_state_key(param)) == 0 || matrix_view(param) == view,
        "Muon::set_matrix_view: the parameter already has state for view ",
        at::IntArrayRef(matrix_view(param)), "; set views before the first step");
  views_[param.unsafeGetTensorImpl()] = std::move(view);
}

std::vector<int64_t> Muon::matrix_view(const at::Tensor& param) const {
  const auto it = views_.find(param.unsafeGetTensorImpl());
  return it != views_.end() ? it->second : param.sizes().vec();
}

void Muon::check_step() const {
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& o = static_cast<const MuonOptions&>(param_groups_[gi].options());
    check_options(o);
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& p = params[i];
      if (p.grad().defined()) check_muon_item(p, p.grad(), o, matrix_view(p), param_label(gi, i));
    }
  }
}

at::Tensor Muon::step(LossClosure closure) {
  const auto loss = run_closure(closure);
  at::NoGradGuard no_grad;
  check_step();
  std::vector<MuonItem> items;
  int64_t index = 0;  // the tensor's position in the optimizer: part of its rounding seed
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      const int64_t position = index++;
      if (!p.grad().defined()) continue;
      auto view = matrix_view(p);
      auto& state = muon_state(state_[compat::param_state_key(p)], p, o, view);
      items.push_back({p, p.grad(), &state, &o, std::move(view), position});
    }
  }
  muon_update(items, workspaces_);
  return loss;
}

void Muon::save(torch::serialize::OutputArchive& archive) const {
  save_optimizer_state(*this, archive);
}

void Muon::load(torch::serialize::InputArchive& archive) {
  load_optimizer_state(*this, archive);
}

}  // namespace muon
