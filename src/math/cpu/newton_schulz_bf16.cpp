#include "muon/internal/newton_schulz_bf16.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "bf16_rounding.h"
#include "muon/error.h"
#include "muon/internal/blas.h"
#include "muon/internal/dnnl.h"
#include "transpose_bf16.h"
#include "upper_blocks.h"

namespace muon::detail {

namespace {

// C ← A·B + beta·C for 2-D bf16 A, B and an fp32 or bf16 C (C not read when beta is 0): one
// oneDNN product with bf16 operands and fp32 sums, rounded to nearest even for a bf16 C, or its
// emulation. A and B may be strided views; C's rows must be dense (oneDNN 2.x otherwise leaves
// its brgemm kernels for a GEMM that also fails to run beside PyPI's torch).
void product_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                  Bf16Products products, double beta = 0) {
  if (products == Bf16Products::emulated) {
    // On the fp32 products' library (blas::gemm_rows), in parts of kColumnsPerCall of C's
    // columns dealt to the threads, each part one call on one thread: the same calls on any count
    // (LibTorch's at::mm on MKL, called from the threads, gave some parts other bits at times).
    const auto a = A.to(at::kFloat).contiguous(), b = B.to(at::kFloat).contiguous();
    const int64_t rows = C.size(0), columns = C.size(1), inner = A.size(1);
    for_each_column_part(columns, [&](int64_t j0, int64_t width) {
      auto AB = at::empty({rows, width}, a.options());
      blas::gemm_rows(static_cast<int>(rows), static_cast<int>(width), static_cast<int>(inner),
                      a.data_ptr<float>(), inner, b.data_ptr<float>() + j0, columns,
                      AB.data_ptr<float>(), width);
      auto c = C.narrow(1, j0, width);
      if (beta == 0) {
        c.copy_(AB);
      } else {
        c.mul_(beta).add_(AB);
      }
    });
    return;
  }
  const auto out = C.scalar_type() == at::kBFloat16 ? dnnl::Type::bf16 : dnnl::Type::f32;
  dnnl::matmul(A.size(0), B.size(1), A.size(1), dnnl::Type::bf16,
               {A.data_ptr(), A.stride(0), A.stride(1)}, {B.data_ptr(), B.stride(0), B.stride(1)},
               out, C.data_ptr(), C.stride(0), C.stride(1), static_cast<float>(beta));
}

// C ← A·B rounded to bf16 for a bf16 C: a whole product (not a block of one), which runs on
// LibTorch's GEMM under Bf16Products::libtorch.
void whole_product_into(const at::Tensor& A, const at::Tensor& B, const at::Tensor& C,
                        Bf16Products products) {
  if (products != Bf16Products::libtorch) {
    product_into(A, B, C, products);
    return;
  }
  auto out = C;  // at::mm_out takes a non-const reference; it writes C's elements in place
  at::mm_out(out, A, B);
  check(out.data_ptr() == C.data_ptr(), "bf16 Newton–Schulz: LibTorch's at::mm_out gave its ",
        A.size(0), "x", B.size(1), " bf16 result new memory instead of the workspace's");
}

// The upper triangle of a symmetric k×k fp32 or bf16 matrix as its blocks of kBf16BlockRows rows:
// the block at row i0 holds rows i0 .. i0 + r and columns i0 .. k densely — what one product
// writes (oneDNN 2.6 runs its brgemm kernels only on a result whose rows are that dense).
template <class T>
struct UpperBlocks {
  at::Tensor data;  // 1-D, elements(k) long
  int64_t k;
  const T* base = data.data_ptr<T>();  // read per element: not looked up each time

