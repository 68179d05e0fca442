// Orthogonalization of matrices by Newton–Schulz iteration
// (docs/design.md §Newton–Schulz orthogonalization): maps each matrix of a batch to approximately
// U·Vᵀ of its SVD without computing an SVD.
#pragma once

#include <ATen/ATen.h>
#include <torch/arg.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "muon/enum_names.h"

namespace muon {

// One iteration's odd polynomial p(x) = a·x + b·x³ + c·x⁵, applied to a matrix as
// X ← a·X + (b·A + c·A²)·X with A = X·Xᵀ.
using Coefficients = std::array<double, 3>;

// A table of per-iteration coefficients plus the normalization X / (‖X‖_F·safety + eps) it was
// tuned for. When an iteration count exceeds the table, the last row repeats. eps 0 (every table
// here) adds only the working dtype's smallest normal number, so that 0 stays 0 and the result
// does not depend on X's scale; a positive eps (Muon's ns_eps) is added as given.
struct CoefficientTable {
  std::string name;
  std::vector<Coefficients> rows;
  double safety = 1.0;
  double eps = 0.0;
  // Method `gram` in float32: how many iterations may follow one Gram matrix before it is formed
  // afresh (see gram_restart_points()). The Gram matrix squares the condition number and every
  // iteration on it amplifies its rounding; measured against the plain chain's own error, the
  // quintic tolerates 3, Polar Express and Dion (larger leading coefficients) 2.
  int64_t gram_restart_interval = 2;

  // Keller Jordan's quintic (3.4445, −4.7750, 2.0315), used by torch.optim.Muon and optax.
  static CoefficientTable quintic();
  // Polar Express (Amsel et al. 2025, arXiv 2505.16932) as nanochat/flaxchat use it: 5 rows
  // tuned with safety factor 2e-2 and cushion 2.
  static CoefficientTable polar_express();
  // The 5-row table of the Dion optimizer (arXiv 2504.05295), optax's `dion` preset.
  static CoefficientTable dion();
  // From NVIDIA's Emerging-Optimizers (docs/algorithms.md has each one's source and accuracy):
  // CANS's Chebyshev-type quintics (5 rows), the rows flash-newton-schulz tuned for AOL scaling
  // (4), five cubic steps (c = 0), and DeepSeek-V4's 10 iterations (use ns_steps 10).
  static CoefficientTable cans();
  static CoefficientTable aol();
  static CoefficientTable cubic5();
  static CoefficientTable deepseekv4();
  // A caller's table; validated when used.
  static CoefficientTable custom(std::vector<Coefficients> rows, double safety = 1.0,
                                 double eps = 0.0);
  // A table above by its name (`quintic`, `polar_express`, ...); any other name is an error
  // listing the names.
  static CoefficientTable by_name(const std::string& name);
  // The names by_name accepts, comma-separated, in the order docs/algorithms.md lists them.
  static const std::string& names();

  // Coefficients of iteration `k` (0-based).
  const Coefficients& row(int64_t k) const;
};

// How the iterations are computed; all give the same polynomial of the singular values.
enum class NsMethod {
  automatic,  // CPU float32/float64 with BLIS or a CBLAS: the cheaper of symmetric and gram; else
              // plain
  plain,      // three batched GEMMs per iteration (the reference)
  symmetric,  // one triangle of X·Xᵀ and of A², B·X whole (CPU, BLIS or CBLAS)
  gram,       // Gram Newton–Schulz on the k×k Gram matrix (CPU, BLIS or CBLAS; rectangular)
};

template <>
struct EnumNames<NsMethod> {
  static constexpr const char* noun = "orthogonalization method";
  static constexpr const char* plural = "methods";
  static constexpr std::array<std::pair<NsMethod, const char*>, 4> table{
      {{NsMethod::automatic, "automatic"},
       {NsMethod::plain, "plain"},
       {NsMethod::symmetric, "symmetric"},
       {NsMethod::gram, "gram"}}};
};
inline std::string to_string(NsMethod method) {
  return enum_name(method);
}
inline NsMethod ns_method_from_string(const std::string& name) {
  return enum_from_name<NsMethod>(name);
}

// Buffers orthogonalize() keeps between calls so that the steady state allocates nothing. One
// workspace serves problems of every shape in turn (its buffers grow to the largest). A result
// computed with a workspace lives in it and is overwritten by the next call with the workspace.
class OrthogonalizeWorkspace {
 public:
  // What each buffer holds.
  enum class Slot {
    normalized,  // X / (‖X‖_F·safety + eps), the iterate the methods start from (bf16: the result)
    iterate,     // the methods' second iterate buffer (they alternate between the two)
    squares,     // the k×k matrices of the symmetric and Gram methods
    operands,    // bf16 on CPU: the iterate and k×k matrices rounded to bf16, the products' inputs
    directions,  // Muon: the stacked momentum directions of one batch
    count,
  };
  // Buffer `slot` as a contiguous tensor of `sizes`/`options`: the front of the slot's buffer,
  // which is allocated again only when it is too small or of another dtype or device.
  at::Tensor get(Slot slot, at::IntArrayRef sizes, const at::TensorOptions& options);
  // The buffers of lane `index`, one of the threads that iterate whole matrices of a batch at once
  // on CPU (docs/algorithms.md §Lanes), made on first use.
  OrthogonalizeWorkspace& lane(size_t index);

