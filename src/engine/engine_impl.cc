// The Engine behind engine.h: one engine thread runs steps of
//   Schedule() -> copy-on-write block copies -> one batched Model::Forward() ->
//   per sequence that reached its last token: sample, logprobs, detokenize, stop checks ->
//   publish events -> free finished sequences.
// HTTP threads only touch the submission queue, the abort list, the stats snapshot (under
// mu_) and the streams (each with its own lock).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "engine/engine.h"
#include "engine/queue_stream.h"
#include "engine/llm.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "grammar/grammar.h"
#include "kernels/probe.h"
#include "kernels/work_counter.h"
#include "kv/kv_cache_manager.h"
#include "model/registry.h"
#include "tokenizer/streaming_decoder.h"

namespace peng {
namespace {

using Stream = QueueStream;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Request;

// One completion of a request: a scheduler sequence plus its sampling and text state.
struct Completion : Sequence {
  Completion(Request* r, int i, const SamplingParams& p) : req(r), index(i), sampler(p) {}
  Request* req;
  int index;
  Sampler sampler;
  TokenHistory history;
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<grammar::Matcher> matcher;  // when the request has a grammar
  std::string pending;  // text held back while a stop string may be forming
  int64_t num_output = 0;
  bool done = false;
};

struct Request {
  GenerateRequest in;
  std::shared_ptr<Stream> stream;
  std::vector<std::unique_ptr<Completion>> completions;  // [0] first; the rest after prefill
  int num_done = 0;
  bool forked = false;
  Clock::time_point submitted;  // for the queue wait
  bool scheduled = false;       // has been in a step
};

// One step's times and kernel work, for the utilization window (EngineStats).
struct StepRecord {
  Clock::time_point end;
  double seconds = 0;
  kernels::WorkCounts work;
};

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
}

class EngineImpl : public Engine {
 public:
  EngineImpl(const EngineOptions& o, std::unique_ptr<Model> model,
             std::unique_ptr<Tokenizer> tok, std::unique_ptr<KvCache> kv, int64_t max_model_len)
      : opt_(o),
        pool_(o.threads),
        model_(std::move(model)),
        tokenizer_(std::move(tok)),
        kv_(std::move(kv)),
        kvm_(kv_->num_blocks(), o.block_size, o.enable_prefix_caching),
        sched_({o.max_num_batched_tokens, o.max_num_seqs}, &kvm_),
        max_model_len_(max_model_len),
        vocab_(model_->config().vocab_size) {
    stats_.kv_blocks_total = kvm_.num_blocks();
    stats_.peak_read_bytes_per_s = o.peak_read_bytes_per_s;
    stats_.peak_flops_f32_per_s = o.peak_flops_f32_per_s;
    stats_.peak_ops_int8_per_s = o.peak_ops_int8_per_s;
    if (o.measure_peaks && (o.peak_read_bytes_per_s <= 0 || o.peak_flops_f32_per_s <= 0 ||
                            o.peak_ops_int8_per_s <= 0)) {
      const kernels::MachinePeaks m = kernels::MeasureMachinePeaks(&pool_);
      if (o.peak_read_bytes_per_s <= 0) stats_.peak_read_bytes_per_s = m.read_bytes_per_s;
      if (o.peak_flops_f32_per_s <= 0) stats_.peak_flops_f32_per_s = m.flops_f32_per_s;
      if (o.peak_ops_int8_per_s <= 0) stats_.peak_ops_int8_per_s = m.ops_int8_per_s;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~EngineImpl() override { Stop(); }

  StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) override;
  void Abort(const std::string& id) override {
    std::lock_guard<std::mutex> lk(mu_);
    aborts_.push_back(id);
    cv_.notify_all();
  }
  EngineStats GetStats() const override;
  const Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const ModelConfig& model_config() const override { return model_->config(); }
  int64_t max_model_len() const override { return max_model_len_; }
  bool Drain(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lk(mu_);
    draining_ = true;
    return done_cv_.wait_for(lk, timeout, [&] { return stopped_ || (in_flight_.empty() && idle_); });
  }
  void Stop() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = draining_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop();
  void Admit(std::unique_ptr<Request> r);
  void Step();
  void Fork(Request* r, const float* row);
  void SampleAndEmit(Completion* c, float* row);
  void FinishCompletion(Completion* c, RequestOutput ev, const char* reason);
  void EndRequest(Request* r, const char* reason, const std::string& error);
  void AbortRequest(Request* r) { EndRequest(r, "abort", ""); }
  void FailRequest(Request* r, const std::string& error);
  void RetireRequest(Request* r);
  // `step_begin`: the step that began then has just ended; its times and work are added.
  void PublishStats(const Clock::time_point* step_begin = nullptr);
  void RecordStepLocked(Clock::time_point begin, Clock::time_point end);
  bool IsEndOfGeneration(int32_t id) const {
    return tokenizer_ ? tokenizer_->IsEndOfGeneration(id) : id == model_->config().eos_id;
  }

  const EngineOptions opt_;
  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCache> kv_;
  KvCacheManager kvm_;
  Scheduler sched_;
  const int64_t max_model_len_;
  const int64_t vocab_;

  // Engine thread only.
  std::unordered_map<std::string, std::unique_ptr<Request>> active_;
  std::vector<std::string> finished_ids_;  // requests to drop at the end of the step
  ForwardBatch batch_;
  std::vector<float> logits_, fork_row_, raw_row_;
  int64_t next_seq_id_ = 0;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0, finished_total_ = 0;
  int64_t failed_total_ = 0;
  int64_t steps_total_ = 0;
  // The current step's phase boundaries, sampling time and forward-pass work
  // (RecordStepLocked).
  Clock::time_point forward_begin_, forward_end_;
  bool forward_ran_ = false;
  double sample_seconds_ = 0;
  kernels::WorkCounts step_work_;
  double queue_wait_sum_ = 0;
  int64_t queue_wait_count_ = 0;

  // Shared with the API threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the engine thread
  std::condition_variable done_cv_;  // a request finished (Drain)
  std::vector<std::unique_ptr<Request>> submitted_;
  std::vector<std::string> aborts_;
  std::unordered_set<std::string> in_flight_;
  bool draining_ = false, stop_ = false, stopped_ = false;
  bool idle_ = true;  // no request was active at the last stats publication
  EngineStats stats_;
  double frag_sum_ = 0;    // sum of kv_fragmentation over steps with running sequences
  int64_t frag_steps_ = 0;
  std::deque<StepRecord> recent_steps_;  // those that ended in the last utilization window
  std::thread thread_;
};

StatusOr<std::shared_ptr<RequestStream>> EngineImpl::Submit(GenerateRequest request) {
  PENG_RETURN_IF_ERROR(request.params.Validate());
  if (request.n < 1 || request.n > 128) return InvalidArgument("n must be in [1, 128]");
  if (request.params.seed > std::numeric_limits<int64_t>::max() - (request.n - 1))
    return InvalidArgument("seed = " + std::to_string(request.params.seed) +
                           ": seed + n - 1 must be <= " +
                           std::to_string(std::numeric_limits<int64_t>::max()));
  const int64_t len = static_cast<int64_t>(request.prompt.size());
  if (len == 0) return InvalidArgument("the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= vocab_)
      return InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_) + ")");
  for (const auto& [id, bias] : request.params.logit_bias)
    if (id >= vocab_)
      return InvalidArgument("logit_bias: token id " + std::to_string(id) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  if (len >= max_model_len_)
    return OutOfRange("prompt of " + std::to_string(len) + " tokens leaves no room to generate " +
                      "within the maximum context length of " + std::to_string(max_model_len_));
  if (len + 1 > kvm_.num_blocks() * kvm_.block_size())
    return OutOfRange("prompt of " + std::to_string(len) + " tokens does not fit in the KV cache (" +
                      std::to_string(kvm_.num_blocks() * kvm_.block_size()) + " token slots)");
  auto r = std::make_unique<Request>();
  r->stream = std::make_shared<Stream>(request.n);
  std::shared_ptr<RequestStream> stream = r->stream;
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_) return ResourceExhausted("the engine is shutting down");
  if (in_flight_.count(request.id)) return InvalidArgument("duplicate request id " + request.id);
  if (stats_.num_waiting + static_cast<int64_t>(submitted_.size()) >= opt_.max_waiting)
    return ResourceExhausted("too many waiting requests");
  in_flight_.insert(request.id);
  idle_ = false;
  r->submitted = Clock::now();
  r->in = std::move(request);
  submitted_.push_back(std::move(r));
  cv_.notify_all();
  return stream;
}

void EngineImpl::Loop() {
  std::vector<std::unique_ptr<Request>> fresh;
  std::vector<std::string> aborts;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !submitted_.empty() || !aborts_.empty() || !sched_.empty(); });
      if (stop_) break;
      fresh.swap(submitted_);
      aborts.swap(aborts_);
    }
    const Clock::time_point begin = Clock::now();
    for (auto& r : fresh) Admit(std::move(r));
    fresh.clear();
    for (const std::string& id : aborts)
      if (auto it = active_.find(id); it != active_.end()) AbortRequest(it->second.get());
    aborts.clear();
    const bool stepped = !sched_.empty();
    if (stepped) Step();
    PublishStats(stepped ? &begin : nullptr);
  }
  for (auto& r : submitted_) active_[r->in.id] = std::move(r);  // aborted below
  submitted_.clear();
  for (auto& [id, r] : active_) AbortRequest(r.get());
  PublishStats();
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  done_cv_.notify_all();
}

