// Internal: work spread over LibTorch's threads as "lanes" (docs/algorithms.md §Lanes). Each
// thread takes whole items, the next free one at a time, and runs each alone — its own loops and
// products serial inside it — so the threads meet at one barrier when everything is done, not at
// one per item: a thread that shares its core with a busy process takes fewer items instead of
// holding the others up.
#pragma once

#include <cstdint>
#include <functional>

namespace muon::detail {

// The threads lanes would run on: LibTorch's intra-op thread count, 1 inside a parallel region
// (where everything runs serially).
int64_t lane_threads();

// The items of n that run in lanes on `threads` threads: whole rounds, one item per thread each
// (0 with one thread). The caller runs the rest with its work split between the threads.
int64_t items_in_lanes(int64_t n, int64_t threads);

// Runs work(item, lane) for every item in [0, n) on `threads` threads (lane: 0 … threads − 1, the
// one running it), under the caller's grad and inference mode. The first exception is rethrown
// after the lanes stop; items not yet started are skipped then.
void for_each_in_lanes(int64_t n, int64_t threads,
                       const std::function<void(int64_t item, int64_t lane)>& work);

}  // namespace muon::detail
