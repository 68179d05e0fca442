// Which computation orthogonalize() runs: the working dtype for the input and device, the Gram
// iteration's restart points, and the method — `automatic` by the FLOP model of the symmetric and
// Gram iterations (docs/algorithms.md §Methods), the others checked against what this build and
// CPU can run.
#include <algorithm>
#include <vector>

#include "cpu/newton_schulz_blas.h"
#include "cpu/upper_blocks.h"
#include "muon/error.h"
#include "muon/internal/blas.h"
#include "muon/internal/newton_schulz_bf16.h"
#include "muon/orthogonalize.h"

namespace muon {

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

}  // namespace

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
  if (device.is_cpu() && dtype == at::kBFloat16) {  // bf16 products: oneDNN's, or emulated
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

}  // namespace muon