void EngineImpl::Admit(std::unique_ptr<Request> r) {
  SamplingParams p = r->in.params;
  auto c = std::make_unique<Completion>(r.get(), 0, p);
  c->id = next_seq_id_++;
  c->tokens = r->in.prompt;
  c->num_prompt_tokens = static_cast<int64_t>(c->tokens.size());
  c->history = TokenHistory(c->tokens);
  if (tokenizer_) c->decoder = std::make_unique<StreamingDecoder>(*tokenizer_, p.skip_special_tokens);
  if (r->in.grammar) c->matcher = std::make_unique<grammar::Matcher>(r->in.grammar);
  prompt_tokens_total_ += c->num_prompt_tokens;
  sched_.Add(c.get());
  r->completions.push_back(std::move(c));
  const std::string id = r->in.id;
  active_[id] = std::move(r);
}

void EngineImpl::Step() {
  forward_ran_ = false;
  sample_seconds_ = 0;
  step_work_ = {};
  const SchedulerOutput& out = sched_.Schedule();
  for (Sequence* s : out.too_long) {  // outgrew the whole KV pool: ends like max_model_len
    auto* c = static_cast<Completion*>(s);
    RequestOutput ev;
    if (c->decoder) c->pending += c->decoder->Flush();
    ev.text = std::move(c->pending);
    FinishCompletion(c, std::move(ev), "length");
  }
  if (out.scheduled.empty()) return;
  const Clock::time_point now = Clock::now();
  for (const ScheduledSeq& sc : out.scheduled) {
    Request* r = static_cast<Completion*>(sc.seq)->req;
    if (r->scheduled) continue;
    r->scheduled = true;
    queue_wait_sum_ += Seconds(now - r->submitted);
    ++queue_wait_count_;
  }
  for (const BlockCopy& cp : out.copies) kv_->CopyBlock(cp.src, cp.dst);
  batch_.tokens.clear();
  batch_.seqs.clear();
  for (const ScheduledSeq& sc : out.scheduled) {
    const Sequence* s = sc.seq;
    auto first = s->tokens.begin() + s->num_computed_tokens;
    batch_.tokens.insert(batch_.tokens.end(), first, first + sc.num_new_tokens);
    const std::vector<int32_t>& table = kvm_.block_table(s->id);
    SeqBatchEntry e;
    e.n_tokens = sc.num_new_tokens;
    e.pos0 = s->num_computed_tokens;
    e.block_table = table.data();
    e.n_blocks = static_cast<int64_t>(table.size());
    e.want_logits = s->num_computed_tokens + sc.num_new_tokens == s->num_tokens();
    batch_.seqs.push_back(e);
  }
  logits_.resize(std::max<size_t>(logits_.size(), batch_.NumLogitRows() * vocab_));
  Status st = OkStatus();
  const kernels::WorkCounts work_before = kernels::ThreadWork();
  forward_ran_ = true;
  forward_begin_ = Clock::now();
  try {
    st = model_->Forward(batch_, kv_.get(), logits_.data(), &pool_);
  } catch (const std::exception& e) {
    st = Internal(std::string("exception in the forward pass: ") + e.what());
  }
  forward_end_ = Clock::now();
  step_work_ = kernels::ThreadWork() - work_before;
  ++steps_total_;
  if (!st.ok()) {  // the batch's KV writes are not trusted: its requests end, nothing is cached
    std::vector<Request*> failed;
    for (const ScheduledSeq& sc : out.scheduled) {
      Request* r = static_cast<Completion*>(sc.seq)->req;
      if (std::find(failed.begin(), failed.end(), r) == failed.end()) failed.push_back(r);
    }
    for (Request* r : failed) FailRequest(r, "model forward pass failed: " + st.message());
    return;
  }
  sched_.OnStepDone();
  int64_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (!batch_.seqs[i].want_logits) continue;
    auto* c = static_cast<Completion*>(out.scheduled[i].seq);
    float* logits = logits_.data() + row++ * vocab_;
    if (c->done) continue;  // failed earlier in this step
    Request* r = c->req;
    try {
      // A NaN anywhere (or +inf, which the softmax cannot weigh) means this row is garbage.
      const Clock::time_point check_begin = Clock::now();
      for (int64_t v = 0; v < vocab_; ++v) {
        if (std::isnan(logits[v]) || logits[v] == std::numeric_limits<float>::infinity())
          throw std::runtime_error("the model produced a non-finite logit (token " +
                                   std::to_string(v) + ")");
      }
      sample_seconds_ += Seconds(Clock::now() - check_begin);
      if (r->in.n > 1 && !r->forked) Fork(r, logits);
      SampleAndEmit(c, logits);
    } catch (const std::exception& e) {
      FailRequest(r, e.what());
    }
  }
}

