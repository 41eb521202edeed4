#include "engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <stdexcept>
#include <tuple>

#include "engine/llm.h"
#include "engine/sampler.h"
#include "grammar/grammar.h"
#include "kernels/ops.h"
#include "tokenizer/streaming_decoder.h"

namespace peng {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

// One completion of a request: a scheduler sequence plus its sampling and text state.
struct EngineCore::Completion : Sequence {
  Completion(Request* r, int i, const SamplingParams& p) : req(r), index(i), sampler(p) {}
  Request* req;
  int index;
  Sampler sampler;
  TokenHistory history;
  LogitEdits edits;  // what a device changes in its next row (SeqBatchEntry::edits)
  std::unique_ptr<StreamingDecoder> decoder;
  std::unique_ptr<grammar::Matcher> matcher;  // when the request has a grammar
  std::string pending;  // text held back while a stop string may be forming
  int64_t num_output = 0;
  bool done = false;
};

struct EngineCore::Request {
  GenerateRequest in;
  std::vector<std::unique_ptr<Completion>> completions;  // [0] first; the rest after prefill
  int num_done = 0;
  bool forked = false;
  Clock::time_point arrival;  // for the queue wait
  bool scheduled = false;     // has been in a step
  int replica = 0;            // the data-parallel replica that runs it
};

// One data-parallel replica's scheduler and KV block manager (one replica without data
// parallelism), and its batch of the current step.
struct EngineCore::Replica {
  Replica(const EngineOptions& o, const Executor& ex)
      : kvm(ex.num_kv_blocks(), ex.block_size(), o.enable_prefix_caching),
        sched({o.max_num_batched_tokens, o.max_num_seqs}, &kvm) {}
  KvCacheManager kvm;
  Scheduler sched;
  const SchedulerOutput* out = nullptr;  // this step's schedule
  ForwardBatch batch;
  std::vector<float> logits, hidden;
  TopLogits top;  // the rows sampled from their best logits alone (SeqBatchEntry::top_logits)
};

namespace {
// EngineCore::top_logits_nucleus_: the executor's most, at most a quarter of the vocabulary.
int NucleusList(const Executor& ex, int64_t vocab) {
  return static_cast<int>(std::min<int64_t>(ex.top_logits_max(), vocab / 4));
}
// EngineCore::top_logits_wide_: the executor's most, at most half the vocabulary, where that is
// more than a step's nucleus list; else 0.
int WideList(const Executor& ex, int64_t vocab) {
  const int64_t k = std::min<int64_t>(ex.top_logits_wide(), vocab / 2);
  return k > NucleusList(ex, vocab) ? static_cast<int>(k) : 0;
}
}  // namespace

EngineCore::EngineCore(const EngineOptions& o, std::unique_ptr<Executor> executor,
                       std::unique_ptr<Tokenizer> tokenizer)
    : opt_(o),
      executor_(std::move(executor)),
      tokenizer_(std::move(tokenizer)),
      max_model_len_(EffectiveMaxModelLen(o, executor_->config())),
      vocab_(executor_->config().vocab_size),
      top_logits_max_(executor_->top_logits_max()),
      top_logits_nucleus_(NucleusList(*executor_, vocab_)),
      top_logits_wide_(WideList(*executor_, vocab_)) {
  for (int d = 0; d < executor_->data_parallel_size(); ++d)
    replicas_.push_back(std::make_unique<Replica>(o, *executor_));
}

EngineCore::~EngineCore() = default;

StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(const EngineOptions& o,
                                                         std::unique_ptr<Executor> executor,
                                                         std::unique_ptr<Tokenizer> tokenizer) {
  if (!executor) return InvalidArgument("no executor");
  PENG_RETURN_IF_ERROR(ValidateOptions(o));
  return std::unique_ptr<EngineCore>(
      new EngineCore(o, std::move(executor), std::move(tokenizer)));
}

bool EngineCore::IsEndOfGeneration(int32_t id) const {
  return tokenizer_ ? tokenizer_->IsEndOfGeneration(id) : id == executor_->config().eos_id;
}

Status EngineCore::Validate(const GenerateRequest& request) const {
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
      return InvalidArgument("token id " + std::to_string(id) + " is out of range: the vocabulary is [0, " +
                             std::to_string(vocab_) + ")");
  for (const auto& [id, bias] : request.params.logit_bias)
    if (id >= vocab_)
      return InvalidArgument("logit_bias: token id " + std::to_string(id) +
                             " is outside the vocabulary [0, " + std::to_string(vocab_) + ")");
  const KvCacheManager& kvm = replicas_[0]->kvm;  // (every replica's pool has this size)
  const int64_t slots = kvm.num_blocks() * kvm.block_size();
  const bool scoring = request.return_prompt_logits || request.return_hidden_states;
  if (scoring) {  // the prompt alone, no token sampled: it may fill the context
    if (request.n != 1) return InvalidArgument("a scoring request (prompt logits / hidden states) has n = 1");
    if (request.return_hidden_states && opt_.max_num_seqs != 1)
      return InvalidArgument("return_hidden_states needs an engine with max_num_seqs = 1");
    if (request.return_hidden_states && replicas_.size() > 1)
      return InvalidArgument("return_hidden_states needs an engine without data parallelism");
    if (request.return_hidden_states && opt_.pipeline_parallel_size > 1)
      return InvalidArgument("return_hidden_states needs an engine without pipeline stages");
    if (len > max_model_len_)
      return OutOfRange("prompt of " + std::to_string(len) + " tokens exceeds the context length: " +
                        "max_model_len is " + std::to_string(max_model_len_));
    if (len > slots)
      return OutOfRange("prompt of " + std::to_string(len) + " tokens does not fit in the KV cache (" +
                        std::to_string(slots) + " token slots)");
    return OkStatus();
  }
  if (len >= max_model_len_)
    return OutOfRange("prompt of " + std::to_string(len) + " tokens exceeds the context length: " +
                      "max_model_len is " + std::to_string(max_model_len_) +
                      " and at least one token must be generated");
  if (len + 1 > slots)
    return OutOfRange("prompt of " + std::to_string(len) + " tokens does not fit in the KV cache (" +
                      std::to_string(slots) + " token slots)");
  return OkStatus();
}

Status EngineCore::Add(GenerateRequest request, Clock::time_point arrival) {
  if (!health_.ok()) return Internal("the engine cannot run: " + health_.message());
  PENG_RETURN_IF_ERROR(Validate(request));
  if (active_.count(request.id)) return InvalidArgument("duplicate request id " + request.id);
  auto r = std::make_unique<Request>();
  r->in = std::move(request);
  r->arrival = arrival;
  const SamplingParams& p = r->in.params;
  auto c = std::make_unique<Completion>(r.get(), 0, p);
  c->id = next_seq_id_++;
  c->tokens = r->in.prompt;
  c->num_prompt_tokens = static_cast<int64_t>(c->tokens.size());
  c->history = TokenHistory(c->tokens);
  // Scoring needs every prompt position computed, not served from the prefix cache.
  c->use_prefix_cache = !r->in.return_prompt_logits && !r->in.return_hidden_states;
  if (tokenizer_) c->decoder = std::make_unique<StreamingDecoder>(*tokenizer_, p.skip_special_tokens);
  if (r->in.grammar) c->matcher = std::make_unique<grammar::Matcher>(r->in.grammar);
  prompt_tokens_total_ += c->num_prompt_tokens;
  r->replica = PickReplica(r->in.prompt);
  replicas_[r->replica]->sched.Add(c.get());
  r->completions.push_back(std::move(c));
  const std::string id = r->in.id;
  active_[id] = std::move(r);
  return OkStatus();
}

// Data parallelism: among the replicas within one sequence of the least load (running +
// waiting sequences), the one with the longest cached prefix of the prompt (a hash lookup per
// block), then the least loaded, then the lowest KV use, then the lowest index.
int EngineCore::PickReplica(const std::vector<int32_t>& prompt) const {
  if (replicas_.size() == 1) return 0;
  auto load = [](const Replica& R) { return R.sched.num_running() + R.sched.num_waiting(); };
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const auto& R : replicas_) least = std::min(least, load(*R));
  int best = -1;
  std::tuple<int64_t, int64_t, double> best_key;  // (-cached, load, usage): smallest wins
  for (int d = 0; d < static_cast<int>(replicas_.size()); ++d) {
    const Replica& R = *replicas_[d];
    if (load(R) > least + 1) continue;
    const std::tuple<int64_t, int64_t, double> key{-R.kvm.GetComputedBlocks(prompt).num_tokens,
                                                   load(R), R.kvm.usage()};
    if (best < 0 || key < best_key) {
      best = d;
      best_key = key;
    }
  }
  return best;
}

