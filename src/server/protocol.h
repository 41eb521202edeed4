// OpenAI protocol, request side: turns the JSON body of a /v1/completions or
// /v1/chat/completions request into the prompts and SamplingParams the Engine takes, with
// vLLM's extensions (top_k, min_p, repetition_penalty, stop_token_ids, ignore_eos, ...).
// Every failure is an ApiError that the server writes in OpenAI's error shape
// {"error": {"message", "type", "param", "code"}} with its HTTP status.
//
// Unknown fields are ignored (like vLLM); known fields of the wrong type, out-of-range values,
// empty prompts and prompts that do not fit the context are 400s. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "server/tool_calls.h"

namespace peng {

class Tokenizer;
namespace grammar {
class CompiledGrammar;
}

namespace server {

// An error answered in OpenAI's shape.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null

  nlohmann::json ToJson() const;
};

ApiError BadRequest(std::string message, std::string param = "", std::string code = "");

// nullopt = success.
using MaybeError = std::optional<ApiError>;

enum class Endpoint { kCompletions, kChat };

// Bounds on what one request may carry, so that no single body can make the server spend
// unbounded stack, memory or time (each is a 400 naming the field when exceeded).
inline constexpr int kMaxJsonDepth = 64;          // nesting of arrays/objects in the body
inline constexpr size_t kMaxPrompts = 64;         // prompts in one completions request
inline constexpr size_t kMaxMessages = 4096;      // chat messages
inline constexpr size_t kMaxStopStrings = 32;     // "stop"
inline constexpr size_t kMaxStopStringBytes = 4096;
inline constexpr size_t kMaxStopTokenIds = 1024;  // "stop_token_ids"
inline constexpr size_t kMaxLogitBias = 1024;     // "logit_bias" entries
inline constexpr size_t kMaxChoices = 1024;       // "guided_choice" entries

// Parses a request body into *out: a body nested deeper than kMaxJsonDepth or that is not
// valid JSON is a 400 (checked before any recursive structure is built).
// Objects keep the client's key order (a JSON Schema's properties, tools): what the model sees
// in its prompt and writes follows that order, as with transformers / the OpenAI API.
MaybeError ParseJsonBody(std::string_view body, nlohmann::ordered_json* out);

// A parsed request: one or more prompts (batch completions), each sampled `n` times.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                       // as sent; empty when absent
  std::vector<std::vector<int32_t>> prompts;  // token ids; filled by Tokenize*()
  std::vector<std::string> prompt_texts;   // completions: string prompts (for echo)
  bool prompt_is_text = false;
  nlohmann::ordered_json messages;         // chat: normalized (content flattened to strings)
  bool add_generation_prompt = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  SamplingParams params;
  bool max_tokens_given = false;
  int n = 1;
  bool stream = false;
  bool include_usage = false;              // stream_options.include_usage
  bool continuous_usage = false;           // stream_options.continuous_usage_stats (vLLM)
  bool echo = false;                       // completions
  bool logprobs = false;                   // return logprobs
  int top_logprobs = 0;                    // alternatives per token
  // GBNF grammar the output must follow (grammar/grammar.h), from response_format
  // (json_object, json_schema), vLLM's guided_json / guided_regex / guided_choice /
  // guided_grammar (or structured_outputs.{json,regex,choice,grammar}), or a forced tool
  // call; empty = free text. `grammar_param` names the field it came from (for errors).
  std::string grammar;
  std::string grammar_param;
  std::shared_ptr<const grammar::CompiledGrammar> compiled_grammar;  // set by the server
  // Chat tool calling (tool_calls.h): tools / tool_choice / parallel_tool_calls, and the
  // model's call syntax (kAuto: PreparePrompts detects it from the chat template; the server
  // sets it from --tool-call-parser). A forced choice fills `grammar` in PreparePrompts.
  ToolRequest tools;
  ToolCallFormat tool_format = ToolCallFormat::kAuto;
};

// Parses the body of a request for `endpoint`. Does not tokenize.
MaybeError ParseRequest(const nlohmann::ordered_json& body, Endpoint endpoint,
                        ParsedRequest* out);

// Context the prompt checks need.
struct PromptLimits {
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;
};

// Completions: tokenizes string prompts (token-id prompts are taken as they are); chat: renders
// the messages with the model's chat template and tokenizes the result. `tokenizer` may be
// null (token-id prompts only). Then fills the default max_tokens and checks prompt lengths.
MaybeError PreparePrompts(ParsedRequest* req, const Tokenizer* tokenizer,
                          const PromptLimits& limits);

// Checks one prompt against the limits (and fills max_tokens for chat when not given):
// empty prompt, token ids out of vocabulary, prompt + max_tokens > max_model_len.
MaybeError CheckPrompt(const std::vector<int32_t>& prompt, const PromptLimits& limits,
                       ParsedRequest* req);

// Maps a SamplingParams::Validate() / Engine::Submit() error onto an ApiError
// ("top_p = 1.5: must be in (0, 1]" -> param "top_p").
ApiError FromStatus(const Status& status);

}  // namespace server
}  // namespace peng
