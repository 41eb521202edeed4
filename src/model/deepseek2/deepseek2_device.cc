// DeepSeek-V2's graph on a backend::Device (model/device_model.h): MLA in its absorbed form over
// the latent cache for every step (W_UK folded into the query, W_UV applied to the attended
// latents; kv_b per head in its stored type for decodes where the file has it so, else the FP32
// copy: backend::MlaWeights) and DeepSeekMoE with routing on the device (kernels::MoeRoute's
// arithmetic) and the selected experts' rows read per (token, slot) -- no host round trip
// inside a layer. Tensor parallel: the host model is the rank's shard (its heads, the FFNs'
// slices, each expert's intermediate slice or -- expert parallel -- its whole experts, the
// latent cache replicated) and the graph sums o, the dense FFN and each MoE layer's routed +
// shared output with the device's collectives, as the CPU model does; another rank's expert
// contributes zeros here. Expert parallelism across data-parallel replicas: each MoE layer
// gathers every replica's tokens with the device's collectives, runs this rank's experts on
// them and reduce-scatters the sums back (the CPU model's all-gather exchange; recorded where
// the rows are few), or -- from the CPU model's token count on -- sends each peer only the rows
// its experts need (its all-to-all; not recorded: the routing comes back to the host); a
// replica without tokens runs the exchanges alone (IdleStep).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "model/deepseek2/deepseek2.h"
#include "model/device_model.h"

namespace peng {

using backend::DeviceExperts;
using backend::DeviceMatrix;

class DeviceDeepseekModel : public DeviceModel {
 public:
  DeviceDeepseekModel(const DeepseekV2Model& m, backend::Device* d) : DeviceModel(m, d), m_(m) {}

  Status Init() {
    if (m_.cfg_.n_routed_experts > kernels::kMaxRoutedExperts)
      return Unimplemented(std::to_string(m_.cfg_.n_routed_experts) + " routed experts on " +
                           dev_->Name() + " (at most 512)");
    PENG_RETURN_IF_ERROR(Upload(m_.tok_embd_, m_.output_, m_.output_norm_, m_.tp_));
    if (m_.ep_) {  // (after the tensor-parallel group's: every rank sets them up in this order)
      PENG_ASSIGN_OR_RETURN(ep_own_, dev_->CreateCommunicator(m_.ep_));
      ep_comm_ = ep_own_ ? ep_own_.get() : m_.ep_;
      layer_comm_ = ep_comm_;
    }
    return OkStatus();
  }

 private:
  struct Layer {
    const float* attn_norm = nullptr;
    DeviceMatrix wq, wq_a, wq_b, wkv_a, wo;
    const float *bq = nullptr, *bq_a = nullptr, *q_a_norm = nullptr, *bq_b = nullptr;
    const float *bkv_a = nullptr, *kv_a_norm = nullptr, *bo = nullptr;
    backend::MlaWeights kv_b;  // the FP32 copy, and per head where the file stores it so
    const float* ffn_norm = nullptr;
    bool moe = false;
    DeviceMatrix w_gate, w_up, w_down;  // dense
    DeviceMatrix router;
    const float* router_bias = nullptr;
    DeviceExperts exp_gate, exp_up, exp_down;
    bool shared = false;
    DeviceMatrix sh_gate, sh_up, sh_down;
  };

  // An optional matrix (bound or not in the host model).
  Status MaybeMatrix(const Linear& l, DeviceMatrix* out) {
    if (!l.bound()) return OkStatus();
    PENG_ASSIGN_OR_RETURN(*out, Matrix(l));
    return OkStatus();
  }
  StatusOr<DeviceExperts> Experts(const std::vector<Linear>& ls) {
    std::vector<const TensorView*> views;  // null: another rank's expert (expert parallel)
    std::vector<const float*> scales;      // INT8 (peng quantize folders)
    bool int8 = false, w8a8 = false;
    int64_t held = 0;
    for (const Linear& l : ls) {
      views.push_back(l.bound() ? &l.tensor() : nullptr);
      scales.push_back(l.bound() ? l.int8_scales() : nullptr);
      int8 |= l.bound() && l.is_int8();
      w8a8 |= l.bound() && l.int8_activations();
      held += l.bound();
    }
    if (!int8) scales.clear();
    PENG_ASSIGN_OR_RETURN(DeviceExperts e, dev_->UploadExperts(views, &allocs_, scales, w8a8));
    weight_bytes_ += static_cast<int64_t>(RowBytes(e.dtype, e.cols)) * e.rows * held;
    return e;
  }