void EngineCore::Abort(const std::string& id) {
  auto it = active_.find(id);
  if (it != active_.end()) EndRequest(it->second.get(), "abort", "");
}

void EngineCore::AbortAll() {
  std::vector<Request*> all;
  for (auto& [id, r] : active_) all.push_back(r.get());
  for (Request* r : all) EndRequest(r, "abort", "");
}

std::vector<EngineCoreOutput> EngineCore::Step() {
  step_ = StepInfo();
  bool pending = false, running = false;
  for (const auto& R : replicas_) pending = pending || !R->sched.empty();
  if (pending) RunStep();
  for (const auto& R : replicas_) running = running || !R->sched.running().empty();
  if (running) {
    const double frag = KvFragmentation(nullptr);
    frag_sum_ += frag;
    ++frag_steps_;
    frag_max_ = std::max(frag_max_, frag);
  }
  retired_.clear();
  std::vector<EngineCoreOutput> out;
  out.swap(outputs_);
  return out;
}

void EngineCore::RunStep() {
  const Clock::time_point now = Clock::now();
  work_.clear();
  bool any = false;
  for (const auto& rp : replicas_) {  // every replica's schedule and batch
    Replica& R = *rp;
    const SchedulerOutput& out = R.sched.Schedule();
    R.out = &out;
    for (Sequence* s : out.too_long) {  // outgrew the whole KV pool: ends like max_model_len
      auto* c = static_cast<Completion*>(s);
      RequestOutput ev;
      if (c->decoder) c->pending += c->decoder->Flush();
      ev.text = std::move(c->pending);
      FinishCompletion(c, std::move(ev), "length");
    }
    ForwardBatch& batch = R.batch;
    batch.tokens.clear();
    batch.seqs.clear();
    batch.capture_hidden = nullptr;
    batch.top = top_logits_max_ > 0 ? &R.top : nullptr;
    for (const ScheduledSeq& sc : out.scheduled) {
      auto* c = static_cast<Completion*>(sc.seq);
      Request* r = c->req;
      if (!r->scheduled) {
        r->scheduled = true;
        queue_wait_sum_ += Seconds(now - r->arrival);
        ++queue_wait_count_;
      }
      auto first = c->tokens.begin() + c->num_computed_tokens;
      batch.tokens.insert(batch.tokens.end(), first, first + sc.num_new_tokens);
      const std::vector<int32_t>& table = R.kvm.block_table(c->id);
      SeqBatchEntry e;
      e.n_tokens = sc.num_new_tokens;
      e.pos0 = c->num_computed_tokens;
      e.block_table = table.data();
      e.n_blocks = static_cast<int64_t>(table.size());
      e.want_logits = c->num_computed_tokens + sc.num_new_tokens == c->num_tokens();
      if (r->in.return_prompt_logits && c->num_computed_tokens < c->num_prompt_tokens)
        e.all_logits = e.want_logits = true;
      if (e.want_logits && !e.all_logits) e.top_logits = TopLogitsFor(*c);
      if (e.top_logits > 0) {
        e.edits = EditsFor(c);
        // (a grammar's mask over its work budget: the whole row, where Choose() says so)
        if (c->matcher && !e.edits) e.top_logits = 0;
      }
      const SamplingParams& p = r->in.params;
      if (e.top_logits > 0 && Sampler::DrawsInIdOrder(p, vocab_)) {  // the device draws
        e.draw_inv_temperature = 1.0f / p.temperature;
        e.draw_uniform = c->sampler.PendingUniform();
      } else if (e.top_logits > 0 && Sampler::SamplesNucleus(p, vocab_)) {  // and sums
        e.draw_inv_temperature = 1.0f / p.temperature;
      }
      e.log_total = e.top_logits > 0 && p.want_logprobs;
      if (r->in.return_hidden_states && c->num_computed_tokens < c->num_prompt_tokens)
        batch.capture_hidden = &R.hidden;  // alone in the batch (Validate)
      batch.seqs.push_back(e);
    }
    R.logits.resize(std::max<size_t>(
        {R.logits.size(), static_cast<size_t>(batch.NumLogitRows() * vocab_), size_t{1}}));
    work_.push_back({&batch, out.copies, R.logits.data()});
    any = any || !out.scheduled.empty();
  }
  if (!any) return;
  const kernels::WorkCounts work_before = kernels::ThreadWork();
  step_.forward_ran = true;
  step_.forward_begin = Clock::now();
  const Status st = executor_->ExecuteReplicas(work_);
  step_.forward_end = Clock::now();
  step_.work = kernels::ThreadWork() - work_before;
  ++steps_total_;
  if (!st.ok()) {  // the batch's KV writes are not trusted: its requests end, nothing is cached
    std::vector<Request*> failed;
    for (const auto& R : replicas_)
      for (const ScheduledSeq& sc : R->out->scheduled) {
        Request* r = static_cast<Completion*>(sc.seq)->req;
        if (std::find(failed.begin(), failed.end(), r) == failed.end()) failed.push_back(r);
      }
    for (Request* r : failed) FailRequest(r, "model forward pass failed: " + st.message());
    if (health_.ok()) health_ = executor_->Health();
    if (!health_.ok()) {  // nothing more can run: every request ends now
      failed.clear();
      for (auto& [id, r] : active_) failed.push_back(r.get());
      for (Request* r : failed) FailRequest(r, "the engine cannot run: " + health_.message());
    }
    return;
  }
  for (const auto& R : replicas_)
    if (!R->out->scheduled.empty()) FinishStep(R.get());
}

