// DeepSeek-V2 family (V2, V2-Lite, V2.5, Coder-V2; HF model_type deepseek_v2, GGUF arch
// deepseek2): multi-head latent attention (MLA) over a compressed paged KV cache, and
// DeepSeekMoE feed-forward layers (routed experts + always-on shared experts) after
// first_k_dense_replace dense SwiGLU layers.
//
// MLA, per token (H heads, d_n = qk_nope_head_dim, d_r = qk_rope_head_dim, d_v = v_head_dim,
// r = kv_lora_rank):
//   q      = q_proj(a)  or  q_b_proj(RMSNorm_1e-6(q_a_proj(a)))         [H, d_n + d_r]
//   [c_raw | k_pe] = kv_a_proj_with_mqa(a);  c = RMSNorm_1e-6(c_raw)     [r], [d_r]
//   RoPE (interleaved pairs 2i, 2i+1; YaRN inv_freq and amplitude) on q_pe and k_pe only
//   cache row = [c | k_pe rotated]        (r + d_r values per token and layer, nothing else)
//   k_nope[h] = W_UK[h] c, v[h] = W_UV[h] c   (kv_b_proj split per head at load, FP32)
//   score = scale * (q_nope . k_nope + q_pe . k_pe), scale = (d_n + d_r)^-0.5 * mscale^2
// Decode runs absorbed (q_abs = W_UK^T q_nope attends over the latents directly, then W_UV);
// a prefill chunk may instead expand k_nope / v of its context from the cached latents when
// that is cheaper. Either way every token's row is written to the cache first, so chunked
// prefill and prefix-cache hits behave exactly as for the dense models.
//
// MoE: FP32 router logits -> softmax -> greedy top-k or group_limited_greedy (contiguous
// expert groups scored by their max, the best topk_group kept, the rest masked to 0) ->
// weights * routed_scaling_factor (norm_topk_prob ignored, as HF DeepseekV2 does); noaux_tc
// (V3-style sigmoid + e_score_correction_bias, groups scored by their top-2 sum, weights
// normalised when norm_topk_prob) is also accepted. Tokens are grouped by expert so every
// selected expert runs once over its tokens; the shared-expert MLP runs over all tokens.
//
// Files: deepseek2.cc (config, loading, attention, the forward pass), deepseek2_moe.cc (MLPs,
// router, routed experts and their exchange across replicas).
//
// Weights: HF folders with per-expert mlp.experts.{e}.{gate,up,down}_proj or the transformers 5
// fused mlp.experts.gate_up_proj [E, 2I, D] (gate rows first) / down_proj [E, D, I]; GGUF files
// in llama.cpp's deepseek2 layout: attn_q or attn_q_a / attn_q_a_norm / attn_q_b,
// attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b (older files) or attn_k_b [H, r, d_n] = W_UK^T and
// attn_v_b [H, d_v, r] (newer files, with head_count_kv 1, key_length r + d_r and the real sizes
// in key_length_mla / value_length_mla), attn_output, ffn_gate_inp, exp_probs_b.bias,
// ffn_{gate,up,down}_exps [E, ...] (or ffn_gate_up_exps), ffn_{gate,up,down}_shexp. llama.cpp's
// converter permutes no q/k rows for deepseek2 (only its V1 "deepseek" arch does) and runs
// LLAMA_ROPE_TYPE_NORM, the same interleaved pairs, so both formats share one RoPE. GGUF keeps
// only rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim: the RoPE amplitude is taken as
// 1 (mscale == mscale_all_dim in every released V2 config).
//
// Tensor parallelism (over a Communicator of tp ranks, docs/parallelism.md): the attention heads
// are split -- q (or q_b) column parallel by heads, each rank's heads of kv_b (k_b / v_b), o
// row parallel followed by one all-reduce -- while q_a and kv_a, the latent norm and RoPE of k_pe
// are computed by every rank, so every rank keeps the whole latent cache (r + d_r values per
// token and layer: MLA's one "KV head" is replicated, as vLLM does, rather than split). Dense
// FFNs and the shared experts are split by their intermediate size (column / row parallel);
// routed experts either the same way (each expert's intermediate size split over the ranks) or,
// with expert parallelism, whole experts partitioned over the ranks (rank k owns experts
// [k E / tp, (k + 1) E / tp)). The router is replicated, so every rank routes every token the
// same way and runs only its experts (or expert slices) for the tokens routed there; routed and
// shared partial outputs are summed in one all-reduce per MoE layer. Vocabulary-parallel
// embedding and LM head (layers/tensor_parallel.h). Expert parallelism across data-parallel
// replicas (ep_replicas): the experts are partitioned over all tp x dp ranks; in each MoE layer
// the ranks of one tensor-parallel index gather the replicas' tokens, run their experts on all
// of them and sum the outputs back; an idle replica runs an empty forward pass that takes part.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "model/layers/pipeline.h"
#include "model/layers/tensor_parallel.h"
#include "model/model.h"
#include "model/model_files.h"
#include "parallel/communicator.h"