  Status UploadLayers() override {
    const DeepseekV2Config& c = m_.cfg_;
    const int64_t D = c.base.hidden_size, H = m_.n_heads_, dqk = c.qk_head_dim();
    const int64_t r = c.kv_lora_rank, row = c.cache_row();
    layers_.resize(m_.layers_.size());
    for (size_t il = 0; il < m_.layers_.size(); ++il) {
      const DeepseekV2Model::Layer& S = m_.layers_[il];
      Layer& L = layers_[il];
      PENG_ASSIGN_OR_RETURN(L.attn_norm, Floats(S.attn_norm, D));
      PENG_RETURN_IF_ERROR(MaybeMatrix(S.wq, &L.wq));
      PENG_RETURN_IF_ERROR(MaybeMatrix(S.wq_a, &L.wq_a));
      PENG_RETURN_IF_ERROR(MaybeMatrix(S.wq_b, &L.wq_b));
      PENG_ASSIGN_OR_RETURN(L.bq, Floats(S.bq, H * dqk));
      PENG_ASSIGN_OR_RETURN(L.bq_a, Floats(S.bq_a, c.q_lora_rank));
      PENG_ASSIGN_OR_RETURN(L.q_a_norm, Floats(S.q_a_norm, c.q_lora_rank));
      PENG_ASSIGN_OR_RETURN(L.bq_b, Floats(S.bq_b, H * dqk));
      PENG_ASSIGN_OR_RETURN(L.wkv_a, Matrix(S.wkv_a));
      PENG_ASSIGN_OR_RETURN(L.bkv_a, Floats(S.bkv_a, row));
      PENG_ASSIGN_OR_RETURN(L.kv_a_norm, Floats(S.kv_a_norm, r));
      PENG_ASSIGN_OR_RETURN(L.kv_b.kvb,
                            Floats(S.w_kvb, H * (c.qk_nope_head_dim + c.v_head_dim) * r));
      if (m_.DecodesWithStoredKvb(S)) {  // (as the CPU model decodes)
        std::vector<Linear> k_b, v_b;
        for (int64_t h = 0; h < H; ++h) {
          k_b.push_back(S.kv_b_parts[2 * h]);
          v_b.push_back(S.kv_b_parts[2 * h + 1]);
        }
        PENG_ASSIGN_OR_RETURN(L.kv_b.k_b, Experts(k_b));
        PENG_ASSIGN_OR_RETURN(L.kv_b.v_b, Experts(v_b));
      }
      PENG_ASSIGN_OR_RETURN(L.wo, Matrix(S.wo));
      PENG_ASSIGN_OR_RETURN(L.bo, Floats(S.bo, D));
      PENG_ASSIGN_OR_RETURN(L.ffn_norm, Floats(S.ffn_norm, D));
      L.moe = S.moe;
      if (!S.moe) {
        PENG_ASSIGN_OR_RETURN(L.w_gate, Matrix(S.w_gate));
        PENG_ASSIGN_OR_RETURN(L.w_up, Matrix(S.w_up));
        PENG_ASSIGN_OR_RETURN(L.w_down, Matrix(S.w_down));
        continue;
      }
      PENG_ASSIGN_OR_RETURN(L.router, Matrix(S.router));
      PENG_ASSIGN_OR_RETURN(L.router_bias, Floats(S.router_bias, c.n_routed_experts));
      PENG_ASSIGN_OR_RETURN(L.exp_gate, Experts(S.exp_gate));
      PENG_ASSIGN_OR_RETURN(L.exp_up, Experts(S.exp_up));
      PENG_ASSIGN_OR_RETURN(L.exp_down, Experts(S.exp_down));
      L.shared = S.sh_gate.bound();
      if (L.shared) {
        PENG_ASSIGN_OR_RETURN(L.sh_gate, Matrix(S.sh_gate));
        PENG_ASSIGN_OR_RETURN(L.sh_up, Matrix(S.sh_up));
        PENG_ASSIGN_OR_RETURN(L.sh_down, Matrix(S.sh_down));
      }
    }
    PENG_ASSIGN_OR_RETURN(inv_freq_, Floats(m_.inv_freq_.data(),
                                            static_cast<int64_t>(m_.inv_freq_.size())));
    return OkStatus();
  }