// After the forward pass: the replica's sequences that reached their last token sample.
void EngineCore::FinishStep(Replica* rp) {
  Replica& R = *rp;
  const SchedulerOutput& out = *R.out;
  R.sched.OnStepDone();
  if (R.batch.capture_hidden) {  // the batch is this one sequence's prompt chunk
    RequestOutput ev;
    ev.prompt_tokens = out.scheduled[0].seq->num_prompt_tokens;
    ev.hidden_states = std::move(R.hidden);
    Emit(static_cast<Completion*>(out.scheduled[0].seq)->req, std::move(ev));
  }
  // The rows to sample, in order. Each is first checked for NaN (or +inf, which the softmax
  // cannot weigh): such a row is garbage and fails its request (the device checked the rows it
  // returned the best of). A row that came back as its best logits (a grammar's too: the device
  // masked it), or a whole row of a completion without a grammar (whose masks share the
  // grammar's cache) that does not fork, then has its token chosen there too; both over the
  // pool's threads (a batch's logits are megabytes, and the tokens of a step's sequences
  // depend only on their own rows and samplers). The other completions sample, the grammars
  // take their tokens, and every token is emitted, after, in order, on this thread.
  choices_.clear();
  bool any_whole = false;
  int64_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const SeqBatchEntry& e = R.batch.seqs[i];
    if (!e.want_logits) continue;
    auto* c = static_cast<Completion*>(out.scheduled[i].seq);
    const int64_t rows = e.all_logits ? e.n_tokens : 1;
    float* first_row = R.logits.data() + row * vocab_;
    row += rows;
    if (c->done) continue;  // failed earlier in this step
    Request* r = c->req;
    if (e.all_logits) {  // scoring: the prompt positions' logits, before any sampling
      RequestOutput ev;
      ev.prompt_tokens = c->num_prompt_tokens;
      ev.prompt_logits.assign(first_row, first_row + rows * vocab_);
      Emit(r, std::move(ev));
    }
    if (c->num_computed_tokens < c->num_tokens()) continue;  // mid-prompt chunk
    if (r->in.return_prompt_logits || r->in.return_hidden_states) {  // scoring: no sampling
      FinishCompletion(c, RequestOutput(), "length");
      continue;
    }
    RowChoice ch;
    ch.c = c;
    ch.row = first_row + (rows - 1) * vocab_;
    if (e.top_logits > 0) {  // (never a request that forks: TopLogitsFor)
      const int64_t at = (row - 1) * R.top.k;
      ch.top_val = R.top.val.data() + at;
      ch.top_idx = R.top.idx.data() + at;
      ch.top_k = R.top.k;
      ch.bad = R.top.first_bad[row - 1];
      ch.draws = e.draw_inv_temperature > 0 && e.draw_uniform >= 0;
      ch.nucleus = e.draw_inv_temperature > 0 && !ch.draws;
      ch.top = &R.top;
      ch.logit_row = row - 1;
      ch.edited = e.edits != nullptr;
    }
    any_whole = any_whole || ch.top_k == 0;
    ++(ch.top_k > 0 ? logit_rows_best_total_ : logit_rows_whole_total_);
    ch.parallel = ch.top_k > 0 || (!c->matcher && !(r->in.n > 1 && !r->forked));
    choices_.push_back(std::move(ch));
  }
  const Clock::time_point sample_begin = Clock::now();
  const auto check_and_choose = [&](int64_t a, int64_t b) {
    std::vector<float> raw;
    for (int64_t j = a; j < b; ++j) {
      RowChoice& ch = choices_[j];
      if (ch.top_k == 0) ch.bad = kernels::FindNanOrPosInf(ch.row, vocab_);
      if (ch.bad >= 0 || !ch.parallel) continue;
      try {
        if (ch.top_k > 0) {
          ChooseFromBest(&ch);
        } else {
          ch.id = Choose(ch.c, ch.row, &ch.lp, &raw);
        }
      } catch (const std::exception& e) {
        ch.error = e.what();
      }
    }
  };
  // (rows of a device's best logits alone are not worth waking the threads for)
  ForRows(&executor_->pool(), static_cast<int64_t>(choices_.size()), any_whole ? vocab_ : 1,
          check_and_choose);
  // Top-p / min-p rows whose nucleus may reach past the best logits the device returned: their
  // best top_logits_wide_ now (ChooseFromWide), and where it may reach past those too their
  // whole rows (on the device until the next step), sampled from those -- as the device changed
  // them (SeqBatchEntry::edits): the sampler then makes no change of its own.
  late_.clear();
  for (RowChoice& ch : choices_)
    if (ch.nucleus && ch.parallel && ch.id < 0 && ch.bad < 0 && ch.error.empty())
      late_.push_back(&ch);
  ChooseFromWide(&late_);
  size_t kept = 0;
  for (RowChoice* ch : late_) {
    const Status st = FetchWholeRow(ch);
    if (st.ok()) {
      late_[kept++] = ch;
    } else {
      ch->error = "the logit row: " + st.message();
    }
  }
  late_.resize(kept);
  ForRows(&executor_->pool(), static_cast<int64_t>(late_.size()), vocab_,
          [&](int64_t a, int64_t b) {
            std::vector<float> raw;
            for (int64_t j = a; j < b; ++j) {
              RowChoice& ch = *late_[j];
              try {
                ch.id = ch.edited ? ch.c->sampler.Sample(ch.row, vocab_, TokenHistory())
                                  : Choose(ch.c, ch.row, &ch.lp, &raw);
              } catch (const std::exception& e) {
                ch.error = e.what();
              }
            }
          });
  step_.sample_seconds += Seconds(Clock::now() - sample_begin);
  for (RowChoice& ch : choices_) {
    Completion* c = ch.c;
    Request* r = c->req;
    if (c->done) continue;  // a sibling completion failed the request in this step
    if (ch.bad >= 0) {
      FailRequest(r, "the model produced a non-finite logit (token " + std::to_string(ch.bad) +
                         ")");
      continue;
    }
    try {
      if (ch.parallel) {
        if (!ch.error.empty()) throw std::runtime_error(ch.error);
        if (ch.top_k > 0) Accept(c, ch.id);  // (a grammar's row: the device masked it)
        EmitToken(c, ch.id, r->in.params.want_logprobs ? &ch.lp : nullptr);
      } else {
        if (r->in.n > 1 && !r->forked) Fork(r, ch.row);
        SampleAndEmit(c, ch.row);
      }
    } catch (const std::exception& e) {
      FailRequest(r, e.what());
    }
  }
}