// The prompt is computed: the other n - 1 completions share its blocks and sample from the
// same logits, each with its own seed (seed + index).
void EngineImpl::Fork(Request* r, const float* row) {
  r->forked = true;
  const Completion* parent = r->completions[0].get();
  for (int i = 1; i < r->in.n; ++i) {
    SamplingParams p = r->in.params;
    if (p.seed >= 0) p.seed += i;
    auto c = std::make_unique<Completion>(r, i, p);
    c->id = next_seq_id_++;
    c->tokens = parent->tokens;
    c->num_prompt_tokens = parent->num_prompt_tokens;
    c->num_computed_tokens = parent->num_computed_tokens;
    c->history = TokenHistory(c->tokens);
    if (tokenizer_) c->decoder = std::make_unique<StreamingDecoder>(*tokenizer_, p.skip_special_tokens);
    if (parent->matcher) c->matcher = std::make_unique<grammar::Matcher>(*parent->matcher);
    kvm_.Fork(parent->id, c->id);
    sched_.AddRunning(c.get());
    Completion* cp = c.get();
    r->completions.push_back(std::move(c));
    fork_row_.assign(row, row + vocab_);
    SampleAndEmit(cp, fork_row_.data());
  }
}

void EngineImpl::SampleAndEmit(Completion* c, float* row) {
  const Clock::time_point sample_begin = Clock::now();
  const SamplingParams& p = c->req->in.params;
  RequestOutput ev;
  TokenLogprob lp;
  if (p.want_logprobs) {
    raw_row_.assign(row, row + vocab_);
    if (p.logprobs > 0) Sampler::TopLogprobs(row, vocab_, p.logprobs, &lp.top);
  }
  for (const auto& [id, bias] : p.logit_bias) row[id] += bias;
  if (c->matcher) {
    if (!c->matcher->ApplyMask(row, vocab_))
      throw std::runtime_error("the grammar is too ambiguous to follow: one token mask went over "
                               "its work budget");
    // ignore_eos: the output goes on while the grammar allows more (benchmarks).
    if (p.ignore_eos && !c->matcher->IsTerminated()) {
      for (int32_t id : c->req->in.grammar->vocab().eos_ids())
        if (id < vocab_) row[id] = -std::numeric_limits<float>::infinity();
    }
  }
  if (c->num_output < p.min_tokens) {  // EOS and stop ids cannot be drawn yet
    const float ninf = -std::numeric_limits<float>::infinity();
    const int32_t eos = tokenizer_ ? tokenizer_->eos_id() : model_->config().eos_id;
    if (!p.ignore_eos && eos >= 0 && eos < vocab_) row[eos] = ninf;
    for (int32_t id : p.stop_token_ids)
      if (id < vocab_) row[id] = ninf;
  }
  const int32_t id = c->sampler.Sample(row, vocab_, c->history);
  // The mask leaves at least one token unless the grammar is at a dead end (an end that
  // min_tokens or the stop-id ban took away): that ends the request with an error.
  if (c->matcher && !c->matcher->Accept(id))
    throw std::runtime_error("the grammar allows no token here (token " + std::to_string(id) +
                             " was drawn); min_tokens too large for the format?");
  sample_seconds_ += Seconds(Clock::now() - sample_begin);  // the rest is emitting
  c->tokens.push_back(id);
  c->history.Append(id);
  ++c->num_output;
  ++generation_tokens_total_;
  ev.token_ids.push_back(id);
  if (p.want_logprobs) {
    lp.id = id;
    lp.logprob = Sampler::LogProb(raw_row_.data(), vocab_, id);
    ev.logprobs.push_back(std::move(lp));
  }

  const char* reason = nullptr;
  const bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) !=
                       p.stop_token_ids.end();
  const bool grammar_eos = c->matcher && IsEndOfGeneration(id);  // the grammar is complete
  if (grammar_eos ||
      ((stop_id || (!p.ignore_eos && IsEndOfGeneration(id))) && c->num_output > p.min_tokens)) {
    reason = "stop";  // the stop token's text is not part of the output
  } else if (c->decoder) {
    const std::string piece = c->decoder->Push(id);
    if (p.want_logprobs) ev.logprobs.back().text = piece;
    c->pending += piece;
  }
  bool stop_string = false;
  for (size_t i = 0; !reason && i < p.stop.size(); ++i) {
    const size_t at = c->pending.find(p.stop[i]);
    if (at == std::string::npos) continue;
    c->pending.resize(p.include_stop_str_in_output ? at + p.stop[i].size() : at);
    reason = "stop";
    stop_string = true;
  }
  if (!reason && c->matcher && c->matcher->IsTerminated()) reason = "stop";  // nothing can follow
  if (!reason && (c->num_output >= p.max_tokens || c->num_tokens() >= max_model_len_))
    reason = "length";
  if (reason && !stop_string && c->decoder) {
    const std::string tail = c->decoder->Flush();
    if (p.want_logprobs) ev.logprobs.back().text += tail;
    c->pending += tail;
  }
  const size_t hold = reason ? 0 : StopHoldback(c->pending, p.stop);
  ev.text = c->pending.substr(0, c->pending.size() - hold);
  c->pending.erase(0, c->pending.size() - hold);
  if (reason) {
    FinishCompletion(c, std::move(ev), reason);
  } else {
    ev.index = c->index;
    ev.prompt_tokens = c->num_prompt_tokens;
    ev.completion_tokens = c->num_output;
    c->req->stream->Push(std::move(ev));
  }
}

