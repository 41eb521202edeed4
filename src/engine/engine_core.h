// EngineCore: the generation loop, synchronous and single-threaded (vLLM v1's EngineCore).
// It owns the scheduler, the KV block manager and the per-request state (sampler, grammar
// matcher, streaming detokenizer, stop checks) and drives an Executor:
//
//   Add(request) / Abort(id)       -- between steps
//   Step() -> outputs              -- schedule -> Executor::Execute (one batched forward over
//                                     all scheduled tokens) -> per sequence that reached its
//                                     last token: sample, logprobs, detokenize, stop checks
//
// Data parallelism (an executor with data_parallel_size() > 1): one scheduler and KV block
// manager per replica; Add() gives each request to the least-loaded replica (prefix-cache
// aware), and a step schedules every replica and runs all their batches in one
// ExecuteReplicas() call, so the replicas step together.
//
// Every way peng generates goes through it: the serving Engine (engine.h) wraps it in a thread
// with queues and streams; Llm (`peng generate`, `peng logits`, `peng eval`, `peng bench`)
// steps it in the caller's thread with one request at a time. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/scheduler.h"
#include "kernels/work_counter.h"
#include "kv/kv_cache_manager.h"
#include "tokenizer/tokenizer.h"

namespace peng {

// One event of one request.
struct EngineCoreOutput {
  std::string request_id;
  RequestOutput output;
  bool request_finished = false;  // the request's last event: its id is free again
};

// What the last Step() did, for the engine's phase times and utilization gauges.
struct StepInfo {
  using Clock = std::chrono::steady_clock;
  bool forward_ran = false;
  Clock::time_point forward_begin, forward_end;
  double sample_seconds = 0;   // logits checks, bias, grammar masks, sampler
  kernels::WorkCounts work;    // of the forward pass
};

class EngineCore {
 public:
  using Clock = std::chrono::steady_clock;

  // `tokenizer` may be null (requests must then carry token ids; no text in the events).
  static StatusOr<std::unique_ptr<EngineCore>> Create(const EngineOptions& options,
                                                      std::unique_ptr<Executor> executor,
                                                      std::unique_ptr<Tokenizer> tokenizer);
  ~EngineCore();

  // The checks Add() makes that need no engine state (thread-safe): params, n, seed, empty
  // prompt, token ids vs vocabulary, prompt length vs max_model_len and vs the whole KV pool.
  Status Validate(const GenerateRequest& request) const;
  // Validates and queues the request (InvalidArgument also for an id still in flight).
  // `arrival` starts its queue-wait clock.
  Status Add(GenerateRequest request, Clock::time_point arrival = Clock::now());
  // Ends the request's completions with finish_reason "abort" (events in the next Step()'s
  // outputs); frees its blocks. Unknown ids are ignored.
  void Abort(const std::string& id);
  // Aborts every request.
  void AbortAll();
  bool HasUnfinished() const { return !active_.empty(); }
  // Runs one step if any request is unfinished; returns every event since the last call.
  std::vector<EngineCoreOutput> Step();
  const StepInfo& last_step() const { return step_; }

  // Counters and gauges of EngineStats that the core owns (running, waiting, KV, prefix
  // cache, token and request totals, steps, queue wait); the caller adds the time-based ones.
  void FillStats(EngineStats* stats) const;

  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const ModelConfig& model_config() const { return executor_->config(); }
  int64_t max_model_len() const { return max_model_len_; }
  Executor& executor() { return *executor_; }
  bool IsEndOfGeneration(int32_t id) const;

  struct Request;
  struct Completion;
  struct Replica;

