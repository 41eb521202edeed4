// Generation: one HTTP generation request in flight: its engine requests (one per prompt, each
// with `n` choices), the per-choice state, and the two ways of answering — Collect() for a
// JSON response, Stream() for Server-Sent Events. Records latency metrics as tokens arrive.
// Destroying a Generation aborts whatever is still running, so a handler that returns early
// (client gone, write failed) frees the KV blocks of its requests.
//
// Used by one HTTP thread at a time; not thread-safe.
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
  // `client_gone` tells whether the client hung up (may be empty).
  Generation(Engine* engine, ServerMetrics* metrics, ParsedRequest request, ResponseMeta meta,
             std::function<bool()> client_gone);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Submits every prompt. On failure nothing stays submitted; ResourceExhausted -> 429.
  MaybeError Submit();
  // Waits for every choice. nullopt when the client went away (its requests are aborted).
  std::optional<nlohmann::json> Collect();
  // Writes the SSE chunks (ending with [DONE]) through `write`; false when a write failed or
  // the client went away (its requests are aborted).
  bool Stream(const std::function<bool(const std::string&)>& write);

 private:
  using Clock = std::chrono::steady_clock;
  enum class Poll { kEvent, kTimeout, kDone };
  struct Choice {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    std::optional<std::string> finish_reason;
    int64_t completion_tokens = 0;
    int64_t text_offset = 0;  // completions logprobs text_offset
    bool started = false;     // streamed its first chunk
    Clock::time_point last_token;
  };

  Poll Next(std::chrono::milliseconds wait, int* choice, RequestOutput* out);
  void Account(int choice, const RequestOutput& out);
  Usage CurrentUsage() const;
  std::string EchoText(int prompt_index) const;
  void AbortAll();

  Engine* engine_;
  ServerMetrics* metrics_;
  ParsedRequest req_;
  ResponseMeta meta_;
  std::function<bool()> client_gone_;
  const Tokenizer* tokenizer_;
  std::vector<std::string> engine_ids_;                  // per prompt
  std::vector<std::shared_ptr<RequestStream>> streams_;  // per prompt
  std::vector<bool> stream_done_;
  size_t round_robin_ = 0;
  std::vector<Choice> choices_;                          // prompt * n + index
  Clock::time_point arrival_;
  bool first_token_seen_ = false;
  bool finished_ = false;
};

}  // namespace peng::server
