// Server metrics in the Prometheus text exposition format (version 0.0.4), with vLLM's metric
// names under a "peng_" prefix (promtool rejects ":"): engine gauges and counters (taken from EngineStats when
// rendering) plus request latency histograms (time to first token, inter-token latency,
// end-to-end latency) and finished-request counters observed by the HTTP threads.
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace peng::server {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value, int64_t count = 1);
  // Appends the _bucket/_sum/_count samples of `name` with `labels` ("a=\"b\"", may be empty).
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class ServerMetrics {
 public:
  explicit ServerMetrics(std::string model_name);

  void ObserveTimeToFirstToken(double seconds);
  // `tokens` tokens arrived `seconds` after the previous ones: `tokens` observations of
  // seconds / tokens each.
  void ObserveInterToken(double seconds, int64_t tokens);
  void ObserveE2eLatency(double seconds);
  // One finished completion (a choice) with its finish reason ("stop", "length", "abort").
  void RecordFinished(const std::string& finish_reason);

  // `http_connections`: open client connections (the front end's), exported when >= 0.
  std::string Render(const EngineStats& stats, int64_t http_connections = -1) const;

 private:
  const std::string model_label_;  // model_name="..."
  mutable std::mutex mu_;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  std::map<std::string, int64_t> finished_;
};

// Prometheus number text: shortest round-trip form, "+Inf"/"-Inf"/"NaN".
std::string PromNumber(double v);
// A label value with \, " and newline escaped.
std::string PromEscape(const std::string& v);

}  // namespace peng::server