  static int64_t offset(int64_t i0, int64_t k) {  // where the block at row i0 starts
    const int64_t before = i0 / kBf16BlockRows;
    return kBf16BlockRows * (before * k - kBf16BlockRows * before * (before - 1) / 2);
  }
  static int64_t elements(int64_t k) {
    const int64_t last = (k - 1) / kBf16BlockRows * kBf16BlockRows;
    return offset(last, k) + (k - last) * (k - last);
  }
  at::Tensor block(int64_t i0) const {
    const int64_t rows = std::min(kBf16BlockRows, k - i0);
    return data.narrow(0, offset(i0, k), rows * (k - i0)).view({rows, k - i0});
  }
  // Row i indexed by column: row(i)[j] is element (i, j) for j ≥ i.
  const T* row(int64_t i) const {
    const int64_t i0 = i / kBf16BlockRows * kBf16BlockRows;
    return base + offset(i0, k) + (i - i0) * (k - i0) - i0;
  }
};

// C ← the upper triangle of A·Bᵀ for bf16 A and B (k×n each) whose product is symmetric — W·Wᵀ,
// or A·B for a symmetric B: one product per block of rows (for_each_upper_block), into
// C_block(i0), the block at row i0 (rows i0 .. i0 + kBf16BlockRows, columns i0 .. k). Bᵀ rather than
// B makes each block's right operand rows of B, read densely. The emulation splits each
// product's columns between the threads itself, so its blocks are not dealt to them.
template <class Block>
void upper_product_into(const at::Tensor& A, const at::Tensor& B, const Block& C_block,
                        Bf16Products products) {
  const int64_t k = A.size(0);
  for_each_upper_block(k, kBf16BlockRows, products != Bf16Products::emulated, [&](int64_t i0) {
    const int64_t rows = std::min(kBf16BlockRows, k - i0);
    product_into(A.narrow(0, i0, rows), B.narrow(0, i0, k - i0).t(), C_block(i0), products);
  });
}

template <class T>
void upper_product_into(const at::Tensor& A, const at::Tensor& B, const UpperBlocks<T>& C,
                        Bf16Products products) {
  upper_product_into(
      A, B, [&](int64_t i0) { return C.block(i0); }, products);
}

// Fills the symmetric k×k bf16 S from its upper triangle: row_values(i, j0, j1, out) writes the
// bf16 values (i, j0 .. j1) into out, for j0 ≥ i. By tiles
// of 32 rows × 256 columns through a local buffer, so that the reads and both writes run along
// rows: each row's 256 values are one run that the prefetchers follow (32×32 tiles left the reads
// waiting on memory), and writing a column of a power-of-two-wide matrix directly would hit one
// cache set. The threads take tile rows in pairs from both ends, so that each gets as much of the
// triangle.
constexpr int64_t kFillCols = 256;  // the columns of fill_symmetric's tiles: at most one row_values

template <class RowValues>
void fill_symmetric(const at::Tensor& S, RowValues row_values) {
  constexpr int64_t kRows = 32, kCols = kFillCols;
  const int64_t k = S.size(0), tile_rows = (k + kRows - 1) / kRows;
  auto* s = S.data_ptr<at::BFloat16>();
  const auto fill_tile_row = [&](int64_t i0) {
    const int64_t rows = std::min(kRows, k - i0);
    at::BFloat16 tile[kRows][kCols];
    for (int64_t j0 = i0; j0 < k; j0 += kCols) {
      const int64_t cols = std::min(kCols, k - j0);
      const bool diagonal = j0 == i0;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t from = diagonal ? i : 0;
        row_values(i0 + i, j0 + from, j0 + cols, tile[i] + from);
        std::copy(tile[i] + from, tile[i] + cols, s + (i0 + i) * k + j0 + from);
      }
      write_transposed(tile[0], kCols, rows, cols, diagonal, s + j0 * k + i0, k);
    }
  };
  at::parallel_for(0, (tile_rows + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      fill_tile_row(pair * kRows);
      const int64_t other = tile_rows - 1 - pair;
      if (other != pair) fill_tile_row(other * kRows);
    }
  });
}

