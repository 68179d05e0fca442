#include "muon/internal/lanes.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <atomic>

namespace muon::detail {

int64_t lane_threads() {
  return at::in_parallel_region() ? 1 : at::get_num_threads();
}

int64_t items_in_lanes(int64_t n, int64_t threads) {
  return threads > 1 ? n / threads * threads : 0;
}

void for_each_in_lanes(int64_t n, int64_t threads,
                       const std::function<void(int64_t item, int64_t lane)>& work) {
  std::atomic<int64_t> next{0};
  const at::ThreadLocalState caller;  // grad and inference mode: the pool's threads lack them
  // One chunk per lane (grain 1 over `threads` indices): at::parallel_for gives each of its
  // threads one, and rethrows the first exception once they are done.
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    const at::ThreadLocalStateGuard same_modes(caller);
    for (int64_t lane = begin; lane < end; ++lane) {
      for (int64_t item = next++; item < n; item = next++) {
        try {
          work(item, lane);
        } catch (...) {
          next = n;  // the other lanes start nothing more
          throw;
        }
      }
    }
  });
}

}  // namespace muon::detail
