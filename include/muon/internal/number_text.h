// Internal: numbers as text that reads back exactly.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace muon::detail {

// The shortest decimal text that reads back as `v` (0.65, not 0.65000000000000002).
inline std::string shortest_text(double v) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

}  // namespace muon::detail