// The prompt is computed: the other n - 1 completions share its blocks and sample from the
// same logits, each with its own seed (seed + index).
void EngineCore::Fork(Request* r, const float* row) {
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
    Replica& R = *replicas_[r->replica];
    R.kvm.Fork(parent->id, c->id);
    R.sched.AddRunning(c.get());
    Completion* cp = c.get();
    r->completions.push_back(std::move(c));
    fork_row_.assign(row, row + vocab_);
    SampleAndEmit(cp, fork_row_.data());
  }
}

void EngineCore::SampleAndEmit(Completion* c, float* row) {
  const Clock::time_point sample_begin = Clock::now();
  const SamplingParams& p = c->req->in.params;
  TokenLogprob lp;
  const int32_t id = Choose(c, row, &lp, &raw_row_);
  step_.sample_seconds += Seconds(Clock::now() - sample_begin);  // the rest is emitting
  EmitToken(c, id, p.want_logprobs ? &lp : nullptr);
}

// f(id) for each id min_tokens bans until it is reached: EOS (unless ignore_eos) and the stop
// ids.
template <typename F>
void EngineCore::ForEachMinTokensBan(const SamplingParams& p, F&& f) const {
  const int32_t eos = tokenizer_ ? tokenizer_->eos_id() : executor_->config().eos_id;
  if (!p.ignore_eos && eos >= 0 && eos < vocab_) f(eos);
  for (int32_t id : p.stop_token_ids)
    if (id < vocab_) f(id);
}

