#include "server/protocol.h"

#include <gtest/gtest.h>

#include "grammar/gbnf_builder.h"

namespace peng::server {
namespace {

using nlohmann::json;

std::string ParseError(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  ParsedRequest req;
  MaybeError e = ParseRequest(json::parse(body), ep, &req);
  return e ? e->ToJson().dump() : "ok";
}

TEST(ProtocolTest, WrongTypeIsInvalidType) {
  EXPECT_EQ(ParseError(R"({"prompt": [1], "temperature": "hot"})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'temperature': )"
            R"(expected a number, but got a string instead.","param":"temperature",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "max_tokens": 2.5})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'max_tokens': )"
            R"(expected an integer, but got a decimal instead.","param":"max_tokens",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "stream": 1})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'stream': )"
            R"(expected a boolean, but got an integer instead.","param":"stream",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": {"a": 1}})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'prompt': )"
            R"(expected a string, an array of strings or token ids, but got an object )"
            R"(instead.","param":"prompt","type":"invalid_request_error"}})");
}

TEST(ProtocolTest, OutOfRangeUsesValidateMessage) {
  EXPECT_EQ(ParseError(R"({"prompt": [1], "top_p": 1.5})"),
            R"({"error":{"code":"invalid_value","message":"top_p = 1.500000: must be in )"
            R"((0, 1]","param":"top_p","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "n": 0})"),
            R"({"error":{"code":"invalid_value","message":"n = 0: must be in [1, 128]",)"
            R"("param":"n","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "max_tokens": 0})"),
            R"({"error":{"code":"invalid_value","message":"max_tokens = 0: must be >= 1",)"
            R"("param":"max_tokens","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logprobs": 21})"),
            R"({"error":{"code":"invalid_value","message":"logprobs = 21: must be in [0, 20]",)"
            R"("param":"logprobs","type":"invalid_request_error"}})");
}

ParsedRequest Parsed(const std::string& body, Endpoint ep = Endpoint::kCompletions) {
  ParsedRequest req;
  MaybeError e = ParseRequest(json::parse(body), ep, &req);
  EXPECT_FALSE(e) << e->ToJson().dump();
  return req;
}

TEST(ProtocolTest, LogitBias) {
  ParsedRequest r = Parsed(R"({"prompt": [1], "logit_bias": {"50": -100, "7": 2.5}})");
  using Bias = std::vector<std::pair<int32_t, float>>;
  EXPECT_EQ(r.params.logit_bias, (Bias{{7, 2.5f}, {50, -100.0f}}));
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logit_bias": {"x": 1}})"),
            R"({"error":{"code":"invalid_value","message":"logit_bias key 'x' is not a token )"
            R"(id","param":"logit_bias","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logit_bias": {"-3": 1}})"),
            R"({"error":{"code":"invalid_value","message":"logit_bias key '-3' is not a token )"
            R"(id","param":"logit_bias","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logit_bias": {"3": 101}})"),
            R"({"error":{"code":"invalid_value","message":"logit_bias[3] = 101: must be in )"
            R"([-100, 100]","param":"logit_bias","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logit_bias": {"3": "a"}})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'logit_bias': )"
            R"(expected a number, but got a string instead.","param":"logit_bias",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "logit_bias": {"3": 1, "03": 1}})"),
            R"({"error":{"code":"invalid_value","message":"logit_bias names token 3 twice",)"
            R"("param":"logit_bias","type":"invalid_request_error"}})");
}

TEST(ProtocolTest, SkipSpecialTokens) {
  EXPECT_TRUE(Parsed(R"({"prompt": [1]})").params.skip_special_tokens);
  EXPECT_FALSE(Parsed(R"({"prompt": [1], "skip_special_tokens": false})")
                   .params.skip_special_tokens);
}

