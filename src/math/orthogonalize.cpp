#include "muon/orthogonalize.h"

#include <array>
#include <cmath>
#include <vector>

#include "cpu/newton_schulz_blas.h"
#include "muon/error.h"
#include "muon/internal/blas.h"
#include "muon/internal/lanes.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/option_schema.h"
#include "muon/reduction.h"

namespace muon {

at::Tensor OrthogonalizeWorkspace::get(Slot slot, at::IntArrayRef sizes,
                                       const at::TensorOptions& options) {
  // A slot only grows: a smaller request is the front of its buffer, so that matrices of every
  // shape share one set of buffers (the largest's) instead of one set per shape.
  auto& buffer = slots_[static_cast<size_t>(slot)];
  const auto elements = c10::multiply_integers(sizes);
  if (!buffer.defined() || buffer.numel() < elements || buffer.dtype() != options.dtype() ||
      buffer.device() != options.device()) {
    buffer = at::empty({elements}, options);
  }
  return buffer.narrow(0, 0, elements).view(sizes);
}

OrthogonalizeWorkspace& OrthogonalizeWorkspace::lane(size_t index) {
  while (lanes_.size() <= index) lanes_.push_back(std::make_unique<OrthogonalizeWorkspace>());
  return *lanes_[index];
}

bool operator==(const OrthogonalizeOptions& a, const OrthogonalizeOptions& b) {
  return a.steps() == b.steps() && a.coefficients() == b.coefficients() && a.dtype() == b.dtype() &&
         a.method() == b.method() && a.gram_restarts() == b.gram_restarts();
}

namespace {

void check_input(const at::Tensor& x) {
  check(x.dim() >= 2, "orthogonalize: expected a matrix or a batch of matrices (at least 2 dims), ",
        "got a tensor of shape ", x.sizes());
  check(!x.is_complex(), "orthogonalize: complex tensors are not supported (got ", x.scalar_type(),
        "); use float32, float64, bfloat16 or float16");
  check(x.is_floating_point(), "orthogonalize: expected a floating-point tensor (float32, ",
        "float64, bfloat16 or float16), got ", x.scalar_type());
}

}  // namespace

void check_options(const OrthogonalizeOptions& options, const OrthogonalizeNames& names) {
  const std::string who = names.who;
  check(in_range(Range::iteration_count, static_cast<double>(options.steps())), who, ": ",
        names.steps, " must be ", range_text(Range::iteration_count), ", got ", options.steps());
  if (options.dtype()) {
    check(at::isFloatingType(*options.dtype()), who, ": ", names.dtype,
          " must be a floating-point type (float32, float64, bfloat16 or float16), got ",
          *options.dtype());
  }
  const auto& table = options.coefficients();
  const auto where = who + ": coefficients: table '" + table.name + "'";
  check(!table.rows.empty(), where, " has no rows; give at least one [a, b, c] row");
  for (const auto& row : table.rows) {
    check(std::isfinite(row[0]) && std::isfinite(row[1]) && std::isfinite(row[2]), where,
          " has a non-finite coefficient");
  }
  check(table.eps >= 0 && std::isfinite(table.eps), where, ": eps must be >= 0, got ", table.eps);
  check(table.safety > 0 && std::isfinite(table.safety), where, ": safety must be > 0, got ",
        table.safety);
  check(table.gram_restart_interval >= 1, where, ": gram_restart_interval must be >= 1, got ",
        table.gram_restart_interval);
  if (const auto& restarts = options.gram_restarts()) {
    check(options.method() == NsMethod::gram || options.method() == NsMethod::automatic, who,
          ": gram_restarts would do nothing: ", names.method, " ", to_string(options.method()),
          " never runs the Gram iteration; choose gram or automatic, or leave gram_restarts unset");
    for (size_t i = 0; i < restarts->size(); ++i) {
      check((*restarts)[i] >= 1 && (i == 0 || (*restarts)[i] > (*restarts)[i - 1]), who,
            ": gram_restarts must be strictly increasing iteration counts >= 1, got ",
            at::IntArrayRef(*restarts));
    }
  }
}

namespace {

// The plain reference: three batched GEMMs per iteration on the smaller side. For tall X,
// A = XᵀX and X ← a·X + X·(b·A + c·A²) equals transposing, iterating and transposing back,
// without the copies.
at::Tensor plain_iterations(at::Tensor X, const CoefficientTable& table, int64_t steps) {
  const bool tall = X.size(1) > X.size(2);
  for (int64_t k = 0; k < steps; ++k) {
    const auto& [a, b, c] = table.row(k);
    const auto A = tall ? at::bmm(X.transpose(1, 2), X) : at::bmm(X, X.transpose(1, 2));
    const auto B = at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
    X = tall ? at::baddbmm(X, X, B, /*beta=*/a) : at::baddbmm(X, B, X, /*beta=*/a);
  }
  return X;
}

// max |x| per matrix of the batch X (batch..., rows, cols), shaped (batch..., 1, 1), NaN where a
// matrix holds one: as the infinity norm, exactly (a maximum does not round), from ATen's
// largest and smallest entries, whose CPU kernels run at memory speed where its infinity norm's
// reduction went one element at a time (~8× slower in LibTorch 1.13 and 2.15 alike).
at::Tensor largest_magnitude(const at::Tensor& X) {
  const auto entries = X.flatten(-2);
  const auto largest =
      at::maximum(entries.amax(-1, /*keepdim=*/true), entries.amin(-1, /*keepdim=*/true).neg());
  return largest.unsqueeze(-1);
}

// Writes X / (‖X‖_F·safety + eps) per matrix of the batch X into `out` (X's shape and dtype; not
// X itself). Computed as (X/m) / (‖X/m‖_F·safety + eps/m) with m = max |X| per matrix, so that the
// squares of the norm neither underflow nor overflow at any scale of X; with eps 0 (every table's)
// the result is then the same for X scaled by any factor (docs/algorithms.md §Normalization). A
// zero matrix gives zeros.
void normalize_into(at::Tensor& out, const at::Tensor& X, const CoefficientTable& table) {
  const std::array<int64_t, 2> matrix{-2, -1};
  const auto largest = largest_magnitude(X);
  const auto scale = at::where(largest > 0, largest, at::ones_like(largest));
  at::div_out(out, X, scale);
  // The norm accumulates in at least fp32, also for bf16/fp16 working dtypes.
  const auto accumulate = at::promote_types(out.scalar_type(), at::kFloat);
  const auto norm = vector_norm(out, matrix, /*keepdim=*/true, accumulate);
  const auto denominator = norm * table.safety + table.eps / scale.to(accumulate);
  out.div_(
      at::where(denominator > 0, denominator, at::ones_like(denominator)).to(out.scalar_type()));
}

// Runs iterate(first, count, workspace) over the n matrices of a batch on CPU. With at least one
// matrix per thread of LibTorch's pool, each thread takes whole matrices, the next one free at a
// time, and iterates them alone with its lane's workspace (docs/algorithms.md §Lanes: a product
// split between threads waits at a barrier, which a busy process on the machine can stretch to a
// time slice). What is left over after whole rounds is iterated with every product split between
// the threads. (Not over a CBLAS: OpenBLAS runs its own threads under every call.)
template <class Iterate>
void iterate_in_lanes(int64_t n, bool cpu_bf16, OrthogonalizeWorkspace& ws,
                      const Iterate& iterate) {
  const bool own_threads = cpu_bf16 || detail::blas::helper_threads() > 1;
  const int64_t threads = own_threads ? detail::lane_threads() : 1;
  const int64_t in_lanes = detail::items_in_lanes(n, threads);
  if (in_lanes > 0) {
    // BLIS chooses its configuration (through the environment) on first use: here, not in a lane
    // while the others may read the environment.
    if (!cpu_bf16) detail::blas::backend();
    std::vector<OrthogonalizeWorkspace*> lanes;  // made here: lane() may grow its list
    for (int64_t lane = 0; lane < threads; ++lane) lanes.push_back(&ws.lane(lane));
    detail::for_each_in_lanes(in_lanes, threads,
                              [&](int64_t i, int64_t lane) { iterate(i, 1, *lanes[lane]); });
  }
  if (in_lanes < n) iterate(in_lanes, n - in_lanes, ws);
}

}  // namespace

std::string blas_backend() {
  return detail::blas::backend();
}

std::string bf16_products() {
  return detail::bf16_products_description();
}

namespace {

// orthogonalize(), in x's memory where `overwrite` allows it and x needs no cast or copy.
at::Tensor orthogonalize_batch(const at::Tensor& x, const OrthogonalizeOptions& options,
                               OrthogonalizeWorkspace* workspace, bool overwrite) {
  check_input(x);
  check_options(options);
  const auto method = resolve_method(x, options);
  if (x.numel() == 0) return x.clone();
  const int64_t rows = x.size(-2);
  const int64_t cols = x.size(-1);
  const auto& table = options.coefficients();

  // The iterations start from a fresh tensor (or workspace buffer), so x — possibly aliased by the
  // reshape/cast — is never written.
  const bool cpu_bf16 =
      x.device().is_cpu() && orthogonalize_dtype(x, options.dtype()) == at::kBFloat16;
  // CPU bf16 reads the input in fp32 and normalizes it where it first rounds it to bf16.
  const auto batch = x.reshape({-1, rows, cols})
                         .to(cpu_bf16 ? at::kFloat : orthogonalize_dtype(x, options.dtype()));
  at::Tensor X;
  if (method == NsMethod::plain && !cpu_bf16) {
    auto normalized = at::empty_like(batch);
    normalize_into(normalized, batch, table);
    const detail::blas::OneThread alone;  // LibTorch's GEMMs whole on one thread: the same bits
    X = plain_iterations(normalized, table, options.steps());
  } else {
    OrthogonalizeWorkspace local;
    auto& ws = workspace != nullptr ? *workspace : local;
    // Every method reads a matrix only before it writes that matrix's first iterate (elementwise,
    // in the same pass), so x's own memory can hold the iterates.
    const bool in_x = overwrite && batch.is_contiguous() && batch.data_ptr() == x.data_ptr();
    auto normalized =
        in_x ? batch
             : ws.get(OrthogonalizeWorkspace::Slot::normalized, batch.sizes(), batch.options());
    const auto inputs = cpu_bf16 ? batch.contiguous() : batch;  // bf16 reads it by pointer
    const auto restarts = gram_restart_points(options, cpu_bf16 ? at::kBFloat16 : at::kFloat);
    const auto products = detail::default_bf16_products();  // one choice for the whole batch
    // Iterates matrices [first, first + count). The methods alternate between two buffers, and
    // a result may end in the workspace's second one: for the whole batch X is then that buffer;
    // a part of the batch (a lane's matrix, what whole rounds left over) is copied into
    // `normalized`, which then holds them all.
    const auto iterate = [&](int64_t first, int64_t count, OrthogonalizeWorkspace& w) {
      auto out = normalized.narrow(0, first, count);
      const auto in = inputs.narrow(0, first, count);
      at::Tensor result;
      if (cpu_bf16) {  // normalized in the pass that rounds to bf16, into `out`
        result =
            detail::bf16_iterations(in, out, method, table, options.steps(), restarts, w, products);
      } else {
        normalize_into(out, in, table);
        result = method == NsMethod::symmetric
                     ? detail::symmetric_iterations(out, table, options.steps(), w)
                     : detail::gram_iterations(out, table, options.steps(), restarts, w);
      }
      if (first + count == batch.size(0) && first == 0) {
        X = result;  // the whole batch at once: no copy
      } else if (result.data_ptr() != out.data_ptr()) {
        out.copy_(result);
      }
    };
    X = normalized;
    iterate_in_lanes(batch.size(0), cpu_bf16, ws, iterate);
  }
  return X.to(x.scalar_type()).reshape(x.sizes());
}

}  // namespace

at::Tensor orthogonalize(const at::Tensor& x, const OrthogonalizeOptions& options,
                         OrthogonalizeWorkspace* workspace) {
  return orthogonalize_batch(x, options, workspace, /*overwrite=*/false);
}

at::Tensor orthogonalize_overwriting(at::Tensor& x, const OrthogonalizeOptions& options,
                                     OrthogonalizeWorkspace* workspace) {
  return orthogonalize_batch(x, options, workspace, /*overwrite=*/true);
}

double orthogonality_error(const at::Tensor& x) {
  check(x.dim() >= 2, "orthogonality_error: expected at least 2 dims, got shape ", x.sizes());
  if (x.numel() == 0) return 0.0;
  const auto batch = x.reshape({-1, x.size(-2), x.size(-1)}).to(at::kDouble);
  const bool tall = x.size(-2) > x.size(-1);
  const auto gram =
      tall ? at::bmm(batch.transpose(1, 2), batch) : at::bmm(batch, batch.transpose(1, 2));
  const auto k = gram.size(-1);
  const auto eye = at::eye(k, gram.options());
  const auto err = at::linalg_vector_norm(gram - eye, 2, at::IntArrayRef{-2, -1}) / std::sqrt(k);
  return err.max().item<double>();
}

}  // namespace muon