  Status EnsureLayerScratch(int64_t T) override {
    const DeepseekV2Config& c = m_.cfg_;
    const int64_t D = c.base.hidden_size, H = m_.n_heads_, r = c.kv_lora_rank;
    const int64_t k = std::max<int64_t>(c.num_experts_per_tok, 1);
    const int64_t sh = std::max<int64_t>(c.n_shared_experts * c.moe_intermediate_size, 1);
    const int64_t ffn = std::max({c.base.ffn_dim, k * c.moe_intermediate_size});
    for (auto [n, p] :
         {std::pair{H * c.qk_head_dim(), &q_}, {std::max<int64_t>(c.q_lora_rank, 1), &qa_},
          {c.cache_row(), &ckv_}, {H * c.cache_row(), &qlat_}, {H * r, &olat_},
          {H * c.v_head_dim, &attn_}, {D, &o_}, {ffn, &gate_}, {ffn, &up_},
          {(k + 1) * D, &ys_}, {sh, &sh_gate_}, {sh, &sh_up_},
          {std::max<int64_t>(c.n_routed_experts, 1), &router_logits_}, {k, &w_}})
      PENG_RETURN_IF_ERROR(Scratch(T * n, p));
    return Scratch(T * k, &ids_);
  }

  // Expert parallelism across the data-parallel replicas (the CPU model's exchange by
  // all-gather, DeepseekV2Model::ExchangeAllGather): every replica's token count, once a step
  // over the host group, and the scratch of the exchange for n_rep x the largest count.
  Status BeginLayers(int64_t T) override {
    if (!m_.ep_) return OkStatus();
    const DeepseekV2Config& c = m_.cfg_;
    const int n_rep = m_.ep_->size();
    std::vector<int64_t> counts(n_rep);
    m_.ep_->AllGather(&T, sizeof T, counts.data());
    ep_max_t_ = *std::max_element(counts.begin(), counts.end());
    int64_t n = 0;
    for (const int64_t t : counts) n += t;
    const int64_t N = n_rep * ep_max_t_;
    // From the CPU model's count on (PENG_EP_ALL_TO_ALL_TOKENS, the same on every rank), the
    // exchange is the all-to-all (RoutedAllToAll), whose host round trip no recording may hold.
    layer_host_sync_ = n > 0 && n >= m_.ep_all_to_all_tokens_;
    layer_rows_ = N;
    if (N <= ep_capacity_) return OkStatus();
    const int64_t D = c.base.hidden_size, k = c.num_experts_per_tok;
    for (auto [n, p] : {std::pair{D, &ep_send_}, {D, &ep_in_}, {D, &ep_out_},
                        {int64_t{c.n_routed_experts}, &ep_logits_}, {k, &ep_w_},
                        {k * c.moe_intermediate_size, &ep_gate_},
                        {k * c.moe_intermediate_size, &ep_up_}, {k * D, &ep_ys_}})
      PENG_RETURN_IF_ERROR(Scratch(N * n, p));
    PENG_RETURN_IF_ERROR(Scratch((N + 1) * D, &ep_back_));
    PENG_RETURN_IF_ERROR(Scratch(N, &ep_ones_));
    const std::vector<float> ones(N, 1.f);
    PENG_RETURN_IF_ERROR(dev_->CopyToDevice(ep_ones_, ones.data(), N * 4));
    PENG_RETURN_IF_ERROR(Scratch(N * k, &ep_ids_));
    PENG_RETURN_IF_ERROR(Scratch(2 * N, &ep_rows_));
    PENG_RETURN_IF_ERROR(Scratch(N * k, &ep_send_w_));
    PENG_RETURN_IF_ERROR(Scratch(N * k, &ep_send_ids_));
    ep_capacity_ = N;
    return OkStatus();
  }
  Status IdleStep() override {
    if (!m_.ep_) return OkStatus();
    PENG_RETURN_IF_ERROR(BeginLayers(0));
    for (const Layer& L : layers_) {
      if (!L.moe) continue;
      layer_host_sync_ ? RoutedAllToAll(L, 0) : RoutedAcrossReplicas(L, 0);
      if (!layer_status_.ok()) return std::exchange(layer_status_, OkStatus());
    }
    return dev_->Synchronize();
  }
  // The routed experts of this rank for every replica's tokens: this replica's T normalized
  // rows (h_) padded to the largest count and gathered from every replica, routed and run here,
  // the weighted sums reduce-scattered back: this replica's rows into ep_send_[T, D] (the sums
  // over the replicas' ranks at this tensor-parallel index). No replica has tokens: nothing.
  void RoutedAcrossReplicas(const Layer& L, int64_t T) {
    if (ep_max_t_ == 0) return;  // (every replica idle: nobody calls a collective)
    const DeepseekV2Config& c = m_.cfg_;
    const int64_t D = c.base.hidden_size, N = m_.ep_->size() * ep_max_t_;
    const int k = static_cast<int>(c.num_experts_per_tok);
    backend::Device& d = *dev_;
    const int64_t row_bytes = D * static_cast<int64_t>(sizeof(float));
    d.Fill(ep_send_, 0, ep_max_t_ * row_bytes);  // (the padding rows route, to no effect)
    if (T > 0) d.CopyOnDevice(ep_send_, h_, T * row_bytes);
    ep_comm_->AllGather(ep_send_, ep_max_t_ * row_bytes, ep_in_);
    d.MatMuls(ep_in_, N, {{&L.router, ep_logits_}});
    d.MoeRoute(ep_logits_, L.router_bias, N, c.Routing(), ep_ids_, ep_w_);
    d.ExpertsMatMuls(ep_in_, N, ep_ids_, k, false, {{&L.exp_gate, ep_gate_}, {&L.exp_up, ep_up_}});
    d.Fill(ep_out_, 0, N * row_bytes);
    d.MoeDown(backend::GatedActivation::kSilu, ep_gate_, ep_up_, N, k, c.moe_intermediate_size,
              L.exp_down, ep_ids_, ep_w_, {}, ep_ys_, ep_out_);
    ep_comm_->ReduceScatterSum(ep_out_, ep_send_, ep_max_t_ * D);
  }

