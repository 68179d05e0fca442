// Internal: the upper triangle of a symmetric k×k product computed as row blocks, one GEMM each
// (oneDNN has no syrk; LibTorch exports MKL's public sgemm but not its gemmt or syrk). The bf16
// chain (newton_schulz_bf16.cpp) and the fp32 products on another sgemm (blas_sgemm.cpp) share
// the blocking; the bf16 chain deals its blocks to the threads here (for_each_upper_block), the
// sgemm cuts them further into calls of kColumnsPerCall columns and deals those.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "muon/internal/lanes.h"

namespace muon::detail {

// Rows per product when only the upper triangle of a symmetric product is wanted: smaller blocks
// skip more of the lower triangle (128 rows compute 58% of a 768² product, 192 compute 62.5%, 256
// compute 67%), larger ones give the kernels longer panels and fewer right operands to pack. On
// a CPU with AMX, bf16 products (oneDNN's brgemm) ran 3-5% faster at 192 rows than at 128 or 256
// (192 also splits the usual width 768 into four blocks that two threads share evenly); fp32 ones
// (oneDNN's sgemm) 5-6% faster at 128 than at 192 for k = 1024 (docs/benchmarks.md).
constexpr int64_t kBf16BlockRows = 192;
constexpr int64_t kFp32BlockRows = 128;

// The columns of one call where a product on oneDNN's or MKL's sgemm, or the bf16 products'
// emulation on LibTorch's GEMM, is cut into calls (each on one thread): cuts at fixed multiples
// of this, whatever the thread count, make the same calls on any — single-threaded MKL 2024.2
// summed a 64-column part of a 1024³ product otherwise than the whole product in 55112 entries
// (docs/algorithms.md §Same bits at any thread count).
constexpr int64_t kColumnsPerCall = 512;

// Runs part(first, count) for the parts of `columns` columns cut at multiples of kColumnsPerCall,
// dealt to the threads one at a time (lanes): the same calls on any thread count.
template <class Part>
void for_each_column_part(int64_t columns, const Part& part) {
  const int64_t parts = (columns + kColumnsPerCall - 1) / kColumnsPerCall;
  for_each_in_lanes(parts, std::max<int64_t>(1, lane_threads()), [&](int64_t index, int64_t) {
    const int64_t first = index * kColumnsPerCall;
    part(first, std::min(kColumnsPerCall, columns - first));
  });
}

// The elements the block of `rows` rows at row i0 of a k×k upper triangle computes, its diagonal
// block whole.
inline int64_t block_elements(int64_t k, int64_t rows, int64_t i0) {
  return std::min(rows, k - i0) * (k - i0);
}

// The elements all the blocks of `rows` rows of a k×k upper triangle compute.
inline int64_t upper_block_elements(int64_t k, int64_t rows) {
  int64_t elements = 0;
  for (int64_t i0 = 0; i0 < k; i0 += rows) elements += block_elements(k, rows, i0);
  return elements;
}

// The row blocks of a k×k upper triangle (their first rows) dealt to `threads` threads so that
// each computes about as many elements: the largest block first, each to the least loaded thread.
inline std::vector<std::vector<int64_t>> deal_blocks(int64_t k, int64_t rows, int64_t threads) {
  std::vector<std::vector<int64_t>> dealt(static_cast<size_t>(std::max<int64_t>(threads, 1)));
  std::vector<int64_t> load(dealt.size(), 0);
  for (int64_t i0 = 0; i0 < k; i0 += rows) {  // widest (first) blocks first
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    dealt[least].push_back(i0);
    load[least] += block_elements(k, rows, i0);
  }
  return dealt;
}

// Runs block(i0) for the first row i0 of every block of `rows` rows of a k×k upper triangle; the
// block's product computes rows i0 .. i0 + rows and columns i0 .. k, its diagonal block whole.
//
// With at least two blocks per thread (and `deal`) the blocks are dealt to the threads, each
// running its blocks' products on its own core in one parallel region: a product per block
// spread over every thread paid a fork, a join and an uneven tail per block, which on a CPU with
// AMX cost as much as the smaller blocks' arithmetic. With fewer, dealt blocks would leave cores
// idle (and each thread's oneDNN scratchpad is sized for every thread), so the blocks run in
// order, each product spread over all of them.
template <class Block>
void for_each_upper_block(int64_t k, int64_t rows, bool deal, Block block) {
  const int64_t threads = at::get_num_threads();
  const int64_t blocks = (k + rows - 1) / rows;
  if (!deal || blocks < 2 * threads) {
    for (int64_t i0 = 0; i0 < k; i0 += rows) block(i0);
    return;
  }
  const auto dealt = deal_blocks(k, rows, threads);
  at::parallel_for(0, static_cast<int64_t>(dealt.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (const int64_t i0 : dealt[t]) block(i0);
    }
  });
}

}  // namespace muon::detail