// S ← A·B rounded to bf16, for bf16 A and B whose product is symmetric: its upper triangle by
// block rows, each rounded by its product, into C, then spread over S.
void symmetric_product(const at::Tensor& A, const at::Tensor& B, const UpperBlocks<at::BFloat16>& C,
                       const at::Tensor& S, Bf16Products products) {
  upper_product_into(A, B, C, products);
  fill_symmetric(S, [&](int64_t i, int64_t j0, int64_t j1, at::BFloat16* out) {
    const at::BFloat16* c = C.row(i);
    std::copy(c + j0, c + j1, out);
  });
}

// S ← a·I + b·A16 + c·P for the symmetric bf16 A16 and P = A16² (its upper triangle), summed in
// fp32 and rounded once. The polynomial takes A as rounded, the matrix its square was formed
// from: with the fp32 A in b·A it is no polynomial of one matrix, and the iterations' rounding
// error was twice as large (docs/algorithms.md).
void polynomial(const at::Tensor& S, const at::Tensor& A16, const UpperBlocks<float>& P,
                const Coefficients& abc) {
  const auto a = static_cast<float>(abc[0]), b = static_cast<float>(abc[1]),
             c = static_cast<float>(abc[2]);
  const int64_t k = A16.size(0);
  const auto* a16 = A16.data_ptr<at::BFloat16>();
  fill_symmetric(S, [&](int64_t i, int64_t j0, int64_t j1, at::BFloat16* out) {
    const at::BFloat16* ai = a16 + i * k;
    const float* pi = P.row(i);
    float values[kFillCols];
    for (int64_t j = j0; j < j1; ++j) values[j - j0] = b * static_cast<float>(ai[j]) + c * pi[j];
    if (j0 == i) values[0] += a;
    round_to_bf16(values, out, j1 - j0);
  });
}

// One matrix of the batch, seen on its smaller side k×m (k ≤ m): W is X, or Xᵀ when X is tall.
// X (rows×cols fp32) holds the iterate where a method adds a·W, and the result; W16 holds W
// rounded to bf16, k×m row-major either way: for the row blocks of W·Wᵀ with a transposed left
// operand oneDNN 2.6 has no bf16 brgemm kernel, and its fallback fails beside PyPI's torch.
struct Iterate {
  at::Tensor X, W16, spare;  // rows×cols fp32; k×m bf16 each
  bool tall;

  // The first iterate, G normalized: W16 ← G·scale rounded to bf16, and X ← G·scale where
  // `keep` (for the methods that add a·W to a product), in one pass over G.
  void start(const at::Tensor& G, double scale, bool keep) const {
    round_from(G, scale, keep ? X.data_ptr<float>() : nullptr);
  }
  // W16 ← X rounded to bf16: the operand of the products that follow.
  void round() const { round_from(X, 1.0, nullptr); }
  // W ← S·W for the symmetric k×k bf16 S, rounded to bf16 by the product itself (Gram's restart,
  // after which only W16 is read): into `spare`, which then trades places with W16. The k×m
  // layout serves a tall X as well as a wide one, with no transposed pass.
  void advance(const at::Tensor& S16, Bf16Products products) {
    whole_product_into(S16, W16, spare, products);
    std::swap(W16, spare);
  }
  // X ← R·W for the symmetric k×k bf16 R, Gram's result: summed into the fp32 X by the product,
  // or under Bf16Products::libtorch rounded to bf16 by LibTorch's product and widened into X.
  // Rounding the result adds 2⁻⁸ of it at most, far below the bf16 iterations' own distance from
  // the fp32 ones (docs/algorithms.md).
  void finish(const at::Tensor& R16, Bf16Products products) {
    if (products != Bf16Products::libtorch) {
      accumulate(R16, 0.0, products);
      return;
    }
    whole_product_into(R16, W16, spare, products);
    if (tall) {
      widen_transposed(spare, X);
    } else {
      X.copy_(spare);
    }
  }
  // X ← beta·X + S·W for the symmetric k×k bf16 S, summed into the fp32 X by the product itself;
  // a tall X as Xᵀ ← beta·Xᵀ + Wᵀ·S (S = Sᵀ), so that X's rows are the result's.
  void accumulate(const at::Tensor& S16, double beta, Bf16Products products) const {
    if (tall) {
      product_into(W16.t(), S16, X, products, beta);
    } else {
      product_into(S16, W16, X, products, beta);
    }
  }
  // A16 ← W·Wᵀ rounded to bf16, its upper triangle formed in C.
  void gram(const UpperBlocks<at::BFloat16>& C, const at::Tensor& A16,
            Bf16Products products) const {
    symmetric_product(W16, W16, C, A16, products);
  }

