#include "model/layers/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/check.h"
#include "core/half.h"
#include "kernels/ops.h"

namespace peng {

using kernels::AttentionParams;

StatusOr<std::unique_ptr<DecoderModel>> DecoderModel::Load(std::unique_ptr<ModelFiles> files,
                                                           const ModelConfig& config,
                                                           Communicator* tp,
                                                           Communicator* pp) {
  std::unique_ptr<DecoderModel> m(new DecoderModel());
  m->files_ = std::move(files);
  m->cfg_ = config;
  PENG_RETURN_IF_ERROR(m->stage_.Plan(config.n_layers, pp, m->files_->path()));
  if (tp && tp->size() > 1) {
    m->tp_ = tp;
    m->tp_size_ = tp->size();
    m->tp_rank_ = tp->rank();
  }
  PENG_RETURN_IF_ERROR(m->Bind());
  return m;
}

StatusOr<Linear> DecoderModel::Matrix(const std::string& name, int64_t rows, int64_t cols) {
  return Linear::Bind(*files_, name, rows, cols);
}

StatusOr<Linear> DecoderModel::Shard(const std::string& name, int64_t rows, int64_t cols,
                                     int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  return Linear::BindShard(*files_, name, rows, cols, r0, nr, c0, nc);
}

void DecoderModel::AllReduce(float* x, int64_t n) {
  if (tp_) tp_->AllReduceSum(x, n);
}

// Heads: n_heads / tp per rank; KV heads n_kv / tp, or (fewer KV heads than ranks) the one KV
// head of the rank's query heads, replicated. FFN and vocabulary: contiguous ranges, the FFN cut
// at whole blocks of ffn_down's storage (its columns are split).
Status DecoderModel::PlanTensorParallel() {
  const ModelConfig& c = cfg_;
  const int64_t tp = tp_size_, r = tp_rank_;
  const std::string why = " for tensor parallel size " + std::to_string(tp);
  if (c.n_heads % tp != 0)
    return InvalidArgument(files_->path() + ": " + std::to_string(c.n_heads) +
                           " attention heads cannot be split" + why);
  n_heads_ = c.n_heads / tp;
  q_head0_ = r * n_heads_;
  if (c.n_kv_heads % tp == 0) {
    n_kv_heads_ = c.n_kv_heads / tp;
    kv_head0_ = r * n_kv_heads_;
  } else if (tp % c.n_kv_heads == 0) {
    n_kv_heads_ = 1;
    kv_head0_ = q_head0_ / (c.n_heads / c.n_kv_heads);
  } else {
    return InvalidArgument(files_->path() + ": " + std::to_string(c.n_kv_heads) +
                           " KV heads cannot be split or replicated" + why);
  }
  std::vector<std::string> downs;
  for (int il = 0; il < c.n_layers; ++il)
    downs.push_back("blk." + std::to_string(il) + ".ffn_down.weight");
  PENG_ASSIGN_OR_RETURN(const int64_t g, ColumnGranularityOf(*files_, downs));
  PENG_ASSIGN_OR_RETURN(const TpSlice ffn, SplitAtBlocks(c.ffn_dim, g, static_cast<int>(tp),
                                                         static_cast<int>(r),
                                                         files_->path() + ": the FFN"));
  ffn0_ = ffn.begin;
  ffn_ = ffn.size;
  return OkStatus();
}

const Int8Acts* DecoderModel::Norm(float* x, const float* w, float* h, int64_t T,
                                   const Linear& consumer, ThreadPool* pool, float* add,
                                   const float* post_w) {
  const ModelConfig& c = cfg_;
  const int64_t D = c.hidden_size;
  const bool int8 = consumer.WantsInt8Acts();
  if (int8) acts_.Resize(T, D);
  const int64_t groups = D / kernels::kInt8ActGroup;
  ForRows(pool, T, D, [&](int64_t t0, int64_t t1) {
    const int64_t n = t1 - t0;
    if (add) {
      if (post_w) kernels::RmsNorm(add + t0 * D, post_w, c.norm_weight_offset, add + t0 * D, n, D,
                                   c.rms_eps);
      kernels::AddInPlace(x + t0 * D, add + t0 * D, n * D);
    }
    if (int8) {
      kernels::RmsNormQuantize(x + t0 * D, w, c.norm_weight_offset, h + t0 * D,
                               acts_.q.data() + t0 * D, acts_.scales.data() + t0 * groups, n, D,
                               c.rms_eps);
    } else {
      kernels::RmsNorm(x + t0 * D, w, c.norm_weight_offset, h + t0 * D, n, D, c.rms_eps);
    }
  });
  return int8 ? &acts_ : nullptr;
}

StatusOr<const float*> DecoderModel::Vector(const std::string& name, int64_t n, bool optional) {
  return BindVector(*files_, name, n, optional, &owned_);
}

Status DecoderModel::Bind() {
  const ModelConfig& c = cfg_;
  if (c.n_layers <= 0 || c.hidden_size <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.head_dim <= 0 || c.ffn_dim <= 0 || c.vocab_size <= 0 || c.n_heads % c.n_kv_heads != 0)
    return InvalidArgument(files_->path() + ": inconsistent model dimensions: " + c.Summary());
  if (c.rope.rot_dim > c.head_dim || c.rope.rot_dim % 2 != 0)
    return InvalidArgument(files_->path() + ": rope dimension " + std::to_string(c.rope.rot_dim) +
                           " does not fit head_dim " + std::to_string(c.head_dim));
  n_heads_ = c.n_heads;
  n_kv_heads_ = c.n_kv_heads;
  ffn_ = c.ffn_dim;
  PENG_RETURN_IF_ERROR(vocab_.Plan(c.vocab_size, tp_, files_->path()));
  if (tp_) PENG_RETURN_IF_ERROR(PlanTensorParallel());
  const int64_t D = c.hidden_size, hd = c.head_dim;
  const int64_t qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  const int64_t q0 = q_head0_ * hd, nq = n_heads_ * hd, k0 = kv_head0_ * hd, nk = n_kv_heads_ * hd;
  const int64_t v0 = vocab_.begin(), nv = vocab_.size();
  PENG_ASSIGN_OR_RETURN(tok_embd_, Shard("token_embd.weight", c.vocab_size, D, v0, nv, 0, D));
  PENG_ASSIGN_OR_RETURN(output_norm_, Vector("output_norm.weight", D));
  if (files_->Find("output.weight") && !c.tie_embeddings) {
    PENG_ASSIGN_OR_RETURN(output_, Shard("output.weight", c.vocab_size, D, v0, nv, 0, D));
  } else {
    output_ = tok_embd_;
  }
  layers_.resize(c.n_layers);
  for (int il = stage_.begin(); il < stage_.end(); ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    Layer& L = layers_[il];
    PENG_ASSIGN_OR_RETURN(L.attn_norm, Vector(p + "attn_norm.weight", D));
    PENG_ASSIGN_OR_RETURN(L.wq, Shard(p + "attn_q.weight", qd, D, q0, nq, 0, D));
    PENG_ASSIGN_OR_RETURN(L.wk, Shard(p + "attn_k.weight", kvd, D, k0, nk, 0, D));
    PENG_ASSIGN_OR_RETURN(L.wv, Shard(p + "attn_v.weight", kvd, D, k0, nk, 0, D));
    PENG_ASSIGN_OR_RETURN(L.wo, Shard(p + "attn_output.weight", D, qd, 0, D, q0, nq));
    PENG_ASSIGN_OR_RETURN(L.bq, Vector(p + "attn_q.bias", qd, !c.qkv_bias));
    PENG_ASSIGN_OR_RETURN(L.bk, Vector(p + "attn_k.bias", kvd, !c.qkv_bias));
    PENG_ASSIGN_OR_RETURN(L.bv, Vector(p + "attn_v.bias", kvd, !c.qkv_bias));
    if (L.bq) {  // this rank's heads
      L.bq += q0;
      L.bk += k0;
      L.bv += k0;
    }
    if (c.qk_norm) {
      PENG_ASSIGN_OR_RETURN(L.q_norm, Vector(p + "attn_q_norm.weight", c.head_dim));
      PENG_ASSIGN_OR_RETURN(L.k_norm, Vector(p + "attn_k_norm.weight", c.head_dim));
    }
    if (c.post_norms) {
      PENG_ASSIGN_OR_RETURN(L.post_attn_norm, Vector(p + "post_attention_norm.weight", D));
      PENG_ASSIGN_OR_RETURN(L.post_ffn_norm, Vector(p + "post_ffw_norm.weight", D));
    }
    PENG_ASSIGN_OR_RETURN(L.ffn_norm, Vector(p + "ffn_norm.weight", D));
    const int64_t F = c.ffn_dim;
    PENG_ASSIGN_OR_RETURN(L.w_gate, Shard(p + "ffn_gate.weight", F, D, ffn0_, ffn_, 0, D));
    PENG_ASSIGN_OR_RETURN(L.w_up, Shard(p + "ffn_up.weight", F, D, ffn0_, ffn_, 0, D));
    PENG_ASSIGN_OR_RETURN(L.w_down, Shard(p + "ffn_down.weight", D, F, 0, D, ffn0_, ffn_));
  }
  if (!c.layer_sliding.empty() && static_cast<int64_t>(c.layer_sliding.size()) != c.n_layers)
    return InvalidArgument("layer_sliding has the wrong length");
  inv_freq_.resize(c.rope.rot_dim / 2);
  kernels::ComputeRopeInvFreq(c.rope, inv_freq_.data());
  if (c.sliding_window > 0) {
    inv_freq_local_.resize(c.rope_local.rot_dim / 2);
    kernels::ComputeRopeInvFreq(c.rope_local, inv_freq_local_.data());
  }
  return OkStatus();
}

KvCacheSpec DecoderModel::kv_spec() const {
  KvCacheSpec spec;
  for (int il = 0; il < cfg_.n_layers; ++il) {  // (another stage's layer: none)
    const int heads = stage_.Holds(il) ? static_cast<int>(n_kv_heads_) : 0;
    spec.layers.push_back({heads, static_cast<int>(cfg_.head_dim),
                           static_cast<int>(cfg_.head_dim)});
  }
  return spec;
}

WeightTraffic DecoderModel::WeightsPerToken() const {
  WeightTraffic w;
  w.bytes = cfg_.hidden_size * 4;  // the token's embedding row
  if (stage_.last()) w.Add(output_);
  for (const Layer& L : stage_.Layers(layers_))
    for (const Linear* l : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) w.Add(*l);
  return w;
}

std::string DecoderModel::WeightSummary() const { return files_->DTypeSummary(); }

std::vector<const Linear*> DecoderModel::Linears() const {
  std::vector<const Linear*> out = {&tok_embd_};
  for (const Layer& L : stage_.Layers(layers_))
    for (const Linear* l : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      out.push_back(l);
  if (&output_.tensor() != &tok_embd_.tensor()) out.push_back(&output_);
  return out;
}

void DecoderModel::EnsureScratch(int64_t T) {
  if (T <= scratch_tokens_) return;
  const ModelConfig& c = cfg_;
  scratch_tokens_ = T;
  x_.resize(T * c.hidden_size);
  h_.resize(T * c.hidden_size);
  o_.resize(T * c.hidden_size);
  q_.resize(T * n_heads_ * c.head_dim);
  attn_.resize(T * n_heads_ * c.head_dim);
  k_.resize(T * n_kv_heads_ * c.head_dim);
  v_.resize(T * n_kv_heads_ * c.head_dim);
  gate_.resize(T * ffn_);
  up_.resize(T * ffn_);
  pos_.resize(T);
  seq_of_token_.resize(T);
  sel_.resize(T * c.hidden_size);
}

void DecoderModel::RunLayer(int il, const ForwardBatch& batch, KvCache* kv, ThreadPool* pool) {
  const ModelConfig& c = cfg_;
  const Layer& L = layers_[il];
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = c.hidden_size, hd = c.head_dim;
  const int64_t H = n_heads_, KV = n_kv_heads_;  // this rank's
  const int64_t qd = H * hd, kvd = KV * hd;
  const bool sliding = !c.layer_sliding.empty() && c.layer_sliding[il];
  const kernels::RopeConfig& rope = sliding ? c.rope_local : c.rope;
  const float* rope_cs = sliding ? rope_cs_local_.data() : rope_cs_.data();

  // --- attention block
  const Int8Acts* hq = Norm(x_.data(), L.attn_norm, h_.data(), T, L.wq, pool);
  {  // q [T, n_heads * hd], k and v [T, n_kv_heads * hd]
    const Linear* ls[] = {&L.wq, &L.wk, &L.wv};
    float* ys[] = {q_.data(), k_.data(), v_.data()};
    Linear::ForwardGroup(ls, ys, 3, h_.data(), hq, T, pool, &acts_scratch_);
  }
  // Per token: biases, q/k norms, RoPE, and its K and V into the cache (its own slot).
  const kernels::KvLayerView& kvl = kv->layer(il);
  ForRows(pool, T, qd + 2 * kvd, [&](int64_t ta, int64_t tb) {
    const int64_t n = tb - ta;
    float* q = q_.data() + ta * qd;
    float* k = k_.data() + ta * kvd;
    float* v = v_.data() + ta * kvd;
    kernels::AddBiasRows(q, L.bq, n, qd);
    kernels::AddBiasRows(k, L.bk, n, kvd);
    kernels::AddBiasRows(v, L.bv, n, kvd);
    if (c.qk_norm) {
      kernels::RmsNorm(q, L.q_norm, c.norm_weight_offset, q, n * H, hd, c.rms_eps);
      kernels::RmsNorm(k, L.k_norm, c.norm_weight_offset, k, n * KV, hd, c.rms_eps);
    }
    for (int64_t t = ta; t < tb; ++t) {
      kernels::ApplyRopeCosSin(q_.data() + t * qd, H, hd, rope, rope_cs + t * rope.rot_dim);
      kernels::ApplyRopeCosSin(k_.data() + t * kvd, KV, hd, rope, rope_cs + t * rope.rot_dim);
      const SeqBatchEntry& s = batch.seqs[seq_of_token_[t]];
      kernels::KvWrite(kvl, s.block_table, pos_[t], k_.data() + t * kvd, v_.data() + t * kvd);
    }
  });
  AttentionParams ap;
  ap.n_heads = static_cast<int>(H);
  ap.scale = c.AttentionScale();
  ap.sliding_window = sliding ? c.sliding_window : 0;
  attn_seqs_.clear();
  int64_t t0 = 0;
  for (const SeqBatchEntry& s : batch.seqs) {
    attn_seqs_.push_back({q_.data() + t0 * qd, s.n_tokens, s.pos0, s.block_table,
                          attn_.data() + t0 * qd});
    t0 += s.n_tokens;
  }
  kernels::PagedAttentionBatch(attn_seqs_.data(), static_cast<int64_t>(attn_seqs_.size()), kvl,
                               ap, pool);
  L.wo.Forward(attn_.data(), nullptr, T, o_.data(), pool, &acts_scratch_);  // [T, D]
  AllReduce(o_.data(), T * D);

  // --- feed-forward block (after the attention's residual)
  hq = Norm(x_.data(), L.ffn_norm, h_.data(), T, L.w_gate, pool, o_.data(), L.post_attn_norm);
  {  // gate and up [T, ffn]
    const Linear* ls[] = {&L.w_gate, &L.w_up};
    float* ys[] = {gate_.data(), up_.data()};
    Linear::ForwardGroup(ls, ys, 2, h_.data(), hq, T, pool, &acts_scratch_);
  }
  ForRows(pool, T, ffn_, [&](int64_t ta, int64_t tb) {
    float* g = gate_.data() + ta * ffn_;
    const float* u = up_.data() + ta * ffn_;
    if (c.activation == Activation::kSilu) {
      kernels::SiluMul(g, u, g, (tb - ta) * ffn_);
    } else {
      kernels::GeluTanhMul(g, u, g, (tb - ta) * ffn_);
    }
  });
  L.w_down.Forward(gate_.data(), nullptr, T, o_.data(), pool, &acts_scratch_);  // [T, D]
  AllReduce(o_.data(), T * D);
  ForRows(pool, T, D, [&](int64_t ta, int64_t tb) {
    float* o = o_.data() + ta * D;
    if (L.post_ffn_norm)
      kernels::RmsNorm(o, L.post_ffn_norm, c.norm_weight_offset, o, tb - ta, D, c.rms_eps);
    kernels::AddInPlace(x_.data() + ta * D, o, (tb - ta) * D);
  });
}

Status DecoderModel::Forward(const ForwardBatch& batch, KvCache* kv, float* logits,
                             ThreadPool* pool) {
  if (batch.tokens.empty()) return OkStatus();
  return stage_.Run(batch, logits, cfg_.vocab_size, tp_rank_ == 0, /*one_pass=*/false,
                    [&](const ForwardBatch& mb, float* mb_logits) {
                      return ForwardStage(mb, kv, mb_logits, pool);
                    });
}

Status DecoderModel::ForwardStage(const ForwardBatch& batch, KvCache* kv, float* logits,
                                  ThreadPool* pool) {
  const ModelConfig& c = cfg_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t D = c.hidden_size;
  EnsureScratch(T);
  // Validate the batch before touching the cache.
  PENG_RETURN_IF_ERROR(PrepareBatch(batch, *kv, c.vocab_size, pos_.data(), seq_of_token_.data()));
  std::vector<float>* cap = batch.capture_hidden;
  RopeRows(pos_.data(), T, c.rope, inv_freq_, &rope_cs_);
  if (!inv_freq_local_.empty())
    RopeRows(pos_.data(), T, c.rope_local, inv_freq_local_, &rope_cs_local_);
  if (stage_.first()) {
    vocab_.Embed(tok_embd_, batch.tokens.data(), T, D, x_.data());
    if (c.embed_scale != 1.f) kernels::ScaleInPlace(x_.data(), c.embed_scale, T * D);
  } else {
    stage_.Receive(x_.data(), T * D);
  }

  if (cap) cap->assign(x_.begin(), x_.begin() + T * D);
  for (int il = stage_.begin(); il < stage_.end(); ++il) {
    RunLayer(il, batch, kv, pool);
    if (cap) cap->insert(cap->end(), x_.begin(), x_.begin() + T * D);
  }
  if (!stage_.last()) {
    stage_.SendOn(x_.data(), T * D);
    return OkStatus();
  }

  // Gather the rows that need logits, normalise, project.
  const int64_t rows = GatherLogitRows(batch, x_.data(), D, sel_.data());
  if (rows == 0) return OkStatus();
  const Int8Acts* sq = Norm(sel_.data(), output_norm_, sel_.data(), rows, output_, pool);
  if (!vocab_.Project(output_, sel_.data(), sq, rows, logits, pool, &acts_scratch_))
    return OkStatus();  // only rank 0 of a tensor-parallel group has the logits
  if (c.final_logit_softcap > 0) {
    const float cap = c.final_logit_softcap;
    for (int64_t i = 0; i < rows * c.vocab_size; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return OkStatus();
}

}  // namespace peng
