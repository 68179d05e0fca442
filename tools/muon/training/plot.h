// A dependency-free SVG line chart for loss curves (loss.svg, compare.svg).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace muon::cli {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

// Lines with axes, ticks and a legend; empty series are skipped.
std::string svg_line_chart(const std::vector<Series>& series, const std::string& title,
                           const std::string& x_label, const std::string& y_label);

}  // namespace muon::cli
