// Tool calling (tool_calls.h): request validation (exact error objects), the per-family output
// parsers, the streaming parser against the full one, the forced-call grammars, the response
// shapes, and tool round trips through real chat templates.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "grammar/grammar.h"
#include "server/protocol.h"
#include "server/responses.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace peng::server {
namespace {

using nlohmann::json;

const json kWeatherTool = json::parse(R"({
  "type": "function",
  "function": {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
      },
      "required": ["city"]
    }
  }
})");

const json kTimeTool = json::parse(R"({
  "type": "function",
  "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}
})");

json ChatBody(json extra = json::object()) {
  json body = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
               {"tools", json::array({kWeatherTool, kTimeTool})}};
  for (auto& [k, v] : extra.items()) body[k] = v;
  return body;
}

// "ok" or the error object's JSON.
std::string ParseError(const json& body) {
  ParsedRequest req;
  MaybeError e = ParseRequest(body, Endpoint::kChat, &req);
  return e ? e->ToJson().dump() : "ok";
}

std::string ErrorJson(const std::string& message, const std::string& param,
                      const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", "invalid_request_error"},
                {"param", param},
                {"code", code}}}}
      .dump();
}

TEST(ToolRequestTest, AcceptsToolsAndChoices) {
  EXPECT_EQ(ParseError(ChatBody()), "ok");
  for (json choice : {json("none"), json("auto"), json("required"),
                      json::parse(R"({"type": "function", "function": {"name": "get_time"}})")}) {
    EXPECT_EQ(ParseError(ChatBody({{"tool_choice", choice}})), "ok") << choice;
  }
  ParsedRequest req;
  ASSERT_FALSE(ParseRequest(ChatBody({{"tool_choice", json::parse(
                                           R"({"type": "function",
                                               "function": {"name": "get_weather"}})")},
                                      {"parallel_tool_calls", false}}),
                            Endpoint::kChat, &req));
  EXPECT_EQ(req.tools.choice, ToolChoice::kNamed);
  EXPECT_EQ(req.tools.named, "get_weather");
  EXPECT_FALSE(req.tools.parallel);
  EXPECT_TRUE(req.tools.forced());
  ASSERT_EQ(req.tools.specs.size(), 2u);
  EXPECT_EQ(req.tools.specs[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json(req.tools.specs[1].parameters), kTimeTool["function"]["parameters"]);
  // Without tool_choice: auto with tools, none without.
  ASSERT_FALSE(ParseRequest(ChatBody(), Endpoint::kChat, &req));
  EXPECT_EQ(req.tools.choice, ToolChoice::kAuto);
  EXPECT_TRUE(req.tools.parse_output());
  json no_tools = ChatBody();
  no_tools.erase("tools");
  ASSERT_FALSE(ParseRequest(no_tools, Endpoint::kChat, &req));
  EXPECT_FALSE(req.tools.parse_output());
  // An empty list is no tools; "none"/"auto" without tools are harmless.
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array()}, {"tool_choice", "auto"}})), "ok");
}

