#include "monitor/replica.h"

#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "benchclient/openai_client.h"

namespace peng::monitor {
namespace {

constexpr double kLatencyWindowS = 60;  // percentiles over the last minute
constexpr double kRateWindowS = 5;      // rates over the last few seconds
constexpr size_t kSparkPoints = 30;  // the sparkline's width
const double kNaN = std::numeric_limits<double>::quiet_NaN();

double Or0(double v) { return std::isnan(v) ? 0 : v; }

std::string HttpError(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::ConnectionTimeout: return "connect timed out";
    case httplib::Error::Read: return "no answer (read failed or timed out)";
    default: return httplib::to_string(e);
  }
}

// The scrape at least `window` seconds older than the newest that is closest to it (else the
// oldest one that has metrics).
const Scrape* Baseline(const std::deque<Scrape>& h, double window) {
  const Scrape* best = nullptr;
  const double target = h.back().t - window;
  for (const Scrape& s : h) {
    if (&s == &h.back()) break;
    if (s.state == "down") continue;
    if (s.t <= target || !best) best = &s;
  }
  return best;
}

std::map<double, double> BucketDelta(const PromScrape& now, const PromScrape* then,
                                     const std::string& name) {
  std::map<double, double> d = now.Buckets(name);
  if (!then) return d;
  const std::map<double, double> b = then->Buckets(name);
  for (auto& [le, c] : d) {
    auto it = b.find(le);
    if (it != b.end()) c -= it->second;
  }
  // A restarted server's counters start again from zero: then the newest alone counts.
  for (const auto& [le, c] : d)
    if (c < 0) return now.Buckets(name);
  return d;
}

}  // namespace

nlohmann::json ReplicaRow::ToJson() const {
  auto num = [](double v) -> nlohmann::json {
    if (std::isnan(v) || std::isinf(v)) return nullptr;
    return v;
  };
  return {{"url", url},
          {"state", state},
          {"error", error},
          {"model", model},
          {"running", num(running)},
          {"waiting", num(waiting)},
          {"kv_cache_usage", num(kv_usage)},
          {"prefix_cache_hit_rate", num(prefix_hit_rate)},
          {"prompt_tokens_per_s", num(prompt_tps)},
          {"generation_tokens_per_s", num(gen_tps)},
          {"read_bandwidth_utilization", num(bandwidth_util)},
          {"read_bandwidth_gb_per_s", num(read_gbs)},
          {"compute_utilization", num(compute_util)},
          {"engine_busy", num(busy)},
          {"ttft_p50_s", num(ttft_p50)},
          {"ttft_p99_s", num(ttft_p99)},
          {"itl_p50_s", num(itl_p50)},
          {"itl_p99_s", num(itl_p99)}};
}

ReplicaMonitor::ReplicaMonitor(std::string url, double timeout_s)
    : url_(std::move(url)), timeout_s_(timeout_s) {
  while (!url_.empty() && url_.back() == '/') url_.pop_back();
}

void ReplicaMonitor::Poll(double t) {
  Scrape s;
  s.t = t;
  auto parsed = benchclient::ParseUrl(url_);
  if (!parsed.ok()) {
    s.state = "down";
    s.error = parsed.status().message();
    AddScrape(std::move(s));
    return;
  }
  httplib::Client http(parsed->origin);
  const auto to = std::chrono::microseconds(static_cast<int64_t>(timeout_s_ * 1e6));
  http.set_connection_timeout(to);
  http.set_read_timeout(to);
  http.set_write_timeout(to);
  httplib::Result health = http.Get(parsed->prefix + "/health");
  if (!health) {
    s.state = "down";
    s.error = "GET /health: " + HttpError(health.error());
    AddScrape(std::move(s));
    return;
  }
  s.state = health->status == 200 ? "healthy" : health->status == 503 ? "draining" : "down";
  if (s.state == "down") s.error = "/health answered " + std::to_string(health->status);
  httplib::Result metrics = http.Get(parsed->prefix + "/metrics");
  if (metrics && metrics->status == 200) {
    auto samples = ParsePromText(metrics->body);
    if (samples.ok()) s.metrics = PromScrape(std::move(*samples));
    else s.error = samples.status().message();
  } else if (s.state != "down") {
    s.error = metrics ? "/metrics answered " + std::to_string(metrics->status)
                      : "GET /metrics: " + HttpError(metrics.error());
  }
  AddScrape(std::move(s));
}

void ReplicaMonitor::AddScrape(Scrape s) {
  history_.push_back(std::move(s));
  while (history_.size() > 2 && history_[1].t <= history_.back().t - kLatencyWindowS)
    history_.pop_front();
  gen_tps_.push_back(Or0(Row().gen_tps));
  while (gen_tps_.size() > kSparkPoints) gen_tps_.pop_front();
}

