// Engine: the continuous-batching serving engine. HTTP threads Submit() requests and read their
// output from a RequestStream; one engine thread owns the model, the KV cache, the KV cache
// manager and the scheduler, and runs steps (schedule -> one batched Forward() over all
// scheduled tokens -> sample -> detokenize / stop checks -> publish) until stopped. Only the
// submission queue and the streams are synchronized; everything else lives on the engine
// thread without locks.
//
// Thread-safety: Submit, Abort, GetStats, Drain and Stop may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "engine/sampling_params.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace peng {
class Communicator;
namespace grammar {
class CompiledGrammar;
}

struct EngineOptions {
  std::string model_path;
  int threads = 0;                      // 0 = physical cores
  // Where the forward pass runs: "cpu" (peng's CPU kernels), "cuda" or "cuda:N" (the CUDA
  // backend, CreateDeviceExecutor). `--device`.
  std::string device = "cpu";
  int64_t max_model_len = 4096;         // prompt + output tokens per sequence (capped by model)
  int max_num_seqs = 64;                // running sequences at most
  int64_t max_num_batched_tokens = 512; // tokens per step (prefill chunks + decodes)
  int block_size = 16;
  int64_t kv_cache_bytes = 0;           // 0 = enough for max_num_seqs full-length sequences,
                                        // capped at 25% of physical memory
  int64_t num_kv_blocks = 0;            // > 0: exactly this many blocks (overrides the bytes)
  // On a device (--device cuda): the share of its memory this engine may fill -- weights,
  // scratch and KV cache --, vLLM's --gpu-memory-utilization: the default KV cache is capped
  // at what stays free of it after the weights and the largest step's scratch
  // (DeviceModel::ReserveStepScratch): free - (1 - share) x total; 0 < share <= 1.
  double gpu_memory_utilization = 0.9;
  // Set by a job of several ranks on devices (not by users): the ranks' executors agree on one
  // KV cache size over kv_group (the job's world), the smallest any proposes; kv_fit_devices
  // (the default size, CoreStart): num_kv_blocks is rank 0's count, which KvBlocks caps by the
  // rank's share of its device.
  Communicator* kv_group = nullptr;
  bool kv_fit_devices = false;
  bool enable_prefix_caching = true;
  DType kv_dtype = DType::kF16;         // --kv-cache-dtype: F16, F32 (exact-mode scoring,
                                        // `peng logits --exact`) or Q8_0 (KvCacheDtypes)
  // Tensor parallelism over the processes of an MPI job (`mpirun -np N peng ... -tp N`):
  // rank 0 runs the engine, the other ranks run RunParallelWorker() (engine_core.h).
  int tensor_parallel_size = 1;
  // Pipeline parallelism (`-pp N`): the model's layers split into N stages of contiguous layers
  // (model/layers/pipeline.h), each stage tensor_parallel_size ranks; on the CPU.
  int pipeline_parallel_size = 1;
  // Data parallelism: replicas of the model (each tensor_parallel_size ranks with its own KV
  // cache) behind one engine, which routes each request to the least-loaded one; the job has
  // tensor_parallel_size x pipeline_parallel_size x data_parallel_size processes,
  // tensor-parallel groups innermost, then the stages (ranks [d * tp * pp, (d + 1) * tp * pp)
  // are replica d).
  int data_parallel_size = 1;
  // MoE models under tensor parallelism: whole routed experts per rank instead of a slice of
  // each (ModelLoadOptions::expert_parallel; `--enable-expert-parallel`).
  bool enable_expert_parallel = false;
  // `--huge-pages`: a job of one process reads the weight files into private
  // transparent-huge-page memory (ModelLoadOptions::huge_pages) when they take at most a
  // quarter of the memory available; otherwise (the default, a job of several ranks, a device)
  // they are mapped in place, where the page cache is shared. WeightsInHugePages()
  // (engine_core.h) decides. (The kernels' packed panels live in huge pages either way.)
  bool huge_pages = false;
  int max_waiting = 256;                // Submit() fails with ResourceExhausted beyond this
  // The machine's peaks, the denominators of the utilization gauges (EngineStats): measured
  // once per process at start-up on the engine's threads (kernels/probe.h, ~0.3 s) unless
  // given here (> 0); measure_peaks = false leaves unset ones at 0 (utilization then 0).
  bool measure_peaks = true;
  double peak_read_bytes_per_s = 0;
  double peak_flops_f32_per_s = 0;
  double peak_ops_int8_per_s = 0;
  double utilization_window_s = 2.0;  // the gauges cover the steps that ended this long ago
};

