#include "server/generation.h"

#include <utility>

#include "tokenizer/tokenizer.h"

namespace peng::server {
namespace {

using nlohmann::json;

constexpr std::chrono::milliseconds kPollWait{100};
// How often a waiting handler asks whether its client is still there.
constexpr std::chrono::milliseconds kLivenessEvery{200};

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Generation::Generation(Engine* engine, ServerMetrics* metrics, ParsedRequest request,
                       ResponseMeta meta, std::function<bool()> client_gone)
    : engine_(engine),
      metrics_(metrics),
      req_(std::move(request)),
      meta_(std::move(meta)),
      client_gone_(std::move(client_gone)),
      tokenizer_(engine->tokenizer()),
      choices_(req_.prompts.size() * static_cast<size_t>(req_.n)),
      arrival_(Clock::now()) {}

Generation::~Generation() {
  if (!finished_) AbortAll();
}

MaybeError Generation::Submit() {
  for (size_t p = 0; p < req_.prompts.size(); ++p) {
    GenerateRequest g;
    g.id = meta_.id + "-" + std::to_string(p);
    g.prompt = req_.prompts[p];
    g.params = req_.params;
    g.n = req_.n;
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

void Generation::AbortAll() {
  for (size_t p = 0; p < streams_.size(); ++p) {
    if (!stream_done_[p]) engine_->Abort(engine_ids_[p]);
  }
  for (Choice& c : choices_) {
    if (!c.finish_reason) {
      c.finish_reason = "abort";
      metrics_->RecordFinished("abort");
    }
  }
  finished_ = true;
}

Generation::Poll Generation::Next(std::chrono::milliseconds wait, int* choice,
                                  RequestOutput* out) {
  const auto deadline = Clock::now() + wait;
  // One stream blocks for the whole wait; several are polled in turn, 1 ms each.
  const auto slice = streams_.size() == 1 ? wait : std::chrono::milliseconds(1);
  do {
    bool any_open = false;
    for (size_t k = 0; k < streams_.size(); ++k) {
      const size_t p = (round_robin_ + k) % streams_.size();
      if (stream_done_[p]) continue;
      bool timed_out = false;
      if (!streams_[p]->Next(out, slice, &timed_out)) {
        stream_done_[p] = true;
        continue;
      }
      any_open = true;
      if (timed_out) continue;
      round_robin_ = p + 1;
      *choice = static_cast<int>(p) * req_.n + out->index;
      return Poll::kEvent;
    }
    if (!any_open) {
      if (!finished_) metrics_->ObserveE2eLatency(Seconds(Clock::now() - arrival_));
      finished_ = true;
      return Poll::kDone;
    }
  } while (Clock::now() < deadline);
  return Poll::kTimeout;
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

std::optional<json> Generation::Collect() {
  auto last_check = Clock::now();
  for (;;) {
    int c = 0;
    RequestOutput out;
    const Poll p = Next(kPollWait, &c, &out);
    if (p == Poll::kDone) break;
    if (p == Poll::kEvent) Account(c, out);
    if (Clock::now() - last_check >= kLivenessEvery) {
      last_check = Clock::now();
      if (client_gone_ && client_gone_()) {
        AbortAll();
        return std::nullopt;
      }
    }
  }
  std::vector<ChoiceResult> results;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    ChoiceResult r;
    r.index = static_cast<int>(i);
    r.text = req_.echo ? EchoText(static_cast<int>(i) / req_.n) + c.text : c.text;
    r.logprobs = std::move(c.logprobs);
    r.finish_reason = c.finish_reason.value_or("abort");
    results.push_back(std::move(r));
  }
  return FinalResponse(meta_, results, CurrentUsage(), req_.logprobs, tokenizer_);
}

bool Generation::Stream(const std::function<bool(const std::string&)>& write) {
  const bool chat = meta_.endpoint == Endpoint::kChat;
  auto send = [&](const json& chunk) {
    if (write(SseData(chunk))) return true;
    AbortAll();
    return false;
  };
  // Chat streams open every choice with its role; echo sends the prompt first.
  for (size_t i = 0; i < choices_.size() && (chat || req_.echo); ++i) {
    ChunkChoice cc;
    cc.index = static_cast<int>(i);
    cc.role = chat;
    if (!chat) cc.text = EchoText(static_cast<int>(i) / req_.n);
    if (!send(StreamChunk(meta_, cc, req_.include_usage, std::nullopt))) return false;
  }
  auto last_check = Clock::now();
  for (;;) {
    int c = 0;
    RequestOutput out;
    const Poll p = Next(kPollWait, &c, &out);
    if (p == Poll::kDone) break;
    if (Clock::now() - last_check >= kLivenessEvery) {
      last_check = Clock::now();
      if (client_gone_ && client_gone_()) {
        AbortAll();
        return false;
      }
    }
    if (p != Poll::kEvent) continue;
    Account(c, out);
    const bool has_logprobs = req_.logprobs && !out.logprobs.empty();
    const bool bare_ids = !tokenizer_ && !out.token_ids.empty();
    if (out.text.empty() && !has_logprobs && !out.finish_reason && !bare_ids) continue;
    ChunkChoice cc;
    cc.index = c;
    cc.text = out.text;
    if (has_logprobs) {
      cc.logprobs = chat ? ChatLogprobs(out.logprobs, tokenizer_)
                         : CompletionLogprobs(out.logprobs, tokenizer_,
                                              &choices_[c].text_offset);
    }
    cc.finish_reason = out.finish_reason;
    std::optional<Usage> usage;
    if (req_.include_usage && req_.continuous_usage) usage = CurrentUsage();
    if (!send(StreamChunk(meta_, cc, req_.include_usage, usage))) return false;
  }
  if (req_.include_usage && !send(UsageChunk(meta_, CurrentUsage()))) return false;
  return write(kSseDone);
}

}  // namespace peng::server