TEST(ProtocolTest, OutputConstraintsBecomeGrammars) {
  const char* chat = R"("messages": [{"role": "user", "content": "hi"}])";
  ParsedRequest r = Parsed(std::string("{") + chat +
                               R"(, "response_format": {"type": "json_object"}})",
                           Endpoint::kChat);
  EXPECT_EQ(r.grammar, grammar::JsonObjectGbnf());
  EXPECT_EQ(r.grammar_param, "response_format");
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                 "required": ["a"]})";
  r = Parsed(std::string("{") + chat + R"(, "response_format": {"type": "json_schema",
             "json_schema": {"name": "x", "strict": true, "schema": )" + schema + "}}}",
             Endpoint::kChat);
  EXPECT_EQ(r.grammar, *grammar::JsonSchemaToGbnf(json::parse(schema)));
  // Completions too, and vLLM's spellings (guided_json also as JSON text).
  EXPECT_EQ(Parsed(R"({"prompt": "x", "guided_json": )" + schema + "}").grammar, r.grammar);
  EXPECT_EQ(Parsed(R"({"prompt": "x", "guided_json": )" + json(schema).dump() + "}").grammar,
            r.grammar);
  EXPECT_EQ(Parsed(R"({"prompt": "x", "structured_outputs": {"json": )" + schema + "}}")
                .grammar, r.grammar);
  EXPECT_EQ(Parsed(R"({"prompt": "x", "guided_regex": "[0-9]+"})").grammar,
            *grammar::RegexToGbnf("[0-9]+"));
  EXPECT_EQ(Parsed(R"({"prompt": "x", "guided_choice": ["a", "b"]})").grammar,
            grammar::ChoiceToGbnf({"a", "b"}));
  EXPECT_EQ(Parsed(R"({"prompt": "x", "guided_grammar": "root ::= \"a\""})").grammar,
            "root ::= \"a\"");
  EXPECT_EQ(Parsed(R"({"prompt": "x", "response_format": {"type": "text"}})").grammar, "");
}

TEST(ProtocolTest, OutputConstraintErrors) {
  EXPECT_EQ(ParseError(R"({"prompt": "x", "guided_regex": "a", "guided_choice": ["a"]})"),
            R"({"error":{"code":"invalid_value","message":"only one output constraint may be )"
            R"(given, got guided_regex and guided_choice","param":"guided_choice",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "response_format": {"type": "xml"}})"),
            R"({"error":{"code":"invalid_value","message":"response_format type 'xml' is not )"
            R"x(supported (text, json_object, json_schema)","param":"response_format",)x"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "response_format": {"type": "json_schema"}})"),
            R"({"error":{"code":"invalid_value","message":"response_format.json_schema must )"
            R"(be an object with a 'schema'","param":"response_format",)"
            R"("type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": "x", "guided_choice": []})"),
            R"({"error":{"code":"invalid_type","message":"Invalid type for 'guided_choice': )"
            R"(expected a non-empty array of strings, but got an array instead.",)"
            R"("param":"guided_choice","type":"invalid_request_error"}})");
  // An unsupported schema keyword is named.
  const std::string e = ParseError(
      R"({"prompt": "x", "guided_json": {"type": "object", "patternProperties": {}}})");
  EXPECT_NE(e.find("patternProperties"), std::string::npos) << e;
  EXPECT_NE(e.find(R"("param":"guided_json")"), std::string::npos) << e;
  EXPECT_NE(ParseError(R"({"prompt": "x", "guided_json": "{not json"})")
                .find("guided_json is not valid JSON"), std::string::npos);
}

TEST(ProtocolTest, MissingAndEmptyPrompt) {
  EXPECT_EQ(ParseError(R"({"model": "m"})"),
            R"({"error":{"code":"missing_required","message":"'prompt' is a required )"
            R"(property","param":"prompt","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"prompt": []})"),
            R"({"error":{"code":"invalid_value","message":"Prompt cannot be empty",)"
            R"("param":"prompt","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"([1, 2])"),
            R"({"error":{"code":null,"message":"The request body must be a JSON object",)"
            R"("param":null,"type":"invalid_request_error"}})");
}

TEST(ProtocolTest, CompletionFieldsMapOntoSamplingParams) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({
      "model": "m", "prompt": [[1, 2], [3]], "max_tokens": 7, "temperature": 0,
      "top_p": 0.5, "top_k": 4, "min_p": 0.1, "repetition_penalty": 1.1,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 42, "n": 2,
      "stop": "x", "stop_token_ids": [9], "ignore_eos": true, "logprobs": 3,
      "stream": true, "stream_options": {"include_usage": true}, "unknown": {"a": 1}})"),
                            Endpoint::kCompletions, &r));
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{3}));
  EXPECT_EQ(r.params.max_tokens, 7);
  EXPECT_EQ(r.params.temperature, 0.0f);
  EXPECT_EQ(r.params.top_p, 0.5f);
  EXPECT_EQ(r.params.top_k, 4);
  EXPECT_FLOAT_EQ(r.params.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.params.repetition_penalty, 1.1f);
  EXPECT_EQ(r.params.presence_penalty, 0.5f);
  EXPECT_EQ(r.params.frequency_penalty, -0.5f);
  EXPECT_EQ(r.params.seed, 42);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{9});
  EXPECT_TRUE(r.params.ignore_eos);
  EXPECT_TRUE(r.params.want_logprobs);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ProtocolTest, NullMeansDefault) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(
      json::parse(R"({"prompt": "hi", "max_tokens": null, "stop": null, "seed": null})"),
      Endpoint::kCompletions, &r));
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_TRUE(r.params.stop.empty());
  EXPECT_EQ(r.params.seed, -1);
  EXPECT_TRUE(r.prompt_is_text);
  EXPECT_EQ(r.prompt_texts, std::vector<std::string>{"hi"});
}

