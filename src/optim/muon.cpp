#include "muon/muon.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "in_place.h"
#include "muon/compat.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/generic_update.h"
#include "muon/stochastic_rounding.h"

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

std::string to_string(MomentumForm form) {
  return form == MomentumForm::ema ? "ema" : "sum";
}

std::string to_string(AdjustLr mode) {
  switch (mode) {
    case AdjustLr::original:
      return "original";
    case AdjustLr::match_rms_adamw:
      return "match_rms_adamw";
    case AdjustLr::spectral:
      return "spectral";
    case AdjustLr::none:
      return "none";
  }
  return "?";
}

MomentumForm momentum_form_from_string(const std::string& name) {
  if (name == "ema") return MomentumForm::ema;
  check(name == "sum", "expected ema or sum, got '", name, "'");
  return MomentumForm::sum;
}

AdjustLr adjust_lr_from_string(const std::string& name) {
  for (auto m :
       {AdjustLr::original, AdjustLr::match_rms_adamw, AdjustLr::spectral, AdjustLr::none}) {
    if (to_string(m) == name) return m;
  }
  throw Error("unknown mode '" + name +
              "'; valid modes are original, match_rms_adamw, spectral, none");
}

namespace {

// Without the fused kernels (fused: false) `automatic` means the plain ATen chain, as on GPUs.
OrthogonalizeOptions orthogonalize_options(const MuonOptions& o) {
  const bool plain_only = o.fused() == false && o.ns_method() == NsMethod::automatic;
  return OrthogonalizeOptions()
      .steps(o.ns_steps())
      .coefficients(o.coefficients())
      .dtype(o.ns_dtype())
      .method(plain_only ? NsMethod::plain : o.ns_method())
      .gram_restarts(o.gram_restarts());
}

}  // namespace

void check_options(const MuonOptions& o) {
  check(std::isfinite(o.lr()) && o.lr() >= 0, "Muon: lr must be >= 0, got ", o.lr());
  check(o.momentum() >= 0 && o.momentum() < 1, "Muon: momentum must be in [0, 1), got ",
        o.momentum());
  check(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0,
        "Muon: weight_decay must be >= 0, got ", o.weight_decay());
  check(o.state_dtype() == at::kFloat || o.state_dtype() == at::kBFloat16, "Muon: state_dtype ",
        o.state_dtype(), " is not supported; use Float (full precision) or BFloat16");
  check(std::isfinite(o.post_norm_eps()) && o.post_norm_eps() > 0,
        "Muon: post_norm_eps must be > 0, got ", o.post_norm_eps());
  if (o.normuon()) {
    check(o.normuon()->beta2 >= 0 && o.normuon()->beta2 < 1,
          "Muon: normuon beta2 must be in [0, 1), got ", o.normuon()->beta2);
  }
  check_options(orthogonalize_options(o));
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

// Momentum accumulates in fp32 whatever the parameter dtype (fp64 stays fp64).
at::ScalarType compute_dtype(const at::Tensor& p) {
  return p.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Updates the momentum buffer and writes the direction Q to orthogonalize into `direction`: one
// fused pass on CPU, the same formulas in ATen operations elsewhere (any buffer dtype in both).
void momentum_direction(const at::Tensor& grad, at::Tensor& B, at::Tensor& direction,
                        const MuonOptions& o, uint32_t seed) {
  const MomentumScalars k{o.momentum(), o.momentum_form() == MomentumForm::ema, o.nesterov(), seed};
  if (detail::runs_fused(o.fused(), grad)) {
    fused_momentum(grad.contiguous(), B, direction, k);
  } else {
    generic_momentum(grad, B, direction, k);
  }
}

// W ← W·(1 − lr·λ) − lr·factor·U (decay masked to U·W ≥ 0 when cautious), computed in U's dtype
// and rounded once into W.
// With `masked`, entries where (W_old − W_new)·g ≤ 0 keep W_old (cautious optimizer).
void apply_update(at::Tensor& p, const at::Tensor& U, const MuonOptions& o, double factor) {
  const double decay = 1.0 - o.lr() * o.weight_decay();
  const double scale = o.lr() * factor;
  const bool masked = o.cautious();
  if (!detail::runs_fused(o.fused(), p)) {
    const auto grad = masked ? p.grad() : at::Tensor();
    generic_apply_update(p, U, decay, scale, o.cautious_weight_decay(), masked ? &grad : nullptr);
    return;
  }
  const auto grad = masked ? p.grad().contiguous() : at::Tensor();
  detail::update_in_place(p, [&](at::Tensor& dense) {
    fused_apply_update(dense, U.contiguous(), decay, scale, o.cautious_weight_decay(),
                       masked ? &grad : nullptr);
  });
}

// Matrices that can share one orthogonalize() call: same matrix shape, dtype, device and settings.
std::string batch_key(const std::vector<int64_t>& view, const at::Tensor& p, const MuonOptions& o) {
  std::ostringstream key;
  key << view[view.size() - 2] << 'x' << view.back() << '|' << compute_dtype(p) << '|' << p.device()
      << '|' << o.ns_steps() << '|' << to_string(o.ns_method()) << '|'
      << at::IntArrayRef(gram_restart_points(orthogonalize_options(o))) << '|'
      << (o.ns_dtype() ? c10::toString(*o.ns_dtype()) : "default");
  for (const auto& row : o.coefficients().rows)
    key << '|' << row[0] << ',' << row[1] << ',' << row[2];
  key << '|' << o.coefficients().safety << '|' << o.coefficients().eps;
  return key.str();
}

int64_t matrices_in(const std::vector<int64_t>& view) {
  int64_t n = 1;
  for (size_t i = 0; i + 2 < view.size(); ++i) n *= view[i];
  return n;
}

}  // namespace

// One parameter's share of a step: where its direction sits in its batch.
struct Muon::Pending {
  at::Tensor param;
  MuonParamState* state;
  const MuonOptions* options;
  std::vector<int64_t> view;
  int64_t offset;  // first matrix in the batch
  int64_t count;   // matrices
};

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups, MuonOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<MuonOptions>(defaults)) {
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

void Muon::set_matrix_view(const at::Tensor& param, std::vector<int64_t> view) {
  bool known = false;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) known = known || p.is_same(param);
  }
  check(known, "Muon::set_matrix_view: the tensor of shape ", param.sizes(),
        " is not a parameter of this optimizer");
  check(view.size() >= 2, "Muon::set_matrix_view: a view needs (batch..., rows, cols), got ",
        at::IntArrayRef(view));
  int64_t numel = 1;
  for (auto d : view) {
    check(d > 0, "Muon::set_matrix_view: view ", at::IntArrayRef(view), " has a non-positive dim");
    numel *= d;
  }
  check(numel == param.numel(), "Muon::set_matrix_view: view ", at::IntArrayRef(view), " holds ",
        numel, " elements, the parameter of shape ", param.sizes(), " ", param.numel());
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
      if (!p.grad().defined()) continue;
      check(!p.grad().is_sparse(), "Muon does not support sparse gradients (", param_label(gi, i),
            ")");
      check_muon_param(p, param_label(gi, i));
      check(p.grad().sizes() == p.sizes(), "Muon: ", param_label(gi, i),
            " has a gradient of shape ", p.grad().sizes(), " for a parameter of shape ", p.sizes());
      detail::check_kernels(o.fused(), p, "Muon", param_label(gi, i));
      // The orthogonalization can run (a bf16 dtype on CPU needs bf16 dot products): checked
      // before anything changes, not in the middle of the step.
      resolve_method(matrix_view(p), p.scalar_type(), p.device(), orthogonalize_options(o));
    }
  }
}

