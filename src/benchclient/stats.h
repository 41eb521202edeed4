// Summary statistics of latency samples: mean and percentiles with linear interpolation between
// the closest ranks (numpy's default), so numbers match what Python tooling reports.
#pragma once

#include <cstddef>
#include <vector>

namespace peng::benchclient {

struct Distribution {
  size_t count = 0;
  double mean = 0;
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
};

// q in [0, 100]; `sorted` must be ascending and non-empty.
double Percentile(const std::vector<double>& sorted, double q);

// All fields zero for an empty input.
Distribution Summarize(std::vector<double> values);

}  // namespace peng::benchclient