 private:
  EngineCore(const EngineOptions& o, std::unique_ptr<Executor> executor,
             std::unique_ptr<Tokenizer> tokenizer);
  void RunStep();
  void FinishStep(Replica* replica);
  int PickReplica(const std::vector<int32_t>& prompt) const;
  double KvFragmentation(int64_t* unfilled) const;
  void Fork(Request* r, const float* row);
  void SampleAndEmit(Completion* c, float* row);
  int32_t Choose(Completion* c, float* row, TokenLogprob* lp, std::vector<float>* raw) const;
  static void Accept(Completion* c, int32_t id);
  int TopLogitsFor(const Completion& c) const;
  const LogitEdits* EditsFor(Completion* c) const;
  template <typename F>
  void ForEachMinTokensBan(const SamplingParams& p, F&& f) const;
  template <typename F>
  void ForEachGrammarEosBan(const Completion& c, F&& f) const;
  struct RowChoice;
  void ChooseFromBest(RowChoice* ch) const;
  void ChooseFromWide(std::vector<RowChoice*>* rows);
  Status FetchWholeRow(RowChoice* ch);
  static void LogprobsFromBest(RowChoice* ch);
  void EmitToken(Completion* c, int32_t id, TokenLogprob* lp);
  void Emit(Request* r, RequestOutput ev);
  void FinishCompletion(Completion* c, RequestOutput ev, const char* reason);
  void EndRequest(Request* r, const char* reason, const std::string& error);
  void FailRequest(Request* r, const std::string& error);

  const EngineOptions opt_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Tokenizer> tokenizer_;
  // One scheduler + KV block manager per data-parallel replica of the executor (one without).
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::vector<Executor::ReplicaWork> work_;
  const int64_t max_model_len_;
  const int64_t vocab_;
  const int top_logits_max_;  // Executor::top_logits_max
  // The best logits a top-p / min-p row asks for in a step: the executor's most, at most a
  // quarter of the vocabulary (TopLogitsFor).
  const int top_logits_nucleus_;
  // The best logits a nucleus past those takes after the step, before its whole row: the
  // executor's most (Executor::top_logits_wide), at most half the vocabulary; 0: none.
  const int top_logits_wide_;