MuonParamState& Muon::state_of(const at::Tensor& p, const MuonOptions& o) {
  auto& slot = state_[compat::param_state_key(p)];
  if (!slot) {
    auto state = std::make_unique<MuonParamState>();
    const auto dtype = o.state_dtype() == at::kBFloat16 ? at::kBFloat16 : compute_dtype(p);
    state->momentum_buffer(at::zeros(p.sizes(), p.options().dtype(dtype)));
    slot = std::move(state);
  }
  auto& state = static_cast<MuonParamState&>(*slot);
  if (o.normuon() && !state.normuon_second_moment().defined()) {
    // NorMuon can be switched on between steps: its statistic starts at 0 then.
    state.normuon_second_moment(at::zeros(normuon_state_shape(matrix_view(p), o.normuon()->axis),
                                          p.options().dtype(compute_dtype(p))));
  }
  return state;
}

// Everything after orthogonalization: Muon+, NorMuon, shape factor, decay and the update.
void Muon::finish(Pending& item, const at::Tensor& U_view) {
  const auto& o = *item.options;
  auto U = U_view;
  if (o.post_norm() != PostNorm::none) U = post_normalize(U, o.post_norm(), o.post_norm_eps());
  if (o.normuon()) {
    U = normuon_scale(U, item.state->normuon_second_moment(), o.normuon()->beta2,
                      o.normuon()->axis);
  }
  const auto rows = item.view[item.view.size() - 2];
  const auto cols = item.view.back();
  apply_update(item.param, U.reshape(item.param.sizes()), o,
               shape_factor(o.adjust_lr(), rows, cols));
  item.state->step(item.state->step() + 1);
}

at::Tensor Muon::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  check_step();

  // Gather the parameters to update into batches of same-shape matrices.
  std::map<std::string, std::vector<Pending>> batches;
  std::map<const void*, int64_t> tensor_indices;  // position in the optimizer: part of the seed
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const MuonOptions&>(group.options());
    for (auto& p : group.params()) {
      tensor_indices[p.unsafeGetTensorImpl()] = static_cast<int64_t>(tensor_indices.size());
      if (!p.grad().defined()) continue;
      auto view = matrix_view(p);
      auto& batch = batches[batch_key(view, p, o)];
      const int64_t offset = batch.empty() ? 0 : batch.back().offset + batch.back().count;
      const int64_t count = matrices_in(view);
      batch.push_back({p, &state_of(p, o), &o, std::move(view), offset, count});
    }
  }

  // Per batch: momentum into one stacked direction tensor, one orthogonalization, then each
  // parameter's own finish.
  for (auto& [key, items] : batches) {
    auto& workspace = workspaces_[key];
    const auto& first = items.front();
    const int64_t total = items.back().offset + items.back().count;
    const auto rows = first.view[first.view.size() - 2];
    const auto cols = first.view.back();
    auto directions = workspace.get(
        /*slot=*/7, {total, rows, cols}, first.param.options().dtype(compute_dtype(first.param)));
    for (auto& item : items) {
      auto Q = directions.narrow(0, item.offset, item.count).view(item.param.sizes());
      const uint32_t seed = sr::tensor_salt(sr::step_seed(item.state->step()),
                                            tensor_indices.at(item.param.unsafeGetTensorImpl()));
      momentum_direction(item.param.grad(), item.state->momentum_buffer(), Q, *item.options, seed);
    }
    const auto U = orthogonalize(directions, orthogonalize_options(*first.options), &workspace);
    for (auto& item : items) finish(item, U.narrow(0, item.offset, item.count).view(item.view));
  }
  return loss;
}

}  // namespace muon