 private:
  void round_from(const at::Tensor& source, double scale, float* copy) const {
    if (tall) {
      round_transposed(source, scale, copy, W16);
      return;
    }
    const auto* x = source.data_ptr<float>();
    auto* w = W16.data_ptr<at::BFloat16>();
    at::parallel_for(0, source.numel(), 16384, [&](int64_t begin, int64_t end) {
      round_scaled_to_bf16(x + begin, scale, copy != nullptr ? copy + begin : nullptr, w + begin,
                           end - begin);
    });
  }
};

// The k×k matrices of one iteration: the fp32 upper triangle of A² (summed into the polynomial
// before it is rounded) and whole bf16 operands.
struct Squares {
  UpperBlocks<float> P;
  UpperBlocks<at::BFloat16> C;  // where the bf16 symmetric products form their upper triangles
  at::Tensor A16, Q16, R16, S16;
};

// The symmetric method: A = W·Wᵀ and A² by block rows, B = b·A + c·A² rounded once, and
// W ← a·W + B·W with a·W added to the fp32 W inside the product (the sum post-op). Where W is
// (nearly) rank-deficient, B vanishes on the missing directions and the fp32 a·W keeps them empty;
// with a on B's diagonal (a·I + B ≈ a·I there) the bf16 rounding of W would be amplified by a at
// every iteration (rank 8 of 192: 0.36 from the polar factor against 0.067).
void symmetric_one(const Iterate& w, const CoefficientTable& table, int64_t steps, Squares& sq,
                   Bf16Products products) {
  for (int64_t t = 0; t < steps; ++t) {
    const auto& [a, b, c] = table.row(t);
    if (t > 0) w.round();  // the first W16 is start()'s
    w.gram(sq.C, sq.A16, products);
    upper_product_into(sq.A16, sq.A16, sq.P, products);
    polynomial(sq.Q16, sq.A16, sq.P, {0.0, b, c});
    w.accumulate(sq.Q16, a, products);
  }
}

// Gram Newton–Schulz as the fp32 method runs it (newton_schulz_blas.cpp): R = ∏Q_t, A ← A·Q_t²,
// W and A formed afresh at each restart, W_T = R·W. All of R, Q_t and A are polynomials in the
// same Gram matrix, so every k×k product is symmetric and computed by block rows.
void gram_one(Iterate& w, const CoefficientTable& table, int64_t steps,
              const std::vector<int64_t>& restarts, Squares& sq, Bf16Products products) {
  w.gram(sq.C, sq.A16, products);
  bool fresh = true;  // R is the identity
  for (int64_t t = 0; t < steps; ++t) {
    upper_product_into(sq.A16, sq.A16, sq.P, products);
    polynomial(sq.Q16, sq.A16, sq.P, table.row(t));
    if (fresh) {  // R = Q_t: take the buffer rather than copy it
      std::swap(sq.R16, sq.Q16);
    } else {
      symmetric_product(sq.R16, sq.Q16, sq.C, sq.S16, products);
      std::swap(sq.R16, sq.S16);
    }
    const at::Tensor& q16 = fresh ? sq.R16 : sq.Q16;
    fresh = false;
    const int64_t done = t + 1;
    if (done == steps) break;
    if (std::binary_search(restarts.begin(), restarts.end(), done)) {
      w.advance(sq.R16, products);
      w.gram(sq.C, sq.A16, products);
      fresh = true;
      continue;
    }
    symmetric_product(q16, q16, sq.C, sq.S16, products);        // Q_t²
    symmetric_product(sq.A16, sq.S16, sq.C, sq.Q16, products);  // A·Q_t², into Q_t's buffer
    std::swap(sq.A16, sq.Q16);
  }
  w.finish(sq.R16, products);
}

