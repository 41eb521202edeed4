#include "benchclient/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <vector>

namespace peng::benchclient {
namespace {

using Json = nlohmann::json;

constexpr double kWidth = 1100, kHeight = 470;
constexpr double kTop = 60, kBottom = 400;  // plot area, y
struct Panel {
  double left, right;
};
constexpr Panel kCdfPanel{70, 520}, kTimelinePanel{620, 1070};

struct Series {
  const char* name;
  const char* color;
  std::vector<double> ms;
};

std::string Fmt(const char* fmt, double a) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, a);
  return b;
}

std::string Text(double x, double y, const std::string& s, const char* anchor = "middle",
                 int size = 12) {
  return "<text x=\"" + Fmt("%.1f", x) + "\" y=\"" + Fmt("%.1f", y) + "\" font-size=\"" +
         std::to_string(size) + "\" text-anchor=\"" + anchor + "\">" + s + "</text>\n";
}

std::string Line(double x1, double y1, double x2, double y2, const char* style) {
  return "<line x1=\"" + Fmt("%.1f", x1) + "\" y1=\"" + Fmt("%.1f", y1) + "\" x2=\"" +
         Fmt("%.1f", x2) + "\" y2=\"" + Fmt("%.1f", y2) + "\" style=\"" + style + "\"/>\n";
}

std::string MsLabel(double ms) {
  if (ms >= 1000) return Fmt("%.3g s", ms / 1000);
  return Fmt("%.3g ms", ms);
}

// Log-scale ticks at 1, 2, 5 x 10^k within [lo, hi] (only 1 x 10^k when that gives many).
std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> all, decades;
  for (int k = static_cast<int>(std::floor(std::log10(lo))); k <= std::ceil(std::log10(hi)); ++k)
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, k);
      if (v < lo * 0.999 || v > hi * 1.001) continue;
      all.push_back(v);
      if (m == 1.0) decades.push_back(v);
    }
  return all.size() > 9 && decades.size() >= 2 ? decades : all;
}

std::string CdfPanel(const std::vector<Series>& series) {
  std::string s;
  const Panel p = kCdfPanel;
  double lo = INFINITY, hi = 0;
  for (const Series& se : series)
    for (double v : se.ms)
      if (v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  s += Text((p.left + p.right) / 2, kTop - 20, "Latency CDFs", "middle", 15);
  s += Line(p.left, kBottom, p.right, kBottom, "stroke:#333");
  s += Line(p.left, kTop, p.left, kBottom, "stroke:#333");
  for (int i = 0; i <= 4; ++i) {
    const double y = kBottom - (kBottom - kTop) * i / 4.0;
    s += Line(p.left, y, p.right, y, "stroke:#ddd");
    s += Text(p.left - 6, y + 4, Fmt("%.2f", i / 4.0), "end", 11);
  }
  s += Text(p.left - 48, (kTop + kBottom) / 2, "fraction of samples", "middle", 12)
           .insert(6, Fmt("transform=\"rotate(-90 %.1f ", p.left - 48) +
                          Fmt("%.1f)\" ", (kTop + kBottom) / 2));
  if (hi <= 0) return s + Text((p.left + p.right) / 2, (kTop + kBottom) / 2, "no data");
  lo = std::pow(10.0, std::floor(std::log10(lo)));
  hi = std::pow(10.0, std::ceil(std::log10(hi)));
  if (hi <= lo) hi = lo * 10;
  auto x_of = [&](double v) {
    return p.left + (p.right - p.left) * (std::log10(std::max(v, lo)) - std::log10(lo)) /
                        (std::log10(hi) - std::log10(lo));
  };
  for (double t : LogTicks(lo, hi)) {
    s += Line(x_of(t), kTop, x_of(t), kBottom, "stroke:#eee");
    s += Text(x_of(t), kBottom + 16, MsLabel(t), "middle", 11);
  }
  s += Text((p.left + p.right) / 2, kBottom + 36, "latency (log scale)");
  double legend_x = p.left - 40;  // one row under the axis label
  const double legend_y = kBottom + 56;
  for (const Series& se : series) {
    std::vector<double> v = se.ms;
    std::sort(v.begin(), v.end());
    if (v.empty()) continue;
    std::string pts;
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = x_of(v[i]);
      pts += Fmt("%.1f,", x) + Fmt("%.1f ", kBottom - (kBottom - kTop) * i / v.size());
      pts += Fmt("%.1f,", x) + Fmt("%.1f ", kBottom - (kBottom - kTop) * (i + 1) / v.size());
    }
    s += std::string("<polyline fill=\"none\" stroke=\"") + se.color +
         "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    s += Line(legend_x, legend_y - 4, legend_x + 16, legend_y - 4,
              (std::string("stroke-width:3;stroke:") + se.color).c_str());
    s += Text(legend_x + 20, legend_y, std::string(se.name) + " p50 " + MsLabel(v[v.size() / 2]),
              "start", 11);
    legend_x += 125;
  }
  return s;
}