TEST(ProtocolTest, StreamOptionsNeedStream) {
  EXPECT_EQ(ParseError(R"({"prompt": [1], "stream_options": {"include_usage": true}})"),
            R"({"error":{"code":null,"message":"stream_options is only allowed when stream )"
            R"(is true","param":"stream_options","type":"invalid_request_error"}})");
}

TEST(ProtocolTest, ChatMessagesAreFlattened) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({"messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null}],
      "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 5})"),
                            Endpoint::kChat, &r));
  EXPECT_EQ(r.messages.dump(),
            R"([{"content":"be brief","role":"system"},{"content":"a\nb","role":"user"},)"
            R"({"content":"","role":"assistant"}])");
  EXPECT_TRUE(r.params.want_logprobs);
  EXPECT_EQ(r.params.logprobs, 2);
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_TRUE(r.max_tokens_given);
}

TEST(ProtocolTest, ChatErrors) {
  EXPECT_EQ(ParseError(R"({"messages": []})", Endpoint::kChat),
            R"({"error":{"code":"invalid_value","message":"'messages' must not be empty",)"
            R"("param":"messages","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                       Endpoint::kChat),
            R"({"error":{"code":"invalid_value","message":"content part type 'image_url' is )"
            R"(not supported","param":"messages","type":"invalid_request_error"}})");
  EXPECT_EQ(ParseError(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
                       Endpoint::kChat),
            R"({"error":{"code":null,"message":"top_logprobs requires logprobs to be true",)"
            R"("param":"top_logprobs","type":"invalid_request_error"}})");
}

TEST(ProtocolTest, ChatWithoutTemplateIs400) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({"messages": [{"role": "user", "content": "x"}]})"),
                            Endpoint::kChat, &r));
  MaybeError e = PreparePrompts(&r, nullptr, PromptLimits{100, 1000});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->ToJson().dump(),
            R"({"error":{"code":null,"message":"model has no chat template","param":"messages",)"
            R"("type":"invalid_request_error"}})");
}

TEST(ProtocolTest, TextPromptWithoutTokenizerIs400) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({"prompt": "hello"})"), Endpoint::kCompletions, &r));
  MaybeError e = PreparePrompts(&r, nullptr, PromptLimits{100, 1000});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "model has no tokenizer: send the prompt as token ids");
}

TEST(ProtocolTest, ContextLengthNamesBothNumbers) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({"prompt": [1,2,3,4,5,6,7,8], "max_tokens": 5})"),
                            Endpoint::kCompletions, &r));
  MaybeError e = PreparePrompts(&r, nullptr, PromptLimits{10, 1000});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->ToJson().dump(),
            R"({"error":{"code":"context_length_exceeded","message":"This model's maximum )"
            R"(context length is 10 tokens. However, you requested 13 tokens (8 in the )"
            R"(prompt, 5 in the completion). Please reduce the length of the prompt or )"
            R"(completion.","param":"prompt","type":"invalid_request_error"}})");
}

TEST(ProtocolTest, TokenIdsOutOfVocabulary) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(json::parse(R"({"prompt": [1, 1000]})"), Endpoint::kCompletions,
                            &r));
  MaybeError e = PreparePrompts(&r, nullptr, PromptLimits{100, 1000});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->message, "Token id 1000 is out of vocabulary (vocab size 1000)");
}

TEST(ProtocolTest, ChatDefaultMaxTokensFillsTheContext) {
  ParsedRequest r;
  r.endpoint = Endpoint::kChat;
  EXPECT_FALSE(CheckPrompt({1, 2, 3}, PromptLimits{10, 100}, &r));
  EXPECT_EQ(r.params.max_tokens, 7);
}

