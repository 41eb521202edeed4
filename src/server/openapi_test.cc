#include "server/openapi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "server/protocol.h"
#include "server/responses.h"

// The OpenAPI document against the code it describes: it parses, every $ref resolves, the
// limits it states are protocol.h's, and the objects responses.cc / ApiError write have the
// fields it marks required (and nothing it does not know of). tests/e2e/test_schemathesis.py
// checks it against a live server.
namespace peng::server {
namespace {

using nlohmann::json;

json Spec() {
  json doc = json::parse(OpenApiJson(), nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded());
  return doc;
}

const json& Schema(const json& doc, const std::string& name) {
  return doc.at("components").at("schemas").at(name);
}

// The property schema of `field` in a request schema (allOf of the shared fields and the
// route's own).
const json& RequestField(const json& doc, const std::string& request, const std::string& field) {
  const std::string kPrefix = "#/components/schemas/";
  for (const json& part : Schema(doc, request).at("allOf")) {
    const json& s = part.contains("$ref")
                        ? Schema(doc, part["$ref"].get<std::string>().substr(kPrefix.size()))
                        : part;
    if (s.at("properties").contains(field)) return s["properties"][field];
  }
  ADD_FAILURE() << request << " has no field " << field;
  static const json kNone;
  return kNone;
}

// The fields of `object` match the schema's properties: every required one present, no
// unknown one.
// Properties and required names of an object schema, through allOf and component $refs.
void CollectShape(const json& doc, const json& s, std::set<std::string>* props,
                  std::set<std::string>* required) {
  if (s.contains("$ref")) {
    const std::string ref = s.at("$ref");
    return CollectShape(doc, Schema(doc, ref.substr(ref.rfind('/') + 1)), props, required);
  }
  const json all_of = s.value("allOf", json::array());
  const json properties = s.value("properties", json::object());
  const json req = s.value("required", json::array());
  for (const json& part : all_of) CollectShape(doc, part, props, required);
  for (const auto& [k, v] : properties.items()) props->insert(k);
  for (const json& r : req) required->insert(r.get<std::string>());
}

void ExpectShape(const json& doc, const std::string& schema_name, const json& object) {
  std::set<std::string> props, required;
  CollectShape(doc, Schema(doc, schema_name), &props, &required);
  ASSERT_FALSE(props.empty()) << schema_name << " documents no properties";
  for (const std::string& r : required) {
    EXPECT_TRUE(object.contains(r)) << schema_name << " needs " << r;
  }
  for (const auto& [k, v] : object.items()) {
    EXPECT_TRUE(props.count(k)) << schema_name << " does not document " << k;
  }
}

TEST(OpenApiTest, ParsesAndIsOpenApi303) {
  const json doc = Spec();
  EXPECT_EQ(doc.at("openapi"), "3.0.3");
  EXPECT_TRUE(doc.at("info").contains("title"));
  EXPECT_TRUE(doc.at("components").at("securitySchemes").contains("bearer"));
}

TEST(OpenApiTest, DocumentsEveryRoute) {
  const json doc = Spec();
  std::set<std::string> routes;
  for (const auto& [path, ops] : doc.at("paths").items()) {
    for (const auto& [method, op] : ops.items()) routes.insert(method + " " + path);
  }
  EXPECT_EQ(routes, (std::set<std::string>{"post /v1/completions", "post /v1/chat/completions",
                                           "get /v1/models", "get /health", "get /metrics",
                                           "get /openapi.json"}));
}

TEST(OpenApiTest, EveryRefResolves) {
  const json doc = Spec();
  int refs = 0;
  std::function<void(const json&)> walk = [&](const json& j) {
    if (j.is_object()) {
      if (auto it = j.find("$ref"); it != j.end()) {
        ++refs;
        const std::string ref = *it;
        ASSERT_EQ(ref.rfind("#/", 0), 0u) << ref;
        EXPECT_TRUE(doc.contains(json::json_pointer(ref.substr(1)))) << ref;
      }
      for (const auto& [k, v] : j.items()) walk(v);
    } else if (j.is_array()) {
      for (const json& v : j) walk(v);
    }
  };
  walk(doc);
  EXPECT_GT(refs, 20);
}

TEST(OpenApiTest, LimitsAreProtocolLimits) {
  const json doc = Spec();
  const json& stop = Schema(doc, "StopField").at("anyOf");
  EXPECT_EQ(stop[0].at("maxLength"), kMaxStopStringBytes);
  EXPECT_EQ(stop[1].at("maxItems"), kMaxStopStrings);
  EXPECT_EQ(RequestField(doc, "CompletionRequest", "stop_token_ids").at("maxItems"),
            kMaxStopTokenIds);
  const json& prompt = RequestField(doc, "CompletionRequest", "prompt").at("anyOf");
  EXPECT_EQ(prompt[1].at("maxItems"), kMaxPrompts);
  EXPECT_EQ(prompt[3].at("maxItems"), kMaxPrompts);
  EXPECT_EQ(RequestField(doc, "ChatCompletionRequest", "messages").at("maxItems"), kMaxMessages);
  EXPECT_EQ(RequestField(doc, "ChatCompletionRequest", "n").at("maximum"), 128);
  EXPECT_EQ(RequestField(doc, "CompletionRequest", "logprobs").at("maximum"), 20);
  EXPECT_EQ(RequestField(doc, "ChatCompletionRequest", "top_logprobs").at("maximum"), 20);
  EXPECT_EQ(RequestField(doc, "CompletionRequest", "temperature").at("maximum"), 2);
}

// The limits in the document are the ones the parser enforces: at the bound is accepted,
// one past it is a 400 naming the field.
TEST(OpenApiTest, ParserAgreesAtTheBounds) {
  auto parse = [](json body, Endpoint ep) {
    ParsedRequest req;
    return ParseRequest(body, ep, &req);
  };
  const json base = {{"prompt", "x"}};
  auto with = [&](const char* k, json v) {
    json b = base;
    b[k] = std::move(v);
    return b;
  };
  EXPECT_FALSE(parse(with("n", 128), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("n", 129), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("logprobs", 20), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("logprobs", 21), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("temperature", 2), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("temperature", 2.5), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("top_p", 1), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("top_p", 0), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("seed", -1), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("seed", -2), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("max_tokens", 1), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("max_tokens", 0), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("stop", json::array({"a"})), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("stop", json(std::vector<std::string>(kMaxStopStrings + 1, "a"))),
                    Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("frequency_penalty", -2), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("frequency_penalty", -2.5), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("top_k", -1), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("top_k", -2), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("min_p", 1), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("min_p", 1.5), Endpoint::kCompletions));
  EXPECT_FALSE(parse(with("repetition_penalty", 0.01), Endpoint::kCompletions));
  EXPECT_TRUE(parse(with("repetition_penalty", 0.001), Endpoint::kCompletions));
  json chat = {{"messages", json::array({{{"role", "user"}, {"content", nullptr}}})}};
  EXPECT_FALSE(parse(chat, Endpoint::kChat));
  chat["top_logprobs"] = 21;
  chat["logprobs"] = true;
  EXPECT_TRUE(parse(chat, Endpoint::kChat));
}

TEST(OpenApiTest, ResponseObjectsMatchTheirSchemas) {
  const json doc = Spec();
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
    const bool chat = ep == Endpoint::kChat;
    ResponseMeta meta;
    meta.endpoint = ep;
    meta.id = NewResponseId(ep);
    meta.created = 1700000000;
    meta.model = "m";
    ChoiceResult c;
    c.text = "hi";
    c.finish_reason = "length";
    TokenLogprob lp;
    lp.id = 1;
    lp.logprob = -0.5f;
    lp.top = {{1, -0.5f}, {2, -1.5f}};
    lp.text = "hi";
    c.logprobs = {lp};
    const json full = FinalResponse(meta, {c}, Usage{3, 1}, /*with_logprobs=*/true, nullptr);
    ExpectShape(doc, chat ? "ChatCompletionResponse" : "CompletionResponse", full);
    ExpectShape(doc, chat ? "ChatCompletionChoice" : "CompletionChoice", full["choices"][0]);
    ExpectShape(doc, "Usage", full["usage"]);
    if (chat) {
      ExpectShape(doc, "ChatMessageOut", full["choices"][0]["message"]);
      ExpectShape(doc, "ChatLogprobs", full["choices"][0]["logprobs"]);
      ExpectShape(doc, "ChatTokenLogprob", full["choices"][0]["logprobs"]["content"][0]);
      ExpectShape(doc, "ChatTopLogprob",
                  full["choices"][0]["logprobs"]["content"][0]["top_logprobs"][0]);
    } else {
      ExpectShape(doc, "CompletionLogprobs", full["choices"][0]["logprobs"]);
    }
    ChunkChoice cc;
    cc.text = "x";
    cc.role = chat;
    cc.finish_reason = "stop";
    ExpectShape(doc, chat ? "ChatCompletionChunk" : "CompletionChunk",
                StreamChunk(meta, cc, /*include_usage_field=*/true, Usage{1, 1}));
    ExpectShape(doc, chat ? "ChatCompletionChunk" : "CompletionChunk",
                UsageChunk(meta, Usage{1, 1}));
  }
  ApiError e = BadRequest("bad", "temperature", "invalid_value");
  ExpectShape(doc, "ErrorResponse", e.ToJson());
  ExpectShape(doc, "Error", e.ToJson()["error"]);
  ExpectShape(doc, "Error", BadRequest("bad").ToJson()["error"]);
}

// Tool calling: the request fields' limits, and the message / delta with tool calls.
TEST(OpenApiTest, ToolCallShapes) {
  const json doc = Spec();
  EXPECT_EQ(RequestField(doc, "ChatCompletionRequest", "tools").at("maxItems"), kMaxTools);
  EXPECT_EQ(Schema(doc, "Tool").at("properties").at("function").at("properties").at("name").at(
                "pattern"),
            "^[a-zA-Z0-9_-]{1,64}$");
  ResponseMeta meta;
  meta.endpoint = Endpoint::kChat;
  meta.id = NewResponseId(Endpoint::kChat);
  meta.model = "m";
  const ToolCall call{NewToolCallId(), "get_time", "{}"};
  ChoiceResult c;
  c.finish_reason = "tool_calls";
  c.tool_calls = json::array({call.ToJson()});
  const json full = FinalResponse(meta, {c}, Usage{3, 1}, false, nullptr);
  const json& message = full["choices"][0]["message"];
  ExpectShape(doc, "ChatMessageOut", message);
  EXPECT_TRUE(message["content"].is_null());
  ExpectShape(doc, "ToolCallOut", message["tool_calls"][0]);
  ExpectShape(doc, "ChatCompletionChoice", full["choices"][0]);
  const json& finish = Schema(doc, "FinishReason").at("enum");
  EXPECT_NE(std::find(finish.begin(), finish.end(), "tool_calls"), finish.end());
  ChunkChoice cc;
  cc.tool_calls = json::array({call.ToDeltaJson(0)});
  const json chunk = StreamChunk(meta, cc, false, std::nullopt);
  ExpectShape(doc, "ChatCompletionChunk", chunk);
  ExpectShape(doc, "ToolCallDelta", chunk["choices"][0]["delta"]["tool_calls"][0]);
}

}  // namespace
}  // namespace peng::server