// One generation request. `n` > 1 samples several completions of one prompt; they share the
// prompt's KV blocks (copy-on-write).
struct GenerateRequest {
  std::string id;                       // unique; the engine does not invent ids
  std::vector<int32_t> prompt;
  SamplingParams params;
  int n = 1;
  // Constrains the output to this grammar (structured output, forced tool calls): each step
  // only tokens that keep the text a prefix of a sentence are allowed, end-of-generation only
  // once it is a whole sentence; generation stops when nothing can follow. Null = free text.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // Scoring and diagnostics (Llm: `peng logits`, `peng eval`, layer diagnosis): a request
  // with either flag computes its prompt only (which may then fill max_model_len), samples
  // nothing and ends with "length"; its events carry the logits of every prompt position, in
  // order, as the prompt is computed (RequestOutput::prompt_logits) / the residual stream after
  // the embeddings and after each layer for the prompt tokens of each step
  // (RequestOutput::hidden_states; needs an engine with max_num_seqs = 1, so that the step's
  // batch is this request's tokens alone). n must be 1.
  bool return_prompt_logits = false;
  bool return_hidden_states = false;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // params.logprobs most likely, if asked
  // What this token added to the output text: valid UTF-8, empty while a character is still
  // incomplete (byte tokens), so the texts of all tokens concatenate to the output text.
  std::string text;
};

// What a request's stream yields. For n > 1 each event belongs to one completion (`index`).
struct RequestOutput {
  int index = 0;
  std::vector<int32_t> token_ids;       // new tokens since the previous event
  std::string text;                     // new text (never half a UTF-8 character; stop
                                        // strings withheld until they cannot match)
  std::vector<TokenLogprob> logprobs;   // one per new token when params.want_logprobs
  std::optional<std::string> finish_reason;  // "stop" | "length" | "abort" | "error" on the
                                        // last event ("length" also when the sequence alone
                                        // outgrows the whole KV pool)
  std::string error;                    // with finish_reason "error": what failed (this
                                        // request only; the engine goes on)
  // With return_prompt_logits / return_hidden_states (GenerateRequest): for the prompt tokens
  // computed in one step, [tokens, vocab_size] / [n_layers + 1][tokens][hidden_size].
  std::vector<float> prompt_logits;
  std::vector<float> hidden_states;
  // Set on every event:
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;        // so far, this completion
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Blocks until an event is ready, the request ended (returns false once every completion
  // has delivered its final event), or `timeout` passed (returns true with *out unchanged and
  // *timed_out = true).
  virtual bool Next(RequestOutput* out, std::chrono::milliseconds timeout, bool* timed_out) = 0;
  // Registers `notify`, called (on the engine thread, without locks held) after every event
  // pushed from now on, and once at once if events are already waiting: an event-driven
  // reader drains the stream with Next(.., 0ms, ..) when notified. Must be quick and must
  // not call back into the stream. Pass {} to unregister before the reader goes away.
  virtual void SetNotify(std::function<void()> notify) = 0;
};

// The KV cache types (EngineOptions::kv_dtype) by the names `--kv-cache-dtype`, the benchmarks'
// JSON and /metrics give them: "f16", "f32", "q8_0".
const std::map<std::string, DType>& KvCacheDtypes();
std::string KvCacheDtypeName(DType kv_dtype);

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_preemptions_total = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_block_size = 0;            // tokens a block (EngineOptions::block_size)
  DType kv_dtype = DType::kF16;         // the cache's values (EngineOptions::kv_dtype)
  double kv_usage = 0;                  // used / total
  // Internal fragmentation: token slots of used blocks that hold no token (the unfilled
  // tail of each running sequence's last block), as a share of the whole pool -- now, and
  // the mean and max over all steps that had running sequences.
  int64_t kv_slots_unfilled = 0;
  double kv_fragmentation = 0;
  double kv_fragmentation_mean = 0;
  double kv_fragmentation_max = 0;
  int64_t prefix_cache_queries = 0;     // tokens looked up
  int64_t prefix_cache_hits = 0;        // tokens found
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t requests_finished_total = 0;
  int64_t requests_failed_total = 0;    // of those, finished with finish_reason "error"
  int64_t steps_total = 0;
  // Empty while the engine can run steps; else why it cannot (its device lost its context:
  // Executor::Health), for good: every request failed, new ones are refused, /health is 503.
  std::string fatal_error;
  // Logit rows sampled from their best logits alone (a device's, Executor::top_logits_max),
  // from the wider list a nucleus past those takes (Executor::top_logits_wide), and from the
  // whole row (brought to the host where the model ran on a device).
  int64_t logit_rows_best_total = 0;
  int64_t logit_rows_wide_total = 0;
  int64_t logit_rows_whole_total = 0;
  int64_t tensor_parallel_size = 1;     // ranks the model is split over (EngineOptions)
  int64_t pipeline_parallel_size = 1;   // stages of its layers, each tensor_parallel_size ranks
  int64_t data_parallel_size = 1;       // replicas of the model, each with its own KV cache
  struct Replica {                      // each data-parallel replica's gauges
    int64_t num_running = 0, num_waiting = 0;
    double kv_usage = 0;
    double forward_seconds_total = 0;   // its forward passes, measured on its leader rank
  };
  std::vector<Replica> replicas;

