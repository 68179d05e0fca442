#include "training/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace muon::cli {

namespace {

constexpr double kWidth = 720, kHeight = 420;
constexpr double kLeft = 70, kRight = 170, kTop = 40, kBottom = 50;
const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

std::string number(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", v);
  return buffer;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string svg_line_chart(const std::vector<Series>& series, const std::string& title,
                           const std::string& x_label, const std::string& y_label) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series) {
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (!std::isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * plot_h; };

  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth << "' height='" << kHeight
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n<text x='"
      << kWidth / 2 << "' y='22' text-anchor='middle' font-size='15'>" << escape(title)
      << "</text>\n<rect x='" << kLeft << "' y='" << kTop << "' width='" << plot_w << "' height='"
      << plot_h << "' fill='none' stroke='#444'/>\n";
  for (int i = 0; i <= 5; ++i) {  // ticks and grid
    const double fx = x0 + (x1 - x0) * i / 5, fy = y0 + (y1 - y0) * i / 5;
    svg << "<line x1='" << px(fx) << "' y1='" << kTop << "' x2='" << px(fx) << "' y2='"
        << kTop + plot_h << "' stroke='#eee'/><text x='" << px(fx) << "' y='" << kTop + plot_h + 16
        << "' text-anchor='middle'>" << number(fx) << "</text>\n";
    svg << "<line x1='" << kLeft << "' y1='" << py(fy) << "' x2='" << kLeft + plot_w << "' y2='"
        << py(fy) << "' stroke='#eee'/><text x='" << kLeft - 6 << "' y='" << py(fy) + 4
        << "' text-anchor='end'>" << number(fy) << "</text>\n";
  }
  svg << "<text x='" << kLeft + plot_w / 2 << "' y='" << kHeight - 12 << "' text-anchor='middle'>"
      << escape(x_label) << "</text>\n<text x='16' y='" << kTop + plot_h / 2
      << "' text-anchor='middle' transform='rotate(-90 16 " << kTop + plot_h / 2 << ")'>"
      << escape(y_label) << "</text>\n";
  int index = 0;
  for (const auto& s : series) {
    if (s.points.empty()) continue;
    const char* color = kColors[index % 6];
    svg << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
    for (const auto& [x, y] : s.points) svg << px(x) << ',' << py(y) << ' ';
    svg << "'/>\n<line x1='" << kWidth - kRight + 15 << "' y1='" << kTop + 14 + 20 * index
        << "' x2='" << kWidth - kRight + 40 << "' y2='" << kTop + 14 + 20 * index << "' stroke='"
        << color << "' stroke-width='3'/><text x='" << kWidth - kRight + 46 << "' y='"
        << kTop + 18 + 20 * index << "'>" << escape(s.name) << "</text>\n";
    ++index;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace muon::cli
