#include "server/responses.h"

#include <gtest/gtest.h>

#include <cmath>

namespace peng::server {
namespace {

using nlohmann::json;

ResponseMeta Meta(Endpoint ep) {
  ResponseMeta m;
  m.endpoint = ep;
  m.id = ep == Endpoint::kChat ? "chatcmpl-1" : "cmpl-1";
  m.created = 1700000000;
  m.model = "m";
  return m;
}

TEST(ResponsesTest, Ids) {
  const std::string a = NewResponseId(Endpoint::kCompletions);
  const std::string b = NewResponseId(Endpoint::kChat);
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(b.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(a, NewResponseId(Endpoint::kCompletions));
}

TEST(ResponsesTest, ChatChunks) {
  const ResponseMeta m = Meta(Endpoint::kChat);
  ChunkChoice first;
  first.role = true;
  EXPECT_EQ(SseData(StreamChunk(m, first, false, std::nullopt)),
            "data: {\"choices\":[{\"delta\":{\"content\":\"\",\"role\":\"assistant\"},"
            "\"finish_reason\":null,\"index\":0,\"logprobs\":null}],\"created\":1700000000,"
            "\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":\"chat.completion.chunk\"}\n\n");
  ChunkChoice mid;
  mid.index = 1;
  mid.text = "Hi";
  EXPECT_EQ(StreamChunk(m, mid, true, std::nullopt).dump(),
            R"({"choices":[{"delta":{"content":"Hi"},"finish_reason":null,"index":1,)"
            R"("logprobs":null}],"created":1700000000,"id":"chatcmpl-1","model":"m",)"
            R"("object":"chat.completion.chunk","usage":null})");
  ChunkChoice last;
  last.finish_reason = "length";
  EXPECT_EQ(StreamChunk(m, last, false, std::nullopt)["choices"][0].dump(),
            R"({"delta":{},"finish_reason":"length","index":0,"logprobs":null})");
  EXPECT_EQ(UsageChunk(m, Usage{3, 4}).dump(),
            R"({"choices":[],"created":1700000000,"id":"chatcmpl-1","model":"m",)"
            R"("object":"chat.completion.chunk","usage":{"completion_tokens":4,)"
            R"("prompt_tokens":3,"total_tokens":7}})");
}

TEST(ResponsesTest, CompletionChunk) {
  ChunkChoice c;
  c.text = " world";
  c.finish_reason = "stop";
  EXPECT_EQ(StreamChunk(Meta(Endpoint::kCompletions), c, false, std::nullopt).dump(),
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,)"
            R"("text":" world"}],"created":1700000000,"id":"cmpl-1","model":"m",)"
            R"("object":"text_completion"})");
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
}

TEST(ResponsesTest, FinalResponses) {
  ChoiceResult a;
  a.text = "x";
  a.finish_reason = "stop";
  EXPECT_EQ(FinalResponse(Meta(Endpoint::kChat), {a}, Usage{2, 1}, false, nullptr).dump(),
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,)"
            R"("message":{"content":"x","role":"assistant"}}],"created":1700000000,)"
            R"("id":"chatcmpl-1","model":"m","object":"chat.completion",)"
            R"("usage":{"completion_tokens":1,"prompt_tokens":2,"total_tokens":3}})");
  EXPECT_EQ(FinalResponse(Meta(Endpoint::kCompletions), {a}, Usage{2, 1}, false, nullptr)
                .dump(),
            R"({"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"text":"x"}],)"
            R"("created":1700000000,"id":"cmpl-1","model":"m","object":"text_completion",)"
            R"("usage":{"completion_tokens":1,"prompt_tokens":2,"total_tokens":3}})");
}

TEST(ResponsesTest, Logprobs) {
  TokenLogprob t;
  t.id = 7;
  t.logprob = -0.5f;
  t.top = {{7, -0.5f}, {8, -INFINITY}};
  int64_t offset = 3;
  EXPECT_EQ(CompletionLogprobs({t, t}, nullptr, &offset).dump(),
            R"({"text_offset":[3,13],"token_logprobs":[-0.5,-0.5],)"
            R"("tokens":["token_id:7","token_id:7"],)"
            R"("top_logprobs":[{"token_id:7":-0.5,"token_id:8":-9999.0},)"
            R"({"token_id:7":-0.5,"token_id:8":-9999.0}]})");
  EXPECT_EQ(offset, 23);
  t.top.resize(1);
  EXPECT_EQ(ChatLogprobs({t}, nullptr).dump(),
            R"({"content":[{"bytes":[116,111,107,101,110,95,105,100,58,55],"logprob":-0.5,)"
            R"("token":"token_id:7","top_logprobs":[{"bytes":[116,111,107,101,110,95,105,)"
            R"(100,58,55],"logprob":-0.5,"token":"token_id:7"}]}]})");
}

TEST(ResponsesTest, InvalidUtf8IsReplaced) {
  EXPECT_EQ(DumpJson(json{{"t", std::string("a\xff")}}), "{\"t\":\"a\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace peng::server
