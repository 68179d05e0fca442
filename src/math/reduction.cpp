#include "muon/reduction.h"

#include <ATen/WrapDimUtils.h>

#include <vector>

namespace muon {
namespace {

// x with the reduced dims last, flattened: (outputs, elements per output), and the outputs' shape.
struct Outputs {
  at::Tensor rows;
  std::vector<int64_t> shape;
};

Outputs outputs_of(const at::Tensor& x, at::IntArrayRef dims, bool keepdim) {
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), dims.empty());
  for (const auto d : dims) reduced[static_cast<size_t>(at::maybe_wrap_dim(d, x.dim()))] = true;
  std::vector<int64_t> order, shape;
  int64_t outputs = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[static_cast<size_t>(d)]) {
      if (keepdim) shape.push_back(1);
      continue;
    }
    order.push_back(d);
    shape.push_back(x.size(d));
    outputs *= x.size(d);
  }
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (reduced[static_cast<size_t>(d)]) order.push_back(d);
  }
  return {x.permute(order).reshape({outputs, -1}), shape};
}

// Σ along the last dim of the 2-D `values`, in fp64, in an order fixed by their count: blocks of
// kReductionBlock, each summed alone, then the blocks' sums the same way.
at::Tensor sum_in_order(at::Tensor values) {
  while (values.size(1) > kReductionBlock) {
    const int64_t n = values.size(1), full = n / kReductionBlock * kReductionBlock;
    const int64_t outputs = values.size(0);
    auto sums = values.narrow(1, 0, full)
                    .reshape({outputs, -1, kReductionBlock})
                    .sum(2, false, at::kDouble);
    if (full < n) {
      sums = at::cat({sums, values.narrow(1, full, n - full).sum(1, true, at::kDouble)}, 1);
    }
    values = sums;
  }
  return values.sum(1, false, at::kDouble);
}

// reduce(part, dim) of each output's blocks of kReductionBlock elements (the last one shorter):
// (outputs, blocks).
template <class Reduce>
at::Tensor per_block(const at::Tensor& rows, Reduce reduce) {
  const int64_t n = rows.size(1), full = n / kReductionBlock * kReductionBlock;
  auto parts = reduce(rows.narrow(1, 0, full).reshape({rows.size(0), -1, kReductionBlock}), 2);
  if (full < n) parts = at::cat({parts, reduce(rows.narrow(1, full, n - full), 1).unsqueeze(1)}, 1);
  return parts;
}

bool on_cpu_and_long(const at::Tensor& x, at::IntArrayRef dims) {
  if (!x.device().is_cpu()) return false;
  int64_t n = 1;
  if (dims.empty()) {
    n = x.numel();
  } else {
    for (const auto d : dims) n *= x.size(d);
  }
  return n > kReductionBlock;
}

}  // namespace

at::Tensor sum_of_squares(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
                          at::ScalarType dtype) {
  if (!on_cpu_and_long(x, dims)) {
    return dims.empty() ? x.square().sum(dtype) : at::sum(x.square(), dims, keepdim, dtype);
  }
  const auto out = outputs_of(x, dims, keepdim);
  const auto squares = per_block(out.rows, [&](const at::Tensor& part, int64_t dim) {
    return at::sum(part.square(), {dim}, false, at::kDouble);
  });
  return sum_in_order(squares).to(dtype).reshape(out.shape);
}

at::Tensor vector_norm(const at::Tensor& x, at::IntArrayRef dims, bool keepdim,
                       at::ScalarType dtype) {
  if (!on_cpu_and_long(x, dims)) return at::linalg_vector_norm(x, 2, dims, keepdim, dtype);
  const auto out = outputs_of(x, dims, keepdim);
  const auto norms = per_block(out.rows, [&](const at::Tensor& part, int64_t dim) {
    return at::linalg_vector_norm(part, 2, at::IntArrayRef{dim}, false, dtype);
  });
  return sum_in_order(norms.to(at::kDouble).square()).sqrt().to(dtype).reshape(out.shape);
}

}  // namespace muon
