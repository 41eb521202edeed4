// HTTP behaviour of the server over a scripted fake engine: exact response shapes, error
// statuses, client disconnects and the drain. The real-engine test is server_e2e_test.cc.
#include "server/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/fake_engine.h"
#include "server/test_http.h"

namespace peng::server {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::PostAndHangUp;
using testing::RunningServer;
using testing::WaitFor;

class ServerTest : public ::testing::Test {
 protected:
  ServerOptions Options() {
    ServerOptions o;
    o.served_model_name = "fake";
    o.max_body_bytes = 4096;
    return o;
  }
  FakeEngine engine_;
};

json Body(const httplib::Result& r) { return json::parse(r->body); }

TEST_F(ServerTest, CompletionNonStreaming) {
  RunningServer s(&engine_, Options());
  auto r = s.Client()->Post("/v1/completions",
                            R"({"model": "fake", "prompt": [1, 2, 3], "max_tokens": 3, "n": 2,
                                "temperature": 0, "top_k": 5, "seed": 3})",
                            "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = Body(r);
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake");
  EXPECT_GT(j["created"].get<int64_t>(), 1600000000);
  EXPECT_EQ(j["choices"].dump(),
            R"([{"finish_reason":"length","index":0,"logprobs":null,"text":"xxx"},)"
            R"({"finish_reason":"length","index":1,"logprobs":null,"text":"xxx"}])");
  EXPECT_EQ(j["usage"].dump(), R"({"completion_tokens":6,"prompt_tokens":3,"total_tokens":9})");
  EXPECT_EQ(engine_.last_params.top_k, 5);
  EXPECT_EQ(engine_.last_params.seed, 3);
  EXPECT_EQ(engine_.last_params.temperature, 0.0f);
}

TEST_F(ServerTest, BatchPromptsGetOneChoiceEach) {
  RunningServer s(&engine_, Options());
  auto r = s.Client()->Post("/v1/completions",
                            R"({"prompt": [[1], [2, 3]], "max_tokens": 2, "logprobs": 1})",
                            "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = Body(r);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["logprobs"].dump(),
            R"({"text_offset":[0,10],"token_logprobs":[-0.25,-0.25],)"
            R"("tokens":["token_id:7","token_id:7"],)"
            R"("top_logprobs":[{"token_id:7":-0.25},{"token_id:7":-0.25}]})");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
}

TEST_F(ServerTest, CompletionStreaming) {
  RunningServer s(&engine_, Options());
  auto r = s.Client()->Post("/v1/completions",
                            R"({"prompt": [1, 2], "max_tokens": 2, "stream": true,
                                "stream_options": {"include_usage": true}})",
                            "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> chunks;
  size_t pos = 0;
  const std::string& b = r->body;
  while (pos < b.size()) {
    ASSERT_EQ(b.compare(pos, 6, "data: "), 0) << b;
    const size_t end = b.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string payload = b.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (payload == "[DONE]") {
      EXPECT_EQ(pos, b.size());
      break;
    }
    chunks.push_back(json::parse(payload));
  }
  ASSERT_EQ(chunks.size(), 3u) << b;
  const std::string id = chunks[0]["id"];
  EXPECT_EQ(chunks[0]["choices"].dump(),
            R"([{"finish_reason":null,"index":0,"logprobs":null,"text":"x"}])");
  EXPECT_EQ(chunks[0]["usage"], nullptr);
  EXPECT_EQ(chunks[1]["choices"].dump(),
            R"([{"finish_reason":"length","index":0,"logprobs":null,"text":"x"}])");
  EXPECT_EQ(chunks[2]["choices"].dump(), "[]");
  EXPECT_EQ(chunks[2]["usage"].dump(),
            R"({"completion_tokens":2,"prompt_tokens":2,"total_tokens":4})");
  for (const json& c : chunks) {
    EXPECT_EQ(c["id"], id);
    EXPECT_EQ(c["object"], "text_completion");
  }
}

TEST_F(ServerTest, ModelsHealthAndMetrics) {
  RunningServer s(&engine_, Options());
  auto c = s.Client();
  auto models = c->Get("/v1/models");
  ASSERT_TRUE(models);
  json j = Body(models);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "fake");
  EXPECT_EQ(j["data"][0]["object"], "model");
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");
  ASSERT_TRUE(c->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 2})",
                      "application/json"));
  auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find(
                "peng_request_success_total{model_name=\"fake\",finished_reason=\"length\"} 1\n"),
            std::string::npos)
      << metrics->body;
  EXPECT_NE(metrics->body.find("peng_time_to_first_token_seconds_count{model_name=\"fake\"} 1\n"),
            std::string::npos);
}

// An engine that cannot run any more (its device lost its context): /health answers 503 with
// the reason -- a proxy's health check takes the replica out --, peng_engine_healthy is 0, and
// a new request gets 500 with the reason.
TEST_F(ServerTest, AnEngineThatCannotRunIsUnhealthy) {
  RunningServer s(&engine_, Options());
  auto c = s.Client();
  auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("peng_engine_healthy{model_name=\"fake\"} 1\n"), std::string::npos)
      << metrics->body;
  engine_.SetFatalError("cuda:0: an illegal memory access was encountered");
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(health->body, "unhealthy: cuda:0: an illegal memory access was encountered");
  metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("peng_engine_healthy{model_name=\"fake\"} 0\n"), std::string::npos);
  auto r = c->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(r->body.find("the engine cannot run: cuda:0: an illegal memory access"),
            std::string::npos)
      << r->body;
}

