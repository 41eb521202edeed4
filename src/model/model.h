// Model: the forward pass of one loaded model over a batch of sequences, reading and writing
// a paged KV cache. The batch is "flattened" vLLM-style: the tokens of all sequences lie
// back-to-back, each sequence says how many tokens it contributes, where they start (its
// position) and which cache blocks it owns (its block table). One step may mix prefill chunks
// and single-token decodes. A Model is immutable after loading except for scratch buffers, so
// Forward() must be called from one thread at a time (the engine thread); it parallelises
// internally over the ThreadPool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/kv_cache.h"
#include "model/layers/linear.h"
#include "model/model_config.h"

namespace peng {

// What the engine changes in a row before it samples from it -- EngineCore::Choose's
// logit_bias, grammar mask and bans, then Sampler::ApplyPenalties -- for a device to change in
// its copy of the row (Device::EditLogits), so that the best logits, draw and totals it returns
// are of the changed row. In this order: bias[i].second added to logit bias[i].first, one after
// another; the ids `allow` does not allow and the ids of `ban` set to -inf; the penalties on the
// ids of `history` (the distinct ids of the prompt and the output, each with its count in the
// output, as a float).
struct LogitEdits {
  std::vector<std::pair<int32_t, float>> bias;
  // A grammar's mask (grammar::Matcher::FillMask: bit id % 32 of word id / 32 set = id allowed;
  // grammar::MaskWords(vocabulary) words), or empty: every id allowed.
  std::vector<uint32_t> allow;
  std::vector<int32_t> ban;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> history;  // (with penalties only)
  bool empty() const { return bias.empty() && allow.empty() && ban.empty() && history.empty(); }
  void clear() {
    bias.clear();
    allow.clear();
    ban.clear();
    history.clear();
  }
};

struct SeqBatchEntry {
  int64_t n_tokens = 0;               // tokens of this sequence in the batch (contiguous)
  int64_t pos0 = 0;                   // absolute position of its first token in the batch
  const int32_t* block_table = nullptr;  // logical block -> physical block in the KvCache
  int64_t n_blocks = 0;               // entries in block_table (must cover pos0 + n_tokens)
  bool all_logits = false;            // logits for every token, else only for the last one
  bool want_logits = true;            // false: no logits at all (a prefill chunk mid-prompt)
  // > 0 (a row sampled from its best logits alone, Sampler::TopNeeded; only where the executor
  // offers it, Executor::top_logits_max): its row's top_logits best logits may come back in
  // ForwardBatch::top instead of the row (a device model does; the row in `logits` is then
  // not written).
  int32_t top_logits = 0;
  // > 0 with top_logits (a row of temperature sampling without top-k or penalties): the device
  // also sums the row's softmax denominator at this inverse temperature and, where draw_uniform
  // >= 0 (plain temperature sampling, Sampler::DrawsInIdOrder), draws the row's token with
  // that uniform (Sampler::PendingUniform): TopLogits::total, drawn (Device::DrawTokens).
  float draw_inv_temperature = 0;
  double draw_uniform = -1;
  // With top_logits (a row with logprobs): the device also sums the log-softmax's denominator
  // (TopLogits::log_total).
  bool log_total = false;
  // With top_logits: the changes the device makes to the row first (null: none).
  const LogitEdits* edits = nullptr;
};

// The best logits of a step's rows (ForwardBatch::top), by logit row: k a row, best first in
// kernels::TopK's order, and the row's first NaN / +inf index (-1: none). Filled for the rows of
// sequences with top_logits > 0; k is the largest of theirs.
struct TopLogits {
  int k = 0;
  std::vector<float> val;          // [rows, k]
  std::vector<int32_t> idx;        // [rows, k]
  std::vector<int32_t> first_bad;  // [rows]
  // [rows]: for a row that asked (SeqBatchEntry::draw_inv_temperature, log_total), the token
  // drawn (-1 where it asked for the total alone) and its logit, the softmax's denominator at
  // its temperature, the log-softmax's (Device::DrawTokens); -1 and 0 for the others and for a
  // row whose best logit is not finite.
  std::vector<int32_t> drawn;
  std::vector<float> drawn_logit;
  std::vector<double> total;
  std::vector<double> log_total;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;        // all sequences' tokens back-to-back
  std::vector<SeqBatchEntry> seqs;
  // Diagnostics: when set, Forward() replaces its contents with the residual stream of every
  // token after the embeddings and after each layer: (n_layers + 1) blocks of [T, hidden].
  std::vector<float>* capture_hidden = nullptr;
  // Device conformance tests: when set, the device graph (model/device_model.h) replaces the
  // residual stream entering each layer with that layer's block of these values -- what
  // capture_hidden wrote on another run of the same batch -- so that each layer is compared on
  // equal inputs. The CPU models ignore it.
  const std::vector<float>* replace_hidden = nullptr;
  // Where the rows of sequences with top_logits > 0 go instead of `logits` (device models; the
  // CPU models write every row and ignore it).
  TopLogits* top = nullptr;

  // Number of logit rows Forward() writes, in sequence order.
  int64_t NumLogitRows() const;
};

// Helpers shared by the models' Forward(). PrepareBatch checks every sequence against its
// block table and the cache, and every token id against the vocabulary, then fills pos[t] (the
// absolute position of token t) and seq_of_token[t] (its sequence). GatherLogitRows copies the
// rows of x [T, hidden] that need logits, in sequence order, into sel and returns their count.
Status PrepareBatch(const ForwardBatch& batch, int64_t num_blocks, int block_size,
                    int64_t vocab_size, int64_t* pos, int32_t* seq_of_token);
inline Status PrepareBatch(const ForwardBatch& batch, const KvCache& kv, int64_t vocab_size,
                           int64_t* pos, int32_t* seq_of_token) {
  return PrepareBatch(batch, kv.num_blocks(), kv.block_size(), vocab_size, pos, seq_of_token);
}
int64_t GatherLogitRows(const ForwardBatch& batch, const float* x, int64_t hidden, float* sel);
// RoPE's cos/sin rows of the batch's T positions (kernels::RopeCosSin, cfg.rot_dim floats a
// token) into *cs: computed once a step and shared by every layer.
void RopeRows(const int64_t* pos, int64_t T, const kernels::RopeConfig& cfg,
              const std::vector<float>& inv_freq, std::vector<float>* cs);

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // Shapes of the KV cache this model needs (per layer).
  virtual KvCacheSpec kv_spec() const = 0;
  // Runs the batch; writes NumLogitRows() rows of vocab_size logits into `logits`.
  virtual Status Forward(const ForwardBatch& batch, KvCache* kv, float* logits,
                         ThreadPool* pool) = 0;
  // The weights one decoded token reads (everything but the embedding table, of which one row)
  // and the multiply-adds done with them.
  virtual WeightTraffic WeightsPerToken() const = 0;
  int64_t WeightBytesPerToken() const { return WeightsPerToken().bytes; }
  // Short description of the weight types, e.g. "Q4_1 x210, Q8_0 x1, F32 x61".
  virtual std::string WeightSummary() const = 0;
  // Every weight matrix under its GGUF-style name (diagnostics: per-tensor comparisons).
  virtual std::vector<const Linear*> Linears() const = 0;
  // Data parallelism: true when every replica must run every step (an empty batch included)
  // because the forward pass has collectives across replicas (expert parallelism over them).
  virtual bool StepsWithAllReplicas() const { return false; }
};

}  // namespace peng
