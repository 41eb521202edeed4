// Llm: one loaded model with its tokenizer, thread pool and paged KV cache, able to run one
// sequence at a time -- score a prompt (logits at every position) or generate with sampling
// and streaming detokenization. This is the single-sequence runner under `peng generate`,
// `peng logits` and `peng bench`; it drives the model through the same batched, paged
// Forward() that the continuous-batching scheduler uses (prefill in chunks of
// `prefill_chunk` tokens over a block table). Not thread-safe: use from one thread.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/sampling_params.h"
#include "kv/block_pool.h"
#include "model/model.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace peng {

struct LlmOptions {
  std::string model_path;
  int threads = 0;             // 0 = physical cores
  int64_t max_context = 4096;  // tokens per sequence (capped by the model's context length)
  int block_size = 16;         // tokens per KV block
  DType kv_dtype = DType::kF16;
  int prefill_chunk = 512;     // tokens per forward during prefill
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prompt_seconds = 0;
  double generate_seconds = 0;  // from first sampled token to the end
  std::string finish_reason;    // "stop" (EOS / stop string / stop token) or "length"
};

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`: text to
// hold back because a stop string may be completing.
size_t StopHoldback(const std::string& text, const std::vector<std::string>& stops);

class Llm {
 public:
  static StatusOr<std::unique_ptr<Llm>> Load(const LlmOptions& options);

  Model& model() { return *model_; }
  // nullptr for a model folder without a tokenizer (token ids only).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  ThreadPool& pool() { return pool_; }
  int64_t max_context() const { return max_context_; }

  // Tokenizes with the model's default BOS handling; an error if there is no tokenizer.
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  // End-of-generation token (EOS, end-of-turn...) of the tokenizer, else the config's EOS.
  bool IsEndOfGeneration(int32_t id) const;

  // Runs `tokens` as a fresh sequence; returns logits for every position, [n, vocab].
  StatusOr<std::vector<float>> PromptLogits(std::span<const int32_t> tokens);
  // Runs `tokens` as a fresh sequence; returns the residual stream after the embeddings and
  // after every layer: [n_layers + 1][n][hidden] (diagnostics).
  StatusOr<std::vector<float>> PromptHiddenStates(std::span<const int32_t> tokens);

  // Generates after `prompt`. on_text receives each new piece of text (never half a UTF-8
  // character) and the token id that completed it; returning false stops generation.
  using TokenCallback = std::function<bool(int32_t id, const std::string& text)>;
  Status Generate(const std::vector<int32_t>& prompt, const SamplingParams& params,
                  const TokenCallback& on_text, GenerateStats* stats,
                  std::vector<int32_t>* output_ids = nullptr);

  // Timed primitives for `peng bench`: prefill n tokens as a fresh sequence; then decode
  // n single tokens continuing it. Both return seconds.
  StatusOr<double> BenchPrefill(std::span<const int32_t> tokens);
  StatusOr<double> BenchDecode(int64_t n_tokens);

 private:
  explicit Llm(int threads) : pool_(threads) {}
  // Forward of tokens [pos0, pos0 + n) of the current sequence.
  Status Step(std::span<const int32_t> tokens, int64_t pos0, bool all_logits, float* logits,
              std::vector<float>* capture_hidden = nullptr);
  Status Reset();  // frees the current sequence's blocks

  ThreadPool pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<BlockPool> blocks_;
  BlockTable table_;
  int64_t max_context_ = 0;
  int prefill_chunk_ = 512;
  std::vector<float> logits_;
};

}  // namespace peng