  // The same by all-to-all from ep_all_to_all_tokens_ tokens in all on (the CPU model's
  // DeepseekV2Model::ExchangeAllToAll): this replica's T rows routed here and their routing
  // brought to the host, which lists the rows each peer's experts need (expert e is global
  // rank e / per_rank = replica x tp + the tensor-parallel index: ours); the counts exchanged
  // over the host group; each peer sent those rows alone (ep_send_) with their routing (ids
  // and weights: the CPU model routes what it receives again, with the same arithmetic; a
  // device's router may not give a row the same bits in another batch -- a GEMV up to 64 rows,
  // FP16 GEMMs past them --, and a row's peers must use the routing that chose them) and
  // running its experts on what it received (ep_in_) into ep_out_, which goes back the same
  // way (ep_back_, a zero row after the rows); each token's returns then gathered in peer order
  // (ep_in_ [T, n_rep], the zero row where a peer had none of them) and summed into
  // ep_send_ [T, D] (SlotSum, weights 1: the CPU model's additions in its order).
  void RoutedAllToAll(const Layer& L, int64_t T) {
    const DeepseekV2Config& c = m_.cfg_;
    const int64_t D = c.base.hidden_size, k = c.num_experts_per_tok;
    const int n_rep = m_.ep_->size();
    const int64_t per_rank = m_.experts_.size;
    backend::Device& d = *dev_;
    const int64_t row_bytes = D * static_cast<int64_t>(sizeof(float));
    auto keep = [&](Status s) {
      if (layer_status_.ok()) layer_status_ = std::move(s);
      return layer_status_.ok();
    };
    std::vector<int32_t>& ids = a2a_ids_;
    ids.resize(T * k);
    if (T > 0) {
      d.MatMuls(h_, T, {{&L.router, ep_logits_}});
      d.MoeRoute(ep_logits_, L.router_bias, T, c.Routing(), ep_ids_, ep_w_);
      if (!keep(d.CopyToHost(ids.data(), ep_ids_, T * k * 4))) return;
    }
    // Rows to send, peer by peer (lists[0, n_send)), then where each token's return from each
    // peer lands in ep_back_ (lists[n_send, n_send + T n_rep); n_send: the zero row), uploaded
    // together into ep_rows_; the rows counts to and from each peer (counts[0, 2 n_rep)).
    std::vector<int32_t>& lists = a2a_lists_;
    std::vector<int32_t>& at = a2a_at_;
    std::vector<int64_t>& counts = a2a_counts_;
    lists.clear();
    at.assign(T * n_rep, -1);
    counts.assign(2 * n_rep, 0);
    for (int p = 0; p < n_rep; ++p) {
      for (int64_t t = 0; t < T; ++t) {
        bool need = false;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t g = ids[t * k + j] / per_rank;
          need |= g % m_.tp_size_ == m_.tp_rank_ && g / m_.tp_size_ == p;
        }
        if (!need) continue;
        at[t * n_rep + p] = static_cast<int32_t>(lists.size());
        lists.push_back(static_cast<int32_t>(t));
        ++counts[p];
      }
    }
    const int64_t n_send = static_cast<int64_t>(lists.size());
    for (const int32_t a : at) lists.push_back(a < 0 ? static_cast<int32_t>(n_send) : a);
    m_.ep_->AllToAll(counts.data(), sizeof(int64_t), counts.data() + n_rep);
    int64_t n_recv = 0;
    for (int p = 0; p < n_rep; ++p) n_recv += counts[n_rep + p];
    // Bytes to and from each peer: its rows (D floats a row), then their routing (k values).
    std::vector<int64_t>& bytes = a2a_bytes_;
    bytes.resize(4 * n_rep);
    for (int i = 0; i < 2 * n_rep; ++i) {
      bytes[i] = counts[i] * row_bytes;
      bytes[2 * n_rep + i] = counts[i] * k * 4;
    }
    const int64_t* send = bytes.data();
    const int64_t* recv = send + n_rep;
    const int64_t* send_k = send + 2 * n_rep;
    const int64_t* recv_k = send + 3 * n_rep;
    if (!lists.empty() &&
        !keep(d.CopyToDevice(ep_rows_, lists.data(), static_cast<int64_t>(lists.size()) * 4)))
      return;
    // The rows and their routing out (the ids moved as the bits of floats: GatherRows copies);
    // the routing received in ep_ids_ / ep_w_, whose own rows have gone out.
    d.GatherRows(h_, ep_rows_, n_send, D, ep_send_);
    d.GatherRows(ep_w_, ep_rows_, n_send, k, ep_send_w_);
    d.GatherRows(reinterpret_cast<const float*>(ep_ids_), ep_rows_, n_send, k,
                 reinterpret_cast<float*>(ep_send_ids_));
    ep_comm_->AllToAllV(ep_send_, send, ep_in_, recv);
    ep_comm_->AllToAllV(ep_send_w_, send_k, ep_w_, recv_k);
    ep_comm_->AllToAllV(ep_send_ids_, send_k, ep_ids_, recv_k);
    d.Fill(ep_out_, 0, n_recv * row_bytes);
    if (n_recv > 0) {
      d.ExpertsMatMuls(ep_in_, n_recv, ep_ids_, static_cast<int>(k), false,
                       {{&L.exp_gate, ep_gate_}, {&L.exp_up, ep_up_}});
      d.MoeDown(backend::GatedActivation::kSilu, ep_gate_, ep_up_, n_recv, static_cast<int>(k),
                c.moe_intermediate_size, L.exp_down, ep_ids_, ep_w_, {}, ep_ys_, ep_out_);
    }
    ep_comm_->AllToAllV(ep_out_, recv, ep_back_, send);
    if (T == 0) return;
    d.Fill(ep_back_ + n_send * D, 0, row_bytes);
    d.GatherRows(ep_back_, ep_rows_ + n_send, T * n_rep, D, ep_in_);
    d.Fill(ep_send_, 0, T * row_bytes);
    d.SlotSum(ep_in_, ep_ones_, T, n_rep, D, ep_send_);
  }