// f(id) for each end-of-generation id of the completion's grammar that ignore_eos bans while the
// grammar allows more (the output goes on: benchmarks).
template <typename F>
void EngineCore::ForEachGrammarEosBan(const Completion& c, F&& f) const {
  if (!c.matcher || !c.req->in.params.ignore_eos || c.matcher->IsTerminated()) return;
  for (int32_t id : c.req->in.grammar->vocab().eos_ids())
    if (id < vocab_) f(id);
}

// Choose()'s logprobs of a row that came back as its best logits (RowChoice::top_val / top_idx,
// log_total; the chosen token's logit from the list or, where the device drew it past the list,
// drawn_logit): Sampler::TopLogprobs' and LogProb's values.
void EngineCore::LogprobsFromBest(RowChoice* ch) {
  const int64_t lr = ch->logit_row;
  const double lse = Sampler::LogSumExpOf(ch->top_val[0], ch->top->log_total[lr]);
  Sampler::ListLogprobs(ch->top_val, ch->top_idx, ch->c->req->in.params.logprobs, lse,
                        &ch->lp.top);
  float logit = ch->top->drawn_logit[lr];
  for (int i = 0; i < ch->top_k; ++i)
    if (ch->top_idx[i] == ch->id) logit = ch->top_val[i];
  ch->lp.logprob = static_cast<float>(logit - lse);
}