TEST(ToolRequestTest, ErrorsNameTheParam) {
  EXPECT_EQ(ParseError(ChatBody({{"tools", "x"}})),
            ErrorJson("Invalid type for 'tools': expected an array, but got a string instead.",
                      "tools", "invalid_type"));
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({{{"type", "retrieval"}}})}})),
            ErrorJson("tools[0].type 'retrieval' is not supported: only \"function\" tools are",
                      "tools", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({{{"type", "function"}}})}})),
            ErrorJson("tools[0].function is required", "tools", "missing_required"));
  json bad_name = kWeatherTool;
  bad_name["function"]["name"] = "get weather";
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({bad_name})}})),
            ErrorJson("tools[0].function.name 'get weather' must be 1 to 64 characters a-z, "
                      "A-Z, 0-9, '_' or '-'",
                      "tools", "invalid_value"));
  json long_name = kWeatherTool;
  long_name["function"]["name"] = std::string(65, 'a');
  EXPECT_NE(ParseError(ChatBody({{"tools", json::array({long_name})}})), "ok");
  long_name["function"]["name"] = std::string(64, 'a');
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({long_name})}})), "ok");
  json bad_params = kWeatherTool;
  bad_params["function"]["parameters"] = json::array();
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({bad_params})}})),
            ErrorJson("Invalid type for 'tools[0].function.parameters': expected an object, but "
                      "got an array instead.",
                      "tools", "invalid_type"));
  bad_params["function"]["parameters"] = {{"type", "string"}};
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({bad_params})}})),
            ErrorJson("tools[0].function.parameters must be a JSON Schema of type \"object\"",
                      "tools", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tools", json::array({kWeatherTool, kWeatherTool})}})),
            ErrorJson("tools: the function name 'get_weather' appears twice", "tools",
                      "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tool_choice", "always"}})),
            ErrorJson("Invalid value for 'tool_choice': 'always'. Expected 'none', 'auto', "
                      "'required' or a named function.",
                      "tool_choice", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tool_choice", 3}})),
            ErrorJson("Invalid type for 'tool_choice': expected a string or an object, but got "
                      "an integer instead.",
                      "tool_choice", "invalid_type"));
  EXPECT_EQ(ParseError(ChatBody({{"tool_choice", json::parse(
                                      R"({"type": "function", "function": {"name": "nope"}})")}})),
            ErrorJson("tool_choice names the function 'nope', which is not in tools",
                      "tool_choice", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tool_choice", json::parse(R"({"type": "function"})")}})),
            ErrorJson("tool_choice.function.name must be a string", "tool_choice",
                      "invalid_value"));
  json no_tools = ChatBody({{"tool_choice", "required"}});
  no_tools.erase("tools");
  EXPECT_EQ(ParseError(no_tools),
            ErrorJson("tool_choice 'required' needs tools", "tool_choice", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"parallel_tool_calls", "yes"}})),
            ErrorJson("Invalid type for 'parallel_tool_calls': expected a boolean, but got a "
                      "string instead.",
                      "parallel_tool_calls", "invalid_type"));
  EXPECT_EQ(ParseError(ChatBody({{"tool_choice", "required"},
                                 {"response_format", {{"type", "json_object"}}}})),
            ErrorJson("response_format 'json_object' cannot be combined with a forced "
                      "tool_choice",
                      "tool_choice", "invalid_value"));
  EXPECT_EQ(ParseError(ChatBody({{"tools", json(std::vector<json>(129, kTimeTool))}})),
            ErrorJson("tools has 129 entries: at most 128 are allowed", "tools",
                      "invalid_value"));
}

TEST(ToolRequestTest, ToolMessages) {
  json body = ChatBody();
  body["messages"].push_back(json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})"));
  body["messages"].push_back(
      json::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "22 C"})"));
  ParsedRequest req;
  ASSERT_FALSE(ParseRequest(body, Endpoint::kChat, &req));
  EXPECT_TRUE(req.messages[1]["content"].is_null());  // templates test `content is none`
  EXPECT_EQ(req.messages[2]["tool_call_id"], "call_1");
  // Arguments as objects for most templates, as JSON text for DeepSeek's.
  const nlohmann::ordered_json as_objects = MessagesForTemplate(req.messages, true);
  EXPECT_EQ(as_objects[1]["tool_calls"][0]["function"]["arguments"].dump(), "{\"city\":\"Paris\"}");
  // Argument objects keep the key order of their JSON text.
  json reordered = req.messages;
  reordered[1]["tool_calls"][0]["function"]["arguments"] = "{\"z\": 1, \"a\": 2}";
  EXPECT_EQ(MessagesForTemplate(reordered, true)[1]["tool_calls"][0]["function"]["arguments"].dump(),
            "{\"z\":1,\"a\":2}");
  // A template without tool support gets "" for the null content.
  EXPECT_TRUE(MessagesForChatTemplate(req.messages, "{{ messages[1].tool_calls }}")[1]["content"]
                  .is_null());
  EXPECT_EQ(MessagesForChatTemplate(req.messages, "{{ messages }}")[1]["content"], "");
  const nlohmann::ordered_json as_text = MessagesForTemplate(req.messages, false);
  EXPECT_EQ(as_text[1]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");

  json bad = body;
  bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{city: Paris}";
  EXPECT_EQ(ParseError(bad), ErrorJson("messages[1].tool_calls[0].function.arguments is not "
                                       "valid JSON",
                                       "messages", "invalid_value"));
  bad = body;
  bad["messages"][1]["tool_calls"] = "get_weather";
  EXPECT_EQ(ParseError(bad), ErrorJson("Invalid type for 'messages[1].tool_calls': expected an "
                                       "array, but got a string instead.",
                                       "messages", "invalid_type"));
  bad = body;
  bad["messages"][1]["tool_calls"][0].erase("function");
  EXPECT_EQ(ParseError(bad), ErrorJson("messages[1].tool_calls[0].function must be an object",
                                       "messages", "invalid_value"));
  bad = body;
  bad["messages"][2]["tool_call_id"] = 7;
  EXPECT_EQ(ParseError(bad), ErrorJson("Invalid type for 'messages[2].tool_call_id': expected a "
                                       "string, but got an integer instead.",
                                       "messages", "invalid_type"));
}

