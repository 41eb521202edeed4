#include "server/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "server/byte_size.h"

namespace peng::server {
namespace {

TEST(MetricsTest, Numbers) {
  EXPECT_EQ(PromNumber(0.001), "0.001");
  EXPECT_EQ(PromNumber(2560), "2560");
  EXPECT_EQ(PromNumber(0.25), "0.25");
  EXPECT_EQ(PromNumber(1.0 / 0.0), "+Inf");
  EXPECT_EQ(PromEscape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(MetricsTest, HistogramIsCumulative) {
  Histogram h({0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5, 2);
  h.Observe(7);
  std::string out;
  h.Render("x_seconds", "m=\"a\"", &out);
  EXPECT_EQ(out,
            "x_seconds_bucket{m=\"a\",le=\"0.1\"} 1\n"
            "x_seconds_bucket{m=\"a\",le=\"1\"} 3\n"
            "x_seconds_bucket{m=\"a\",le=\"+Inf\"} 4\n"
            "x_seconds_sum{m=\"a\"} 8.05\n"
            "x_seconds_count{m=\"a\"} 4\n");
}

std::string Rendered() {
  ServerMetrics m("tiny");
  m.ObserveTimeToFirstToken(0.03);
  m.ObserveInterToken(0.2, 4);
  m.ObserveE2eLatency(1.2);
  m.RecordFinished("length");
  m.RecordFinished("stop");
  m.RecordFinished("stop");
  EngineStats s;
  s.num_running = 2;
  s.num_waiting = 1;
  s.kv_blocks_total = 8;
  s.kv_blocks_used = 2;
  s.kv_usage = 0.25;
  s.kv_block_size = 16;
  s.kv_dtype = DType::kQ8_0;
  s.prefix_cache_queries = 32;
  s.prefix_cache_hits = 16;
  s.prompt_tokens_total = 40;
  s.generation_tokens_total = 9;
  return m.Render(s);
}

TEST(MetricsTest, RenderedText) {
  const std::string t = Rendered();
  const char* expected[] = {
      "# HELP peng_num_requests_running Number of requests in model execution batches.\n"
      "# TYPE peng_num_requests_running gauge\n"
      "peng_num_requests_running{model_name=\"tiny\"} 2\n",
      "peng_num_requests_waiting{model_name=\"tiny\"} 1\n",
      "# TYPE peng_kv_cache_usage_perc gauge\npeng_kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n",
      "peng_kv_cache_used_blocks{model_name=\"tiny\"} 2\n",
      "# TYPE peng_cache_config_info gauge\n"
      "peng_cache_config_info{model_name=\"tiny\",block_size=\"16\",cache_dtype=\"q8_0\"} 1\n",
      "# TYPE peng_prefix_cache_queries_total counter\n"
      "peng_prefix_cache_queries_total{model_name=\"tiny\"} 32\n",
      "peng_prefix_cache_hits_total{model_name=\"tiny\"} 16\n",
      "peng_num_preemptions_total{model_name=\"tiny\"} 0\n",
      "peng_prompt_tokens_total{model_name=\"tiny\"} 40\n",
      "peng_generation_tokens_total{model_name=\"tiny\"} 9\n",
      "# TYPE peng_request_success_total counter\n"
      "peng_request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 0\n"
      "peng_request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1\n"
      "peng_request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 2\n",
      "# TYPE peng_time_to_first_token_seconds histogram\n"
      "peng_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 0\n",
      "peng_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 1\n",
      "peng_time_to_first_token_seconds_count{model_name=\"tiny\"} 1\n",
      "peng_inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.05\"} 4\n",
      "peng_inter_token_latency_seconds_sum{model_name=\"tiny\"} 0.2\n",
      "peng_inter_token_latency_seconds_count{model_name=\"tiny\"} 4\n",
      "peng_e2e_request_latency_seconds_bucket{model_name=\"tiny\",le=\"1.5\"} 1\n",
      "peng_e2e_request_latency_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 1\n",
  };
  for (const char* e : expected) EXPECT_NE(t.find(e), std::string::npos) << e << "\n---\n" << t;
  EXPECT_EQ(t.back(), '\n');
}

// Runs `promtool check metrics` (Debian package `prometheus`) on `text`; *out gets its output.
int Promtool(const std::string& text, std::string* out) {
  char path[] = "/tmp/peng_metrics_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return -1;
  close(fd);
  std::ofstream(path) << text;
  const std::string cmd = std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out->append(buf, n);
  const int rc = pclose(p);
  std::remove(path);
  return rc;
}

// The text must parse and pass every promtool lint (names use the "peng_" prefix: promtool
// reserves ':' for recording rules, so vLLM's "vllm:" style would not pass).
TEST(MetricsTest, PromtoolAcceptsTheText) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  }
  std::string out;
  EXPECT_EQ(Promtool(Rendered(), &out), 0) << out;
  EXPECT_EQ(out, "");
}

TEST(ByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("1024"), 1024);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("512M"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("2GB"), int64_t{2000000000});
  EXPECT_EQ(*ParseByteSize("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*ParseByteSize("64B"), 64);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("12XB").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_EQ(ParseByteSize("5 MiB").status().message(),
            "invalid memory size '5 MiB' (e.g. 512MiB, 2GB, 1073741824)");
}

}  // namespace
}  // namespace peng::server