// The completion's next token from its whole logit row (modified: bias, mask, bans,
// penalties), with its logprobs in *lp where asked for (raw: scratch). Touches only the
// completion's own state (its sampler, its matcher), so completions without a grammar choose
// side by side (FinishStep); throws what ends the request.
int32_t EngineCore::Choose(Completion* c, float* row, TokenLogprob* lp,
                           std::vector<float>* raw) const {
  const SamplingParams& p = c->req->in.params;
  if (p.want_logprobs) {
    raw->assign(row, row + vocab_);
    if (p.logprobs > 0) Sampler::TopLogprobs(row, vocab_, p.logprobs, &lp->top);
  }
  for (const auto& [id, bias] : p.logit_bias) row[id] += bias;
  const auto ban = [&](int32_t id) { row[id] = -std::numeric_limits<float>::infinity(); };
  if (c->matcher) {
    if (!c->matcher->ApplyMask(row, vocab_))
      throw std::runtime_error("the grammar is too ambiguous to follow: one token mask went over "
                               "its work budget");
    ForEachGrammarEosBan(*c, ban);
  }
  if (c->num_output < p.min_tokens) ForEachMinTokensBan(p, ban);  // (EOS, stop ids: not yet)
  const int32_t id = c->sampler.Sample(row, vocab_, c->history);
  Accept(c, id);
  if (p.want_logprobs) lp->logprob = Sampler::LogProb(raw->data(), vocab_, id);
  return id;
}

// The completion's grammar, if any, takes the drawn token. The mask leaves at least one token
// unless the grammar is at a dead end (an end that min_tokens or the stop-id ban took away):
// that ends the request with an error (thrown).
void EngineCore::Accept(Completion* c, int32_t id) {
  if (c->matcher && !c->matcher->Accept(id))
    throw std::runtime_error("the grammar allows no token here (token " + std::to_string(id) +
                             " was drawn); min_tokens too large for the format?");
}

// The token of a row that came back as its best logits (RowChoice::top_val / top_idx): the
// device's draw, the nucleus within them or the top-k, with its logprobs where asked for; -1
// (ch->id) where the nucleus may reach past them, drawing nothing (the whole row is needed).
void EngineCore::ChooseFromBest(RowChoice* ch) const {
  Sampler& s = ch->c->sampler;
  const int64_t lr = ch->logit_row;
  if (ch->draws) {
    ch->id = s.SampleDrawn(ch->top_val[0], ch->top_idx[0], ch->top->drawn[lr]);
  } else if (ch->nucleus) {
    ch->id = s.SampleNucleus(ch->top_val, ch->top_idx, ch->top_k, vocab_, ch->top->total[lr]);
  } else {
    ch->id = s.SampleTop(ch->top_val, ch->top_idx, ch->top_k);
  }
  if (ch->id >= 0 && s.params().want_logprobs) LogprobsFromBest(ch);
}

// Rows that came back as their best logits whose nucleus may reach past them (ChooseFromBest
// drew nothing): their best top_logits_wide_, as the device changed them, in one copy, and
// ChooseFromBest from those; counted as wide rows. The rows that drew nothing still (or all,
// where there is no wider list or the copy failed) stay in *rows: their whole rows are next.
void EngineCore::ChooseFromWide(std::vector<RowChoice*>* rows) {
  const int k = top_logits_wide_;
  if (k == 0 || rows->empty()) return;
  const size_t n = rows->size();
  wide_rows_.clear();
  for (const RowChoice* ch : *rows) wide_rows_.push_back(ch->logit_row);
  wide_val_.resize(n * k);
  wide_idx_.resize(n * k);
  if (!executor_->CopyBestOfLogitRows(wide_rows_, k, wide_val_.data(), wide_idx_.data()).ok())
    return;
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    RowChoice* ch = (*rows)[i];
    ch->top_val = wide_val_.data() + i * k;
    ch->top_idx = wide_idx_.data() + i * k;
    ch->top_k = k;
    ch->wide = true;
    ++logit_rows_wide_total_;
    --logit_rows_best_total_;
    ChooseFromBest(ch);
    if (ch->id < 0) (*rows)[kept++] = ch;
  }
  rows->resize(kept);
}