void EngineImpl::FinishCompletion(Completion* c, RequestOutput ev, const char* reason) {
  sched_.Finish(c);
  c->done = true;
  ev.index = c->index;
  ev.prompt_tokens = c->num_prompt_tokens;
  ev.completion_tokens = c->num_output;
  ev.finish_reason = reason;
  Request* r = c->req;
  if (++r->num_done == r->in.n) RetireRequest(r);
  r->stream->Push(std::move(ev));
}

// The id can be reused from now on; the Request object goes at the end of the step.
void EngineImpl::RetireRequest(Request* r) {
  ++finished_total_;
  finished_ids_.push_back(r->in.id);
  std::lock_guard<std::mutex> lk(mu_);
  in_flight_.erase(r->in.id);
}

// Ends every completion of `r` that is still going with `reason` ("abort" or "error").
void EngineImpl::EndRequest(Request* r, const char* reason, const std::string& error) {
  if (r->num_done >= r->in.n) return;
  const int64_t prompt = static_cast<int64_t>(r->in.prompt.size());
  for (int i = 0; i < r->in.n; ++i) {
    RequestOutput ev;
    ev.error = error;
    if (i < static_cast<int>(r->completions.size())) {
      Completion* c = r->completions[i].get();
      if (!c->done) FinishCompletion(c, std::move(ev), reason);
      continue;
    }
    ev.index = i;  // a completion that was never forked
    ev.prompt_tokens = prompt;
    ev.finish_reason = reason;
    if (++r->num_done == r->in.n) RetireRequest(r);
    r->stream->Push(std::move(ev));
  }
}

