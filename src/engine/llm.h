// Llm: one loaded model with its tokenizer, run one request at a time in the caller's thread --
// score a prompt (logits at every position), generate with sampling and streaming
// detokenization, or time prefill and decode. The runner under `peng generate`, `peng logits`,
// `peng eval` and `peng bench`. It is a thin client of the EngineCore (engine_core.h) with
// max_num_seqs = 1: the same generation loop, scheduler, paged KV cache and stop logic as the
// serving engine, stepped synchronously. Not thread-safe: use from one thread.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine_core.h"
#include "engine/sampling_params.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace peng {

struct LlmOptions {
  std::string model_path;
  int threads = 0;                       // 0 = physical cores
  std::string device = "cpu";            // (EngineOptions)
  int64_t max_model_len = 4096;          // tokens per sequence (capped by the model's context)
  int block_size = 16;                   // tokens per KV block
  DType kv_dtype = DType::kF16;          // --kv-cache-dtype (EngineOptions::kv_dtype)
  int64_t max_num_batched_tokens = 512;  // tokens per forward (prefill chunk)
  int tensor_parallel_size = 1;          // > 1: under mpirun (EngineOptions)
  int pipeline_parallel_size = 1;        // > 1: under mpirun (EngineOptions)
  bool enable_expert_parallel = false;   // (EngineOptions)
  int data_parallel_size = 1;            // (EngineOptions; one request at a time uses replica 0)
  bool huge_pages = false;               // (EngineOptions)
  // Keep finished sequences' full KV blocks for later prompts with the same prefix (off: every
  // prompt is computed whole; `peng bench --depth` turns it on to prefill its context once).
  bool enable_prefix_caching = false;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prompt_seconds = 0;    // to the first sampled token
  double generate_seconds = 0;  // from the first sampled token to the end
  std::string finish_reason;    // "stop" (EOS / stop string / stop token / callback) or "length"
};

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`: text to
// hold back because a stop string may be completing.
size_t StopHoldback(const std::string& text, const std::vector<std::string>& stops);

class Llm {
 public:
  static StatusOr<std::unique_ptr<Llm>> Load(const LlmOptions& options);
  // The options of Llm's engine core (max_num_seqs 1, KV for one sequence);
  // what the worker ranks of a tensor-parallel job pass to RunParallelWorker().
  static EngineOptions CoreOptions(const LlmOptions& options);

  Model& model() { return core_->executor().model(); }
  // nullptr for a model folder without a tokenizer (token ids only).
  const Tokenizer* tokenizer() const { return core_->tokenizer(); }
  ThreadPool& pool() { return core_->executor().pool(); }
  int64_t DeviceKernelLaunches() { return core_->executor().DeviceKernelLaunches(); }
  int64_t max_model_len() const { return core_->max_model_len(); }

  // Tokenizes with the model's default BOS handling; an error if there is no tokenizer.
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  // End-of-generation token (EOS, end-of-turn...) of the tokenizer, else the config's EOS.
  bool IsEndOfGeneration(int32_t id) const { return core_->IsEndOfGeneration(id); }

  // Runs `tokens` as a fresh sequence; returns logits for every position, [n, vocab].
  // n must be < max_model_len.
  StatusOr<std::vector<float>> PromptLogits(std::span<const int32_t> tokens);
  // Runs `tokens` as a fresh sequence; returns the residual stream after the embeddings and
  // after every layer: [n_layers + 1][n][hidden] (diagnostics).
  StatusOr<std::vector<float>> PromptHiddenStates(std::span<const int32_t> tokens);

  // Generates after `prompt`. on_text receives each new piece of text (never half a UTF-8
  // character, stop strings withheld until they cannot match) and the last token id so far
  // (-1 if none); returning false stops generation. Ends with "length" at max_tokens or
  // max_model_len.
  using TokenCallback = std::function<bool(int32_t id, const std::string& text)>;
  Status Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                  const TokenCallback& on_text, GenerateStats* stats,
                  std::vector<int32_t>* output_ids = nullptr);

  // Timed primitives for `peng bench`; both return seconds. BenchPrefill: prefill `tokens` as a
  // fresh sequence (to its first sampled token); `computed` gets the prompt tokens the engine
  // computed (fewer than the prompt when prefix caching found a prefix). BenchDecode: decode n
  // single tokens (greedy, EOS ignored) after `context`, or after a one-token prompt when it is
  // empty; the clock starts at the prompt's first sampled token.
  StatusOr<double> BenchPrefill(std::span<const int32_t> tokens, int64_t* computed = nullptr);
  StatusOr<double> BenchDecode(int64_t n_tokens, std::span<const int32_t> context = {});

 private:
  explicit Llm(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {}
  // Runs `request` to its end, handing every event to `on_event` (false: abort the request).
  Status Run(GenerateRequest request, const std::function<bool(const RequestOutput&)>& on_event);

  std::unique_ptr<EngineCore> core_;
  int64_t next_id_ = 0;
};

}  // namespace peng
