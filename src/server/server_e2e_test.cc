// End to end: the server over a real Engine on loopback. The tiny HF llama folder has no
// tokenizer, so completions send token ids; chat runs on SmolLM2 from the models folder
// ($PENG_MODELS_DIR or $PENG_SOURCE_DIR/models) when it is there.
#include <gtest/gtest.h>

#include "core/test_paths.h"

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/server.h"
#include "server/test_http.h"

namespace peng::server {
namespace {

using nlohmann::json;
using testing::PostAndHangUp;
using testing::RunningServer;
using testing::WaitFor;

using ::peng::test_util::SourceDir;

std::unique_ptr<Engine> MakeEngine(const std::string& path, int64_t max_model_len = 128) {
  EngineOptions o;
  o.model_path = path;
  o.threads = 1;
  o.max_model_len = max_model_len;
  o.max_num_seqs = 8;
  o.max_waiting = 16;
  StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(*e) : nullptr;
}

class ServerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = MakeEngine(SourceDir() + "/tests/data/hf_tiny/llama");
    ASSERT_NE(engine_, nullptr);
  }
  void TearDown() override {
    if (engine_) engine_->Stop();
  }
  ServerOptions Options() {
    ServerOptions o;
    o.served_model_name = "tiny";
    o.max_body_bytes = 1 << 16;
    return o;
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(ServerE2eTest, CompletionsStreamingAndN) {
  RunningServer s(engine_.get(), Options());
  auto c = s.Client();
  auto r = c->Post("/v1/completions",
                   R"({"model": "tiny", "prompt": [1, 5, 9, 13], "max_tokens": 6,
                       "temperature": 0, "ignore_eos": true, "logprobs": 2})",
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["usage"].dump(), R"({"completion_tokens":6,"prompt_tokens":4,"total_tokens":10})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["logprobs"]["tokens"].size(), 6u);
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);

  r = c->Post("/v1/completions",
              R"({"prompt": [1, 5, 9, 13], "max_tokens": 5, "n": 2, "temperature": 1.0,
                  "seed": 7, "ignore_eos": true})",
              "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["usage"]["completion_tokens"], 10);

  r = c->Post("/v1/completions",
              R"({"prompt": [1, 5, 9, 13], "max_tokens": 4, "stream": true, "ignore_eos": true,
                  "stream_options": {"include_usage": true}})",
              "application/json");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body.rfind("data: ", 0), 0u);
  EXPECT_NE(r->body.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(r->body.find("\"usage\":{\"completion_tokens\":4,\"prompt_tokens\":4"),
            std::string::npos)
      << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");

  r = c->Post("/v1/completions", R"({"prompt": [1, 2], "max_tokens": 200})", "application/json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["message"],
            "This model's maximum context length is 128 tokens. However, you requested 202 "
            "tokens (2 in the prompt, 200 in the completion). Please reduce the length of the "
            "prompt or completion.");
  r = c->Post("/v1/completions", std::string(1 << 17, ' '), "application/json");
  EXPECT_EQ(r->status, 413);
}

TEST_F(ServerE2eTest, DisconnectsFreeBlocksAndDrainFinishes) {
  RunningServer s(engine_.get(), Options());
  for (int i = 0; i < 4; ++i) {
    PostAndHangUp(s.port(), "/v1/completions",
                  R"({"prompt": [1, 5, 9], "max_tokens": 120, "stream": true,
                      "ignore_eos": true})",
                  "data: ");
  }
  EXPECT_TRUE(WaitFor([&] {
    EngineStats st = engine_->GetStats();
    return st.kv_blocks_used == 0 && st.num_running == 0 && st.num_waiting == 0;
  })) << s.server().MetricsText();
  EXPECT_NE(s.server().MetricsText().find("peng_kv_cache_used_blocks{model_name=\"tiny\"} 0\n"),
            std::string::npos);

  std::string body;
  std::thread client([&] {
    auto r = s.Client()->Post("/v1/completions",
                              R"({"prompt": [1, 5, 9], "max_tokens": 100, "ignore_eos": true})",
                              "application/json");
    if (r) body = r->body;
  });
  WaitFor([&] { return engine_->GetStats().num_running > 0; }, 1);
  s.server().Shutdown();
  client.join();
  s.Join();
  ASSERT_FALSE(body.empty());
  EXPECT_EQ(json::parse(body)["usage"]["completion_tokens"], 100);
}

TEST(ServerChatE2eTest, SmolLm2Chat) {
  const std::string path = test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m-instruct-q4_1.gguf not present";
  std::unique_ptr<Engine> engine = MakeEngine(path, 512);
  ASSERT_NE(engine, nullptr);
  {
    RunningServer s(engine.get(), ServerOptions{});
    auto c = s.Client();
    auto r = c->Post("/v1/chat/completions",
                     R"({"model": "peng", "messages": [{"role": "user", "content": "Hi"}],
                         "max_tokens": 4, "temperature": 0, "logprobs": true,
                         "top_logprobs": 1})",
                     "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
    EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);
    r = c->Post("/v1/chat/completions",
                R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                    "stream": true})",
                "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->body.find("data: {"), 0u);
    EXPECT_NE(r->body.find("\"delta\":{\"content\":\"\",\"role\":\"assistant\"}"),
              std::string::npos);
    EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
    r = c->Post("/v1/completions", R"({"prompt": "Hello", "max_tokens": 2})",
                "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
  }
  engine->Stop();
}

}  // namespace
}  // namespace peng::server