void EngineImpl::FailRequest(Request* r, const std::string& error) {
  if (r->num_done >= r->in.n) return;
  ++failed_total_;
  std::fprintf(stderr, "peng: request %s failed: %s\n", r->in.id.c_str(), error.c_str());
  EndRequest(r, "error", error);
}

// Drops the requests finished this step and publishes the stats; Drain() returns only after
// a publication that found the engine idle, so the stats it then reads are final.
void EngineImpl::PublishStats(const Clock::time_point* step_begin) {
  for (const std::string& id : finished_ids_) active_.erase(id);
  finished_ids_.clear();
  const Clock::time_point step_end = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (step_begin) RecordStepLocked(*step_begin, step_end);
  idle_ = active_.empty();
  if (idle_) done_cv_.notify_all();
  stats_.num_running = sched_.num_running();
  stats_.num_waiting = sched_.num_waiting();
  stats_.num_preemptions_total = sched_.num_preemptions_total();
  stats_.kv_blocks_total = kvm_.num_blocks();
  stats_.kv_blocks_used = kvm_.num_used_blocks();
  stats_.kv_usage = kvm_.usage();
  int64_t unfilled = 0;
  for (const Sequence* seq : sched_.running()) {
    const int64_t slots = static_cast<int64_t>(kvm_.block_table(seq->id).size()) * kvm_.block_size();
    unfilled += std::max<int64_t>(0, slots - seq->num_computed_tokens);
  }
  const double pool_slots = static_cast<double>(kvm_.num_blocks()) * kvm_.block_size();
  stats_.kv_slots_unfilled = unfilled;
  stats_.kv_fragmentation = unfilled / pool_slots;
  if (!sched_.running().empty()) {
    frag_sum_ += stats_.kv_fragmentation;
    ++frag_steps_;
    stats_.kv_fragmentation_max = std::max(stats_.kv_fragmentation_max, stats_.kv_fragmentation);
    stats_.kv_fragmentation_mean = frag_sum_ / frag_steps_;
  }
  stats_.prefix_cache_queries = kvm_.prefix_cache_queries();
  stats_.prefix_cache_hits = kvm_.prefix_cache_hits();
  stats_.prompt_tokens_total = prompt_tokens_total_;
  stats_.generation_tokens_total = generation_tokens_total_;
  stats_.requests_finished_total = finished_total_;
  stats_.requests_failed_total = failed_total_;
  stats_.steps_total = steps_total_;
  stats_.queue_wait_seconds_sum = queue_wait_sum_;
  stats_.queue_wait_count = queue_wait_count_;
}