 private:
  std::array<at::Tensor, static_cast<size_t>(Slot::count)> slots_;
  std::vector<std::unique_ptr<OrthogonalizeWorkspace>> lanes_;
};

struct OrthogonalizeOptions {
  // Number of Newton–Schulz iterations (≥ 1).
  TORCH_ARG(int64_t, steps) = 5;
  TORCH_ARG(CoefficientTable, coefficients) = CoefficientTable::quintic();
  // Working dtype. Unset: float64 input stays float64, CPU computes in float32, every other device
  // (CUDA, ...) in bfloat16. bfloat16 on CPU runs on bf16 dot products (AVX512_BF16 or AMX,
  // through oneDNN: fp32 sums, the k×k matrices kept in fp32); elsewhere on CPU it is an error.
  TORCH_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  TORCH_ARG(NsMethod, method) = NsMethod::automatic;
  // gram only: the iteration counts after which W and its Gram matrix are formed afresh from the
  // matrix itself (strictly increasing, each ≥ 1; counts ≥ steps have no effect; empty: never).
  // Unset: gram_restart_points() derives them from the table.
  TORCH_ARG(std::optional<std::vector<int64_t>>, gram_restarts) = std::nullopt;
};

// Every field equal (the table's name included). Muon orthogonalizes matrices together only under
// equal options, so a field added to either struct must be compared here.
bool operator==(const CoefficientTable& a, const CoefficientTable& b);
bool operator==(const OrthogonalizeOptions& a, const OrthogonalizeOptions& b);

// Returns a tensor of x's shape and dtype whose last two dims hold, per matrix of the leading
// batch dims, the Newton–Schulz approximation of U·Vᵀ. x itself is never modified. Without a
// workspace the result is a new tensor; with one it may live in the workspace.
at::Tensor orthogonalize(const at::Tensor& x, const OrthogonalizeOptions& options = {},
                         OrthogonalizeWorkspace* workspace = nullptr);

// The same result, computed in x's own memory where x is a contiguous tensor of the working dtype
// (the iterations would otherwise start from a workspace buffer of x's size): x is overwritten
// with anything, and the result may live in it. For an input that is itself scratch, such as
// Muon's momentum directions, whose copy would be the largest buffer of a step.
at::Tensor orthogonalize_overwriting(at::Tensor& x, const OrthogonalizeOptions& options = {},
                                     OrthogonalizeWorkspace* workspace = nullptr);

// The restarts method `gram` makes when it computes in `dtype`: options.gram_restarts() if set;
// otherwise every coefficients().gram_restart_interval iterations — in bfloat16 every 2 at most —
// plus one 2 iterations before the end if the last stretch would be longer (the final iterations
// set the result's accuracy; earlier errors are corrected by the iterations that follow). 5 steps:
// quintic {3} ({2, 4} in bfloat16), Polar Express and Dion {2, 4}.
std::vector<int64_t> gram_restart_points(const OrthogonalizeOptions& options,
                                         at::ScalarType dtype = at::kFloat);

// What the CPU methods symmetric and gram multiply with, the kernels it chose and why, starting
// with the library's name: "BLIS 0.9.0, configuration 'haswell' (avx2 kernels): chosen from the
// CPU's feature bits (avx2); BLIS's own detection picked 'generic'", "CBLAS: ..." or "none ..."
// (then `automatic` always resolves to plain), then where the fp32 products run: "; fp32
// products on oneDNN 2.6.3's sgemm (LibTorch's oneDNN too) instead" on an AVX-512 CPU beside a
// LibTorch on the same oneDNN, else "; fp32 too (not oneDNN: " and why ")". BLIS's configuration
// follows the CPU's feature bits (AVX-512, AVX2+FMA), never a table of CPU models; on other CPUs
// BLIS's own detection stands.
std::string blas_backend();

// Where the bf16 Newton–Schulz products run on CPU (dtype bfloat16): "every bf16 product on the
// linked oneDNN 2.6.3", or, where LibTorch bundles a newer oneDNN (PyPI's torch), "whole bf16
// products on LibTorch's oneDNN 3.13.3 (…), the rest on the linked one" (docs/algorithms.md);
// "none: " and why, on a CPU or build without bf16 products.
std::string bf16_products();

// The method `automatic` resolves to for x (or the requested one, checked to be available).
NsMethod resolve_method(const at::Tensor& x, const OrthogonalizeOptions& options);
// The same for matrices of `sizes` (…, rows, cols) of dtype `input` on `device`.
NsMethod resolve_method(at::IntArrayRef sizes, at::ScalarType input, at::Device device,
                        const OrthogonalizeOptions& options);

// The names errors give the options: orthogonalize's own, or an optimizer's that forwards them.
struct OrthogonalizeNames {
  const char* who = "orthogonalize";
  const char* steps = "steps";
  const char* dtype = "dtype";
  const char* method = "method";
};
inline constexpr OrthogonalizeNames kMuonOrthogonalizeNames{"Muon", "ns_steps", "ns_dtype",
                                                            "ns_method"};

// Throws muon::Error when the options cannot run (steps < 1, empty or non-finite table,
// eps or safety ≤ 0, non-floating dtype) or set what the method never reads (gram_restarts
// beside plain or symmetric), naming each option as `names` says.
void check_options(const OrthogonalizeOptions& options, const OrthogonalizeNames& names = {});

// The dtype orthogonalize() computes in for x under `requested` (see OrthogonalizeOptions::dtype).
at::ScalarType orthogonalize_dtype(const at::Tensor& x, std::optional<at::ScalarType> requested);
at::ScalarType orthogonalize_dtype(at::ScalarType input, at::Device device,
                                   std::optional<at::ScalarType> requested);

// Quality of an orthogonalized result without an SVD: the largest, over the batch, of
// ‖G − I‖_F / √k where G is the k×k Gram matrix on the smaller side. 0 for exact U·Vᵀ.
double orthogonality_error(const at::Tensor& x);

}  // namespace muon
