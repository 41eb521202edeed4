// A self-contained SVG picture of a serving-benchmark report (from BuildReport): on the left
// the cumulative distributions of TTFT, TPOT, ITL and end-to-end latency on a log time axis;
// on the right a timeline with one bar per request, from its send time to its first token
// (waiting + prefill) and on to its last token (decode). Failed requests are drawn in red.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace peng::benchclient {

std::string RenderSvg(const nlohmann::json& report);

// Line charts side by side in one SVG (the monthly benchmark's plots: a number against the
// concurrency, one line per engine). The y axis starts at 0; a log2 x axis puts its ticks at
// the x values of the data (1, 4, 16 clients are evenly spaced).
struct LineSeries {
  std::string name;
  std::string color;  // any SVG color
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
};
struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;
  std::vector<LineSeries> series;
};
std::string RenderLineCharts(const std::string& title, const std::vector<LineChart>& charts);

}  // namespace peng::benchclient
