#include "system/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace muon::cli {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int set_openblas_threads(int threads) {
  using Getter = int (*)();
  using Setter = void (*)(int);
  const auto get = reinterpret_cast<Getter>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  const auto set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (get == nullptr || set == nullptr) return 0;
  const int old = get();
  set(threads);
  return old;
}

int set_all_threads(int threads) {
  at::set_num_threads(threads);
  return set_openblas_threads(threads);
}

ThreadChoice train_threads(int requested) {
  if (requested > 0) return {requested, "--threads"};
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && *omp != '\0') {
    return {at::get_num_threads(), "OMP_NUM_THREADS"};
  }
  return {usable_cpus(), "every usable CPU"};
}

void sleep_idle_threads(int threads, const std::vector<std::string>& argv) {
  if (threads <= 1 || std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  std::vector<char*> pointers;
  for (const auto& a : argv) pointers.push_back(const_cast<char*>(a.c_str()));
  pointers.push_back(nullptr);
  ::execv("/proc/self/exe", pointers.data());  // returns only on failure: run on as we are
}

}  // namespace muon::cli
