// One replica (a `peng serve` URL) as `peng top` watches it: each Poll() scrapes /health and
// /metrics (short timeouts, so a dead host costs at most about a second), keeps the scrapes
// of the last minute, and Row() derives what an operator looks at. Rates come from counter
// differences between the newest scrape and the one `rate_window_s` earlier; latency
// percentiles from histogram bucket differences over the last minute (over the server's
// whole life until the monitor has a minute of history).
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "monitor/prom_text.h"

namespace peng::monitor {

struct Scrape {
  double t = 0;            // seconds since the monitor started
  std::string state;       // "healthy", "draining" (/health 503), "down" (no answer)
  std::string error;       // why it is down
  PromScrape metrics;      // empty when down
};

struct ReplicaRow {
  std::string url;
  std::string state;
  std::string error;
  std::string model;
  double running = 0, waiting = 0;
  double kv_usage = 0;              // 0-1
  double prefix_hit_rate = 0;       // hits / queries over the rate window, 0-1 (NaN: none)
  double prompt_tps = 0, gen_tps = 0;
  double bandwidth_util = 0, compute_util = 0, busy = 0;  // 0-1, the server's gauges
  double read_gbs = 0;              // GB/s achieved while busy
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0;  // seconds, last minute; NaN: none
  std::vector<double> gen_tps_history;  // one per poll, oldest first (for the sparkline)
  nlohmann::json ToJson() const;
};

class ReplicaMonitor {
 public:
  explicit ReplicaMonitor(std::string url, double timeout_s = 1.0);
  // Scrapes now; `t` is the caller's clock in seconds (monotonic).
  void Poll(double t);
  ReplicaRow Row() const;
  // Adds a scrape made elsewhere (tests).
  void AddScrape(Scrape s);

 private:
  std::string url_;
  double timeout_s_;
  std::deque<Scrape> history_;       // the last minute (and a bit) of scrapes
  std::deque<double> gen_tps_;       // per poll
};

// The table `peng top` draws (ANSI; `color` adds colors), one row per replica, with
// sparklines of the generation rate; width-stable so that redraws do not jitter.
std::string RenderTable(const std::vector<ReplicaRow>& rows, bool color);

// "▁▂▃▄▅▆▇█" bars for the last `width` values scaled to their max (spaces when all zero).
std::string Sparkline(const std::vector<double>& values, int width);

}  // namespace peng::monitor
