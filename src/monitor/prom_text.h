// A reader of the Prometheus text exposition format (version 0.0.4), as /metrics serves it:
// one sample per line, `name{label="value",...} number [timestamp]`, # comments skipped.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace peng::monitor {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Errors name the line number and what is wrong with it.
StatusOr<std::vector<PromSample>> ParsePromText(std::string_view text);

// The samples of one scrape, looked up by name and labels.
class PromScrape {
 public:
  PromScrape() = default;
  explicit PromScrape(std::vector<PromSample> samples) : samples_(std::move(samples)) {}

  // Sum of the samples named `name` whose labels include every pair of `match` (so an empty
  // match sums over all label sets); NaN when there is none.
  double Sum(const std::string& name, const std::map<std::string, std::string>& match = {}) const;
  bool Has(const std::string& name) const;
  // A histogram's cumulative buckets (upper bound -> count), summed over label sets.
  std::map<double, double> Buckets(const std::string& histogram) const;
  const std::vector<PromSample>& samples() const { return samples_; }

 private:
  std::vector<PromSample> samples_;
};

// The q-quantile (0..1) of the observations counted by cumulative `buckets` (upper bound ->
// count, +Inf last), interpolating linearly inside the bucket, as Prometheus's
// histogram_quantile does; NaN without observations.
double HistogramQuantile(const std::map<double, double>& buckets, double q);

}  // namespace peng::monitor
