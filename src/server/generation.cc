#include "server/generation.h"

#include <utility>

#include "tokenizer/tokenizer.h"

namespace peng::server {
namespace {

using nlohmann::json;

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Generation::Generation(Engine* engine, ServerMetrics* metrics, ParsedRequest request,
                       ResponseMeta meta)
    : engine_(engine),
      metrics_(metrics),
      req_(std::move(request)),
      meta_(std::move(meta)),
      tokenizer_(engine->tokenizer()),
      choices_(req_.prompts.size() * static_cast<size_t>(req_.n)),
      arrival_(Clock::now()) {}

Generation::~Generation() {
  SetNotify({});
  if (!finished_) AbortAll();
}

MaybeError Generation::Submit() {
  for (size_t p = 0; p < req_.prompts.size(); ++p) {
    GenerateRequest g;
    g.id = meta_.id + "-" + std::to_string(p);
    g.prompt = req_.prompts[p];
    g.params = req_.params;
    g.n = req_.n;
    g.grammar = req_.compiled_grammar;
    StatusOr<std::shared_ptr<RequestStream>> s = engine_->Submit(std::move(g));
    if (!s.ok()) {
      AbortAll();
      return FromStatus(s.status());
    }
    engine_ids_.push_back(meta_.id + "-" + std::to_string(p));
    streams_.push_back(*s);
    stream_done_.push_back(false);
  }
  return std::nullopt;
}

void Generation::SetNotify(const std::function<void()>& notify) {
  for (const auto& s : streams_) s->SetNotify(notify);
}

void Generation::AbortAll() {
  if (!aborted_) {
    for (size_t p = 0; p < streams_.size(); ++p) {
      if (!stream_done_[p]) engine_->Abort(engine_ids_[p]);
    }
  }
  aborted_ = true;
  for (Choice& c : choices_) {
    if (!c.finish_reason) {
      c.finish_reason = "abort";
      metrics_->RecordFinished("abort");
    }
  }
}

void Generation::Abort() {
  AbortAll();
  finished_ = true;
}

bool Generation::Next(int* choice, RequestOutput* out) {
  for (size_t k = 0; k < streams_.size(); ++k) {
    const size_t p = (round_robin_ + k) % streams_.size();
    if (stream_done_[p]) continue;
    bool timed_out = false;
    if (!streams_[p]->Next(out, std::chrono::milliseconds(0), &timed_out)) {
      stream_done_[p] = true;
      continue;
    }
    if (timed_out) continue;
    round_robin_ = p + 1;
    *choice = static_cast<int>(p) * req_.n + out->index;
    return true;
  }
  return false;
}

bool Generation::ParsesToolCalls() const {
  return meta_.endpoint == Endpoint::kChat && req_.tools.parse_output() &&
         req_.tool_format != ToolCallFormat::kNone && req_.tool_format != ToolCallFormat::kAuto;
}

bool Generation::AllStreamsDone() const {
  for (bool d : stream_done_) {
    if (!d) return false;
  }
  return true;
}

void Generation::Account(int choice, const RequestOutput& out) {
  if (choice < 0 || choice >= static_cast<int>(choices_.size())) return;
  Choice& c = choices_[choice];
  const auto now = Clock::now();
  if (!out.token_ids.empty()) {
    const int64_t k = static_cast<int64_t>(out.token_ids.size());
    if (!first_token_seen_) {
      first_token_seen_ = true;
      metrics_->ObserveTimeToFirstToken(Seconds(now - arrival_));
      if (k > 1) metrics_->ObserveInterToken(0, k - 1);
    } else if (c.completion_tokens > 0) {
      metrics_->ObserveInterToken(Seconds(now - c.last_token), k);
    }
    c.last_token = now;
  }
  c.text += out.text;
  if (req_.logprobs) c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  c.completion_tokens = out.completion_tokens;
  if (out.finish_reason && !c.finish_reason) {
    c.finish_reason = out.finish_reason;
    metrics_->RecordFinished(*out.finish_reason);
  }
  if (out.finish_reason == "error" && !error_) {
    ApiError e;
    e.http_status = 500;
    e.type = "internal_error";
    e.code = "generation_failed";
    e.message = "Generation failed: " + out.error;
    error_ = std::move(e);
  }
}

Usage Generation::CurrentUsage() const {
  Usage u;
  for (const auto& p : req_.prompts) u.prompt_tokens += static_cast<int64_t>(p.size());
  for (const Choice& c : choices_) u.completion_tokens += c.completion_tokens;
  return u;
}

std::string Generation::EchoText(int prompt_index) const {
  if (req_.prompt_is_text) return req_.prompt_texts[prompt_index];
  return tokenizer_ ? tokenizer_->Decode(req_.prompts[prompt_index]) : std::string();
}

void Generation::StreamEvent(int c, const RequestOutput& out, std::string* sse) {
  const bool chat = meta_.endpoint == Endpoint::kChat;
  const bool has_logprobs = req_.logprobs && !out.logprobs.empty();
  const bool bare_ids = !tokenizer_ && !out.token_ids.empty();
  if (out.text.empty() && !has_logprobs && !out.finish_reason && !bare_ids) return;
  ChunkChoice cc;
  cc.index = c;
  cc.text = out.text;
  std::optional<std::string> finish_reason = out.finish_reason;
  if (ParsesToolCalls()) {  // content that cannot be a call marker now, calls once complete
    Choice& ch = choices_[c];
    if (!ch.tool_parser) ch.tool_parser.emplace(req_.tool_format, req_.tools.names());
    const int first_call = ch.tool_parser->calls();
    ParsedToolOutput parsed = ch.tool_parser->Push(out.text);
    if (out.finish_reason) {
      ParsedToolOutput rest = ch.tool_parser->Finish();
      parsed.content += rest.content;
      for (ToolCall& call : rest.calls) parsed.calls.push_back(std::move(call));
      if (*out.finish_reason == "stop" && ch.tool_parser->calls() > 0) {
        finish_reason = "tool_calls";
      }
    }
    cc.text = std::move(parsed.content);
    if (!parsed.calls.empty()) {
      cc.tool_calls = json::array();
      for (size_t k = 0; k < parsed.calls.size(); ++k) {
        cc.tool_calls.push_back(parsed.calls[k].ToDeltaJson(first_call + static_cast<int>(k)));
      }
    }
    if (cc.text.empty() && cc.tool_calls.is_null() && !has_logprobs && !finish_reason &&
        !bare_ids) {
      return;  // everything held back
    }
  }
  if (has_logprobs) {
    cc.logprobs = chat ? ChatLogprobs(out.logprobs, tokenizer_)
                       : CompletionLogprobs(out.logprobs, tokenizer_, &choices_[c].text_offset);
  }
  cc.finish_reason = finish_reason;
  std::optional<Usage> usage;
  if (req_.include_usage && req_.continuous_usage) usage = CurrentUsage();
  *sse += SseData(StreamChunk(meta_, cc, req_.include_usage, usage));
}

// The end of a stream: the error event if a choice failed, the usage chunk, [DONE].
void Generation::Finish(std::string* sse) {
  finished_ = true;
  if (AllStreamsDone()) aborted_ = true;  // nothing left to abort
  metrics_->ObserveE2eLatency(Seconds(Clock::now() - arrival_));
  if (!req_.stream) return;
  if (error_) {
    *sse += SseData(error_->ToJson());
  } else if (req_.include_usage) {
    *sse += SseData(UsageChunk(meta_, CurrentUsage()));
  }
  *sse += kSseDone;
}

bool Generation::Pump(std::string* sse) {
  if (finished_) return true;
  const bool chat = meta_.endpoint == Endpoint::kChat;
  if (req_.stream && !started_) {
    started_ = true;
    // Chat streams open every choice with its role; echo sends the prompt first.
    for (size_t i = 0; i < choices_.size() && (chat || req_.echo); ++i) {
      ChunkChoice cc;
      cc.index = static_cast<int>(i);
      cc.role = chat;
      if (!chat) cc.text = EchoText(static_cast<int>(i) / req_.n);
      *sse += SseData(StreamChunk(meta_, cc, req_.include_usage, std::nullopt));
    }
  }
  int c = 0;
  RequestOutput out;
  while (Next(&c, &out)) {
    Account(c, out);
    if (error_) {  // one failed choice ends the request
      AbortAll();
      Finish(sse);
      return true;
    }
    if (req_.stream) StreamEvent(c, out, sse);
    out = RequestOutput();
  }
  if (!AllStreamsDone()) return false;
  Finish(sse);
  return true;
}

json Generation::Result() {
  std::vector<ChoiceResult> results;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    ChoiceResult r;
    r.index = static_cast<int>(i);
    r.text = req_.echo ? EchoText(static_cast<int>(i) / req_.n) + c.text : c.text;
    r.logprobs = std::move(c.logprobs);
    r.finish_reason = c.finish_reason.value_or("abort");
    if (ParsesToolCalls()) {
      ParsedToolOutput parsed = ParseToolCalls(r.text, req_.tool_format, req_.tools.names());
      r.text = std::move(parsed.content);
      if (!parsed.calls.empty()) {
        r.tool_calls = json::array();
        for (const ToolCall& call : parsed.calls) r.tool_calls.push_back(call.ToJson());
        if (r.finish_reason == "stop") r.finish_reason = "tool_calls";
      }
    }
    results.push_back(std::move(r));
  }
  return FinalResponse(meta_, results, CurrentUsage(), req_.logprobs, tokenizer_);
}

}  // namespace peng::server