namespace peng {

struct DeepseekV2Config {
  using TopkMethod = kernels::MoeRouting::Method;  // (the router's own enum)
  enum class Scoring { kSoftmax, kSigmoid };

  ModelConfig base;         // arch "deepseek2", head_dim = qk_head_dim, rope over d_r (interleaved)
  int64_t q_lora_rank = 0;  // 0: plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool attention_bias = false;
  float latent_norm_eps = 1e-6f;  // q_a_layernorm / kv_a_layernorm (HF: always 1e-6)
  float softmax_scale = 0.f;

  int64_t n_routed_experts = 0;  // 0: no MoE layers
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;
  Scoring scoring = Scoring::kSoftmax;
  float routed_scaling_factor = 1.f;
  bool norm_topk_prob = false;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // The router's parameters as kernels::MoeRoute takes them.
  kernels::MoeRouting Routing() const;
  int64_t cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
  // Layers < first_k_dense_replace are dense; the others are MoE when experts exist (and
  // layer % moe_layer_freq == 0, which all released configs satisfy with freq 1).
  bool IsMoeLayer(int64_t il) const;
};

// Reads and validates the config from a HF config.json (rope_parameters or legacy
// rope_scaling) or GGUF deepseek2.* metadata. Errors name the file and the field.
StatusOr<DeepseekV2Config> ReadDeepseekV2Config(const ModelFiles& files);

class DeepseekV2Model : public Model {
 public:
  enum class AttentionMode { kAuto, kAbsorbed, kExpanded };

  // `tp`: the tensor-parallel group of this rank (null or size 1: the whole model);
  // `expert_parallel`: partition the routed experts over it instead of splitting each one.
  // `ep_replicas` (with expert_parallel): the ranks of this tensor-parallel index in every
  // data-parallel replica; the experts are then partitioned over all tp x dp ranks and the
  // replicas' tokens exchanged in each MoE layer (the replicas must step together).
  static StatusOr<std::unique_ptr<DeepseekV2Model>> Load(std::unique_ptr<ModelFiles> files,
                                                          Communicator* tp = nullptr,
                                                          bool expert_parallel = false,
                                                          Communicator* ep_replicas = nullptr,
                                                          Communicator* pp = nullptr);

  const ModelConfig& config() const override { return cfg_.base; }
  KvCacheSpec kv_spec() const override;
  Status Forward(const ForwardBatch& batch, KvCache* kv, float* logits, ThreadPool* pool) override;
  // Attention (kv_b as its FP32 copy), dense and shared weights, the router, and the top-k
  // routed experts of every MoE layer (the experts a token actually reads), plus the LM head.
  WeightTraffic WeightsPerToken() const override;
  std::string WeightSummary() const override;
  std::vector<const Linear*> Linears() const override;
  bool StepsWithAllReplicas() const override { return ep_ != nullptr; }

  const DeepseekV2Config& ds_config() const { return cfg_; }
  float softmax_scale() const { return cfg_.softmax_scale; }
  // Tests / diagnostics: force one MLA form for every sequence (kAuto picks per sequence by
  // cost), and run the MoE as a plain per-token loop over each token's experts instead of
  // grouping the batch's tokens by expert.
  void set_attention_mode(AttentionMode m) { attention_mode_ = m; }
  void set_moe_reference(bool on) { moe_reference_ = on; }