std::string TimelinePanel(const Json& requests) {
  std::string s;
  const Panel p = kTimelinePanel;
  const size_t n = requests.size();
  double t_end = 0;
  for (const Json& r : requests)
    t_end = std::max(t_end, r["start_s"].get<double>() + r["e2e_ms"].get<double>() / 1e3);
  if (t_end <= 0) t_end = 1;
  s += Text((p.left + p.right) / 2, kTop - 20, "Requests over time", "middle", 15);
  s += Line(p.left, kBottom, p.right, kBottom, "stroke:#333");
  s += Line(p.left, kTop, p.left, kBottom, "stroke:#333");
  auto x_of = [&](double t) { return p.left + (p.right - p.left) * t / t_end; };
  for (int i = 0; i <= 5; ++i) {
    const double t = t_end * i / 5.0;
    s += Line(x_of(t), kTop, x_of(t), kBottom, "stroke:#eee");
    s += Text(x_of(t), kBottom + 16, Fmt("%.3g", t), "middle", 11);
  }
  s += Text((p.left + p.right) / 2, kBottom + 36, "time since start (s)");
  s += Text(p.left - 8, kTop + 4, "#0", "end", 11);
  std::string last_label = "#";
  last_label += std::to_string(n > 0 ? n - 1 : 0);
  s += Text(p.left - 8, kBottom, last_label, "end", 11);
  const double h = (kBottom - kTop) / std::max<size_t>(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const Json& r = requests[i];
    const double t0 = r["start_s"].get<double>();
    const double t1 = t0 + r["ttft_ms"].get<double>() / 1e3;
    const double t2 = t0 + r["e2e_ms"].get<double>() / 1e3;
    const double y = kTop + h * i, bh = std::max(h * 0.8, 0.5);
    auto rect = [&](double a, double b, const char* color) {
      return "<rect x=\"" + Fmt("%.2f", x_of(a)) + "\" y=\"" + Fmt("%.2f", y) + "\" width=\"" +
             Fmt("%.2f", std::max(x_of(b) - x_of(a), 0.5)) + "\" height=\"" + Fmt("%.2f", bh) +
             "\" fill=\"" + color + "\"/>\n";
    };
    if (!r["ok"].get<bool>()) {
      s += rect(t0, t2, "#d62728");
      continue;
    }
    s += rect(t0, t1, "#ff9f1c");
    s += rect(t1, t2, "#1f77b4");
  }
  const double ly = kBottom + 56;
  s += "<rect x=\"" + Fmt("%.1f", p.left) + "\" y=\"" + Fmt("%.1f", ly - 9) +
       "\" width=\"12\" height=\"10\" fill=\"#ff9f1c\"/>\n";
  s += Text(p.left + 16, ly, "send to first token", "start", 11);
  s += "<rect x=\"" + Fmt("%.1f", p.left + 150) + "\" y=\"" + Fmt("%.1f", ly - 9) +
       "\" width=\"12\" height=\"10\" fill=\"#1f77b4\"/>\n";
  s += Text(p.left + 166, ly, "first to last token", "start", 11);
  s += "<rect x=\"" + Fmt("%.1f", p.left + 300) + "\" y=\"" + Fmt("%.1f", ly - 9) +
       "\" width=\"12\" height=\"10\" fill=\"#d62728\"/>\n";
  s += Text(p.left + 316, ly, "failed", "start", 11);
  return s;
}

