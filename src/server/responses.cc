#include "server/responses.h"

#include <cmath>
#include <random>

#include "tokenizer/tokenizer.h"

namespace peng::server {
namespace {

using nlohmann::json;

// JSON has no -inf; like vLLM, clamp.
double Lp(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

std::string NewResponseId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* kHex = "0123456789abcdef";
  std::string id = endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 2; ++i) {
    uint64_t r = rng();
    for (int k = 0; k < 16; ++k, r >>= 4) id += kHex[r & 15];
  }
  return id;
}

std::string TokenString(const Tokenizer* tokenizer, int32_t id) {
  if (!tokenizer) return "token_id:" + std::to_string(id);
  return tokenizer->TokenText(id);
}

json CompletionLogprobs(const std::vector<TokenLogprob>& lps, const Tokenizer* tokenizer,
                        int64_t* text_offset) {
  json offsets = json::array(), token_lps = json::array(), tokens = json::array(),
       tops = json::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = tokenizer ? t.text : TokenString(tokenizer, t.id);
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(s.size());
    token_lps.push_back(Lp(t.logprob));
    tokens.push_back(s);
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[TokenString(tokenizer, id)] = Lp(lp);
    tops.push_back(std::move(top));
  }
  return json{{"text_offset", std::move(offsets)},
              {"token_logprobs", std::move(token_lps)},
              {"tokens", std::move(tokens)},
              {"top_logprobs", std::move(tops)}};
}

json ChatLogprobs(const std::vector<TokenLogprob>& lps, const Tokenizer* tokenizer) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    // "token" is the text the token added to the output (so the tokens concatenate to the
    // message); "bytes" are the token's own bytes, which may be part of a UTF-8 character.
    const std::string s = tokenizer ? t.text : TokenString(tokenizer, t.id);
    const std::string raw = TokenString(tokenizer, t.id);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = TokenString(tokenizer, id);
      top.push_back({{"token", ts}, {"logprob", Lp(lp)}, {"bytes", Bytes(ts)}});
    }
    content.push_back({{"token", s},
                       {"logprob", Lp(t.logprob)},
                       {"bytes", Bytes(raw)},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}};
}

json UsageJson(const Usage& usage) {
  return json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

json FinalResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                   const Usage& usage, bool with_logprobs, const Tokenizer* tokenizer) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json out_choices = json::array();
  for (const ChoiceResult& c : choices) {
    json lp = nullptr;
    if (with_logprobs) {
      int64_t offset = 0;
      lp = chat ? ChatLogprobs(c.logprobs, tokenizer)
                : CompletionLogprobs(c.logprobs, tokenizer, &offset);
    }
    json choice = {{"index", c.index}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.tool_calls.is_null()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = c.tool_calls;
      }
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = std::move(lp);
    choice["finish_reason"] = c.finish_reason;
    out_choices.push_back(std::move(choice));
  }
  return json{{"id", meta.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", std::move(out_choices)},
              {"usage", UsageJson(usage)}};
}

json StreamChunk(const ResponseMeta& meta, const ChunkChoice& c, bool include_usage_field,
                 const std::optional<Usage>& usage) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  json choice = {{"index", c.index}};
  if (chat) {
    json delta = json::object();
    if (c.role) delta["role"] = "assistant";
    const bool calls = !c.tool_calls.is_null();
    if (!c.text.empty() || (!c.role && !c.finish_reason && !calls)) delta["content"] = c.text;
    if (c.role && c.text.empty()) delta["content"] = "";
    if (calls) delta["tool_calls"] = c.tool_calls;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = c.text;
  }
  choice["logprobs"] = c.logprobs;
  choice["finish_reason"] = c.finish_reason ? json(*c.finish_reason) : json(nullptr);
  json chunk = {{"id", meta.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", meta.created},
                {"model", meta.model},
                {"choices", json::array({std::move(choice)})}};
  if (include_usage_field) chunk["usage"] = usage ? UsageJson(*usage) : json(nullptr);
  return chunk;
}

json UsageChunk(const ResponseMeta& meta, const Usage& usage) {
  const bool chat = meta.endpoint == Endpoint::kChat;
  return json{{"id", meta.id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", meta.created},
              {"model", meta.model},
              {"choices", json::array()},
              {"usage", UsageJson(usage)}};
}

std::string DumpJson(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseData(const json& j) { return "data: " + DumpJson(j) + "\n\n"; }

}  // namespace peng::server