// Adds the step [begin, end) to the phase totals and the utilization window (under mu_).
void EngineImpl::RecordStepLocked(Clock::time_point begin, Clock::time_point end) {
  double phase[4] = {0, 0, 0, 0};
  if (forward_ran_) {
    phase[kPhaseSchedule] = Seconds(forward_begin_ - begin);
    phase[kPhaseForward] = Seconds(forward_end_ - forward_begin_);
    phase[kPhaseSample] = sample_seconds_;
    phase[kPhaseEmit] = std::max(0.0, Seconds(end - forward_end_) - sample_seconds_);
  } else {
    phase[kPhaseSchedule] = Seconds(end - begin);
  }
  StepRecord rec;
  rec.end = end;
  rec.seconds = Seconds(end - begin);
  rec.work = step_work_;
  for (int i = 0; i < 4; ++i) stats_.phase_seconds_total[i] += phase[i];
  stats_.weight_bytes_total += rec.work.weight_bytes;
  stats_.kv_bytes_total += rec.work.kv_bytes;
  stats_.flops_f32_total += rec.work.flops_f32;
  stats_.ops_int8_total += rec.work.ops_int8;
  const auto window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opt_.utilization_window_s));
  while (!recent_steps_.empty() && recent_steps_.front().end < end - window)
    recent_steps_.pop_front();
  recent_steps_.push_back(rec);
}

