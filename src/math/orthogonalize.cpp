#include "muon/orthogonalize.h"

#include <array>
#include <cmath>
#include <vector>

#include "cpu/newton_schulz_blas.h"
#include "cpu/upper_blocks.h"
#include "muon/error.h"
#include "muon/internal/blas.h"
#include "muon/internal/lanes.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/option_schema.h"

namespace muon {

CoefficientTable CoefficientTable::quintic() {
  // Keller Jordan, "Muon: An optimizer for hidden layers" (2024): one quintic reused every step.
  return {"quintic", {{3.4445, -4.7750, 2.0315}}, 1.0, 0.0, /*gram_restart_interval=*/3};
}

CoefficientTable CoefficientTable::polar_express() {
  // Amsel, Persson, Musco, Gower, "The Polar Express" (arXiv 2505.16932), rows as nanochat uses
  // them; the 1.01 safety pairs with the rows' own 2e-2 safety margin.
  return {"polar_express",
          {{8.156554524902461, -22.48329292557795, 15.878769915207462},
           {4.042929935166739, -2.808917465908714, 0.5000178451051316},
           {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
           {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
           {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}},
          1.01,
          0.0};
}

CoefficientTable CoefficientTable::dion() {
  // Ahn et al., "Dion" (arXiv 2504.05295); optax's `dion` preset.
  return {"dion",
          {{4.0848, -6.8946, 2.9270},
           {3.9505, -6.3029, 2.6377},
           {3.7418, -5.5913, 2.3037},
           {2.8769, -3.1427, 1.2046},
           {2.8366, -3.0525, 1.2012}},
          1.0,
          0.0};
}

// The next four are the tables NVIDIA's Emerging-Optimizers offers beyond these
// (orthogonalized_optimizers/muon_utils.py), normalized as it does: x / ‖x‖_F, no safety factor.
CoefficientTable CoefficientTable::cans() {
  // Grishina et al., "Accelerating Newton–Schulz iterations for orthogonalization via
  // Chebyshev-type polynomials" (CANS, arXiv 2506.10935).
  return {"cans",
          {{8.4703, -25.1081, 18.6293},
           {4.1828, -3.1087, 0.5806},
           {3.9619, -2.9541, 0.5630},
           {3.2866, -2.4647, 0.5074},
           {2.2737, -1.6447, 0.4162}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::aol() {
  // The 4 rows of thib-s/flash-newton-schulz tuned for its AOL-rescaled input (arXiv 2208.03160);
  // Emerging-Optimizers uses them after plain Frobenius normalization, as here.
  return {"aol",
          {{4.0098, -7.0585, 2.4635},
           {3.4585, -5.5479, 2.5959},
           {2.7573, -3.2939, 1.4254},
           {2.7215, -3.0494, 1.3169}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::cubic5() {
  // Five cubic steps (c = 0), tuned for a smallest singular value of 7e-3 (arXiv 2606.00371).
  return {"cubic5",
          {{3.3656576, -3.3420992, 0.0},
           {2.5744352, -1.4957376, 0.0},
           {2.5368962, -1.4312570, 0.0},
           {2.4418906, -1.2764040, 0.0},
           {2.2230472, -0.9630650, 0.0}},
          1.0,
          0.0};
}

CoefficientTable CoefficientTable::deepseekv4() {
  // DeepSeek-V4's 10 iterations: the quintic 8 times, then 2 steps of (2, −1.5, 0.5), whose fixed
  // point at 1 is stable, to settle the singular values there.
  std::vector<Coefficients> rows(8, {3.4445, -4.7750, 2.0315});
  rows.insert(rows.end(), 2, {2.0, -1.5, 0.5});
  return {"deepseekv4", std::move(rows), 1.0, 0.0};
}

CoefficientTable CoefficientTable::custom(std::vector<Coefficients> rows, double safety,
                                          double eps) {
  return {"custom", std::move(rows), safety, eps};
}

namespace {

// The named tables, in the order docs/algorithms.md lists them: the one list that by_name, names()
// and through them the errors, the option's documentation and Python read.
const std::vector<CoefficientTable>& named_tables() {
  static const std::vector<CoefficientTable> tables{
      CoefficientTable::quintic(),   CoefficientTable::polar_express(), CoefficientTable::dion(),
      CoefficientTable::cans(),      CoefficientTable::aol(),           CoefficientTable::cubic5(),
      CoefficientTable::deepseekv4()};
  return tables;
}

}  // namespace

const std::string& CoefficientTable::names() {
  static const std::string names = [] {
    std::string out;
    for (const auto& table : named_tables()) out += (out.empty() ? "" : ", ") + table.name;
    return out;
  }();
  return names;
}

CoefficientTable CoefficientTable::by_name(const std::string& name) {
  for (const auto& table : named_tables()) {
    if (table.name == name) return table;
  }
  throw Error("unknown coefficient table '" + name + "'; valid tables are " + names() +
              " (or a list of [a, b, c] rows)");
}

const char* coefficients_option_doc() {
  static const std::string doc =
      "the iterations' polynomial: " + CoefficientTable::names() + " or rows [a, b, c]";
  return doc.c_str();
}

const Coefficients& CoefficientTable::row(int64_t k) const {
  const auto last = static_cast<int64_t>(rows.size()) - 1;
  return rows.at(static_cast<size_t>(std::min(k, last)));
}

at::Tensor OrthogonalizeWorkspace::get(Slot slot, at::IntArrayRef sizes,
                                       const at::TensorOptions& options) {
  auto& t = slots_[static_cast<size_t>(slot)];
  if (!t.defined() || t.sizes() != sizes || t.dtype() != options.dtype() ||
      t.device() != options.device()) {
    t = at::empty(sizes, options);
  }
  return t;
}

OrthogonalizeWorkspace& OrthogonalizeWorkspace::lane(size_t index) {
  while (lanes_.size() <= index) lanes_.push_back(std::make_unique<OrthogonalizeWorkspace>());
  return *lanes_[index];
}

bool operator==(const CoefficientTable& a, const CoefficientTable& b) {
  return a.name == b.name && a.rows == b.rows && a.safety == b.safety && a.eps == b.eps &&
         a.gram_restart_interval == b.gram_restart_interval;
}

bool operator==(const OrthogonalizeOptions& a, const OrthogonalizeOptions& b) {
  return a.steps() == b.steps() && a.coefficients() == b.coefficients() && a.dtype() == b.dtype() &&
         a.method() == b.method() && a.gram_restarts() == b.gram_restarts();
}

at::ScalarType orthogonalize_dtype(const at::Tensor& x, std::optional<at::ScalarType> requested) {
  return orthogonalize_dtype(x.scalar_type(), x.device(), requested);
}

at::ScalarType orthogonalize_dtype(at::ScalarType input, at::Device device,
                                   std::optional<at::ScalarType> requested) {
  if (requested) return *requested;
  if (input == at::kDouble) return at::kDouble;
  // CPU bf16 GEMMs are far slower than fp32 ones; GPUs (and other accelerators) are fastest in
  // bf16, which torch.optim.Muon and Keller Jordan's Muon use everywhere.
  return device.is_cpu() ? at::kFloat : at::kBFloat16;
}

namespace {

// Whether this LibTorch multiplies float16 matrices on the CPU (1.13 does not: "bmm not
// implemented for 'Half'"). Asked once, of LibTorch itself.
bool cpu_half_products_available() {
  static const bool available = [] {
    try {
      const auto x = at::ones({2, 2, 2}, at::kHalf);
      at::bmm(x, x);
      return true;
    } catch (const c10::Error&) {
      return false;
    }
  }();
  return available;
}

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

std::vector<int64_t> gram_restart_points(const OrthogonalizeOptions& options,
                                         at::ScalarType dtype) {
  if (options.gram_restarts()) return *options.gram_restarts();
  const int64_t steps = options.steps();
  // In bf16, R = ∏Q_t rounds to its operands' 8 bits, relative to its largest entries, which grow
  // with each iteration of a stretch: with the quintic's 3 the result of a 768×3072 matrix was 4%
  // farther from the polar factor than torch.optim.Muon's bf16 chain, with 2 as close
  // (docs/algorithms.md).
  const int64_t interval = options.coefficients().gram_restart_interval;
  const int64_t every = dtype == at::kBFloat16 ? std::min<int64_t>(interval, 2) : interval;
  std::vector<int64_t> points;
  for (int64_t done = every; done < steps; done += every) points.push_back(done);
  const int64_t last = points.empty() ? 0 : points.back();
  if (steps - last > 2) points.push_back(steps - 2);
  return points;
}

namespace {

bool gram_is_cheaper(int64_t rows, int64_t cols, const OrthogonalizeOptions& options,
                     at::ScalarType dtype) {
  const double k = static_cast<double>(std::min(rows, cols));
  const double m = static_cast<double>(std::max(rows, cols));
  // bf16 products, and fp32 ones on another sgemm than BLIS's, compute symmetric products by
  // row blocks.
  const bool fp32_blocks = dtype == at::kFloat && detail::blas::fp32_on_sgemm();
  const int64_t block_rows = dtype == at::kBFloat16 ? detail::kBf16BlockRows
                             : fp32_blocks           ? detail::kFp32BlockRows
                                                     : 0;
  return detail::gram_flops(k, m, options.steps(), gram_restart_points(options, dtype),
                            block_rows) < detail::symmetric_flops(k, m, options.steps(), block_rows);
}

bool blas_eligible(at::Device device, at::ScalarType dtype) {
  return detail::have_blas() && device.is_cpu() && (dtype == at::kFloat || dtype == at::kDouble);
}

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
  const auto norm = at::linalg_vector_norm(out, 2, matrix, /*keepdim=*/true, accumulate);
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

NsMethod resolve_method(const at::Tensor& x, const OrthogonalizeOptions& options) {
  return resolve_method(x.sizes(), x.scalar_type(), x.device(), options);
}

NsMethod resolve_method(at::IntArrayRef sizes, at::ScalarType input, at::Device device,
                        const OrthogonalizeOptions& options) {
  const auto dtype = orthogonalize_dtype(input, device, options.dtype());
  const auto method = options.method();
  const int64_t rows = sizes[sizes.size() - 2], cols = sizes.back();
  check(!device.is_cpu() || dtype != at::kHalf || cpu_half_products_available(),
        "orthogonalize: float16 on CPU needs half-precision matrix products, which this LibTorch "
        "lacks; use float32 (the CPU default)");
  if (device.is_cpu() && dtype == at::kBFloat16) {  // bf16 products through oneDNN
    check(detail::bf16_products_available(),
          "orthogonalize: bfloat16 on CPU runs on bf16 dot products, and ",
          detail::bf16_products_unavailable_reason(), "; use float32 (the CPU default)");
    if (method != NsMethod::automatic) return method;
    // Gram in bf16 holds the accuracy bound (docs/algorithms.md) on inputs at least 3 times as
    // long as wide, not on square ones.
    const bool long_enough = std::max(rows, cols) >= 3 * std::min(rows, cols);
    return long_enough && gram_is_cheaper(rows, cols, options, dtype) ? NsMethod::gram
                                                                      : NsMethod::symmetric;
  }
  if (method == NsMethod::plain) return method;
  const bool eligible = blas_eligible(device, dtype);
  if (method == NsMethod::automatic) {
    if (!eligible) return NsMethod::plain;
    return gram_is_cheaper(rows, cols, options, dtype) ? NsMethod::gram : NsMethod::symmetric;
  }
  check(eligible, "orthogonalize: method '", to_string(method), "' runs on CPU float32/float64 ",
        "with BLIS or a CBLAS, or on CPU bfloat16 with bf16 dot products; got a ", dtype,
        " computation on ", device, (detail::have_blas() ? "" : " in a build without either"),
        " (use 'automatic' or 'plain')");
  return method;
}

at::Tensor orthogonalize(const at::Tensor& x, const OrthogonalizeOptions& options,
                         OrthogonalizeWorkspace* workspace) {
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
    X = plain_iterations(normalized, table, options.steps());
  } else {
    OrthogonalizeWorkspace local;
    auto& ws = workspace != nullptr ? *workspace : local;
    auto normalized =
        ws.get(OrthogonalizeWorkspace::Slot::normalized, batch.sizes(), batch.options());
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
