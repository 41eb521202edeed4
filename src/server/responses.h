// OpenAI protocol, response side: the JSON of non-streaming responses, of streamed chunks
// (Server-Sent Events "data: {json}\n\n", ending with "data: [DONE]\n\n") and of logprobs, for
// /v1/completions ("text_completion") and /v1/chat/completions ("chat.completion" /
// "chat.completion.chunk"), in OpenAI's exact shapes. Pure functions of their arguments;
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/protocol.h"

namespace peng {

class Tokenizer;

namespace server {

// What every response object of one request repeats.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;        // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// One finished choice of a non-streaming response.
struct ChoiceResult {
  int index = 0;
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
  // Chat tool calling: the parsed calls ([{id, type, function}]), null when none; then
  // `text` is the content besides them and an empty one is written as null.
  nlohmann::json tool_calls;
};

// "cmpl-" / "chatcmpl-" followed by 32 random hex digits.
std::string NewResponseId(Endpoint endpoint);

// The text a token stands for in logprobs ("token_id:17" without a tokenizer).
std::string TokenString(const Tokenizer* tokenizer, int32_t id);

// Completions logprobs object {"text_offset", "token_logprobs", "tokens", "top_logprobs"} for
// `lps`; offsets start at *text_offset, which is advanced past the tokens.
nlohmann::json CompletionLogprobs(const std::vector<TokenLogprob>& lps,
                                  const Tokenizer* tokenizer, int64_t* text_offset);
// Chat logprobs object {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
nlohmann::json ChatLogprobs(const std::vector<TokenLogprob>& lps, const Tokenizer* tokenizer);

nlohmann::json UsageJson(const Usage& usage);

// Non-streaming response. `with_logprobs` selects whether choices carry logprobs objects.
nlohmann::json FinalResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                             const Usage& usage, bool with_logprobs, const Tokenizer* tokenizer);

// One streamed choice delta. Chat: `role` adds "role": "assistant" to the delta (first chunk
// of a choice); `text` becomes "content" (omitted when empty and `role`, finishing or carrying
// tool calls); `tool_calls` (tool-call deltas [{index, id, type, function}], null when none)
// becomes "tool_calls".
struct ChunkChoice {
  int index = 0;
  std::string text;
  bool role = false;
  nlohmann::json tool_calls;
  nlohmann::json logprobs;                   // null or a logprobs object
  std::optional<std::string> finish_reason;
};
// A chunk; `usage` (null when not asked) is included when include_usage is set.
nlohmann::json StreamChunk(const ResponseMeta& meta, const ChunkChoice& choice,
                           bool include_usage_field, const std::optional<Usage>& usage);
// The last chunk of stream_options.include_usage: empty choices plus usage.
nlohmann::json UsageChunk(const ResponseMeta& meta, const Usage& usage);

// "data: {json}\n\n" (invalid UTF-8 replaced by U+FFFD).
std::string SseData(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";
// JSON text with invalid UTF-8 replaced, for response bodies.
std::string DumpJson(const nlohmann::json& j);

}  // namespace server
}  // namespace peng