// The whole row of a row that came back as its best logits (a nucleus that may reach past
// them and past its wider list), as the device changed it, into ch->row; counted as a whole
// row.
Status EngineCore::FetchWholeRow(RowChoice* ch) {
  ++logit_rows_whole_total_;
  --(ch->wide ? logit_rows_wide_total_ : logit_rows_best_total_);
  return executor_->CopyLogitRow(ch->logit_row, ch->row);
}

// What Choose() would change in the completion's next row before its sampler draws -- the
// logit_bias, the grammar's mask and ignore_eos' ban under it, the min_tokens ban, then the
// sampler's penalties (LogitEdits) -- for the device to change in its copy of the row; null
// where nothing changes, or where the grammar's mask went over its work budget.
const LogitEdits* EngineCore::EditsFor(Completion* c) const {
  const SamplingParams& p = c->req->in.params;
  LogitEdits& e = c->edits;
  e.clear();
  e.bias = p.logit_bias;
  if (c->matcher) {
    e.allow.resize(grammar::MaskWords(vocab_));
    if (!c->matcher->FillMask(e.allow.data(), vocab_)) {
      e.clear();
      return nullptr;
    }
    ForEachGrammarEosBan(*c, [&](int32_t id) { e.ban.push_back(id); });
  }
  if (c->num_output < p.min_tokens)
    ForEachMinTokensBan(p, [&](int32_t id) { e.ban.push_back(id); });
  if (p.penalized()) {
    e.repetition_penalty = p.repetition_penalty;
    e.presence_penalty = p.presence_penalty;
    e.frequency_penalty = p.frequency_penalty;
    for (const TokenHistory::Entry& h : c->history.distinct())
      e.history.push_back({h.id, static_cast<float>(h.output_count)});
  }
  return e.empty() ? nullptr : &e;
}

// How many of the completion's next row's best logits its sampling and its logprobs read, where
// that is all they read -- beside, for temperature sampling without top-k, the device's draw or
// softmax total (SeqBatchEntry::draw_inv_temperature), and for logprobs the log-softmax's total
// (log_total) and the drawn token's logit -- and the executor can return them
// (Executor::top_logits_max), the device changing the row first as Choose() would (EditsFor:
// the bias, a grammar's mask, the bans, the penalties); else 0, the whole row: logprobs of a row
// that changes, and the prompt's last row of a request that forks (its copies' draws).
int EngineCore::TopLogitsFor(const Completion& c) const {
  const Request& r = *c.req;
  const SamplingParams& p = r.in.params;
  if (top_logits_max_ == 0 || r.in.return_prompt_logits || r.in.return_hidden_states ||
      (r.in.n > 1 && !r.forked))
    return 0;
  const bool edited = c.matcher || !p.logit_bias.empty() || c.num_output < p.min_tokens ||
                      p.penalized();
  if (edited && p.want_logprobs) return 0;  // (logprobs of the row before the changes)
  int k = Sampler::DrawsInIdOrder(p, vocab_)   ? 1  // (its best, and the device's draw)
          : Sampler::SamplesNucleus(p, vocab_) ? top_logits_nucleus_  // (mostly)
                                               : Sampler::TopNeeded(p);
  if (k == 0) return 0;
  if (p.want_logprobs) k = std::max(k, p.logprobs);  // (the top-N; log_total the rest)
  return k <= top_logits_max_ && k < vocab_ ? k : 0;
}

// The drawn token to the completion: its history, its text (stop strings held back), its
// logprob (lp: the chosen token's logprob and the top-N, where asked for), its end.
void EngineCore::EmitToken(Completion* c, int32_t id, TokenLogprob* lp) {
  const SamplingParams& p = c->req->in.params;
  RequestOutput ev;
  c->tokens.push_back(id);
  c->history.Append(id);
  ++c->num_output;
  ++generation_tokens_total_;
  ev.token_ids.push_back(id);
  if (lp) {
    lp->id = id;
    ev.logprobs.push_back(std::move(*lp));
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
    if (lp) ev.logprobs.back().text = piece;
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
    if (lp) ev.logprobs.back().text += tail;
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
    Emit(c->req, std::move(ev));
  }
}

void EngineCore::Emit(Request* r, RequestOutput ev) {
  const bool finished = r->num_done == r->in.n;
  EngineCoreOutput o;
  o.request_id = r->in.id;
  o.output = std::move(ev);
  o.request_finished = finished;
  outputs_.push_back(std::move(o));
  if (finished) {  // the Request object lives until the end of the step
    auto it = active_.find(r->in.id);
    retired_.push_back(std::move(it->second));
    active_.erase(it);
    ++finished_total_;
  }
}

