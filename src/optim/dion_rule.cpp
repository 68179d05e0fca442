// Dion (Ahn et al., arXiv 2504.05295, Algorithm 1; microsoft/dion's dion.py for the details):
// instead of orthogonalizing the whole momentum, one power iteration against the previous right
// factor Q finds a rank-r orthonormal basis P of the momentum's leading column space; the part of
// the momentum the update took (P·Rᵀ) is mostly removed from the buffer (error feedback), and the
// update is P times the column-normalized R. Formulas in docs/design.md, "Dion".
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "master_weights.h"
#include "matrix_optimizer.h"
#include "muon/dion.h"
#include "muon/dtypes.h"
#include "muon/internal/blas.h"
#include "muon/reduction.h"
#include "muon_parts.h"

namespace muon {

int64_t dion_rank(const DionOptions& o, int64_t rows, int64_t cols) {
  const auto short_side = std::min(rows, cols);
  // Defined for any settings: reading the state under settings that the step refuses (set
  // between steps) computes this shape too. The clamps change nothing for valid settings.
  const auto multiple = std::max<int64_t>(o.rank_multiple_of(), 1);
  const double fraction = o.rank_fraction() >= 0 ? std::min(o.rank_fraction(), 1.0) : 0.0;
  const auto wanted = static_cast<int64_t>(
      std::ceil(fraction * static_cast<double>(short_side) / static_cast<double>(multiple)));
  return std::min(wanted * multiple, short_side);
}

std::vector<int64_t> dion_q_shape(const DionOptions& o, const std::vector<int64_t>& view) {
  const auto rows = view[view.size() - 2];
  const auto cols = view.back();
  std::vector<int64_t> shape(view.begin(), view.end() - 2);
  shape.push_back(std::min(rows, cols));
  shape.push_back(dion_rank(o, rows, cols));
  return shape;
}

void check_options(const DionOptions& o) {
  check_ranges("Dion", o);
  check(!(o.cautious_weight_decay() && o.weight_decay_method() == WeightDecayMethod::l2),
        "Dion: cautious_weight_decay needs a multiplicative weight_decay_method (decoupled, "
        "independent or palm); l2 adds its decay to the gradient instead");
}

// Dion's power iteration and QR run in float32 or float64 whatever the parameter's dtype: no
// setting of it depends on the device beyond the kernels.
void Algorithm<DionOptions>::check_item(const at::Tensor& p, const at::Tensor& grad,
                                        const DionOptions& o, const std::vector<int64_t>& /*view*/,
                                        const std::string& where) {
  detail::check_matrix_item("Dion", p, grad, o.fused(), where);
}

template class MatrixOptimizer<DionOptions>;

namespace detail {
namespace {

// Seeds Q's first draw: the same on every rank and device for the parameter at `index`.
constexpr uint64_t kDionSeed = 0x44696f6e;  // "Dion"

// Matrices are worked on with their long side first (dion.py's transposition), so P is
// (long × r) and Q (short × r).
bool transposed(const std::vector<int64_t>& view) {
  return view[view.size() - 2] < view.back();
}

// Q as the paper starts it: standard normal entries (drawn in fp64 on the CPU, so every device
// and dtype starts from the same values). A Q of another shape — the rank changed between steps
// — starts afresh too.
at::Tensor& right_factor(const DionItem& item, at::ScalarType dtype) {
  const auto shape = dion_q_shape(*item.options, item.view);
  if (!item.state->dion_q().defined() || item.state->dion_q().sizes() != at::IntArrayRef(shape)) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(kDionSeed + item.index);
    const auto q = at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
    item.state->dion_q(q.to(item.param.device(), dtype));
  }
  return item.state->dion_q();
}

void dion_step(const DionItem& item) {
  const auto& o = *item.options;
  const double epsilon = o.epsilon();
  const auto dtype = full_precision(item.param.scalar_type());
  const auto G = momentum_gradient(item.grad, item.param, o).to(dtype).reshape(item.view);
  auto M = item.state->momentum_buffer().view(item.view);
  M.add_(G);
  const bool flip = transposed(item.view);
  const auto B = flip ? M.transpose(-2, -1) : M;  // a view: (…, long, short)
  auto& Q = right_factor(item, dtype);
  // LibTorch's products and QR whole on one thread: MKL's threads change their bits with their
  // count (docs/algorithms.md §Same bits at any thread count).
  const detail::blas::OneThread alone;
  auto P = std::get<0>(at::linalg_qr(at::matmul(B, Q), "reduced"));
  auto R = at::matmul(B.transpose(-2, -1), P);
  // An all-zero momentum has no column space: no update, and Q is kept (dion.py's
  // fix_all_zero_or_nan).
  const auto zero = M.ne(0).any(-1, true).any(-2, true).logical_not();
  P = at::where(zero, at::zeros_like(P), P.nan_to_num());
  R = at::where(zero, Q, R.nan_to_num());
  B.sub_(at::matmul(P, R.transpose(-2, -1)), 1.0 - o.momentum());  // error feedback, in M
  Q = R / (vector_norm(R, {-2}, /*keepdim=*/true, R.scalar_type()) + epsilon);
  auto U = at::matmul(P, Q.transpose(-2, -1));
  if (flip) U = U.transpose(-2, -1);
  finish_step(item, U, shape_factor(o.adjust_lr(), item.view[item.view.size() - 2], item.view.back()));
}

}  // namespace
}  // namespace detail

void Algorithm<DionOptions>::update(const std::vector<DionItem>& items) {
  detail::with_master_weights(
      items,
      [](const DionItem& item) {
        return detail::mantissa_of(item.options->mantissa_tracking(), item.param, *item.state);
      },
      [](const std::vector<DionItem>& work) {
        for (const auto& item : work) detail::dion_step(item);
      });
}

}  // namespace muon