ReplicaRow ReplicaMonitor::Row() const {
  ReplicaRow r;
  r.url = url_;
  r.prefix_hit_rate = r.ttft_p50 = r.ttft_p99 = r.itl_p50 = r.itl_p99 = kNaN;
  r.gen_tps_history.assign(gen_tps_.begin(), gen_tps_.end());
  if (history_.empty()) {
    r.state = "unknown";
    return r;
  }
  const Scrape& now = history_.back();
  r.state = now.state;
  r.error = now.error;
  if (now.state == "down") return r;
  const PromScrape& m = now.metrics;
  for (const PromSample& s : m.samples()) {
    if (auto it = s.labels.find("model_name"); it != s.labels.end()) {
      r.model = it->second;
      break;
    }
  }
  r.running = Or0(m.Sum("peng_num_requests_running"));
  r.waiting = Or0(m.Sum("peng_num_requests_waiting"));
  r.kv_usage = Or0(m.Sum("peng_kv_cache_usage_perc"));
  r.bandwidth_util = Or0(m.Sum("peng_read_bandwidth_utilization_perc"));
  r.compute_util = Or0(m.Sum("peng_compute_utilization_perc"));
  r.busy = Or0(m.Sum("peng_engine_busy_perc"));
  r.read_gbs = Or0(m.Sum("peng_read_bandwidth_bytes_per_second")) / 1e9;
  if (const Scrape* base = Baseline(history_, kRateWindowS)) {
    const double dt = now.t - base->t;
    auto rate = [&](const std::string& name) {
      const double d = m.Sum(name) - base->metrics.Sum(name);
      return std::isnan(d) || dt <= 0 ? 0.0 : std::max(0.0, d) / dt;  // a restart: 0
    };
    r.prompt_tps = rate("peng_prompt_tokens_total");
    r.gen_tps = rate("peng_generation_tokens_total");
    const double q = m.Sum("peng_prefix_cache_queries_total") -
                     base->metrics.Sum("peng_prefix_cache_queries_total");
    const double h = m.Sum("peng_prefix_cache_hits_total") -
                     base->metrics.Sum("peng_prefix_cache_hits_total");
    if (q > 0 && h >= 0) r.prefix_hit_rate = h / q;
  }
  // Until the history reaches a minute back, the percentiles cover the server's whole life.
  const Scrape* minute = Baseline(history_, kLatencyWindowS);
  const PromScrape* then =
      minute && minute->t <= now.t - kLatencyWindowS ? &minute->metrics : nullptr;
  const auto ttft = BucketDelta(m, then, "peng_time_to_first_token_seconds");
  const auto itl = BucketDelta(m, then, "peng_inter_token_latency_seconds");
  r.ttft_p50 = HistogramQuantile(ttft, 0.5);
  r.ttft_p99 = HistogramQuantile(ttft, 0.99);
  r.itl_p50 = HistogramQuantile(itl, 0.5);
  r.itl_p99 = HistogramQuantile(itl, 0.99);
  return r;
}

std::string Sparkline(const std::vector<double>& values, int width) {
  static const char* kBars[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                 "\u2585", "\u2586", "\u2587", "\u2588"};
  const size_t n = std::min<size_t>(values.size(), static_cast<size_t>(std::max(width, 0)));
  std::string out(static_cast<size_t>(std::max(width, 0)) - n, ' ');
  double mx = 0;
  for (size_t i = values.size() - n; i < values.size(); ++i) mx = std::max(mx, values[i]);
  for (size_t i = values.size() - n; i < values.size(); ++i) {
    if (!(mx > 0) || !(values[i] > 0)) {
      out += ' ';
      continue;
    }
    const int level = std::clamp(static_cast<int>(values[i] / mx * 7.999), 0, 7);
    out += kBars[level];
  }
  return out;
}

std::string RenderTable(const std::vector<ReplicaRow>& rows, bool color) {
  auto fmt = [](const char* f, double v) {
    if (std::isnan(v)) return std::string("-");
    char b[32];
    std::snprintf(b, sizeof(b), f, v);
    return std::string(b);
  };
  auto ms = [&](double s) { return fmt("%.0f", s * 1e3); };
  auto pct = [&](double v) { return fmt("%.0f%%", v * 100); };
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line),
                "%-24s %-8s %4s %4s %5s %5s %8s %8s %5s %6s %5s %11s %11s  %s\n", "REPLICA",
                "STATE", "RUN", "WAIT", "KV", "HIT", "PROMPT/s", "GEN/s", "BW", "GB/s", "COMP",
                "TTFT50/99ms", "ITL50/99ms", "GEN/s, last 30 polls");
  out += color ? "\x1b[1m" + std::string(line) + "\x1b[0m" : std::string(line);
  for (const ReplicaRow& r : rows) {
    std::string url = r.url.size() > 24 ? "…" + r.url.substr(r.url.size() - 23) : r.url;
    const char* c = r.state == "healthy" ? "\x1b[32m" : r.state == "draining" ? "\x1b[33m"
                                                                                : "\x1b[31m";
    std::string state = r.state;
    state.resize(8, ' ');
    if (color) state = c + state + "\x1b[0m";
    if (r.state == "down" || r.state == "unknown") {
      std::snprintf(line, sizeof(line), "%-24s %s %s\n", url.c_str(), state.c_str(),
                    r.error.c_str());
      out += line;
      continue;
    }
    const std::string ttft = ms(r.ttft_p50) + "/" + ms(r.ttft_p99);
    const std::string itl = ms(r.itl_p50) + "/" + ms(r.itl_p99);
    std::snprintf(line, sizeof(line),
                  "%-24s %s %4.0f %4.0f %5s %5s %8.1f %8.1f %5s %6.1f %5s %11s %11s  %s\n",
                  url.c_str(), state.c_str(), r.running, r.waiting, pct(r.kv_usage).c_str(),
                  pct(r.prefix_hit_rate).c_str(), r.prompt_tps, r.gen_tps,
                  pct(r.bandwidth_util).c_str(), r.read_gbs, pct(r.compute_util).c_str(),
                  ttft.c_str(), itl.c_str(), Sparkline(r.gen_tps_history, static_cast<int>(kSparkPoints)).c_str());
    out += line;
  }
  return out;
}

}  // namespace peng::monitor