TEST(ToolFormatTest, NamesAndDetection) {
  EXPECT_EQ(*ParseToolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*ParseToolCallFormat("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ParseToolCallFormat("deepseek_v3"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(*ParseToolCallFormat("none"), ToolCallFormat::kNone);
  EXPECT_EQ(*ParseToolCallFormat("auto"), ToolCallFormat::kAuto);
  EXPECT_FALSE(ParseToolCallFormat("mistral").ok());
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kLlama3Json), "llama3_json");
  auto read = [](const std::string& name) {
    std::ifstream f(std::string(PENG_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(DetectToolCallFormat(read("qwen2_5_coder.jinja")), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat(read("llama3.jinja")), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat(read("deepseek_v2_5.jinja")), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolCallFormat(read("smollm2.jinja")), ToolCallFormat::kNone);
  EXPECT_EQ(DetectToolCallFormat(read("chatml.jinja")), ToolCallFormat::kNone);
  EXPECT_FALSE(TemplateWantsArgumentObjects(read("deepseek_v2_5.jinja")));
  EXPECT_TRUE(TemplateWantsArgumentObjects(read("llama3.jinja")));
}

// Calls without their random ids: [[name, arguments], ...].
json Calls(const ParsedToolOutput& p) {
  json out = json::array();
  for (const ToolCall& c : p.calls) {
    EXPECT_TRUE(std::regex_match(c.id, std::regex("call_[A-Za-z0-9]{24}"))) << c.id;
    out.push_back({c.name, c.arguments});
  }
  return out;
}

struct ParseCase {
  ToolCallFormat format;
  std::string text;
  std::string content;
  json calls;  // [[name, arguments]]
  std::vector<std::string> names = {};  // the request's tools (hermes' untagged calls)
};

const std::string kDsCalls = "<｜tool▁calls▁begin｜>";
const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kDsCall = "<｜tool▁call▁begin｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsSep = "<｜tool▁sep｜>";

std::vector<ParseCase> Cases() {
  const auto H = ToolCallFormat::kHermes;
  const auto L = ToolCallFormat::kLlama3Json;
  const auto D = ToolCallFormat::kDeepSeekV3;
  const std::string ds1 = kDsCall + "function" + kDsSep +
                          "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + kDsCallEnd;
  const std::string ds2 = kDsCall + "function" + kDsSep +
                          "get_time\n```json\n{}\n```" + kDsCallEnd;
  return {
      // Hermes / Qwen2.5
      {H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "", json::parse(R"([["get_weather", "{\"city\":\"Paris\"}"]])")},
      {H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n"
          "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       "", json::parse(R"([["get_weather", "{\"city\":\"Paris\",\"unit\":\"celsius\"}"], ["get_time", "{}"]])")},
      {H, "Let me check.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       "Let me check.", json::parse(R"([["get_time", "{}"]])")},
      {H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich 東京 🌧\"}}\n</tool_call>",
       "", json::parse(R"([["get_weather", "{\"city\":\"Zürich 東京 🌧\"}"]])")},
      {H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>", json::array()},
      {H, "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       json::array()},
      {H, "a < b and <tool_ca", "a < b and <tool_ca", json::array()},
      {H, "Plain answer.\n", "Plain answer.\n", json::array()},
      {H, "  \n", "  \n", json::array()},
      // An unclosed last call still counts; an unknown name is kept.
      {H, "<tool_call>\n{\"name\": \"launch\", \"arguments\": {\"n\": 1}}", "",
       json::parse(R"([["launch", "{\"n\":1}"]])")},
      // A bad call between good ones stays content.
      {H, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n<tool_call>oops</tool_call>\nDone.",
       "<tool_call>oops</tool_call>\nDone.", json::parse(R"([["get_time", "{}"]])")},
      // Untagged hermes calls (small Qwen models) count when they name declared tools.
      {H, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "",
       json::parse(R"([["get_weather", "{\"city\":\"Paris\"}"]])"), {"get_weather", "get_time"}},
      {H, " {\"name\": \"get_time\", \"arguments\": {}}; {\"name\": \"get_time\", \"arguments\": {}}\n", "",
       json::parse(R"([["get_time", "{}"], ["get_time", "{}"]])"), {"get_weather", "get_time"}},
      {H, "{\"name\": \"rm_rf\", \"arguments\": {}}", "{\"name\": \"rm_rf\", \"arguments\": {}}",
       json::array(), {"get_weather", "get_time"}},
      {H, "{\"name\": \"get_time\", \"arguments\": {}}", "{\"name\": \"get_time\", \"arguments\": {}}",
       json::array()},
      {H, "{\"a\": 1} <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", "{\"a\": 1}",
       json::parse(R"([["get_time", "{}"]])"), {"get_weather", "get_time"}},
      {H, "```json\n{\n  \"name\": \"get_time\",\n  \"arguments\": {}\n}\n```", "",
       json::parse(R"([["get_time", "{}"]])"), {"get_time"}},
      {H, "```json\n{\"a\": 1}\n```", "```json\n{\"a\": 1}\n```", json::array(), {"get_time"}},
      {H, "```python\nprint(1)\n```", "```python\nprint(1)\n```", json::array(), {"get_time"}},
      {H, "Hi {\"name\": \"get_time\", \"arguments\": {}}", "Hi {\"name\": \"get_time\", \"arguments\": {}}",
       json::array(), {"get_time"}},
      // Calls nested deeper than 64 levels stay content.
      {H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(70, '[') +
              std::string(70, ']') + "}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(70, '[') +
           std::string(70, ']') + "}}\n</tool_call>",
       json::array()},
      {H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"[[[[\" }}\n</tool_call>", "",
       json::parse(R"([["f", "{\"a\":\"[[[[\"}"]])")},
      // Llama 3.x JSON
      {L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "",
       json::parse(R"([["get_weather", "{\"city\":\"Paris\"}"]])")},
      {L, "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", "",
       json::parse(R"([["get_time", "{}"]])")},
      {L, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
       "", json::parse(R"([["get_weather", "{\"city\":\"Oslo\"}"], ["get_time", "{}"]])")},
      {L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}} and more", 
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}} and more", json::array()},
      {L, "The weather is {sunny}.", "The weather is {sunny}.", json::array()},
      {L, "{\"city\": \"Paris\"}", "{\"city\": \"Paris\"}", json::array()},
      {L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Kraków\"}}", "",
       json::parse(R"([["get_weather", "{\"city\":\"Kraków\"}"]])")},
      // DeepSeek V2.5 / V3 (and V3.1's shorter form)
      {D, kDsCalls + ds1 + kDsCallsEnd, "", json::parse(R"([["get_weather", "{\"city\":\"Paris\"}"]])")},
      {D, "Checking." + kDsCalls + ds1 + "\n" + ds2 + kDsCallsEnd, "Checking.",
       json::parse(R"([["get_weather", "{\"city\":\"Paris\"}"], ["get_time", "{}"]])")},
      {D, kDsCalls + kDsCall + "get_weather" + kDsSep + "{\"city\": \"Lyon\"}" + kDsCallEnd + kDsCallsEnd, "",
       json::parse(R"([["get_weather", "{\"city\":\"Lyon\"}"]])")},
      {D, kDsCalls + kDsCall + "function" + kDsSep + "get_weather\n```json\n{bad\n```" + kDsCallEnd + kDsCallsEnd,
       kDsCall + "function" + kDsSep + "get_weather\n```json\n{bad\n```" + kDsCallEnd, json::array()},
      {D, "No tools needed.", "No tools needed.", json::array()},
      // kNone: everything is content.
      {ToolCallFormat::kNone, "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call>", json::array()},
  };
}

TEST(ToolParserTest, FullText) {
  for (const ParseCase& c : Cases()) {
    SCOPED_TRACE(std::string(ToolCallFormatName(c.format)) + ": " + c.text);
    const ParsedToolOutput p = ParseToolCalls(c.text, c.format, c.names);
    EXPECT_EQ(p.content, c.content);
    EXPECT_EQ(Calls(p), c.calls);
  }
}

// Fed one byte at a time (and in 3-byte pieces), the streaming parser gives the same content
// and calls; a call comes out once complete, and content never includes a marker's start.
TEST(ToolParserTest, StreamingMatchesFullText) {
  for (const ParseCase& c : Cases()) {
    for (size_t step : {size_t{1}, size_t{3}, size_t{7}}) {
      SCOPED_TRACE(std::string(ToolCallFormatName(c.format)) + " step " + std::to_string(step) +
                   ": " + c.text);
      ToolCallStreamParser s(c.format, c.names);
      ParsedToolOutput all;
      for (size_t i = 0; i < c.text.size(); i += step) {
        ParsedToolOutput d = s.Push(std::string_view(c.text).substr(i, step));
        all.content += d.content;
        for (ToolCall& call : d.calls) all.calls.push_back(std::move(call));
        EXPECT_EQ(all.content, c.content.substr(0, all.content.size()))
            << "streamed content is not a prefix of the final content";
      }
      ParsedToolOutput d = s.Finish();
      all.content += d.content;
      for (ToolCall& call : d.calls) all.calls.push_back(std::move(call));
      EXPECT_EQ(all.content, c.content);
      EXPECT_EQ(Calls(all), c.calls);
      EXPECT_EQ(s.calls(), static_cast<int>(c.calls.size()));
    }
  }
}

TEST(ToolParserTest, StreamingEmitsACallAsSoonAsItCloses) {
  ToolCallStreamParser s(ToolCallFormat::kHermes);
  EXPECT_EQ(s.Push("Sure").content, "Sure");
  EXPECT_EQ(s.Push(". <tool").content, ".");  // " <tool" may open a call
  ParsedToolOutput d = s.Push("_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call");
  EXPECT_TRUE(d.calls.empty());
  d = s.Push(">");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_time");
  EXPECT_EQ(d.calls[0].ToDeltaJson(0).dump().find("{\"function\":{\"arguments\":\"{}\","
                                                  "\"name\":\"get_time\"},\"id\":\"call_"),
            0u);
  EXPECT_EQ(s.Finish().content, "");
}

TEST(ToolParserTest, CallJsonShapes) {
  ToolCall c{"call_abc", "get_weather", "{\"city\":\"Paris\"}"};
  EXPECT_EQ(c.ToJson().dump(),
            R"({"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},)"
            R"("id":"call_abc","type":"function"})");
  EXPECT_EQ(c.ToDeltaJson(2).dump(),
            R"({"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},)"
            R"("id":"call_abc","index":2,"type":"function"})");
  EXPECT_NE(NewToolCallId(), NewToolCallId());
}

