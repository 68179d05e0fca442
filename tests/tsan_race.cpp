// A deliberate data race, for the ThreadSanitizer stage (scripts/tsan.sh; docs/robustness.md,
// "Race detector"): the threads of an at::parallel_for increment one shared counter that is not
// atomic. Built only with MUON_TSAN, never part of the library. The stage fails unless
// ThreadSanitizer reports this race, so a clean run of the real tests means something: that the
// sanitizer, the OpenMP runtime and Archer see the threads the library's parallel regions run on.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <omp.h>

#include <cstdio>

namespace {
long counter = 0;  // shared, not atomic: the race
}

int main() {
  at::set_num_threads(2);
  int team = 0;
  at::parallel_for(0, 1 << 16, 1, [&](int64_t begin, int64_t end) {
    if (omp_get_thread_num() == 0) team = omp_get_num_threads();  // thread 0 only: no race here
    for (int64_t i = begin; i < end; ++i) ++counter;
  });
  // The runtime LibTorch's own parallel regions call (GOMP_parallel, resolved as the loader does
  // for libtorch_cpu): libomp, the same as ours, when the build put it first.
  Dl_info gomp{};
  void* entry = dlvsym(RTLD_DEFAULT, "GOMP_parallel", "GOMP_4.0");
  if (!entry || !dladdr(entry, &gomp)) gomp.dli_fname = "(none)";
  std::printf("tsan_race: at::parallel_for ran on %d OpenMP threads; counter %ld; "
              "GOMP_parallel from %s\n", team, counter, gomp.dli_fname);
  return team >= 2 ? 0 : 3;  // one thread makes no race: the stage's check fails
}