  // The dense FFN: h_ = RmsNorm(x_), gate / up / SiLU over its T rows, then the down
  // projection with its output and epilogue.
  void Mlp(const DeviceMatrix& gate, const DeviceMatrix& up, const backend::Device::MatMulOut& down,
           int64_t T, const float* norm) {
    dev_->NormMatMuls(x_, norm, 0.f, m_.cfg_.base.rms_eps, h_, T, m_.cfg_.base.hidden_size,
                      {{&gate, gate_}, {&up, up_}});
    dev_->GatedMatMuls(backend::GatedActivation::kSilu, gate_, up_, gate_, T, gate.rows, {down});
  }
  void RunLayer(int il) override {
    const DeepseekV2Config& c = m_.cfg_;
    const Layer& L = layers_[il];
    const backend::StepBatch& b = step_;
    const int64_t T = b.n_tokens, D = c.base.hidden_size, H = m_.n_heads_;
    const int64_t dn = c.qk_nope_head_dim, dqk = c.qk_head_dim(), r = c.kv_lora_rank;
    const int64_t row = c.cache_row();
    backend::Device& d = *dev_;

    // --- MLA
    if (c.q_lora_rank > 0) {
      d.NormMatMuls(x_, L.attn_norm, 0.f, c.base.rms_eps, h_, T, D,
                    {{&L.wq_a, qa_, L.bq_a}, {&L.wkv_a, ckv_, L.bkv_a}});
      d.NormMatMuls(qa_, L.q_a_norm, 0.f, c.latent_norm_eps, qa_, T, c.q_lora_rank,
                    {{&L.wq_b, q_, L.bq_b}});
    } else {
      d.NormMatMuls(x_, L.attn_norm, 0.f, c.base.rms_eps, h_, T, D,
                    {{&L.wq, q_, L.bq}, {&L.wkv_a, ckv_, L.bkv_a}});
    }
    kernels::MlaParams mp;
    mp.n_heads = static_cast<int>(H);
    mp.kv_lora_rank = static_cast<int>(r);
    mp.d_nope = static_cast<int>(dn);
    mp.d_rope = static_cast<int>(c.qk_rope_head_dim);
    mp.d_v = static_cast<int>(c.v_head_dim);
    mp.scale = c.softmax_scale;
    // The latent c normalized, every head's q_pe and the row's k_pe rotated, the row
    // [c | k_pe] into the cache; then the absorbed query.
    const backend::Device::RopeKv rope{{q_ + dn, H, dqk, H * dqk},
                                       {ckv_ + r, 1, row, row},
                                       &c.base.rope,
                                       inv_freq_,
                                       ckv_,
                                       nullptr,
                                       {ckv_, L.kv_a_norm, c.latent_norm_eps, r, row},
                                       {}};
    d.RopeMlaAbsorbQuery(rope, kv_[il], q_, b, L.kv_b, mp, qlat_);
    d.MlaAttention(qlat_, kv_[il], b, mp, olat_);
    Residual(L.wo, L.bo, {}, o_, [&](const backend::Device::MatMulOut& o) {
      d.MlaProjectMatMuls(olat_, b, L.kv_b, mp, attn_, {o});
    });

    // --- FFN: dense, or routed + shared experts
    if (!L.moe) {
      Residual(L.w_down, nullptr, {}, o_, [&](const backend::Device::MatMulOut& o) {
        Mlp(L.w_gate, L.w_up, o, T, L.ffn_norm);
      });
      return;
    }
    if (m_.ep_) {  // routed across the replicas; plus the shared experts, over tensor ranks
      if (L.shared) {
        d.NormMatMuls(x_, L.ffn_norm, 0.f, c.base.rms_eps, h_, T, D,
                      {{&L.sh_gate, sh_gate_}, {&L.sh_up, sh_up_}});
      } else {
        d.RmsNorm(x_, L.ffn_norm, 0.f, h_, T, D, c.base.rms_eps);
      }
      layer_host_sync_ ? RoutedAllToAll(L, T) : RoutedAcrossReplicas(L, T);
      if (L.shared)
        d.GatedMatMuls(backend::GatedActivation::kSilu, sh_gate_, sh_up_, sh_gate_, T,
                       L.sh_gate.rows, {{&L.sh_down, ep_send_, nullptr, true}});
      if (comm_) comm_->AllReduceSum(ep_send_, T * D);
      d.Add(x_, ep_send_, T * D);
      return;
    }
    const int k = static_cast<int>(c.num_experts_per_tok);
    const int64_t I = c.moe_intermediate_size;
    // The normalized input into the shared experts' gate and up (one preparation of it for them
    // and for the routed experts' gate and up), the router and the routing, the routed experts'
    // gate and up, their down projection.
    const backend::Device::MoeRouteOut route{&L.router, router_logits_, L.router_bias,
                                             c.Routing(), ids_, w_};
    if (L.shared) {
      d.NormMatMuls(x_, L.ffn_norm, 0.f, c.base.rms_eps, h_, T, D,
                    {{&L.sh_gate, sh_gate_}, {&L.sh_up, sh_up_}}, &L.exp_gate, &route);
    } else {
      d.NormMatMuls(x_, L.ffn_norm, 0.f, c.base.rms_eps, h_, T, D, {}, &L.exp_gate, &route);
    }
    d.ExpertsMatMuls(h_, T, ids_, k, false, {{&L.exp_gate, gate_}, {&L.exp_up, up_}});
    // The routed experts' and the shared experts' down projections into the residual (tensor
    // parallel: this rank's slices of them into o_, summed in one all-reduce).
    float* out = x_;
    if (comm_) {
      out = o_;
      d.Fill(o_, 0, T * D * static_cast<int64_t>(sizeof(float)));
    }
    backend::Device::SharedExperts shared;
    if (L.shared) shared = {sh_gate_, sh_up_, L.sh_gate.rows, &L.sh_down};
    d.MoeDown(backend::GatedActivation::kSilu, gate_, up_, T, k, I, L.exp_down, ids_, w_, shared,
              ys_, out);
    if (comm_) {
      comm_->AllReduceSum(o_, T * D);
      d.Add(x_, o_, T * D);
    }
  }

