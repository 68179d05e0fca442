#include "newton_schulz_bf16.h"

#include <algorithm>

#include "dnnl.h"
#include "kernel_choice.h"
#include "muon/error.h"

namespace muon::detail {

bool bf16_products_available() {
  static const bool available = has_bf16_products(cpu_features()) && dnnl::available() &&
                                !dnnl::kernel(dnnl::Type::bf16, dnnl::Type::f32).empty();
  return available;
}

std::string bf16_products_unavailable_reason() {
  if (!has_bf16_products(cpu_features())) {
    return "this CPU has no bf16 dot products (AVX512_BF16 or AMX); it has " +
           cpu_features().flags();
  }
  if (!dnnl::available()) return "this build has no oneDNN (libdnnl-dev)";
  return dnnl::version() + " has no bf16 matrix-product kernel for this CPU";
}

namespace {

constexpr int64_t kBlockRows = 128;  // rows per product of the symmetric ones (block rows)

// C = A·B for 2-D bf16 A and B (any strides), accumulated in fp32, as `out`.
at::Tensor product(const at::Tensor& A, const at::Tensor& B, at::ScalarType out,
                   Bf16Products products) {
  if (products == Bf16Products::emulated) return at::mm(A.to(at::kFloat), B.to(at::kFloat)).to(out);
  auto C = at::empty({A.size(0), B.size(1)}, A.options().dtype(out));
  dnnl::matmul(A.size(0), B.size(1), A.size(1), dnnl::Type::bf16,
               {A.data_ptr(), A.stride(0), A.stride(1)}, {B.data_ptr(), B.stride(0), B.stride(1)},
               out == at::kBFloat16 ? dnnl::Type::bf16 : dnnl::Type::f32, C.data_ptr(), C.stride(0),
               C.stride(1));
  return C;
}

// A·B (fp32) for bf16 A, B whose product is symmetric, computing only the blocks of rows on and
// above the diagonal (about half the FLOPs), mirrored into a full matrix.
at::Tensor symmetric_product(const at::Tensor& A, const at::Tensor& B, Bf16Products products) {
  const int64_t k = A.size(0);
  auto C = at::zeros({k, k}, A.options().dtype(at::kFloat));
  for (int64_t i0 = 0; i0 < k; i0 += kBlockRows) {
    const int64_t rows = std::min(kBlockRows, k - i0);
    C.narrow(0, i0, rows)
        .narrow(1, i0, k - i0)
        .copy_(product(A.narrow(0, i0, rows), B.narrow(1, i0, k - i0), at::kFloat, products));
  }
  return C.triu() + C.triu(1).t();
}

at::Tensor bf16(const at::Tensor& t) {
  return t.to(at::kBFloat16);
}

// Q = a·I + b·A + c·A² for the fp32 symmetric A; `symmetric` computes A² by block rows.
at::Tensor polynomial(const at::Tensor& A, const Coefficients& abc, bool symmetric,
                      Bf16Products products) {
  const auto A16 = bf16(A);
  const auto A2 =
      symmetric ? symmetric_product(A16, A16, products) : product(A16, A16, at::kFloat, products);
  auto Q = A * abc[1] + A2 * abc[2];
  Q.diagonal().add_(abc[0]);
  return Q;
}

// W·Wᵀ (fp32) for the k×m bf16 W.
at::Tensor gram(const at::Tensor& W, bool symmetric, Bf16Products products) {
  return symmetric ? symmetric_product(W, W.t(), products)
                   : product(W, W.t(), at::kFloat, products);
}

// W (k×m) is kept in fp32 between iterations and rounded to bf16 once per iteration as the
// operand of its products: the products' inputs are bf16, nothing else is.

// Keller Jordan's chain with fp32 sums: A = W·Wᵀ, B = b·A + c·A², W ← a·W + B·W.
at::Tensor plain_one(at::Tensor W, const CoefficientTable& table, int64_t steps,
                     Bf16Products products) {
  for (int64_t t = 0; t < steps; ++t) {
    const auto& abc = table.row(t);
    const auto W16 = bf16(W);
    const auto A = gram(W16, false, products);
    const auto A16 = bf16(A);
    const auto B = A * abc[1] + product(A16, A16, at::kFloat, products) * abc[2];
    W = product(bf16(B), W16, at::kFloat, products).add_(W, abc[0]);
  }
  return W;
}

// The symmetric method: A and A² by block rows; a·W is added in fp32 rather than folded into the
// polynomial's diagonal, where bf16 would round a (≈ 3.4) to 2⁻⁸ of itself.
at::Tensor symmetric_one(at::Tensor W, const CoefficientTable& table, int64_t steps,
                         Bf16Products products) {
  for (int64_t t = 0; t < steps; ++t) {
    const auto& abc = table.row(t);
    const auto W16 = bf16(W);
    const auto B = polynomial(gram(W16, true, products), {0.0, abc[1], abc[2]}, true, products);
    W = product(bf16(B), W16, at::kFloat, products).add_(W, abc[0]);
  }
  return W;
}

// Gram Newton–Schulz as the fp32 method does it (newton_schulz_blas.cpp): R = ∏Q_t, A ← A·Q²,
// W and A formed afresh at each restart, W_T = R·W.
at::Tensor gram_one(at::Tensor W, const CoefficientTable& table, int64_t steps,
                    const std::vector<int64_t>& restarts, Bf16Products products) {
  auto A = gram(bf16(W), true, products);
  at::Tensor R;  // undefined: the identity
  for (int64_t t = 0; t < steps; ++t) {
    const auto Q = polynomial(A, table.row(t), true, products);
    const auto Q16 = bf16(Q);
    R = R.defined() ? symmetric_product(bf16(R), Q16, products) : Q;
    const int64_t done = t + 1;
    if (done == steps) break;
    if (std::binary_search(restarts.begin(), restarts.end(), done)) {
      W = product(bf16(R), bf16(W), at::kFloat, products);
      A = gram(bf16(W), true, products);
      R = at::Tensor();
      continue;
    }
    A = symmetric_product(bf16(A), bf16(symmetric_product(Q16, Q16, products)), products);
  }
  return product(bf16(R), bf16(W), at::kFloat, products);
}

}  // namespace

at::Tensor bf16_iterations(const at::Tensor& X, NsMethod method, const CoefficientTable& table,
                           int64_t steps, const std::vector<int64_t>& restarts,
                           Bf16Products products) {
  check(products == Bf16Products::emulated || bf16_products_available(),
        "orthogonalize: bfloat16 on CPU runs on bf16 dot products, and ",
        bf16_products_unavailable_reason());
  check(method == NsMethod::plain || method == NsMethod::symmetric || method == NsMethod::gram,
        "bf16_iterations: a resolved method, not '", to_string(method), "'");
  const bool tall = X.size(1) > X.size(2);
  auto out = at::empty_like(X);
  for (int64_t i = 0; i < X.size(0); ++i) {
    // Each matrix on its smaller side, k×m with k ≤ m.
    const auto W = (tall ? X[i].t() : X[i]).contiguous();
    at::Tensor result;
    if (method == NsMethod::plain) {
      result = plain_one(W, table, steps, products);
    } else if (method == NsMethod::symmetric) {
      result = symmetric_one(W, table, steps, products);
    } else {
      result = gram_one(W, table, steps, restarts, products);
    }
    out[i].copy_(tall ? result.t() : result);
  }
  return out;
}

}  // namespace muon::detail