EngineStats EngineImpl::GetStats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  const Clock::time_point now = Clock::now();
  const auto window = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(opt_.utilization_window_s));
  double busy = 0;
  kernels::WorkCounts work;
  for (const StepRecord& r : recent_steps_) {
    if (r.end < now - window) continue;
    busy += r.seconds;
    work += r.work;
  }
  s.busy_fraction = std::min(1.0, busy / opt_.utilization_window_s);
  if (busy > 0) {
    s.read_bytes_per_s = static_cast<double>(work.weight_bytes + work.kv_bytes) / busy;
    s.ops_per_s = static_cast<double>(work.flops_f32 + work.ops_int8) / busy;
    if (s.peak_read_bytes_per_s > 0) s.bandwidth_utilization = s.read_bytes_per_s / s.peak_read_bytes_per_s;
    double compute_seconds = 0;  // the time each kind of op would take at its peak
    if (s.peak_flops_f32_per_s > 0) compute_seconds += work.flops_f32 / s.peak_flops_f32_per_s;
    if (s.peak_ops_int8_per_s > 0) compute_seconds += work.ops_int8 / s.peak_ops_int8_per_s;
    s.compute_utilization = compute_seconds / busy;
  }
  return s;
}

Status ValidateOptions(const EngineOptions& o) {
  if (o.threads < 0) return InvalidArgument("threads must be >= 0");
  if (!(o.utilization_window_s > 0)) return InvalidArgument("utilization_window_s must be > 0");
  if (o.block_size <= 0 || o.max_num_seqs <= 0 || o.max_num_batched_tokens <= 0 ||
      o.max_model_len <= 0 || o.kv_cache_bytes < 0 || o.max_waiting <= 0 ||
      o.num_kv_blocks < 0)
    return InvalidArgument("engine options must be positive (kv_cache_bytes >= 0)");
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o) {
  PENG_RETURN_IF_ERROR(ValidateOptions(o));  // before the (slow) model load
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(o.model_path));
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::ForModel(o.model_path));
  return Create(o, std::move(model), std::move(tok));
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& o,
                                                 std::unique_ptr<Model> model,
                                                 std::unique_ptr<Tokenizer> tok) {
  PENG_RETURN_IF_ERROR(ValidateOptions(o));
  if (!model) return InvalidArgument("no model");
  const ModelConfig& cfg = model->config();
  const int64_t max_len =
      cfg.max_position > 0 ? std::min<int64_t>(o.max_model_len, cfg.max_position) : o.max_model_len;
  const DType dtype = DType::kF16;
  int64_t blocks;
  if (o.num_kv_blocks > 0) {
    blocks = o.num_kv_blocks;
  } else if (o.kv_cache_bytes == 0) {
    blocks = int64_t{o.max_num_seqs} * ((max_len + o.block_size - 1) / o.block_size);
    blocks = std::min(blocks, KvCache::BlocksForBudget(model->kv_spec(), o.block_size, dtype,
                                                       PhysicalMemoryBytes() / 4));
  } else {
    blocks = KvCache::BlocksForBudget(model->kv_spec(), o.block_size, dtype, o.kv_cache_bytes);
  }
  if (blocks < 1)
    return InvalidArgument("the KV cache budget of " + std::to_string(o.kv_cache_bytes) +
                           " bytes holds no block of " + std::to_string(o.block_size) + " tokens");
  PENG_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv,
                        KvCache::Create(model->kv_spec(), blocks, o.block_size, dtype));
  return std::unique_ptr<Engine>(
      new EngineImpl(o, std::move(model), std::move(tok), std::move(kv), max_len));
}

}  // namespace peng