TEST(ProtocolTest, FromStatusMapsCodes) {
  ApiError e = FromStatus(ResourceExhausted("waiting queue is full (256)"));
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.ToJson().dump(),
            R"x({"error":{"code":null,"message":"waiting queue is full (256)","param":null,)x"
            R"("type":"rate_limit_error"}})");
  e = FromStatus(InvalidArgument("seed = -5: must be >= -1 (-1 = random)"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "seed");
}

// Bounds that keep one body from costing unbounded stack, memory or time.
TEST(ProtocolTest, BodyNestingAndListSizesAreBounded) {
  nlohmann::ordered_json body;
  const std::string deep64 = std::string(63, '[') + std::string(63, ']');
  EXPECT_FALSE(ParseJsonBody("{\"a\": " + deep64 + "}", &body));
  MaybeError e = ParseJsonBody("{\"a\": " + std::string(64, '[') + std::string(64, ']') + "}",
                               &body);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->ToJson().dump(),
            R"({"error":{"code":"invalid_json","message":"The request body nests arrays/objects )"
            R"(deeper than 64 levels","param":null,"type":"invalid_request_error"}})");
  // Brackets inside strings do not count; malformed JSON is still a plain 400.
  EXPECT_FALSE(ParseJsonBody(R"({"a": ")" + std::string(1000, '[') + R"(\"]"})", &body));
  e = ParseJsonBody(std::string(100000, '['), &body);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  e = ParseJsonBody("{not json", &body);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_json");

  json many = json::array();
  for (int i = 0; i < 33; ++i) many.push_back("s" + std::to_string(i));
  EXPECT_EQ(ParseError(json{{"prompt", {1}}, {"stop", many}}.dump()),
            R"({"error":{"code":"invalid_value","message":"stop has 33 entries: at most 32 are )"
            R"(allowed","param":"stop","type":"invalid_request_error"}})");
  EXPECT_NE(ParseError(json{{"prompt", {1}}, {"stop", std::string(4097, 'x')}}.dump())
                .find("stop string of 4097 bytes"),
            std::string::npos);
  EXPECT_NE(ParseError(json{{"prompt", {1}}, {"stop_token_ids", std::vector<int>(1025, 1)}}
                           .dump())
                .find("stop_token_ids has 1025 entries"),
            std::string::npos);
  EXPECT_NE(ParseError(json{{"prompt", std::vector<std::string>(65, "a")}}.dump())
                .find("prompt has 65 entries: at most 64"),
            std::string::npos);
  json msgs = json::array();
  for (int i = 0; i < 4097; ++i) msgs.push_back({{"role", "user"}, {"content", "x"}});
  EXPECT_NE(ParseError(json{{"messages", msgs}}.dump(), Endpoint::kChat)
                .find("messages has 4097 entries"),
            std::string::npos);
}

TEST(ProtocolTest, SeedPlusNMustStayAnInt64) {
  EXPECT_EQ(ParseError(R"({"prompt": [1], "seed": 9223372036854775807, "n": 1})"), "ok");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "seed": 9223372036854775806, "n": 2})"), "ok");
  EXPECT_EQ(ParseError(R"({"prompt": [1], "seed": 9223372036854775807, "n": 2})"),
            R"({"error":{"code":"invalid_value","message":"seed = 9223372036854775807: with )"
            R"(n = 2 the seeds seed..seed+n-1 must be <= 9223372036854775807","param":"seed",)"
            R"("type":"invalid_request_error"}})");
}

TEST(ProtocolTest, ValuesThatBreakTheMathAreRejected) {
  EXPECT_NE(ParseError(R"({"prompt": [1], "repetition_penalty": 1e-30})")
                .find("repetition_penalty = 0.000000: must be in [0.01, 100]"),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"prompt": [1], "repetition_penalty": 1e300})").find("[0.01, 100]"),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"prompt": [1], "presence_penalty": 1e300})").find("[-2, 2]"),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"prompt": [1], "temperature": 1e300})").find("temperature"),
            std::string::npos);
  // A denormal temperature is accepted and samples greedily (SamplingParams::kMinTemperature).
  EXPECT_EQ(ParseError(R"({"prompt": [1], "temperature": 1e-40})"), "ok");
  // Values below the float range stay non-zero: top_p = 1e-50 is in (0, 1].
  EXPECT_EQ(ParseError(R"({"prompt": [1], "top_p": 1e-50})"), "ok");
  EXPECT_NE(ParseError(R"({"prompt": [1], "top_p": -1e-50})").find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace peng::server