  const DeepseekV2Model& m_;
  std::vector<Layer> layers_;
  const float* inv_freq_ = nullptr;
  float *q_ = nullptr, *qa_ = nullptr, *ckv_ = nullptr, *qlat_ = nullptr, *olat_ = nullptr;
  float *attn_ = nullptr, *o_ = nullptr, *gate_ = nullptr, *up_ = nullptr;
  float* ys_ = nullptr;
  float *sh_gate_ = nullptr, *sh_up_ = nullptr;  // the shared experts' gate / up
  float *router_logits_ = nullptr, *w_ = nullptr;
  int32_t* ids_ = nullptr;
  // Expert parallelism across replicas: the exchange's communicator on the device and its
  // scratch, for ep_capacity_ rows (n_rep x the step's largest token count, ep_max_t_).
  Communicator* ep_comm_ = nullptr;
  std::unique_ptr<Communicator> ep_own_;
  int64_t ep_max_t_ = 0, ep_capacity_ = 0;
  float *ep_send_ = nullptr, *ep_in_ = nullptr, *ep_out_ = nullptr, *ep_logits_ = nullptr;
  float *ep_w_ = nullptr, *ep_gate_ = nullptr, *ep_up_ = nullptr, *ep_ys_ = nullptr;
  int32_t* ep_ids_ = nullptr;
  // The all-to-all's (RoutedAllToAll, in steps with layer_host_sync_): the returned rows and a
  // zero row [capacity + 1, D], weights of 1 [capacity], the rows sent and where the returns
  // land [2 capacity], the sent rows' routing [capacity, k] each, and the host's lists.
  float *ep_back_ = nullptr, *ep_ones_ = nullptr, *ep_send_w_ = nullptr;
  int32_t *ep_rows_ = nullptr, *ep_send_ids_ = nullptr;
  std::vector<int32_t> a2a_ids_, a2a_lists_, a2a_at_;
  std::vector<int64_t> a2a_counts_, a2a_bytes_;
};

StatusOr<std::unique_ptr<DeviceModel>> CreateDeviceDeepseek(const DeepseekV2Model& model,
                                                            backend::Device* device) {
  auto m = std::make_unique<DeviceDeepseekModel>(model, device);
  PENG_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<DeviceModel>(std::move(m));
}

}  // namespace peng
