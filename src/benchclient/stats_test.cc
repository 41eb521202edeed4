#include "benchclient/stats.h"

#include <gtest/gtest.h>

namespace peng::benchclient {
namespace {

TEST(StatsTest, PercentilesInterpolateBetweenRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 5.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 9.1);
  EXPECT_DOUBLE_EQ(Percentile(v, 99), 9.91);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
}

TEST(StatsTest, SummarizeSortsAndHandlesEmpty) {
  const Distribution d = Summarize({4, 1, 3, 2});
  EXPECT_EQ(d.count, 4u);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.median, 2.5);
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 4);
  EXPECT_DOUBLE_EQ(Summarize({7}).p99, 7);
  EXPECT_EQ(Summarize({}).count, 0u);
  EXPECT_DOUBLE_EQ(Summarize({}).mean, 0);
}

}  // namespace
}  // namespace peng::benchclient