std::string Escape(const std::string& in) {
  std::string out;
  for (char c : in) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string RenderSvg(const Json& report) {
  std::vector<Series> series = {{"TTFT", "#ff7f0e", {}},
                                {"TPOT", "#2ca02c", {}},
                                {"ITL", "#9467bd", {}},
                                {"E2E", "#1f77b4", {}}};
  for (const Json& r : report["requests"]) {
    if (!r["ok"].get<bool>()) continue;
    const double ttft = r["ttft_ms"], e2e = r["e2e_ms"];
    const int64_t out = r["output_tokens"];
    series[0].ms.push_back(ttft);
    if (out > 1) series[1].ms.push_back((e2e - ttft) / static_cast<double>(out - 1));
    for (const Json& g : r["itl_ms"]) series[2].ms.push_back(g);
    series[3].ms.push_back(e2e);
  }
  const Json& c = report["config"];
  const Json& sum = report["summary"];
  std::string title = "peng bench serve: " + c["model"].get<std::string>() + ", " +
                      std::to_string(c["num_prompts"].get<int>()) + " requests, rate " +
                      (c["request_rate"].is_string() ? c["request_rate"].get<std::string>()
                                                     : Fmt("%g", c["request_rate"])) +
                      " req/s, in " + std::to_string(c["input_len"].get<int>()) + " / out " +
                      std::to_string(c["output_len"].get<int>()) + " tokens; " +
                      Fmt("%.1f", sum["output_throughput"].get<double>()) + " output tok/s";
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Fmt("%.0f", kWidth) +
                  "\" height=\"" + Fmt("%.0f", kHeight) +
                  "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
                  "fill=\"white\"/>\n";
  s += Text(kWidth / 2, 20, Escape(title), "middle", 13);
  s += CdfPanel(series);
  s += TimelinePanel(report["requests"]);
  return s + "</svg>\n";
}

namespace {

constexpr double kChartWidth = 540, kChartHeight = 410;

// The step of about `target` ticks between 0 and `max`: 1, 2 or 5 x 10^k.
double NiceStep(double max, int target) {
  const double raw = max / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string ChartPanel(const LineChart& c, double x0) {
  const double left = x0 + 75, right = x0 + kChartWidth - 25, top = 70, bottom = 330;
  std::string s = Text((left + right) / 2, top - 20, Escape(c.title), "middle", 15);
  s += Line(left, bottom, right, bottom, "stroke:#333");
  s += Line(left, top, left, bottom, "stroke:#333");
  s += Text((left + right) / 2, bottom + 36, Escape(c.x_label));
  s += Text(left - 55, (top + bottom) / 2, Escape(c.y_label), "middle", 12)
           .insert(6, Fmt("transform=\"rotate(-90 %.1f ", left - 55) +
                          Fmt("%.1f)\" ", (top + bottom) / 2));
  std::set<double> xs;
  double y_max = 0;
  for (const LineSeries& se : c.series)
    for (const auto& [x, y] : se.points) {
      if (c.log2_x && !(x > 0)) continue;
      xs.insert(x);
      y_max = std::max(y_max, y);
    }
  if (xs.empty()) return s + Text((left + right) / 2, (top + bottom) / 2, "no data");
  auto tx = [&](double x) { return c.log2_x ? std::log2(x) : x; };
  double lo = tx(*xs.begin()), hi = tx(*xs.rbegin());
  if (hi - lo < 1e-9) lo -= 1, hi += 1;
  const double pad = (hi - lo) * 0.05;
  lo -= pad, hi += pad;
  auto x_of = [&](double x) { return left + (right - left) * (tx(x) - lo) / (hi - lo); };
  if (!(y_max > 0)) y_max = 1;
  const double step = NiceStep(y_max, 5);
  const double y_top = std::ceil(y_max / step) * step;
  auto y_of = [&](double y) { return bottom - (bottom - top) * y / y_top; };
  for (int i = 0; i * step <= y_top * 1.0001; ++i) {
    const double y = y_of(i * step);
    if (i > 0) s += Line(left, y, right, y, "stroke:#ddd");
    s += Text(left - 6, y + 4, Fmt("%g", i * step), "end", 11);
  }
  // Ticks at the data's x values on a log axis; five even ones on a linear axis.
  std::vector<double> ticks(xs.begin(), xs.end());
  if (!c.log2_x) {
    ticks.clear();
    for (int i = 0; i <= 4; ++i)
      ticks.push_back(*xs.begin() + (*xs.rbegin() - *xs.begin()) * i / 4);
  }
  for (double t : ticks) {
    s += Line(x_of(t), top, x_of(t), bottom, "stroke:#eee");
    s += Text(x_of(t), bottom + 16, Fmt("%g", t), "middle", 11);
  }
  double legend_x = left - 40;
  const double legend_y = bottom + 60;
  for (const LineSeries& se : c.series) {
    std::string pts, dots;
    for (const auto& [x, y] : se.points) {
      if (c.log2_x && !(x > 0)) continue;
      pts += Fmt("%.1f,", x_of(x)) + Fmt("%.1f ", y_of(y));
      dots += "<circle cx=\"" + Fmt("%.1f", x_of(x)) + "\" cy=\"" + Fmt("%.1f", y_of(y)) +
              "\" r=\"3\" fill=\"" + se.color + "\"/>\n";
    }
    const std::string dash = se.dashed ? "\" stroke-dasharray=\"6,4" : "";
    s += "<polyline fill=\"none\" stroke=\"" + se.color + "\" stroke-width=\"2" + dash +
         "\" points=\"" + pts + "\"/>\n" + dots;
    s += "<line x1=\"" + Fmt("%.1f", legend_x) + "\" y1=\"" + Fmt("%.1f", legend_y - 4) +
         "\" x2=\"" + Fmt("%.1f", legend_x + 18) + "\" y2=\"" + Fmt("%.1f", legend_y - 4) +
         "\" stroke=\"" + se.color + "\" stroke-width=\"3" + dash + "\"/>\n";
    s += Text(legend_x + 22, legend_y, Escape(se.name), "start", 11);
    legend_x += 30 + 6.5 * static_cast<double>(se.name.size());
  }
  return s;
}

}  // namespace

std::string RenderLineCharts(const std::string& title, const std::vector<LineChart>& charts) {
  const double width = std::max<size_t>(charts.size(), 1) * kChartWidth;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Fmt("%.0f", width) +
                  "\" height=\"" + Fmt("%.0f", kChartHeight) +
                  "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
                  "fill=\"white\"/>\n";
  s += Text(width / 2, 20, Escape(title), "middle", 13);
  for (size_t i = 0; i < charts.size(); ++i) s += ChartPanel(charts[i], i * kChartWidth);
  return s + "</svg>\n";
}

}  // namespace peng::benchclient
