// Skips that are skips. A test that cannot run here for want of hardware or of an optional
// dependency says what it needs with GTEST_SKIP() ("needs hardware: ..." / "needs software: ...",
// the forms python/tests/needs.py uses), so that CTest counts it as skipped and scripts/skips.py
// reports it — never a silent `return` counted as passed.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

#include "muon/internal/kernel_choice.h"
#include "muon/internal/newton_schulz_bf16.h"

namespace muon::testing {

// The words of /proc/cpuinfo's first line starting with `key` ("flags", "vendor_id"): the
// kernel's view of the CPU, independent of the library's own feature detection. Empty off Linux.
inline std::set<std::string> proc_cpuinfo(const std::string& key) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  }
  return {};
}

// Whether the CPU's feature bits promise bf16 dot products (AVX512_BF16 or AMX).
inline bool cpu_flags_promise_bf16_products() {
  const auto flags = proc_cpuinfo("flags");
  return flags.count("avx512_bf16") == 1 || flags.count("amx_bf16") == 1;
}

struct Need {
  bool fail = false;
  std::string why;  // empty: met
};

// bf16 products on CPU (not their emulation): met where the library runs them; a skip where the
// CPU's feature bits lack them (or ONEDNN_MAX_CPU_ISA takes them away) or the build has no oneDNN (MUON_TEST_HAVE_DNNL, from CMake's own decision); a failure
// where the bits promise them, the build links oneDNN, and the library still runs none.
inline Need bf16_products_need() {
  if (detail::bf16_products_available()) return {};
  const auto reason = detail::bf16_products_unavailable_reason();
  if (!cpu_flags_promise_bf16_products() || !detail::cpu_features().ceiling.empty()) {
    return {false, "needs hardware: bf16 dot products (AVX512_BF16 or AMX); " + reason};
  }
#if !MUON_TEST_HAVE_DNNL
  return {false, "needs software: oneDNN (libdnnl-dev); " + reason};
#else
  return {true, "the CPU's feature bits (/proc/cpuinfo) have bf16 dot products and the build "
                "links oneDNN, yet the library runs no bf16 products: " + reason};
#endif
}

}  // namespace muon::testing

// In a test body: fail or skip it (with the reason) unless bf16 products run here.
#define MUON_NEEDS_BF16_PRODUCTS()                                     \
  do {                                                                 \
    const auto muon_need_ = ::muon::testing::bf16_products_need();     \
    if (muon_need_.fail) FAIL() << muon_need_.why;                     \
    if (!muon_need_.why.empty()) GTEST_SKIP() << muon_need_.why;       \
  } while (0)