 private:
  friend class DeviceDeepseekModel;  // runs this model's graph on a device (device_model.h)
  struct Layer {
    const float* attn_norm = nullptr;
    Linear wq;  // no q LoRA
    const float* bq = nullptr;
    Linear wq_a;  // q LoRA
    const float* bq_a = nullptr;
    const float* q_a_norm = nullptr;
    Linear wq_b;
    const float* bq_b = nullptr;
    Linear wkv_a;  // [r + d_r, D]
    const float* bkv_a = nullptr;
    const float* kv_a_norm = nullptr;
    std::vector<Linear> kv_b_parts;  // the stored kv_b (or per-head k_b / v_b slices)
    const float* w_kvb = nullptr;    // FP32 [H][(d_n + d_v)][r]: W_UK rows then W_UV rows
    const TensorView* w_kvb_view = nullptr;
    Linear wo;
    const float* bo = nullptr;
    const float* ffn_norm = nullptr;
    bool moe = false;
    Linear w_gate, w_up, w_down;         // dense
    Linear router;                       // [E, D]
    const float* router_bias = nullptr;  // noaux_tc e_score_correction_bias
    std::vector<Linear> exp_gate, exp_up, exp_down;
    Linear sh_gate, sh_up, sh_down;  // shared experts (bound when n_shared_experts > 0)
  };

  DeepseekV2Model() = default;
  Status Bind();
  Status PlanTensorParallel();
  Status BindAttention(int il, Layer* L);
  Status BindFfn(int il, Layer* L);
  Status BindExperts(int il, Layer* L);
  // Errors about a tensor also name its Hugging Face spelling for HF folders.
  Status Annotate(const Status& s, const std::string& name) const;
  StatusOr<Linear> Matrix(const std::string& name, int64_t rows, int64_t cols);
  // This rank's shard of `name` [rows, cols]: rows [r0, r0 + nr), columns [c0, c0 + nc).
  StatusOr<Linear> Shard(const std::string& name, int64_t rows, int64_t cols, int64_t r0,
                         int64_t nr, int64_t c0, int64_t nc);
  // x summed over the tensor-parallel ranks (no-op alone).
  void AllReduce(float* x, int64_t n);
  StatusOr<const float*> Vector(const std::string& name, int64_t n, bool optional = false);
  float* OwnFloats(int64_t n);

  void EnsureScratch(int64_t n_tokens);
  void RunAttention(int il, const ForwardBatch& batch, KvCache* kv, ThreadPool* pool);
  // True when decode multiplies by the file's per-head k_b / v_b (quantized, all heads in one
  // MatMulGroup) instead of the FP32 kv_b copy: split layout, not INT8.
  bool DecodesWithStoredKvb(const Layer& L) const;
  void Attend(const Layer& L, const kernels::KvLayerView& kvl, const SeqBatchEntry& s, int64_t t0,
              bool expanded, ThreadPool* pool);
  void RunMlp(const Linear& gate, const Linear& up, const Linear& down, const float* x, int64_t T,
              float* y, ThreadPool* pool);
  // Gate/up/SiLU/down with the given scratch (one thread's, or the model's own).
  static void RunMlpWith(const Linear& gate, const Linear& up, const Linear& down,
                         const float* x, int64_t T, float* y, ThreadPool* pool,
                         std::vector<float>* ge, std::vector<float>* ue, Int8Acts* acts);
  // Forward over this rank's stage (all of the model alone): one micro-batch under pipeline
  // parallelism (PipelineStage::Run), its logits on the last stage.
  Status ForwardStage(const ForwardBatch& batch, KvCache* kv, float* logits, ThreadPool* pool);
  void RunMoe(const Layer& L, int64_t T, ThreadPool* pool);
  void RunRoutedExperts(const Layer& L, const float* h, int64_t T, float* out, ThreadPool* pool);
  void Route(const Layer& L, int64_t T);

