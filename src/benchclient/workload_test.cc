#include "benchclient/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

namespace peng::benchclient {
namespace {

TEST(WorkloadTest, PromptsHaveInputLenWordsAndDependOnlyOnSeed) {
  const auto a = MakePrompts(3, 50, 7);
  ASSERT_EQ(a.size(), 3u);
  for (const std::string& p : a) {
    std::istringstream in(p);
    int words = 0;
    for (std::string w; in >> w;) ++words;
    EXPECT_EQ(words, 50);
    EXPECT_EQ(p.front() != ' ' && p.back() != ' ', true);
  }
  EXPECT_NE(a[0], a[1]);
  EXPECT_EQ(MakePrompts(3, 50, 7), a);
  EXPECT_NE(MakePrompts(3, 50, 8), a);
}

TEST(WorkloadTest, InfiniteRateSendsAllAtOnce) {
  const auto t = ArrivalOffsets(5, std::numeric_limits<double>::infinity(), 1);
  EXPECT_EQ(t, std::vector<double>(5, 0.0));
}

TEST(WorkloadTest, PoissonArrivalsHaveTheRequestedMeanGap) {
  const int n = 20000;
  const auto t = ArrivalOffsets(n, 4.0, 3);
  EXPECT_DOUBLE_EQ(t[0], 0.0);
  for (int i = 1; i < n; ++i) ASSERT_GE(t[i], t[i - 1]);
  const double mean_gap = t.back() / (n - 1);
  EXPECT_NEAR(mean_gap, 0.25, 0.01);
  // Exponential gaps: the fraction shorter than the mean is 1 - 1/e.
  int shorter = 0;
  for (int i = 1; i < n; ++i) shorter += (t[i] - t[i - 1]) < 0.25;
  EXPECT_NEAR(shorter / double(n - 1), 1 - std::exp(-1.0), 0.01);
  EXPECT_EQ(ArrivalOffsets(100, 4.0, 3), std::vector<double>(t.begin(), t.begin() + 100));
}

}  // namespace
}  // namespace peng::benchclient