  // Utilization. The kernels count their work (kernels/work_counter.h): weight and KV-cache
  // bytes read, FP32 FLOPs and int8 ops (2 per multiply-add). Totals since start:
  int64_t weight_bytes_total = 0;
  int64_t kv_bytes_total = 0;
  int64_t flops_f32_total = 0;
  int64_t ops_int8_total = 0;
  // Per phase of a step: admit + schedule + batch assembly (on a device also the grammars'
  // masks and the other logit edits: EngineCore::EditsFor), the model's forward pass,
  // sampling (logits checks, bias, grammar mask, sampler), emitting (detokenize, stop checks,
  // stream events, stats). Indexed by StepPhase; they partition each step's time.
  double phase_seconds_total[4] = {0, 0, 0, 0};
  double busy_seconds_total() const {  // inside steps
    return phase_seconds_total[0] + phase_seconds_total[1] + phase_seconds_total[2] +
           phase_seconds_total[3];
  }
  double queue_wait_seconds_sum = 0;  // submission -> first scheduled, over requests
  int64_t queue_wait_count = 0;
  // Over the steps that ended in the last utilization_window_s seconds (EngineOptions): the
  // share of that
  // time spent in steps, and, per second of step time, bytes read (weights + KV) and ops
  // (FP32 FLOPs + int8 ops); the utilizations divide them by the peaks: bandwidth =
  // read rate / peak bandwidth, compute = sum over the two kinds of ops / their peaks.
  double busy_fraction = 0;
  double read_bytes_per_s = 0;
  double ops_per_s = 0;
  double bandwidth_utilization = 0;
  double compute_utilization = 0;
  // The peaks in use (EngineOptions).
  double peak_read_bytes_per_s = 0;
  double peak_flops_f32_per_s = 0;
  double peak_ops_int8_per_s = 0;
};

enum StepPhase { kPhaseSchedule = 0, kPhaseForward, kPhaseSample, kPhaseEmit };
inline constexpr const char* kStepPhaseNames[4] = {"schedule", "forward", "sample", "emit"};


class Model;

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // The same around an already loaded model and tokenizer (tokenizer may be null); the
  // options' model_path is ignored. A seam for tests (e.g. a model that fails on purpose).
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                  std::unique_ptr<Model> model,
                                                  std::unique_ptr<Tokenizer> tokenizer);
  virtual ~Engine() = default;

  // Validates (params, prompt length vs max_model_len, token ids vs vocab, seed + n - 1 within
  // int64) and queues the request. InvalidArgument / OutOfRange for bad input; ResourceExhausted when the waiting
  // queue is full or the engine is draining. Details: InvalidArgument for an empty prompt, n
  // outside [1, 128], or an id still in flight (an id is free again once its stream has
  // delivered its final event); OutOfRange when prompt length >= max_model_len or the prompt
  // does not fit in the whole KV pool. Generation ends with "length" at max_model_len.
  virtual StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateRequest request) = 0;
  // Failure isolation: an error that belongs to one request (a non-finite logit row, an
  // exception while sampling or detokenizing) finishes only that request, with
  // finish_reason "error"; a failed Forward() finishes the requests of that batch. Their
  // blocks are freed and the engine goes on.
  // Stops a request (client gone): frees its KV blocks at the next step; its stream ends with
  // finish_reason "abort". Unknown ids are ignored.
  virtual void Abort(const std::string& id) = 0;
  // A snapshot published after every engine step (so it may lag a stream's final event by
  // one step); after Drain() returns it is final.
  virtual EngineStats GetStats() const = 0;
  // Immutable after Create(); safe from any thread. tokenizer() is nullptr for a model without
  // one (requests must then carry token ids).
  virtual const Tokenizer* tokenizer() const = 0;
  virtual const ModelConfig& model_config() const = 0;
  virtual int64_t max_model_len() const = 0;
  // Stops accepting new requests and returns true when every running or waiting request is
  // done, or false once `timeout` passed first (the requests go on; Stop() aborts them).
  virtual bool Drain(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) = 0;
  // Aborts everything and stops the engine thread.
  virtual void Stop() = 0;
};

}  // namespace peng