  std::unique_ptr<ModelFiles> files_;
  DeepseekV2Config cfg_;
  // Tensor / expert parallelism: this rank's share (everything when alone).
  Communicator* tp_ = nullptr;
  int tp_size_ = 1, tp_rank_ = 0;
  bool expert_parallel_ = false;
  Communicator* ep_ = nullptr;       // expert parallelism across data-parallel replicas
  int64_t n_heads_ = 0, head0_ = 0;  // local attention heads [head0_, head0_ + n_heads_)
  TpSlice dense_ffn_;                // columns of the dense layers' FFN
  TpSlice shared_ffn_;               // of the shared experts' (n_shared x moe_intermediate)
  TpSlice expert_ffn_;               // of each routed expert's (without expert parallelism)
  TpSlice experts_;                  // the routed experts this rank runs (expert parallelism)
  VocabParallel vocab_;
  PipelineStage stage_;  // this rank's layers (all of them alone; layers/pipeline.h)
  std::map<std::string, std::string> hf_layer_names_, hf_global_names_;  // HF -> GGUF-style
  Linear tok_embd_;
  Linear output_;
  const float* output_norm_ = nullptr;
  std::vector<Layer> layers_;
  std::deque<std::vector<float>> owned_;  // converted small tensors, FP32 kv_b
  std::deque<TensorView> owned_views_;
  std::vector<float> inv_freq_;
  AttentionMode attention_mode_ = AttentionMode::kAuto;
  bool moe_reference_ = false;

  // Scratch, sized for the largest batch so far (context buffers: the longest context).
  int64_t scratch_tokens_ = 0;
  std::vector<float> x_, h_, o_, qa_, q_, ckv_, qlat_, olat_, attn_, gate_, up_, sel_;
  std::vector<float> ctx_rows_, ctx_lat_, ctx_kv_;  // expanded prefill: cache rows, latents, K/V
  std::vector<int64_t> pos_;
  std::vector<float> rope_cs_;  // RopeRows of this step
  std::vector<int32_t> seq_of_token_;
  // MoE routing: per token top-k expert ids and weights; per expert its token rows.
  std::vector<float> router_logits_, moe_out_, xe_, ge_, ue_, ye_;
  std::vector<int32_t> topk_ids_;
  std::vector<float> topk_w_;
  std::vector<int32_t> expert_rows_, expert_offsets_;
  std::vector<float> expert_row_w_;
  Int8Acts acts_scratch_;
  // Prefill with many active experts: experts are spread over the threads, each with its own
  // scratch and output accumulator (summed afterwards).
  struct ExpertScratch {
    std::vector<float> xe, ge, ue, ye, o;
    Int8Acts acts;
  };
  std::vector<ExpertScratch> expert_scratch_;
  // Expert-assignment scratch, reused every step.
  struct RouteScratch {
    std::vector<int32_t> fill;
    std::vector<std::pair<int64_t, int32_t>> active;
    std::vector<std::vector<int32_t>> mine;
    std::vector<int64_t> load;
  };
  RouteScratch route_;
  std::vector<float> qpe_;
  void RunExpertsParallel(const Layer& L, const float* h, int64_t T, float* out,
                          ThreadPool* pool);
  // Expert parallelism across replicas: token counts, padded / gathered rows, the gathered
  // tokens and their routed output.
  void ExchangeAllGather(const Layer& L, int64_t T, int64_t n, ThreadPool* pool);
  void ExchangeAllToAll(const Layer& L, int64_t T, ThreadPool* pool);
  std::vector<int64_t> ep_counts_;
  std::vector<float> ep_pad_, ep_all_, ep_h_, ep_o_;
  std::vector<std::vector<int32_t>> ep_rows_;  // all-to-all: this replica's tokens per peer
  std::vector<uint8_t> ep_need_;
  std::vector<int64_t> ep_send_, ep_recv_;
  // Tokens in a step (all replicas) from which the exchange is an all-to-all: each token then
  // travels to the <= k peers that own its experts instead of to every peer.
  int64_t ep_all_to_all_tokens_ = 256;
};

}  // namespace peng
