// Generation: one HTTP generation request in flight: its engine requests (one per prompt, each
// with `n` choices), the per-choice state, and the answer -- a JSON response, or Server-Sent
// Events. Event-driven: the engine calls the notify callback when a stream has news and the
// connection then calls Pump(), which takes what is ready without blocking. Records latency
// metrics as tokens arrive. Destroying a Generation (or Abort()) aborts whatever is still
// running, so a connection that goes away frees the KV blocks of its requests.
//
// A choice the engine finished with "error" (failure isolation: only this request failed)
// ends the whole Generation: a JSON request answers 500 in OpenAI's error shape, a stream
// sends an SSE error event and then [DONE]; the other choices are aborted.
//
// Not thread-safe: used by one connection at a time (the notify callback excepted).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/protocol.h"
#include "server/responses.h"

namespace peng::server {

class Generation {
 public:
  Generation(Engine* engine, ServerMetrics* metrics, ParsedRequest request, ResponseMeta meta);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits every prompt. On failure nothing stays submitted; ResourceExhausted -> 429.
  MaybeError Submit();
  // `notify` runs on the engine thread after each event of any of the streams (and at once if
  // events are waiting). Call SetNotify({}) before the callback's target goes away.
  void SetNotify(const std::function<void()>& notify);
  // Takes every ready event. Streaming requests: appends the SSE text they produce to *sse
  // (role/echo chunks first; the final call appends the usage chunk and "data: [DONE]").
  // Returns true once the generation is over (then Result() is ready).
  bool Pump(std::string* sse);
  bool streaming() const { return req_.stream; }
  // Non-streaming answer after Pump() returned true: the response JSON, or the error.
  nlohmann::json Result();
  const std::optional<ApiError>& error() const { return error_; }
  // The client went away: aborts every engine request still running.
  void Abort();

 private:
  using Clock = std::chrono::steady_clock;
  struct Choice {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    std::optional<std::string> finish_reason;
    int64_t completion_tokens = 0;
    int64_t text_offset = 0;  // completions logprobs text_offset
    Clock::time_point last_token;
    std::optional<ToolCallStreamParser> tool_parser;  // streaming chat with tools
  };

  // One ready event (any stream, in turn): true with *choice/*out set; false when none is.
  bool Next(int* choice, RequestOutput* out);
  bool AllStreamsDone() const;
  // Chat with tools and tool_choice != "none": the output is parsed for tool calls.
  bool ParsesToolCalls() const;
  void Account(int choice, const RequestOutput& out);
  void StreamEvent(int choice, const RequestOutput& out, std::string* sse);
  void Finish(std::string* sse);
  Usage CurrentUsage() const;
  std::string EchoText(int prompt_index) const;
  void AbortAll();

  Engine* engine_;
  ServerMetrics* metrics_;
  ParsedRequest req_;
  ResponseMeta meta_;
  const Tokenizer* tokenizer_;
  std::vector<std::string> engine_ids_;                  // per prompt
  std::vector<std::shared_ptr<RequestStream>> streams_;  // per prompt
  std::vector<bool> stream_done_;
  size_t round_robin_ = 0;
  std::vector<Choice> choices_;                          // prompt * n + index
  Clock::time_point arrival_;
  std::optional<ApiError> error_;  // a choice failed in the engine
  bool first_token_seen_ = false;
  bool started_ = false;   // the opening SSE chunks were produced
  bool finished_ = false;  // Pump() returned true
  bool aborted_ = false;   // engine requests aborted (or all done)
};

}  // namespace peng::server
