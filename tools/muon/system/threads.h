// The threads of the CPU work: LibTorch's intra-op pool and OpenBLAS's (which LibTorch's GEMMs
// call and which ignores LibTorch's count), set together so that one pool runs at a time at one
// size; and muon train's default count.
#pragma once

#include <string>
#include <vector>

namespace muon::cli {

// The CPUs this process may run on (sched_getaffinity: a taskset or a container's cpuset), at
// least 1.
int usable_cpus();

// OpenBLAS's own thread count (0 when it is not loaded); returns the old one.
int set_openblas_threads(int threads);

// Sets the thread count of LibTorch's intra-op pool and of OpenBLAS, so that every library runs
// on the same number of threads. Returns OpenBLAS's previous count (0 when OpenBLAS is not the
// BLAS).
int set_all_threads(int threads);

struct ThreadChoice {
  int threads;
  std::string reason;  // "--threads", "OMP_NUM_THREADS", "every usable CPU"
};

// muon train's threads: --threads when given (`requested` > 0), else OMP_NUM_THREADS when set (the
// share --nproc gives each rank), else every CPU this process may use.
ThreadChoice train_threads(int requested);

// With more than one thread, OpenMP's idle threads must sleep rather than spin: spinning (libgomp's
// default), they take the cores that OpenBLAS's threads, the other OpenMP threads and any other
// process need, and two threads train slower than one (docs/benchmarks.md). libgomp reads
// OMP_WAIT_POLICY once, as it loads, so this sets it to passive and runs the program again with
// `argv` — unless it is set already, or there is one thread. Returns when it does not run again.
void sleep_idle_threads(int threads, const std::vector<std::string>& argv);

}  // namespace muon::cli
