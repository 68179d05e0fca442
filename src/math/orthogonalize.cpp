#include "muon/orthogonalize.h"

#include <cmath>

#include "muon/error.h"

namespace muon {

CoefficientTable CoefficientTable::quintic() {
  // Keller Jordan, "Muon: An optimizer for hidden layers" (2024): one quintic reused every step.
  return {"quintic", {{3.4445, -4.7750, 2.0315}}, 1.0, 1e-7};
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
          1e-6};
}

CoefficientTable CoefficientTable::dion() {
  // Ahn et al., "Dion" (arXiv 2504.05295); optax's `dion` preset, normalized as optax does
  // (x / (‖x‖_F + 1e-8)).
  return {"dion",
          {{4.0848, -6.8946, 2.9270},
           {3.9505, -6.3029, 2.6377},
           {3.7418, -5.5913, 2.3037},
           {2.8769, -3.1427, 1.2046},
           {2.8366, -3.0525, 1.2012}},
          1.0,
          1e-8};
}

CoefficientTable CoefficientTable::custom(std::vector<Coefficients> rows, double safety,
                                          double eps) {
  return {"custom", std::move(rows), safety, eps};
}

CoefficientTable CoefficientTable::by_name(const std::string& name) {
  if (name == "quintic") return quintic();
  if (name == "polar_express") return polar_express();
  if (name == "dion") return dion();
  throw Error("unknown coefficient table '" + name +
              "'; valid tables are quintic, polar_express, dion (or a list of [a, b, c] rows)");
}

const Coefficients& CoefficientTable::row(int64_t k) const {
  const auto last = static_cast<int64_t>(rows.size()) - 1;
  return rows.at(static_cast<size_t>(std::min(k, last)));
}

at::ScalarType orthogonalize_dtype(const at::Tensor& x, std::optional<at::ScalarType> requested) {
  if (requested) return *requested;
  if (x.scalar_type() == at::kDouble) return at::kDouble;
  // CPU bf16 GEMMs are far slower than fp32 ones; GPUs are fastest in bf16.
  return x.is_cuda() ? at::kBFloat16 : at::kFloat;
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

void check_options(const OrthogonalizeOptions& options) {
  check(options.steps() >= 1, "orthogonalize: steps must be >= 1, got ", options.steps());
  if (options.dtype()) {
    check(at::isFloatingType(*options.dtype()),
          "orthogonalize: dtype must be a floating-point type (float32, float64, bfloat16 or ",
          "float16), got ", *options.dtype());
  }
  const auto& table = options.coefficients();
  check(!table.rows.empty(), "orthogonalize: coefficient table '", table.name,
        "' has no rows; give at least one [a, b, c] row");
  for (const auto& row : table.rows) {
    check(std::isfinite(row[0]) && std::isfinite(row[1]) && std::isfinite(row[2]),
          "orthogonalize: coefficient table '", table.name, "' has a non-finite coefficient");
  }
  check(table.eps > 0 && std::isfinite(table.eps), "orthogonalize: eps must be > 0, got ",
        table.eps, " (coefficient table '", table.name, "')");
  check(table.safety > 0 && std::isfinite(table.safety), "orthogonalize: safety must be > 0, got ",
        table.safety, " (coefficient table '", table.name, "')");
}

at::Tensor orthogonalize(const at::Tensor& x, const OrthogonalizeOptions& options) {
  check_input(x);
  check_options(options);
  if (x.numel() == 0) return x.clone();
  const int64_t rows = x.size(-2);
  const int64_t cols = x.size(-1);
  const auto& table = options.coefficients();

  // X is a fresh tensor from the division on, so x (possibly aliased by the reshape/cast) is
  // never written.
  const auto batch = x.reshape({-1, rows, cols}).to(orthogonalize_dtype(x, options.dtype()));
  // The norm accumulates in at least fp32, also for bf16/fp16 working dtypes.
  const auto norm = at::linalg_vector_norm(batch, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true,
                                           at::promote_types(batch.scalar_type(), at::kFloat));
  auto X = batch / (norm * table.safety + table.eps).to(batch.scalar_type());

  // Iterate on the Gram matrix of the smaller side: for tall X, A = XᵀX and X ← a·X + X·(b·A +
  // c·A²) equals transposing, iterating and transposing back, without the copies.
  const bool tall = rows > cols;
  for (int64_t k = 0; k < options.steps(); ++k) {
    const auto& [a, b, c] = table.row(k);
    const auto A = tall ? at::bmm(X.transpose(1, 2), X) : at::bmm(X, X.transpose(1, 2));
    const auto B = at::baddbmm(A, A, A, /*beta=*/b, /*alpha=*/c);
    X = tall ? at::baddbmm(X, X, B, /*beta=*/a) : at::baddbmm(X, B, X, /*beta=*/a);
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