TEST(ToolResponseTest, MessageAndChunkShapes) {
  ResponseMeta meta;
  meta.endpoint = Endpoint::kChat;
  meta.id = "chatcmpl-x";
  meta.created = 1;
  meta.model = "m";
  ChoiceResult r;
  r.finish_reason = "tool_calls";
  r.tool_calls = json::array({ToolCall{"call_1", "get_time", "{}"}.ToJson()});
  json full = FinalResponse(meta, {r}, Usage{1, 2}, false, nullptr);
  EXPECT_EQ(full["choices"][0].dump(),
            R"({"finish_reason":"tool_calls","index":0,"logprobs":null,"message":{"content":null,)"
            R"("role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"get_time"},)"
            R"("id":"call_1","type":"function"}]}})");
  r.text = "Checking.";
  full = FinalResponse(meta, {r}, Usage{1, 2}, false, nullptr);
  EXPECT_EQ(full["choices"][0]["message"]["content"], "Checking.");
  r.tool_calls = nullptr;  // no calls: as before
  r.finish_reason = "stop";
  full = FinalResponse(meta, {r}, Usage{1, 2}, false, nullptr);
  EXPECT_EQ(full["choices"][0]["message"].dump(), R"({"content":"Checking.","role":"assistant"})");

  ChunkChoice cc;
  cc.tool_calls = json::array({ToolCall{"call_1", "get_time", "{}"}.ToDeltaJson(0)});
  EXPECT_EQ(StreamChunk(meta, cc, false, std::nullopt)["choices"][0].dump(),
            R"({"delta":{"tool_calls":[{"function":{"arguments":"{}","name":"get_time"},)"
            R"("id":"call_1","index":0,"type":"function"}]},"finish_reason":null,"index":0,)"
            R"("logprobs":null})");
  cc.tool_calls = nullptr;
  cc.finish_reason = "tool_calls";
  EXPECT_EQ(StreamChunk(meta, cc, false, std::nullopt)["choices"][0].dump(),
            R"({"delta":{},"finish_reason":"tool_calls","index":0,"logprobs":null})");
}