// A second server on a port in use must fail to bind (no SO_REUSEPORT sharing of connections).
TEST_F(ServerTest, SecondServerOnTheSamePortFailsToBind) {
  RunningServer first(&engine_, Options());
  // Wait for the listener (stopping a server before its listen loop has started can hang).
  auto health = first.Client()->Get("/health");
  ASSERT_TRUE(health);
  ASSERT_EQ(health->status, 200);
  ServerOptions o = Options();
  o.host = "127.0.0.1";
  o.port = first.port();
  Server second(&engine_, o);
  const Status s = second.Bind();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot bind 127.0.0.1:" + std::to_string(first.port())),
            std::string::npos)
      << s.ToString();
}

TEST_F(ServerTest, ErrorStatuses) {
  ServerOptions o = Options();
  o.api_key = "sekret";
  RunningServer s(&engine_, o);
  auto c = s.Client();
  auto r = c->Post("/v1/completions", R"({"prompt": [1]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->body,
            R"({"error":{"code":"invalid_api_key","message":"Incorrect API key provided.",)"
            R"("param":null,"type":"invalid_request_error"}})");
  EXPECT_EQ(c->Get("/health")->status, 200);  // health stays open

  httplib::Headers auth = {{"Authorization", "Bearer sekret"}};
  r = c->Post("/v1/completions", auth, "{not json", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->body,
            R"({"error":{"code":"invalid_json","message":"Invalid JSON in the request body",)"
            R"("param":null,"type":"invalid_request_error"}})");
  r = c->Post("/v1/completions", auth, R"({"prompt": [1], "temperature": "hot"})",
              "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["param"], "temperature");
  r = c->Post("/v1/completions", auth, R"({"prompt": [1], "max_tokens": 64})",
              "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["code"], "context_length_exceeded");
  r = c->Post("/v1/completions", auth, R"({"model": "gpt-4", "prompt": [1]})",
              "application/json");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body,
            R"({"error":{"code":"model_not_found","message":"The model `gpt-4` does not )"
            R"(exist.","param":"model","type":"invalid_request_error"}})");
  r = c->Get("/v1/nothing", auth);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(Body(r)["error"]["code"], "not_found");
  r = c->Post("/v1/completions", auth, std::string(5000, ' '), "application/json");
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(Body(r)["error"]["code"], "request_too_large");
  r = c->Post("/v1/chat/completions", auth, R"({"messages": [{"role": "user", "content": "hi"}]})",
              "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "model has no chat template");
  engine_.queue_full = true;
  r = c->Post("/v1/completions", auth, R"({"prompt": [1]})", "application/json");
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(r->body,
            R"({"error":{"code":null,"message":"too many waiting requests","param":null,)"
            R"("type":"rate_limit_error"}})");
}

TEST_F(ServerTest, StreamingClientDisconnectAborts) {
  engine_.delay_ms = 20;
  RunningServer s(&engine_, Options());
  const std::string got =
      PostAndHangUp(s.port(), "/v1/completions",
                    R"({"prompt": [1], "max_tokens": 60, "stream": true})", "\"text\":\"x\"");
  ASSERT_NE(got.find("data: "), std::string::npos) << got;
  EXPECT_TRUE(WaitFor([&] { return engine_.WasAborted("cmpl-"); }, 5));
  EXPECT_TRUE(WaitFor([&] { return engine_.running() == 0; }, 5));
  EXPECT_NE(s.server().MetricsText().find("finished_reason=\"abort\"} 1\n"), std::string::npos);
}

TEST_F(ServerTest, NonStreamingClientDisconnectAborts) {
  engine_.delay_ms = 20;
  RunningServer s(&engine_, Options());
  PostAndHangUp(s.port(), "/v1/completions", R"({"prompt": [1], "max_tokens": 60})", "");
  EXPECT_TRUE(WaitFor([&] { return engine_.WasAborted("cmpl-"); }, 5));
  EXPECT_TRUE(WaitFor([&] { return engine_.running() == 0; }, 5));
}

TEST_F(ServerTest, ShutdownDrainsRunningRequests) {
  engine_.delay_ms = 20;
  RunningServer s(&engine_, Options());
  int status = 0;
  std::string streamed;
  std::thread client([&] {
    auto r = s.Client()->Post("/v1/completions",
                                R"({"prompt": [1], "max_tokens": 25, "stream": true})",
                                "application/json");
    if (r) {
      status = r->status;
      streamed = r->body;
    }
  });
  ASSERT_TRUE(WaitFor([&] { return engine_.running() == 1; }));
  std::thread stopper([&] { s.server().Shutdown(); });
  ASSERT_TRUE(WaitFor([&] { return s.server().draining(); }));
  auto c = s.Client();
  auto health = c->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto rejected = c->Post("/v1/completions", R"({"prompt": [1]})", "application/json");
  ASSERT_TRUE(rejected);
  EXPECT_EQ(rejected->status, 503);
  EXPECT_EQ(json::parse(rejected->body)["error"]["type"], "service_unavailable");
  client.join();
  stopper.join();
  s.Join();
  EXPECT_EQ(status, 200);
  EXPECT_NE(streamed.find("\"finish_reason\":\"length\""), std::string::npos);
  ASSERT_GE(streamed.size(), 14u);
  EXPECT_EQ(streamed.substr(streamed.size() - 14), "data: [DONE]\n\n");
  EXPECT_TRUE(s.served().ok());
}

}  // namespace
}  // namespace peng::server