// The plain method, every product whole: A = W·Wᵀ, B = b·A + c·A², W ← a·W + B·W — the
// symmetric method's arithmetic, in the products Keller Jordan's chain makes.
void plain_one(const Iterate& w, const CoefficientTable& table, int64_t steps,
               Bf16Products products) {
  const int64_t k = w.W16.size(0);
  auto A = at::empty({k, k}, w.X.options());
  auto P = at::empty({k, k}, w.X.options());
  for (int64_t t = 0; t < steps; ++t) {
    const auto& [a, b, c] = table.row(t);
    if (t > 0) w.round();  // the first W16 is start()'s
    product_into(w.W16, w.W16.t(), A, products);
    const auto A16 = A.to(at::kBFloat16);
    product_into(A16, A16, P, products);
    w.accumulate((A16.to(at::kFloat) * b + P * c).to(at::kBFloat16), a, products);
  }
}

}  // namespace

at::Tensor& bf16_iterations(const at::Tensor& G, at::Tensor& X, NsMethod method,
                            const CoefficientTable& table, int64_t steps,
                            const std::vector<int64_t>& restarts, OrthogonalizeWorkspace& ws,
                            Bf16Products products) {
  check(products == Bf16Products::emulated || bf16_products_available(),
        "bf16_iterations: bf16 products on oneDNN or LibTorch, and ",
        bf16_products_unavailable_reason(), "; emulate them");
  check(method == NsMethod::plain || method == NsMethod::symmetric || method == NsMethod::gram,
        "bf16_iterations: a resolved method, not '", to_string(method), "'");
  check(steps >= 1, "bf16_iterations: steps must be >= 1, got ", steps);
  const auto fits = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat && t.dim() == 3 && t.is_contiguous() &&
           t.sizes() == G.sizes();
  };
  check(fits(G) && fits(X),
        "bf16_iterations: contiguous (batch, rows, cols) float32 tensors of one shape, got ",
        G.sizes(), " and ", X.sizes());
  const int64_t rows = X.size(1), cols = X.size(2), k = std::min(rows, cols);
  const int64_t matrix = rows * cols, upper = UpperBlocks<float>::elements(k);
  // W16 and its spare, four k×k bf16 matrices and a bf16 upper triangle; an fp32 one.
  auto operands = ws.get(OrthogonalizeWorkspace::Slot::operands, {2 * matrix + 4 * k * k + upper},
                         X.options().dtype(at::kBFloat16));
  const auto k16 = operands.narrow(0, 2 * matrix, 4 * k * k).view({4, k, k});
  auto k32 = ws.get(OrthogonalizeWorkspace::Slot::squares, {upper}, X.options());
  Squares sq{{k32, k}, {operands.narrow(0, 2 * matrix + 4 * k * k, upper), k},
             k16[0],   k16[1],
             k16[2],   k16[3]};
  const auto operand = [&](int64_t which) {
    return operands.narrow(0, which * matrix, matrix).view({k, matrix / k});
  };
  for (int64_t i = 0; i < X.size(0); ++i) {
    Iterate w{X[i], operand(0), operand(1), rows > cols};
    // Normalized as orthogonalize() normalizes: G / (‖G‖_F·safety + eps), a zero matrix as it is.
    const auto g = G[i];
    const double denominator =
        std::sqrt(sum_of_squares(g.data_ptr<float>(), g.numel())) * table.safety + table.eps;
    w.start(g, denominator > 0 ? 1.0 / denominator : 1.0, method != NsMethod::gram);
    if (method == NsMethod::plain) {
      plain_one(w, table, steps, products);
    } else if (method == NsMethod::symmetric) {
      symmetric_one(w, table, steps, sq, products);
    } else {
      gram_one(w, table, steps, restarts, sq, products);
    }
  }
  return X;
}

}  // namespace muon::detail
