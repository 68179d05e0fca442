// Internal to the composition layer: aligned plain-text tables for reports.
#pragma once

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace muon::detail {

// Columns padded to their widest cell, two spaces apart; no trailing spaces.
inline std::string format_table(const std::vector<std::string>& header,
                                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out << line << '\n';
  };
  print(header);
  for (const auto& row : rows) print(row);
  return out.str();
}

}  // namespace muon::detail
