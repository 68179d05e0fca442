#include "system/memory.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "muon/error.h"

namespace muon::cli {

namespace {

const char* limit_override() {
  return std::getenv("MUON_MEMORY_LIMIT");
}

}  // namespace

double memory_limit_bytes() {
  if (const char* gib = limit_override()) return std::strtod(gib, nullptr) * 1073741824.0;
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

void check_memory_need(double bytes, const std::string& what, const std::string& detail,
                       const std::string& smaller) {
  const double limit = memory_limit_bytes();
  if (bytes <= limit) return;
  const bool overridden = limit_override() != nullptr;
  char text[128];
  std::snprintf(text, sizeof text, " needs about %.3g GiB (", bytes / 1073741824.0);
  char available[64];
  std::snprintf(available, sizeof available, "), more than the %.3g GiB ", limit / 1073741824.0);
  throw Error(what + text + detail + available +
              (overridden ? "MUON_MEMORY_LIMIT allows" : "this machine has") + "; make " + smaller +
              " smaller" + (overridden ? "" : " (or set MUON_MEMORY_LIMIT=GiB to try anyway)"));
}

}  // namespace muon::cli
