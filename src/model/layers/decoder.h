// DecoderModel: the shared forward pass of dense decoder-only transformers (Llama, Qwen2,
// Gemma 3, ...): embeddings -> N x [RMSNorm -> GQA attention with RoPE over the paged KV cache
// -> (post-norm) -> residual -> RMSNorm -> gated MLP -> (post-norm) -> residual] -> final norm
// -> LM head. Differences between families are flags in ModelConfig (qkv bias, q/k norm,
// post norms, GeGLU, sliding-window layers, embedding scale); architecture folders only build
// the config and bind tensor names. Weights stay in the memory-mapped file in their stored
// type; small vectors (norms, biases) are converted to FP32 at load. Scratch buffers grow to
// the largest batch seen and are reused (no allocation per step at steady state).
//
// Tensor parallelism (Megatron style, over a Communicator of tp ranks): each rank holds the
// rows of Q/K/V and gate/up for its heads and its slice of the FFN (column parallel), the
// matching columns of O and down (row parallel; each followed by one all-reduce of the
// [T, hidden] output), its slice of the vocabulary for the embedding and the LM head
// (VocabParallel, layers/tensor_parallel.h), and its KV heads in its own KV
// cache (when there are fewer KV heads than ranks, each rank keeps the one its query heads
// use: replicated). Norms are replicated; the residual stream is the same on every rank.
// Pipeline parallelism (layers/pipeline.h): each stage binds, caches and runs its layers only.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/layers/linear.h"
#include "model/layers/pipeline.h"
#include "model/layers/tensor_parallel.h"
#include "model/model.h"
#include "model/model_files.h"
#include "parallel/communicator.h"

namespace peng {

class DecoderModel : public Model {
 public:
  // Binds and validates every tensor named in GGUF style. Takes ownership of `files`.
  // `tp`: the tensor-parallel group this rank belongs to (null or size 1: the whole model).
  // `pp`: this rank's pipeline stages (layers/pipeline.h; null or size 1: every layer).
  static StatusOr<std::unique_ptr<DecoderModel>> Load(std::unique_ptr<ModelFiles> files,
                                                      const ModelConfig& config,
                                                      Communicator* tp = nullptr,
                                                      Communicator* pp = nullptr);

  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_spec() const override;
  Status Forward(const ForwardBatch& batch, KvCache* kv, float* logits,
                 ThreadPool* pool) override;
  WeightTraffic WeightsPerToken() const override;
  std::string WeightSummary() const override;
  std::vector<const Linear*> Linears() const override;

 private:
  friend class DeviceDecoderModel;  // runs this model's graph on a device (device_model.h)
  struct Layer {
    const float* attn_norm = nullptr;
    Linear wq;
    Linear wk;
    Linear wv;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    Linear wo;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    const float* post_attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    Linear w_gate;
    Linear w_up;
    Linear w_down;
    const float* post_ffn_norm = nullptr;
  };

  DecoderModel() = default;
  Status Bind();
  StatusOr<Linear> Matrix(const std::string& name, int64_t rows, int64_t cols);
  // This rank's shard of `name` [rows, cols]: rows [r0, r0 + nr), columns [c0, c0 + nc).
  StatusOr<Linear> Shard(const std::string& name, int64_t rows, int64_t cols, int64_t r0,
                         int64_t nr, int64_t c0, int64_t nc);
  Status PlanTensorParallel();
  // x [T, hidden] summed over the tensor-parallel ranks (no-op alone).
  void AllReduce(float* x, int64_t n);
  // h = RmsNorm(x) over T rows; when `consumer` takes int8 activations (W8A8) also quantizes
  // them per token into acts_ in the same pass. Returns the int8 input for the consumer.
  // With `add`: first add = RmsNorm(add) * post_w (when post_w is given) and x += add, the
  // residual of the block before. Row by row, over the threads (ForRows).
  const Int8Acts* Norm(float* x, const float* w, float* h, int64_t T, const Linear& consumer,
                       ThreadPool* pool, float* add = nullptr, const float* post_w = nullptr);
  // FP32 view of a vector tensor of n values (converted into owned storage if needed);
  // nullptr without error when optional and absent.
  StatusOr<const float*> Vector(const std::string& name, int64_t n, bool optional = false);
  // Forward over this rank's stage (all of the model alone): one micro-batch under pipeline
  // parallelism (PipelineStage::Run), its logits on the last stage.
  Status ForwardStage(const ForwardBatch& batch, KvCache* kv, float* logits, ThreadPool* pool);
  void RunLayer(int il, const ForwardBatch& batch, KvCache* kv, ThreadPool* pool);
  void EnsureScratch(int64_t n_tokens);

  std::unique_ptr<ModelFiles> files_;
  ModelConfig cfg_;
  // Tensor parallelism: this rank's share (everything when alone).
  Communicator* tp_ = nullptr;
  int tp_size_ = 1, tp_rank_ = 0;
  int64_t n_heads_ = 0, n_kv_heads_ = 0;   // local
  int64_t q_head0_ = 0, kv_head0_ = 0;     // first local head (global index)
  int64_t ffn0_ = 0, ffn_ = 0;             // local FFN columns [ffn0_, ffn0_ + ffn_)
  VocabParallel vocab_;                    // local embedding / LM head rows, the logits gather
  PipelineStage stage_;                    // this rank's layers (all of them alone)
  Linear tok_embd_;
  Linear output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::deque<std::vector<float>> owned_;  // converted small tensors
  std::vector<float> inv_freq_, inv_freq_local_;

  // Scratch, sized for the largest batch so far.
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_;
  std::vector<int64_t> pos_;
  std::vector<float> rope_cs_, rope_cs_local_;  // RopeRows of this step (global / sliding layers)
  std::vector<int32_t> seq_of_token_;
  std::vector<kernels::AttentionSeq> attn_seqs_;  // PagedAttentionBatch arguments
  std::vector<float> sel_;
  Int8Acts acts_, acts_scratch_;
};

}  // namespace peng