void EngineCore::FinishCompletion(Completion* c, RequestOutput ev, const char* reason) {
  replicas_[c->req->replica]->sched.Finish(c);
  c->done = true;
  ev.index = c->index;
  ev.prompt_tokens = c->num_prompt_tokens;
  ev.completion_tokens = c->num_output;
  ev.finish_reason = reason;
  Request* r = c->req;
  ++r->num_done;
  Emit(r, std::move(ev));
}

// Ends every completion of `r` that is still going with `reason` ("abort" or "error").
void EngineCore::EndRequest(Request* r, const char* reason, const std::string& error) {
  if (r->num_done >= r->in.n) return;
  const int64_t prompt = static_cast<int64_t>(r->in.prompt.size());
  const int n = r->in.n;
  for (int i = 0; i < n; ++i) {
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
    ++r->num_done;
    Emit(r, std::move(ev));
  }
}

void EngineCore::FailRequest(Request* r, const std::string& error) {
  if (r->num_done >= r->in.n) return;
  ++failed_total_;
  std::fprintf(stderr, "peng: request %s failed: %s\n", r->in.id.c_str(), error.c_str());
  EndRequest(r, "error", error);
}

// Token slots of the running sequences' blocks that hold no token yet, as a share of all
// replicas' pools (*unfilled: their number).
double EngineCore::KvFragmentation(int64_t* unfilled) const {
  int64_t empty = 0;
  double pool_slots = 0;
  for (const auto& rp : replicas_) {
    const Replica& R = *rp;
    for (const Sequence* seq : R.sched.running()) {
      const int64_t slots =
          static_cast<int64_t>(R.kvm.block_table(seq->id).size()) * R.kvm.block_size();
      empty += std::max<int64_t>(0, slots - seq->num_computed_tokens);
    }
    pool_slots += static_cast<double>(R.kvm.num_blocks()) * R.kvm.block_size();
  }
  if (unfilled) *unfilled = empty;
  return empty / pool_slots;
}

void EngineCore::FillStats(EngineStats* s) const {
  // Sums over the data-parallel replicas (one without data parallelism), and each one's gauges.
  s->num_running = s->num_waiting = s->num_preemptions_total = 0;
  s->kv_blocks_total = s->kv_blocks_used = 0;
  s->prefix_cache_queries = s->prefix_cache_hits = 0;
  s->replicas.clear();
  for (const auto& rp : replicas_) {
    const Replica& R = *rp;
    s->num_running += R.sched.num_running();
    s->num_waiting += R.sched.num_waiting();
    s->num_preemptions_total += R.sched.num_preemptions_total();
    s->kv_blocks_total += R.kvm.num_blocks();
    s->kv_blocks_used += R.kvm.num_used_blocks();
    s->prefix_cache_queries += R.kvm.prefix_cache_queries();
    s->prefix_cache_hits += R.kvm.prefix_cache_hits();
    s->replicas.push_back({R.sched.num_running(), R.sched.num_waiting(), R.kvm.usage(), 0.0});
  }
  const std::vector<double>& forward = executor_->ReplicaForwardSeconds();
  for (size_t d = 0; d < forward.size() && d < s->replicas.size(); ++d)
    s->replicas[d].forward_seconds_total = forward[d];
  s->kv_usage =
      s->kv_blocks_total ? static_cast<double>(s->kv_blocks_used) / s->kv_blocks_total : 0;
  s->kv_fragmentation = KvFragmentation(&s->kv_slots_unfilled);
  s->kv_fragmentation_max = frag_max_;
  s->kv_fragmentation_mean = frag_steps_ ? frag_sum_ / frag_steps_ : 0;
  s->prompt_tokens_total = prompt_tokens_total_;
  s->generation_tokens_total = generation_tokens_total_;
  s->requests_finished_total = finished_total_;
  s->requests_failed_total = failed_total_;
  s->fatal_error = health_.message();
  s->steps_total = steps_total_;
  s->logit_rows_best_total = logit_rows_best_total_;
  s->logit_rows_wide_total = logit_rows_wide_total_;
  s->logit_rows_whole_total = logit_rows_whole_total_;
  s->tensor_parallel_size = opt_.tensor_parallel_size;
  s->pipeline_parallel_size = opt_.pipeline_parallel_size;
  s->data_parallel_size = static_cast<int64_t>(replicas_.size());
  s->kv_block_size = opt_.block_size;
  s->kv_dtype = opt_.kv_dtype;
  s->queue_wait_seconds_sum = queue_wait_sum_;
  s->queue_wait_count = queue_wait_count_;
}

}  // namespace peng