  std::unordered_map<std::string, std::unique_ptr<Request>> active_;
  std::vector<std::unique_ptr<Request>> retired_;  // finished this step; freed by Step()
  std::vector<EngineCoreOutput> outputs_;
  std::vector<float> fork_row_, raw_row_;
  // FinishStep's rows to sample: the whole row or the device's best logits, and what was drawn.
  struct RowChoice {
    Completion* c = nullptr;
    float* row = nullptr;
    const float* top_val = nullptr;
    const int32_t* top_idx = nullptr;
    int top_k = 0;
    bool draws = false;     // the device drew its token (SeqBatchEntry::draw_uniform)
    bool nucleus = false;   // top-p / min-p from the best logits and the total, else the row
    const TopLogits* top = nullptr;  // the step's (draws, totals: at logit_row)
    int64_t logit_row = 0;
    bool edited = false;    // the device changed the row first (SeqBatchEntry::edits)
    bool wide = false;      // its nucleus from its best top_logits_wide_ (ChooseFromWide)
    int64_t bad = -1;       // its first NaN / +inf
    bool parallel = false;  // chosen on the pool's threads
    int32_t id = -1;
    TokenLogprob lp;
    std::string error;
  };
  std::vector<RowChoice> choices_;
  std::vector<RowChoice*> late_;  // nucleus rows past their best: the wider list, whole rows
  // ChooseFromWide's rows and their best top_logits_wide_ logits.
  std::vector<int64_t> wide_rows_;
  std::vector<float> wide_val_;
  std::vector<int32_t> wide_idx_;
  StepInfo step_;
  int64_t next_seq_id_ = 0;
  int64_t prompt_tokens_total_ = 0, generation_tokens_total_ = 0, finished_total_ = 0;
  int64_t failed_total_ = 0, steps_total_ = 0;
  Status health_;  // the executor's, once a step failed and it is not ok (EngineStats)
  // Logit rows sampled from their best logits alone (a device's TopLogits), from the wider
  // list a nucleus past those takes (ChooseFromWide), and from the whole row (brought to the
  // host: every row of an executor without best logits).
  int64_t logit_rows_best_total_ = 0, logit_rows_wide_total_ = 0, logit_rows_whole_total_ = 0;
  double queue_wait_sum_ = 0;
  int64_t queue_wait_count_ = 0;
  double frag_sum_ = 0;  // sum of kv_fragmentation over steps with running sequences
  int64_t frag_steps_ = 0;
  double frag_max_ = 0;
};

// Checks the options every engine needs (threads, positive sizes, the utilization window).
Status ValidateOptions(const EngineOptions& options);
// Whether a single-process engine reads its weights into huge pages (EngineOptions::huge_pages):
// asked for, on the CPU (a device keeps its own copy), and the weight files take at most a
// quarter of the memory available now (MemAvailable): the packed panels may copy most weights
// once more, and the KV cache comes on top.
bool WeightsInHugePages(const EngineOptions& options);
// A core over a LocalExecutor: loads the model and tokenizer from options.model_path, or takes
// the given ones (tokenizer may be null). With options.tensor_parallel_size > 1 (only from
// model_path, on rank 0 of an MPI job of that many processes) the core drives a
// TensorParallelExecutor over this rank's shard.
StatusOr<std::unique_ptr<EngineCore>> CreateEngineCore(const EngineOptions& options);
StatusOr<std::unique_ptr<EngineCore>> CreateEngineCore(const EngineOptions& options,
                                                       std::unique_ptr<Model> model,
                                                       std::unique_ptr<Tokenizer> tokenizer);
// The shape of a job of tensor_parallel_size x pipeline_parallel_size x data_parallel_size
// processes and this rank's place in it: the tensor-parallel groups innermost, then the
// pipeline stages (replica d = ranks [d * tp * pp, (d + 1) * tp * pp), its stage s the ranks
// [s * tp, (s + 1) * tp) of those), so that a group stays on one host when the hosts are filled
// in order. The engine's (RunParallelWorker, CreateEngineCore) and `peng info`'s.
struct JobLayout {
  Communicator* world = nullptr;
  Communicator* group = nullptr;  // this rank's replica: its tp x pp ranks (the world at dp 1)
  Communicator* tp = nullptr;     // the model's tensor-parallel group (null at tp 1)
  Communicator* pp = nullptr;     // the stages of this tensor-parallel index (null at pp 1)
  Communicator* dp = nullptr;     // the replicas' leaders (null at dp 1; unused off leaders)
  Communicator* peers = nullptr;  // this rank of its replica in every replica (null at dp 1)
  int tp_size = 1, pp_size = 1, dp_size = 1;
  int group_rank = 0, tp_rank = 0, stage = 0, dp_rank = 0;
  // How this rank loads its part of the model.
  ModelLoadOptions Shard(bool expert_parallel) const {
    return {.tp = tp, .pp = pp, .expert_parallel = expert_parallel, .ep_replicas = peers};
  }
  struct Owned {  // the communicators split off the world
    std::unique_ptr<Communicator> group, tp, pp, dp, peers;
  };
  std::shared_ptr<Owned> owned;
};
// "--tensor-parallel-size T x --pipeline-parallel-size P x --data-parallel-size D".
std::string JobShape(int tp, int pp, int dp);
// Splits `world` (collective: every rank calls it, in the same order) into the layout; an
// error when the world's size is not tp x pp x dp.
StatusOr<std::unique_ptr<JobLayout>> SplitJob(Communicator* world, int tp, int pp, int dp);

// Multi-process jobs: every process calls this first, with the same options. On ranks other
// than 0 it serves every engine core rank 0 creates (loading this rank's shard each time) until
// rank 0 calls EndParallelJob(), then returns true (the process should exit); on rank 0, and
// when running alone, it returns false at once. An error (on every rank) when the job's size
// does not match the options.
StatusOr<bool> RunParallelWorker(const EngineOptions& options);
// Rank 0, once at the end of the program (tools/main.cc): releases the workers. A no-op alone.
void EndParallelJob();

}  // namespace peng
