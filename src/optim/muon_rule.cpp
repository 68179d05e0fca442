// The Muon update rule (docs/design.md, "Muon update"; NorMuon and Muon+ there too).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "in_place.h"
#include "master_weights.h"
#include "muon/error.h"
#include "muon/fused_update.h"
#include "muon/generic_update.h"
#include "muon/internal/lanes.h"
#include "muon/reduction.h"
#include "muon/stochastic_rounding.h"
#include "muon_parts.h"
#include "state_precision.h"

namespace muon {

OrthogonalizeOptions orthogonalize_options(const MuonOptions& o, int64_t rows, int64_t cols) {
  const bool plain_only = o.fused() == false && o.ns_method() == NsMethod::automatic;
  const bool by_gram_table = o.gram_coefficients() && rows != cols;
  auto table = by_gram_table ? *o.gram_coefficients() : o.coefficients();
  const auto steps = by_gram_table ? static_cast<int64_t>(table.rows.size()) : o.ns_steps();
  if (o.ns_eps()) table.eps = *o.ns_eps();
  return OrthogonalizeOptions()
      .steps(steps)
      .coefficients(std::move(table))
      .dtype(o.ns_dtype())
      .method(plain_only ? NsMethod::plain : o.ns_method())
      .gram_restarts(o.gram_restarts());
}

OrthogonalizeWorkspace& MuonWorkspaces::get(at::ScalarType dtype, at::Device device,
                                            const OrthogonalizeOptions& options) {
  for (auto& e : entries_) {
    if (e.dtype == dtype && e.device == device && e.options == options) return e.workspace;
  }
  entries_.push_back(Entry{dtype, device, options, {}});
  return entries_.back().workspace;
}

void Algorithm<MuonOptions>::check_item(const at::Tensor& p, const at::Tensor& grad,
                                        const MuonOptions& o, const std::vector<int64_t>& view,
                                        const std::string& where) {
  detail::check_matrix_item("Muon", p, grad, o.fused(), where);
  detail::check_state_for("Muon", p, o.state_dtype(), where);
  const auto rows = view[view.size() - 2];
  const auto cols = view.back();
  if (o.num_heads()) {
    check(rows % *o.num_heads() == 0, "Muon: ", where, " has ", rows, " rows (view ",
          at::IntArrayRef(view), "), which num_heads ", *o.num_heads(), " does not divide");
  }
  if (o.split_sizes()) {
    const auto& sizes = *o.split_sizes();
    const auto total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    check(total == rows, "Muon: split_sizes ", at::IntArrayRef(sizes), " add up to ", total,
          " rows, but ", where, " has ", rows, " (view ", at::IntArrayRef(view), ")");
  }
  // The orthogonalization can run (a bf16 dtype on CPU needs bf16 dot products): checked before
  // anything changes, not in the middle of the step.
  try {
    resolve_method(view, p.scalar_type(), p.device(), orthogonalize_options(o, rows, cols));
  } catch (const Error& e) {
    const std::string dtype = o.ns_dtype() ? c10::toString(*o.ns_dtype()) : "unset";
    throw Error("Muon: " + where + " with ns_dtype " + dtype + ": " + e.what());
  }
}

namespace {

using detail::finish_step;
using detail::momentum_gradient;

// The row blocks each matrix is orthogonalized in: num_heads equal heads, split_sizes, or the
// whole matrix (microsoft/dion's num_heads and split_sizes).
std::vector<int64_t> row_blocks(const MuonOptions& o, int64_t rows) {
  if (o.num_heads()) return std::vector<int64_t>(*o.num_heads(), rows / *o.num_heads());
  if (o.split_sizes()) return *o.split_sizes();
  return {rows};
}

// Updates the momentum buffer and writes the direction Q to orthogonalize into `direction`: one
// fused pass on CPU, the same formulas in ATen operations elsewhere (any buffer dtype in both,
// 8-bit included).
void momentum_direction(const at::Tensor& grad, MuonParamState& state, at::Tensor& direction,
                        const MuonOptions& o, uint32_t seed) {
  const MomentumScalars k{o.momentum(), o.momentum_form() == MomentumForm::ema, o.nesterov(), seed};
  const bool fused = detail::runs_fused(o.fused(), grad);
  if (state.momentum_buffer_codes().defined()) {
    QuantizedState B{state.momentum_buffer_codes(), state.momentum_buffer_absmax()};
    if (fused) {
      fused_momentum(grad.contiguous(), B, direction, k);
    } else {
      detail::on_dequantized<1>({&B}, {q8::CodeMap::signed_e4m3},
                                [&](std::array<at::Tensor, 1>& values) {
                                  generic_momentum(grad, values[0], direction, k);
                                });
    }
  } else if (fused) {
    fused_momentum(grad.contiguous(), state.momentum_buffer(), direction, k);
  } else {
    generic_momentum(grad, state.momentum_buffer(), direction, k);
  }
}

// MuonEq's row equilibration (nanochat's muon_step_fused; Chang et al., arXiv 2603.28254): every
// row of each matrix of Q (batch..., rows, cols) rescaled to the matrix's RMS row norm
// ‖Q‖_F/√rows, row norms clamped at 1e-6, so that no row dominates the orthogonalization.
void equilibrate_rows(at::Tensor Q) {
  const auto rows = Q.size(-2);
  const auto target = vector_norm(Q, {-2, -1}, /*keepdim=*/true, Q.scalar_type()) /
                      std::sqrt(static_cast<double>(rows));
  const auto row_norms = vector_norm(Q, {-1}, /*keepdim=*/true, Q.scalar_type()).clamp_min(1e-6);
  Q.mul_(target / row_norms);
}

// Muon+ and NorMuon of one orthogonalized piece (NorMuon only ever sees whole matrices: it
// refuses num_heads and split_sizes).
at::Tensor normalized(const MuonItem& item, at::Tensor U) {
  const auto& o = *item.options;
  if (o.post_norm() != PostNorm::none) U = post_normalize(U, o.post_norm(), o.post_norm_eps());
  if (o.normuon()) {
    U = normuon_scale(U, item.state->normuon_second_moment(), o.normuon()->beta2,
                      o.normuon()->axis);
  }
  return U;
}

int64_t matrices_in(const std::vector<int64_t>& view) {
  int64_t n = 1;
  for (size_t i = 0; i + 2 < view.size(); ++i) n *= view[i];
  return n;
}

// A block of rows of one item's matrices, orthogonalized as a matrix of its own: the whole
// matrices unless num_heads or split_sizes split them.
struct Piece {
  const MuonItem* item;
  int64_t row0, rows;  // the block's first row and row count in each matrix of the item's view
  bool whole() const { return rows == item->view[item->view.size() - 2]; }
  // The block's (batch..., rows, cols) shape.
  std::vector<int64_t> shape() const {
    auto out = item->view;
    out[out.size() - 2] = rows;
    return out;
  }
};

std::vector<Piece> pieces_of(const std::vector<MuonItem>& items) {
  std::vector<Piece> pieces;
  for (const auto& item : items) {
    int64_t row0 = 0;
    for (const auto rows : row_blocks(*item.options, item.view[item.view.size() - 2])) {
      pieces.push_back({&item, row0, rows});
      row0 += rows;
    }
  }
  return pieces;
}

// Pieces whose matrices can share one orthogonalize() call: same matrix shape, dtype, device and
// settings.
struct Batch {
  const Piece* first;
  OrthogonalizeOptions options;
  std::vector<const Piece*> pieces;
  std::vector<int64_t> offsets;  // each piece's first matrix in the stack
  int64_t total = 0;             // matrices
};

bool same_batch(const Batch& batch, const Piece& piece, const OrthogonalizeOptions& options) {
  const auto& a = *batch.first->item;
  const auto& b = *piece.item;
  return batch.first->rows == piece.rows && a.view.back() == b.view.back() &&
         full_precision(a.param.scalar_type()) == full_precision(b.param.scalar_type()) &&
         a.param.device() == b.param.device() && batch.options == options;
}

std::vector<Batch> batches_of(const std::vector<Piece>& pieces) {
  std::vector<Batch> batches;
  for (const auto& piece : pieces) {
    const auto options =
        orthogonalize_options(*piece.item->options, piece.rows, piece.item->view.back());
    auto it = std::find_if(batches.begin(), batches.end(),
                           [&](const Batch& b) { return same_batch(b, piece, options); });
    if (it == batches.end()) it = batches.insert(batches.end(), Batch{&piece, options, {}, {}, 0});
    it->pieces.push_back(&piece);
    it->offsets.push_back(it->total);
    it->total += matrices_in(piece.item->view);
  }
  return batches;
}

uint32_t momentum_seed(const MuonItem& item) {
  return sr::tensor_salt(sr::step_seed(item.state->step()), item.index);
}

// The momentum direction of a split item, in a tensor of its own (its pieces are copied into
// the batches they fall in).
at::Tensor split_direction(const MuonItem& item) {
  auto Q = at::empty(item.param.sizes(),
                     item.param.options().dtype(full_precision(item.param.scalar_type())));
  const auto& o = *item.options;
  momentum_direction(momentum_gradient(item.grad, item.param, o), *item.state, Q, o,
                     momentum_seed(item));
  return Q.view(item.view);
}

// Whether a batch's pieces can run in lanes: each as much work as the others — whole parameters
// of as many matrices (a split piece's passes are a copy; an expert stack's, one per expert) — and
// each parameter once (LibTorch's Module::parameters() lists a tied weight as often as it is
// registered, and the optimizer updates it that often: one at a time, not from two lanes at once).
bool lanes_fit(const Batch& batch) {
  std::set<const void*> params;
  return std::all_of(batch.pieces.begin(), batch.pieces.end(), [&](const Piece* piece) {
    return piece->whole() &&
           matrices_in(piece->item->view) == matrices_in(batch.first->item->view) &&
           params.insert(piece->item->param.unsafeGetTensorImpl()).second;
  });
}

// Runs work(i) for every piece i of a batch. On CPU, where the pieces fit lanes, whole rounds of
// them, one per thread, run in lanes (docs/algorithms.md §Lanes): each thread updates whole
// parameters, and the threads meet once when the batch is done instead of at every parameter's
// loops, whose barriers a busy process on the machine can stretch to a time slice each. The rest
// run one at a time, each parameter's loops split between the threads.
template <class Work>
void for_each_piece(const Batch& batch, const Work& work) {
  const auto n = static_cast<int64_t>(batch.pieces.size());
  const bool lanes = batch.first->item->param.device().is_cpu() && lanes_fit(batch);
  const auto threads = lanes ? detail::lane_threads() : 1;
  const auto in_lanes = detail::items_in_lanes(n, threads);
  if (in_lanes > 0) {
    detail::for_each_in_lanes(in_lanes, threads, [&](int64_t i, int64_t) { work(i); });
  }
  for (auto i = in_lanes; i < n; ++i) work(i);
}

// The gradient of a batch of one whole parameter whose gradient is spent (the step inside
// backward), as the batch's direction tensor: momentum writes Q over g element by element (after
// reading it) and Newton–Schulz iterates there, so that no buffer of the matrix's size is taken.
// Undefined where the gradient cannot be that tensor, or is read again (cautious masks the update
// with it).
at::Tensor spent_gradient(const Batch& batch, at::ScalarType dtype) {
  const auto& item = *batch.first->item;
  const auto& g = item.grad;
  if (batch.pieces.size() != 1 || !batch.first->whole() || !item.grad_spent ||
      item.options->cautious() || g.scalar_type() != dtype || !g.is_contiguous()) {
    return {};
  }
  return g.view({batch.total, batch.first->rows, item.view.back()});
}

// Per batch: momentum into one stacked direction tensor, one orthogonalization, then each piece
// normalized and scaled by its shape factor. A whole parameter is finished at once (the factor
// folded into lr·factor); a split one's pieces, orthogonalized in the batches of their shapes,
// are scaled into one update, and the parameter finished once they are all there.
void update_batches(const std::vector<MuonItem>& items, MuonWorkspaces& workspaces) {
  const auto pieces = pieces_of(items);
  std::map<const MuonItem*, std::pair<at::Tensor, at::Tensor>> split;  // direction, update
  for (const auto& piece : pieces) {
    if (!piece.whole() && split.count(piece.item) == 0) {
      const auto Q = split_direction(*piece.item);
      split[piece.item] = {Q, at::empty_like(Q)};
    }
  }
  for (const auto& batch : batches_of(pieces)) {
    const auto& first = *batch.first->item;
    const auto rows = batch.first->rows;
    const auto cols = first.view.back();
    const auto dtype = full_precision(first.param.scalar_type());
    auto& workspace = workspaces.get(dtype, first.param.device(), batch.options);
    auto directions = spent_gradient(batch, dtype);
    if (!directions.defined()) {
      directions = workspace.get(OrthogonalizeWorkspace::Slot::directions,
                                 {batch.total, rows, cols}, first.param.options().dtype(dtype));
    }
    const auto slot = [&](const at::Tensor& stack, size_t i) {
      const auto& piece = *batch.pieces[i];
      return stack.narrow(0, batch.offsets[i], matrices_in(piece.item->view)).view(piece.shape());
    };
    for_each_piece(batch, [&](size_t i) {
      const auto& piece = *batch.pieces[i];
      const auto& item = *piece.item;
      auto Q = slot(directions, i);
      if (piece.whole()) {
        auto Q_param = Q.view(item.param.sizes());
        momentum_direction(momentum_gradient(item.grad, item.param, *item.options),
                           *item.state, Q_param, *item.options, momentum_seed(item));
      } else {
        Q.copy_(split.at(&item).first.narrow(-2, piece.row0, piece.rows));
      }
      if (item.options->row_equilibration()) equilibrate_rows(Q);
    });
    const auto U = orthogonalize_overwriting(directions, batch.options, &workspace);
    for_each_piece(batch, [&](size_t i) {
      const auto& piece = *batch.pieces[i];
      const auto& item = *piece.item;
      const auto U_piece = normalized(item, slot(U, i));
      const double factor = shape_factor(item.options->adjust_lr(), piece.rows, cols);
      if (piece.whole()) {
        finish_step(item, U_piece, factor);
      } else {
        split.at(&item).second.narrow(-2, piece.row0, piece.rows).copy_(U_piece * factor);
      }
    });
  }
  for (const auto& [item, tensors] : split) finish_step(*item, tensors.second, 1.0);  // scaled
}

}  // namespace

void Algorithm<MuonOptions>::update(const std::vector<MuonItem>& items,
                                    MuonWorkspaces& workspaces) {
  detail::with_master_weights(
      items,
      [](const MuonItem& item) {
        return detail::mantissa_of(item.options->mantissa_tracking(), item.param, *item.state);
      },
      [&](const std::vector<MuonItem>& work) { update_batches(work, workspaces); });
}

}  // namespace muon
