// muon::Muon — orthogonalized momentum for matrix parameters (docs/design.md, "Muon update"), a
// torch::optim::Optimizer.
//
//   auto opt = muon::Muon(params, muon::MuonOptions(0.02).momentum(0.95).weight_decay(0.01));
//   loss.backward(); opt.step(); opt.zero_grad();
#pragma once

#include <torch/optim/optimizer.h>

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "muon/normalization.h"
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

std::string to_string(MomentumForm form);
std::string to_string(AdjustLr mode);
MomentumForm momentum_form_from_string(const std::string& name);  // errors list the valid names
AdjustLr adjust_lr_from_string(const std::string& name);

// NorMuon's settings (nanochat and flaxchat use beta2 0.9).
struct NorMuonOptions {
  double beta2 = 0.95;
  NorMuonAxis axis = NorMuonAxis::automatic;
};

struct MuonOptions : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 0.02) : lr_(lr) {}  // NOLINT(google-explicit-constructor): libtorch style
  TORCH_ARG(double, lr) = 0.02;
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = true;
  TORCH_ARG(MomentumForm, momentum_form) = MomentumForm::ema;
  // Decoupled: W ← W·(1 − lr·weight_decay), with lr excluding the shape factor.
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(int64_t, ns_steps) = 5;
  TORCH_ARG(CoefficientTable, coefficients) = CoefficientTable::quintic();
  TORCH_ARG(AdjustLr, adjust_lr) = AdjustLr::original;
  // Orthogonalization dtype; unset picks per device (see OrthogonalizeOptions::dtype): float32 on
  // CPU, bf16 on GPUs; bf16 on CPU where it has bf16 dot products (AVX512_BF16, AMX).
  TORCH_ARG(std::optional<at::ScalarType>, ns_dtype) = std::nullopt;
  TORCH_ARG(NsMethod, ns_method) = NsMethod::automatic;
  // See OrthogonalizeOptions::gram_restarts.
  TORCH_ARG(std::optional<std::vector<int64_t>>, gram_restarts) = std::nullopt;
  // Muon+: normalization after orthogonalization (stateless).
  TORCH_ARG(PostNorm, post_norm) = PostNorm::none;
  TORCH_ARG(double, post_norm_eps) = 1e-8;
  // NorMuon: unset = off.
  TORCH_ARG(std::optional<NorMuonOptions>, normuon) = std::nullopt;
  // Decay only entries where U·W ≥ 0 (flaxchat/nanochat).
  TORCH_ARG(bool, cautious_weight_decay) = false;
  // Cautious optimizer (arXiv 2411.16085): keep entries where (W_old − W_new)·g > 0 only, applied
  // inside the update pass.
  TORCH_ARG(bool, cautious) = false;
  // Momentum storage: at::kFloat (fp64 for fp64 parameters) or at::kBFloat16 (stochastic
  // rounding, any device).
  TORCH_ARG(at::ScalarType, state_dtype) = at::kFloat;
  // Kernels: unset = the fused CPU kernels (and BLIS/CBLAS Newton–Schulz) on CPU tensors, the
  // device-generic ATen form elsewhere; false = the ATen form everywhere (ns_method automatic
  // then means plain), the code GPUs run; true = fused only (CPU tensors).
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;

 public:
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct MuonParamState : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(int64_t, step) = 0;
  // fp32 (fp64 for fp64 parameters) whatever the parameter dtype, or bf16 by state_dtype.
  TORCH_ARG(at::Tensor, momentum_buffer);
  // NorMuon's statistic (fp32), shape normuon_state_shape(view); undefined without NorMuon.
  TORCH_ARG(at::Tensor, normuon_second_moment);
};

// A parameter of rank ≥ 2 is a batch of matrices over its last two dims: an expert stack
// (E, rows, cols) is orthogonalized expert by expert. set_matrix_view() reshapes a parameter into
// another (batch..., rows, cols) view first, e.g. a conv kernel (out, in, kh, kw) → (out,
// in·kh·kw). Matrices of one shape and settings are orthogonalized together in one batched call, in
// buffers kept across steps.
// An optimizer that orthogonalizes some parameters in a (batch..., rows, cols) view of their own.
class MatrixViews {
 public:
  virtual ~MatrixViews() = default;
  // The view `param` is orthogonalized in (its own shape unless set).
  virtual std::vector<int64_t> matrix_view(const at::Tensor& param) const = 0;
};

// The buffers of Muon's batched orthogonalizations, kept across steps by the optimizer that owns
// them: one workspace per matrix shape, dtype, device and orthogonalization setting.
class MuonWorkspaces {
 public:
  OrthogonalizeWorkspace& get(int64_t rows, int64_t cols, at::ScalarType dtype, at::Device device,
                              const OrthogonalizeOptions& options);

 private:
  struct Entry {
    int64_t rows, cols;
    at::ScalarType dtype;
    at::Device device;
    OrthogonalizeOptions options;
    OrthogonalizeWorkspace workspace;
  };
  std::deque<Entry> entries_;  // a deque: get()'s references stay valid as entries are added
};

class Muon : public torch::optim::Optimizer, public MatrixViews {
 public:
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<at::Tensor> params, MuonOptions defaults = {});

  // Calls `closure` (if any) once with gradients enabled, then updates every parameter that has a
  // gradient. Everything is validated before the first parameter changes.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Throws muon::Error for whatever would stop step() (options, sparse/complex/mis-shaped
  // gradients), changing nothing: step() calls it before its first write.
  void check_step() const;

  // Orthogonalize `param` (one of this optimizer's) as the (batch..., rows, cols) tensor `view`
  // (same element count, at least 2 dims).
  void set_matrix_view(const at::Tensor& param, std::vector<int64_t> view);
  // The view `param` is orthogonalized in (its own shape unless set).
  std::vector<int64_t> matrix_view(const at::Tensor& param) const override;

  // torch::save / torch::load: state and each group's lr, weight decay and momentum
  // (save_optimizer_state in muon/param_state.h).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::map<const void*, std::vector<int64_t>> views_;
  MuonWorkspaces workspaces_;
};

// Throws muon::Error unless `options` are valid (lr ≥ 0, momentum in [0, 1), weight_decay ≥ 0,
// ns_steps ≥ 1, a usable coefficient table, state_dtype Float or BFloat16).
void check_options(const MuonOptions& options);

// Throws muon::Error, prefixed by `who`, unless `view` is a (batch..., rows, cols) view of `param`:
// at least 2 dims, all positive, the parameter's element count.
void check_matrix_view(const at::Tensor& param, const std::vector<int64_t>& view,
                       const std::string& who);

// Throws muon::Error unless `p` can be optimized by Muon: a real floating-point tensor of rank ≥ 2.
// `name` is used in the message.
void check_muon_param(const at::Tensor& p, const std::string& name = "parameter");

}  // namespace muon
