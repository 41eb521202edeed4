#include "benchclient/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

}  // namespace peng::benchclient
