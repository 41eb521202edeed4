#include <cmath>

#include <gtest/gtest.h>

#include "monitor/prom_text.h"
#include "monitor/replica.h"

namespace peng::monitor {
namespace {

TEST(PromText, ParsesSamplesLabelsAndSpecialValues) {
  auto s = ParsePromText(
      "# HELP x help\n# TYPE x gauge\n"
      "x{model_name=\"m\\\"1\",kind=\"a\"} 2.5\n"
      "y 7 1700000000\n"
      "z_bucket{le=\"+Inf\"} +Inf\n"
      "\n  w{} NaN\r\n");
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ((*s)[0].name, "x");
  EXPECT_EQ((*s)[0].labels.at("model_name"), "m\"1");
  EXPECT_EQ((*s)[0].labels.at("kind"), "a");
  EXPECT_EQ((*s)[0].value, 2.5);
  EXPECT_EQ((*s)[1].value, 7);
  EXPECT_TRUE(std::isinf((*s)[2].value));
  EXPECT_TRUE(std::isnan((*s)[3].value));
}

TEST(PromText, ErrorsNameTheLine) {
  auto s = ParsePromText("a 1\nb{x=\"1\" 2\n");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "metrics line 2: ',' or '}' expected");
  EXPECT_EQ(ParsePromText("a one\n").status().message(), "metrics line 1: bad value 'one'");
  EXPECT_EQ(ParsePromText("{a=\"1\"} 1\n").status().message(),
            "metrics line 1: a metric name was expected");
  EXPECT_EQ(ParsePromText("a{b=\"1} 2").status().message(),
            "metrics line 1: label b: unterminated value");
}

TEST(PromText, SumMatchesLabelSubsets) {
  PromScrape p(*ParsePromText("o{kind=\"fp32\",m=\"x\"} 2\no{kind=\"int8\",m=\"x\"} 3\n"));
  EXPECT_EQ(p.Sum("o"), 5);
  EXPECT_EQ(p.Sum("o", {{"kind", "int8"}}), 3);
  EXPECT_TRUE(std::isnan(p.Sum("o", {{"kind", "bf16"}})));
  EXPECT_TRUE(std::isnan(p.Sum("missing")));
}

TEST(PromText, HistogramQuantileInterpolatesLikePrometheus) {
  // 10 observations <= 0.1, 10 more in (0.1, 0.5], none above.
  const std::map<double, double> b = {{0.1, 10}, {0.5, 20}, {INFINITY, 20}};
  EXPECT_DOUBLE_EQ(HistogramQuantile(b, 0.5), 0.1);
  EXPECT_DOUBLE_EQ(HistogramQuantile(b, 0.25), 0.05);
  EXPECT_DOUBLE_EQ(HistogramQuantile(b, 0.75), 0.3);
  EXPECT_DOUBLE_EQ(HistogramQuantile({{0.1, 0}, {INFINITY, 4}}, 0.99), 0.1);  // above the last bound
  EXPECT_TRUE(std::isnan(HistogramQuantile({{0.1, 0}, {INFINITY, 0}}, 0.5)));
}

std::string Metrics(double gen, double prompt, double ttft_le_01, double ttft_total) {
  char b[1024];
  std::snprintf(b, sizeof(b),
                "peng_num_requests_running{model_name=\"m\"} 3\n"
                "peng_num_requests_waiting{model_name=\"m\"} 1\n"
                "peng_kv_cache_usage_perc{model_name=\"m\"} 0.5\n"
                "peng_generation_tokens_total{model_name=\"m\"} %g\n"
                "peng_prompt_tokens_total{model_name=\"m\"} %g\n"
                "peng_prefix_cache_queries_total{model_name=\"m\"} %g\n"
                "peng_prefix_cache_hits_total{model_name=\"m\"} %g\n"
                "peng_read_bandwidth_utilization_perc{model_name=\"m\"} 0.4\n"
                "peng_read_bandwidth_bytes_per_second{model_name=\"m\"} 8e9\n"
                "peng_time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.1\"} %g\n"
                "peng_time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} %g\n",
                gen, prompt, prompt, prompt / 2, ttft_le_01, ttft_total);
  return b;
}

Scrape At(double t, const std::string& text, const std::string& state = "healthy") {
  Scrape s;
  s.t = t;
  s.state = state;
  s.metrics = PromScrape(*ParsePromText(text));
  return s;
}

TEST(ReplicaMonitor, RatesAndMinutePercentilesFromCounterDifferences) {
  ReplicaMonitor m("http://127.0.0.1:1/");
  m.AddScrape(At(0, Metrics(100, 1000, 5, 5)));
  m.AddScrape(At(55, Metrics(100, 1000, 5, 5)));
  m.AddScrape(At(60, Metrics(600, 2000, 5, 15)));  // 10 new TTFTs, all above 0.1 s
  const ReplicaRow r = m.Row();
  EXPECT_EQ(r.url, "http://127.0.0.1:1");
  EXPECT_EQ(r.state, "healthy");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.running, 3);
  EXPECT_EQ(r.waiting, 1);
  EXPECT_DOUBLE_EQ(r.gen_tps, 100);     // 500 tokens in 5 s
  EXPECT_DOUBLE_EQ(r.prompt_tps, 200);  // 1000 in 5 s
  EXPECT_DOUBLE_EQ(r.prefix_hit_rate, 0.5);
  EXPECT_DOUBLE_EQ(r.bandwidth_util, 0.4);
  EXPECT_DOUBLE_EQ(r.read_gbs, 8);
  EXPECT_DOUBLE_EQ(r.ttft_p50, 0.1);  // only the last minute's 10 count: all in (0.1, +Inf)
  ASSERT_EQ(r.gen_tps_history.size(), 3u);
  EXPECT_DOUBLE_EQ(r.gen_tps_history[2], 100);
  const nlohmann::json j = r.ToJson();
  EXPECT_EQ(j["state"], "healthy");
  EXPECT_EQ(j["generation_tokens_per_s"], 100.0);
  EXPECT_TRUE(j["itl_p50_s"].is_null());  // no ITL histogram in the scrape
}

