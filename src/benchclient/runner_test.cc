// RunBenchmark, OpenAiClient, the report and the plot against an in-process fake
// OpenAI-compatible server that streams one word per chunk.
#include "benchclient/runner.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "benchclient/report.h"
#include "benchclient/svg_plot.h"

namespace peng::benchclient {
namespace {

using Json = nlohmann::json;

class FakeServer {
 public:
  FakeServer() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      const bool chat = std::string(path).find("chat") != std::string::npos;
      server_.Post(path, [this, chat](const httplib::Request& req, httplib::Response& res) {
        Handle(req, res, chat);
      });
    }
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_; }
  Json last_body() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_body_;
  }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    const Json body = Json::parse(req.body);
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_body_ = body;
    }
    if (req.get_header_value("Authorization") != "Bearer sk-test") {
      res.status = 401;
      res.set_content(R"({"error":{"message":"bad key","type":"invalid_request_error"}})",
                      "application/json");
      return;
    }
    std::istringstream in(chat ? body["messages"][0]["content"].get<std::string>()
                               : body["prompt"].get<std::string>());
    int prompt_words = 0;
    for (std::string w; in >> w;) ++prompt_words;
    const int max_tokens = body["max_tokens"];
    const int now = ++in_flight_;
    for (int m = max_in_flight_; now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    res.set_chunked_content_provider("text/event-stream", [this, chat, max_tokens, prompt_words](
                                                              size_t, httplib::DataSink& sink) {
      for (int k = 0; k < max_tokens; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        Json c = chat ? Json{{"choices", {{{"index", 0}, {"delta", {{"content", "w "}}}}}}}
                      : Json{{"choices", {{{"index", 0}, {"text", "w "}}}}};
        if (k + 1 == max_tokens) c["choices"][0]["finish_reason"] = "length";
        const std::string ev = "data: " + c.dump() + "\n\n";
        sink.write(ev.data(), ev.size());
      }
      const Json usage = {{"choices", Json::array()},
                          {"usage",
                           {{"prompt_tokens", prompt_words},
                            {"completion_tokens", max_tokens},
                            {"total_tokens", prompt_words + max_tokens}}}};
      const std::string tail = "data: " + usage.dump() + "\n\ndata: [DONE]\n\n";
      sink.write(tail.data(), tail.size());
      --in_flight_;
      sink.done();
      return true;
    });
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::mutex mu_;
  Json last_body_;
};

BenchConfig Config(const FakeServer& s, const char* endpoint) {
  BenchConfig c;
  c.client.url = s.url();
  c.client.endpoint = endpoint;
  c.client.model = "fake-model";
  c.client.api_key = "sk-test";
  c.num_prompts = 8;
  c.input_len = 12;
  c.output_len = 5;
  return c;
}

TEST(RunnerTest, MeasuresEveryStreamedCompletion) {
  FakeServer server;
  const BenchConfig c = Config(server, "/v1/completions");
  int callbacks = 0;
  const BenchRun run = RunBenchmark(c, [&](int done, int total) {
    ++callbacks;
    EXPECT_EQ(total, 8);
    EXPECT_EQ(done, callbacks);
  });
  EXPECT_EQ(callbacks, 8);
  ASSERT_EQ(run.results.size(), 8u);
  for (const RequestResult& r : run.results) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.http_status, 200);
    EXPECT_TRUE(r.usage_reported);
    EXPECT_EQ(r.prompt_tokens, 12);
    EXPECT_EQ(r.output_tokens, 5);
    EXPECT_EQ(r.text_chunks, 5);
    EXPECT_EQ(r.text, "w w w w w ");
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.itl_s.size(), 4u);
    EXPECT_GT(r.ttft_s, 0.001);
    EXPECT_GE(r.e2e_s, r.ttft_s);
  }
  const Json body = server.last_body();
  EXPECT_EQ(body["model"], "fake-model");
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["max_tokens"], 5);

  const Json report = BuildReport(c, run);
  const Json& s = report["summary"];
  EXPECT_EQ(s["completed"], 8);
  EXPECT_EQ(s["failed"], 0);
  EXPECT_EQ(s["total_input_tokens"], 96);
  EXPECT_EQ(s["total_output_tokens"], 40);
  EXPECT_EQ(s["itl_ms"]["count"], 32);
  EXPECT_EQ(s["tpot_ms"]["count"], 8);
  EXPECT_GT(s["tpot_ms"]["median"].get<double>(), 1.0);
  EXPECT_NEAR(s["output_throughput"].get<double>(), 40 / run.duration_s, 1e-9);
  EXPECT_EQ(report["requests"].size(), 8u);
  const std::string svg = RenderSvg(report);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("Latency CDFs"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(RunnerTest, ChatEndpointAndConcurrencyCap) {
  FakeServer server;
  BenchConfig c = Config(server, "/v1/chat/completions");
  c.max_concurrency = 2;
  c.output_len = 10;
  const BenchRun run = RunBenchmark(c);
  EXPECT_EQ(run.num_workers, 2);
  for (const RequestResult& r : run.results) {
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 10);
  }
  EXPECT_EQ(server.last_body()["messages"][0]["role"], "user");
  EXPECT_LE(server.max_in_flight(), 2);
}

TEST(RunnerTest, PoissonRateSpacesOutSends) {
  FakeServer server;
  BenchConfig c = Config(server, "/v1/completions");
  c.request_rate = 100;  // mean gap 10 ms: 8 requests take about 70 ms to send
  const BenchRun run = RunBenchmark(c);
  EXPECT_GT(run.results.back().start_s, 0.0);
  for (size_t i = 1; i < run.results.size(); ++i)
    EXPECT_GE(run.results[i].start_s + 1e-3, run.results[i - 1].start_s);
}

TEST(RunnerTest, HttpErrorsAndUnreachableServersAreFailures) {
  FakeServer server;
  BenchConfig c = Config(server, "/v1/completions");
  c.client.api_key = "wrong";
  c.num_prompts = 2;
  BenchRun run = RunBenchmark(c);
  for (const RequestResult& r : run.results) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.http_status, 401);
    EXPECT_NE(r.error.find("bad key"), std::string::npos) << r.error;
  }
  const Json report = BuildReport(c, run);
  EXPECT_EQ(report["summary"]["failed"], 2);
  EXPECT_NE(RenderSvg(report).find("#d62728"), std::string::npos);

  c.client.url = "http://127.0.0.1:1";  // nothing listens on port 1
  run = RunBenchmark(c);
  for (const RequestResult& r : run.results) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.http_status, 0);
  }
}

TEST(RunnerTest, FirstModelIdAndUrlParsing) {
  FakeServer server;
  ClientOptions o;
  o.url = server.url() + "/";
  auto client = OpenAiClient::Create(o);
  ASSERT_TRUE(client.ok());
  auto id = (*client)->FirstModelId();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "fake-model");

  auto p = ParseUrl("https://example.test:8443/api/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->origin, "https://example.test:8443");
  EXPECT_EQ(p->prefix, "/api");
  EXPECT_FALSE(ParseUrl("127.0.0.1:8000").ok());
  EXPECT_FALSE(ParseUrl("ftp://h").ok());
  EXPECT_FALSE(ParseUrl("http://").ok());
}

}  // namespace
}  // namespace peng::benchclient