ToolRequest Forced(ToolChoice choice, bool parallel) {
  ToolRequest r;
  json body = ChatBody({{"parallel_tool_calls", parallel}});
  if (choice == ToolChoice::kRequired) body["tool_choice"] = "required";
  if (choice == ToolChoice::kNamed) {
    body["tool_choice"] = json::parse(R"({"type": "function", "function": {"name": "get_weather"}})");
  }
  EXPECT_FALSE(ParseToolFields(body, &r));
  return r;
}

// The grammar of a forced call accepts the family's call text for the allowed tools (with
// arguments that follow the schema) and nothing else.
TEST(ToolGrammarTest, ForcedCallGrammars) {
  struct Case {
    ToolCallFormat format;
    std::string weather, time, sep;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", "\n"},
      {ToolCallFormat::kLlama3Json,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       "{\"name\": \"get_time\", \"parameters\": {}}", "; "},
      {ToolCallFormat::kDeepSeekV3,
       kDsCall + "function" + kDsSep + "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + kDsCallEnd,
       kDsCall + "function" + kDsSep + "get_time\n```json\n{}\n```" + kDsCallEnd, "\n"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(ToolCallFormatName(c.format));
    const bool ds = c.format == ToolCallFormat::kDeepSeekV3;
    auto wrap = [&](const std::string& s) { return ds ? kDsCalls + s + kDsCallsEnd : s; };
    for (bool parallel : {true, false}) {
      StatusOr<std::string> g = ToolCallGrammar(Forced(ToolChoice::kRequired, parallel), c.format);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      StatusOr<grammar::Grammar> gr = grammar::Grammar::ParseGbnf(*g);
      if (!gr.ok() && gr.status().code() == StatusCode::kUnimplemented) {
        GTEST_SKIP() << "Grammar::ParseGbnf not implemented yet";
      }
      ASSERT_TRUE(gr.ok()) << gr.status().ToString() << "\n" << *g;
      EXPECT_TRUE(gr->Matches(wrap(c.weather), true)) << *g;
      EXPECT_TRUE(gr->Matches(wrap(c.time), true));
      EXPECT_EQ(gr->Matches(wrap(c.weather + c.sep + c.time), true), parallel);
      std::string wrong = c.weather;
      wrong.replace(wrong.find("get_weather"), 11, "get_wether");
      EXPECT_FALSE(gr->Matches(wrap(wrong), true));
      std::string bad_args = c.weather;
      bad_args.replace(bad_args.find("\"city\""), 6, "\"town\"");
      EXPECT_FALSE(gr->Matches(wrap(bad_args), true));
      EXPECT_FALSE(gr->Matches("Sure! " + wrap(c.time), true));
      EXPECT_FALSE(gr->Matches(wrap(c.weather).substr(0, 20), true));
      EXPECT_TRUE(gr->Matches(wrap(c.weather).substr(0, 20), false));
      // The grammar's text parses back into the calls.
      const ParsedToolOutput p = ParseToolCalls(wrap(c.weather), c.format);
      ASSERT_EQ(p.calls.size(), 1u);
      EXPECT_EQ(p.calls[0].arguments, "{\"city\":\"Paris\"}");
    }
    StatusOr<std::string> g = ToolCallGrammar(Forced(ToolChoice::kNamed, true), c.format);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    StatusOr<grammar::Grammar> gr = grammar::Grammar::ParseGbnf(*g);
    ASSERT_TRUE(gr.ok()) << gr.status().ToString();
    EXPECT_TRUE(gr->Matches(wrap(c.weather), true));
    EXPECT_FALSE(gr->Matches(wrap(c.time), true));  // only the named function
  }
}

TEST(ToolGrammarTest, UnsupportedSchemaNamesTheTool) {
  ToolRequest r = Forced(ToolChoice::kRequired, true);
  r.specs[0].parameters = {{"type", "object"}, {"patternProperties", {{"^x", {{"type", "string"}}}}}};
  StatusOr<std::string> g = ToolCallGrammar(r, ToolCallFormat::kHermes);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tools[0] ('get_weather')"), std::string::npos)
      << g.status().message();
}

// A tool round trip through the real Qwen2.5 template: the tool definitions in the system
// prompt, the assistant's call as <tool_call> JSON, the result as <tool_response>.
TEST(ToolTemplateTest, QwenRoundTrip) {
  const std::string path =
      std::string(PENG_SOURCE_DIR) + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::ForModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  json body = ChatBody({{"tool_choice", "required"}});
  body["messages"].push_back(json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})"));
  body["messages"].push_back(
      json::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"})"));
  ParsedRequest req;
  ASSERT_FALSE(ParseRequest(body, Endpoint::kChat, &req));
  // As the server does: the tools in the client's key order.
  req.tools.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
      "name": "get_weather", "description": "Current weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  PromptLimits limits{4096, (*tok)->vocab_size()};
  MaybeError e = PreparePrompts(&req, tok->get(), limits);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(req.tool_format, ToolCallFormat::kHermes);
  EXPECT_EQ(req.grammar_param, "tools");
  EXPECT_NE(req.grammar.find("get_weather"), std::string::npos);
  const std::string prompt = (*tok)->Decode(req.prompts[0]);
  EXPECT_NE(prompt.find("# Tools"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
                        "\"description\": \"Current weather in a city\", \"parameters\": {\"type\": "
                        "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response>"
                        "<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
  // The call marker is an ordinary (not control) token, so a grammar can produce it.
  const int32_t id = (*tok)->FindPiece("<tool_call>");
  ASSERT_GE(id, 0);
  EXPECT_FALSE((*tok)->IsControl(id));
  EXPECT_EQ((*tok)->TokenText(id), "<tool_call>");
}

// The same round trip through the Llama 3 and DeepSeek test templates: arguments as an object
// for Llama's `| tojson`, as JSON text for DeepSeek's string concatenation.
TEST(ToolTemplateTest, LlamaAndDeepSeekRoundTrips) {
  auto read = [](const std::string& name) {
    std::ifstream f(std::string(PENG_SOURCE_DIR) + "/tests/data/chat_templates/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  json body = ChatBody();
  body["messages"].push_back(json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]})"));
  body["messages"].push_back(
      json::parse(R"({"role": "tool", "tool_call_id": "call_1", "content": "22 C"})"));
  ParsedRequest req;
  ASSERT_FALSE(ParseRequest(body, Endpoint::kChat, &req));
  json extra = {{"tools", req.tools.tools}};

  const std::string llama = read("llama3.jinja");
  StatusOr<std::string> out = ApplyChatTemplate(
      llama, MessagesForTemplate(req.messages, TemplateWantsArgumentObjects(llama)), true, "", "",
      extra);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_NE(out->find("\"name\": \"get_weather\""), std::string::npos) << *out;
  EXPECT_NE(out->find("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
            std::string::npos)
      << *out;
  EXPECT_NE(out->find("<|start_header_id|>ipython<|end_header_id|>\n\n22 C<|eot_id|>"),
            std::string::npos)
      << *out;

  const std::string ds = read("deepseek_v2_5.jinja");
  out = ApplyChatTemplate(ds, MessagesForTemplate(req.messages, TemplateWantsArgumentObjects(ds)),
                          true, "", "", extra);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_NE(out->find(kDsCalls + kDsCall + "function" + kDsSep +
                      "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + kDsCallEnd +
                      kDsCallsEnd),
            std::string::npos)
      << *out;
  EXPECT_NE(out->find("<｜tool▁output▁begin｜>22 C<｜tool▁output▁end｜>"), std::string::npos)
      << *out;
}

}  // namespace
}  // namespace peng::server