TEST(ReplicaMonitor, PercentilesCoverTheServersLifeUntilAMinuteIsWatched) {
  ReplicaMonitor m("http://h:1");
  m.AddScrape(At(0, Metrics(0, 0, 5, 5)));  // 5 TTFTs <= 0.1 s before the watch began
  m.AddScrape(At(1, Metrics(0, 0, 5, 6)));
  EXPECT_DOUBLE_EQ(m.Row().ttft_p50, 0.06);  // rank 3 of 6, inside (0, 0.1]
}

TEST(ReplicaMonitor, DownAndDrainingStates) {
  ReplicaMonitor m("http://127.0.0.1:1");
  m.Poll(0);  // nothing listens on port 1
  ReplicaRow r = m.Row();
  EXPECT_EQ(r.state, "down");
  EXPECT_NE(r.error.find("GET /health"), std::string::npos) << r.error;
  m.AddScrape(At(1, Metrics(1, 1, 0, 0), "draining"));
  EXPECT_EQ(m.Row().state, "draining");
  const std::string table = RenderTable({r, m.Row()}, false);
  EXPECT_NE(table.find("down"), std::string::npos);
  EXPECT_NE(table.find("draining"), std::string::npos);
}

TEST(ReplicaMonitor, ARestartedServerGivesNoNegativeRates) {
  ReplicaMonitor m("http://h:1");
  m.AddScrape(At(0, Metrics(1000, 1000, 0, 0)));
  m.AddScrape(At(6, Metrics(10, 10, 0, 0)));
  EXPECT_EQ(m.Row().gen_tps, 0);
}

TEST(Sparkline, ScalesToTheMaxAndPadsOnTheLeft) {
  EXPECT_EQ(Sparkline({0, 1, 2, 4, 8}, 6), "  \u2581\u2582\u2584\u2588");
  EXPECT_EQ(Sparkline({5, 5}, 2), "\u2588\u2588");
  EXPECT_EQ(Sparkline({}, 3), "   ");
}

}  // namespace
}  // namespace peng::monitor
