// DeepSeek-V2's feed-forward layers: the gated MLP (dense layers, shared and routed experts),
// the router (softmax / sigmoid scores, greedy, group-limited or noaux_tc top-k), the routed
// experts grouped by expert over the batch, and expert parallelism's exchange of the
// data-parallel replicas' tokens (deepseek2.h). The attention, loading and the forward pass
// around them are in deepseek2.cc.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/moe.h"
#include "kernels/ops.h"
#include "kernels/work_counter.h"
#include "model/deepseek2/deepseek2.h"
#include "parallel/communicator.h"

namespace peng {

using TopkMethod = DeepseekV2Config::TopkMethod;
using Scoring = DeepseekV2Config::Scoring;


void DeepseekV2Model::RunMlpWith(const Linear& gate, const Linear& up, const Linear& down,
                                 const float* x, int64_t T, float* y, ThreadPool* pool,
                                 std::vector<float>* ge, std::vector<float>* ue, Int8Acts* acts) {
  const int64_t F = gate.rows();
  if (static_cast<int64_t>(ge->size()) < T * F) ge->resize(T * F);
  if (static_cast<int64_t>(ue->size()) < T * F) ue->resize(T * F);
  const Linear* ls[] = {&gate, &up};
  float* ys[] = {ge->data(), ue->data()};
  Linear::ForwardGroup(ls, ys, 2, x, nullptr, T, pool, acts);
  kernels::SiluMul(ge->data(), ue->data(), ge->data(), T * F);
  down.Forward(ge->data(), nullptr, T, y, pool, acts);
}

void DeepseekV2Model::RunMlp(const Linear& gate, const Linear& up, const Linear& down,
                             const float* x, int64_t T, float* y, ThreadPool* pool) {
  RunMlpWith(gate, up, down, x, T, y, pool, &ge_, &ue_, &acts_scratch_);
}

void DeepseekV2Model::RunExpertsParallel(const Layer& L, const float* h, int64_t T, float* out,
                                         ThreadPool* pool) {
  const int64_t D = cfg_.base.hidden_size, E = cfg_.n_routed_experts;
  const int nt = pool->num_threads();
  // Longest-processing-time assignment of the active experts (cost ~ tokens + a fixed part
  // for streaming the expert's weights once).
  auto& active = route_.active;
  active.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = expert_offsets_[e + 1] - expert_offsets_[e];
    if (n > 0 && L.exp_gate[e].bound()) active.emplace_back(n, static_cast<int32_t>(e));
  }
  std::sort(active.begin(), active.end(), std::greater<>());
  auto& mine = route_.mine;
  auto& load = route_.load;
  mine.resize(nt);
  for (auto& m : mine) m.clear();
  load.assign(nt, 0);
  for (const auto& [n, e] : active) {
    const int ti = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[ti] += n + 8;
    mine[ti].push_back(e);
  }
  if (static_cast<int>(expert_scratch_.size()) < nt) expert_scratch_.resize(nt);
  std::vector<kernels::WorkCounts> work(nt);  // the experts' kernel work, moved to this thread
  pool->Run([&](int ti, int) {
    kernels::WorkCapture capture;
    ExpertScratch& s = expert_scratch_[ti];
    s.o.assign(T * D, 0.f);
    for (const int32_t e : mine[ti]) {
      const int64_t b = expert_offsets_[e], n = expert_offsets_[e + 1] - b;
      s.xe.resize(n * D);
      s.ye.resize(n * D);
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(h + expert_rows_[b + i] * D, D, s.xe.data() + i * D);
      RunMlpWith(L.exp_gate[e], L.exp_up[e], L.exp_down[e], s.xe.data(), n, s.ye.data(),
                 nullptr, &s.ge, &s.ue, &s.acts);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = s.o.data() + expert_rows_[b + i] * D;
        const float* src = s.ye.data() + i * D;
        const float w = expert_row_w_[b + i];
        for (int64_t d = 0; d < D; ++d) dst[d] += w * src[d];
      }
    }
    work[ti] = capture.Take();
  });
  for (const kernels::WorkCounts& w : work) kernels::ThreadWork() += w;
  for (int ti = 0; ti < nt; ++ti) kernels::AddInPlace(out, expert_scratch_[ti].o.data(), T * D);
}

void DeepseekV2Model::Route(const Layer& L, int64_t T) {
  kernels::MoeRoute(router_logits_.data(), L.router_bias, T, cfg_.Routing(), topk_ids_.data(),
                    topk_w_.data());
}

void DeepseekV2Model::RunMoe(const Layer& L, int64_t T, ThreadPool* pool) {
  const int64_t D = cfg_.base.hidden_size;
  if (!ep_) {
    RunRoutedExperts(L, h_.data(), T, o_.data(), pool);
  } else {
    // Expert parallelism across the data-parallel replicas: this rank's experts serve every
    // replica's tokens, exchanged with the ranks of this tensor-parallel index in the other
    // replicas. Everybody first learns every replica's token count.
    const int n_rep = ep_->size();
    ep_counts_.resize(n_rep);
    const int64_t mine = T;
    ep_->AllGather(&mine, sizeof mine, ep_counts_.data());
    int64_t n = 0;
    for (const int64_t c : ep_counts_) n += c;
    if (n == 0) return;  // (every replica idle: nobody calls a collective)
    EnsureScratch(std::max(n, T));
    if (n >= ep_all_to_all_tokens_) {
      ExchangeAllToAll(L, T, pool);
    } else {
      ExchangeAllGather(L, T, n, pool);
    }
  }
  if (L.sh_gate.bound() && T > 0) {
    RunMlp(L.sh_gate, L.sh_up, L.sh_down, h_.data(), T, ye_.data(), pool);
    kernels::AddInPlace(o_.data(), ye_.data(), T * D);
  }
  AllReduce(o_.data(), T * D);  // the ranks' experts (or expert slices) and shared slices
  kernels::AddInPlace(x_.data(), o_.data(), T * D);
}

// Small batches: every replica's tokens to every peer ([replicas][max T][D], padded), each runs
// its experts on all of them, and a reduce-scatter returns to each the sums of its own rows.
void DeepseekV2Model::ExchangeAllGather(const Layer& L, int64_t T, int64_t n, ThreadPool* pool) {
  const int64_t D = cfg_.base.hidden_size;
  const int n_rep = ep_->size();
  const int64_t max_t = *std::max_element(ep_counts_.begin(), ep_counts_.end());
  ep_pad_.assign(max_t * D, 0.f);
  std::copy_n(h_.data(), T * D, ep_pad_.data());
  ep_all_.resize(n_rep * max_t * D);
  ep_->AllGather(ep_pad_.data(), max_t * D * static_cast<int64_t>(sizeof(float)), ep_all_.data());
  ep_h_.resize(n * D);
  ep_o_.resize(n * D);
  for (int d = 0, at = 0; d < n_rep; at += static_cast<int>(ep_counts_[d]), ++d)
    std::copy_n(ep_all_.data() + d * max_t * D, ep_counts_[d] * D, ep_h_.data() + at * D);
  RunRoutedExperts(L, ep_h_.data(), n, ep_o_.data(), pool);
  std::fill(ep_all_.begin(), ep_all_.end(), 0.f);
  for (int d = 0, at = 0; d < n_rep; at += static_cast<int>(ep_counts_[d]), ++d)
    std::copy_n(ep_o_.data() + at * D, ep_counts_[d] * D, ep_all_.data() + d * max_t * D);
  ep_->ReduceScatterSum(ep_all_.data(), ep_pad_.data(), max_t * D);  // this replica's rows
  std::copy_n(ep_pad_.data(), T * D, o_.data());
}

// Large batches: each token goes only to the peers that own one of its k experts (this rank
// routes its replica's tokens first), the peers run their experts on what they received, and
// the outputs come back the same way and are added up per token.
void DeepseekV2Model::ExchangeAllToAll(const Layer& L, int64_t T, ThreadPool* pool) {
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size, k = c.num_experts_per_tok;
  const int n_rep = ep_->size();
  const int64_t per_rank = experts_.size;  // experts of global rank g: [g per, (g + 1) per)
  // Which peers each token needs: expert e belongs to global rank e / per_rank = d tp + t; the
  // peer of replica d at this rank's tensor-parallel index t owns it when t is ours.
  ep_rows_.resize(n_rep);  // (the row lists keep their capacity from step to step)
  for (std::vector<int32_t>& rows : ep_rows_) rows.clear();
  if (T > 0) {
    L.router.Forward(h_.data(), nullptr, T, router_logits_.data(), pool, &acts_scratch_);
    Route(L, T);
    std::vector<uint8_t>& need = ep_need_;
    for (int64_t t = 0; t < T; ++t) {
      need.assign(n_rep, 0);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t g = topk_ids_[t * k + j] / per_rank;
        if (g % tp_size_ == tp_rank_) need[g / tp_size_] = 1;
      }
      for (int d = 0; d < n_rep; ++d)
        if (need[d]) ep_rows_[d].push_back(static_cast<int32_t>(t));
    }
  }
  std::vector<int64_t>& send = ep_send_;  // rows per peer, then bytes per peer
  std::vector<int64_t>& recv = ep_recv_;
  send.resize(n_rep);
  recv.resize(n_rep);
  int64_t n_send = 0;
  for (int d = 0; d < n_rep; ++d) n_send += send[d] = static_cast<int64_t>(ep_rows_[d].size());
  ep_->AllToAll(send.data(), sizeof(int64_t), recv.data());
  int64_t n_recv = 0;
  for (int d = 0; d < n_rep; ++d) n_recv += recv[d];
  ep_pad_.resize(n_send * D);  // the rows to send, peer by peer
  for (int d = 0, at = 0; d < n_rep; ++d)
    for (const int32_t t : ep_rows_[d])
      std::copy_n(h_.data() + t * D, D, ep_pad_.data() + at++ * D);
  ep_h_.resize(n_recv * D);
  ep_o_.resize(n_recv * D);
  const int64_t row = D * static_cast<int64_t>(sizeof(float));
  for (int d = 0; d < n_rep; ++d) {
    send[d] *= row;
    recv[d] *= row;
  }
  ep_->AllToAllV(ep_pad_.data(), send.data(), ep_h_.data(), recv.data());
  RunRoutedExperts(L, ep_h_.data(), n_recv, ep_o_.data(), pool);  // (routes them again)
  ep_all_.resize(n_send * D);
  ep_->AllToAllV(ep_o_.data(), recv.data(), ep_all_.data(), send.data());
  std::fill(o_.begin(), o_.begin() + T * D, 0.f);
  for (int d = 0, at = 0; d < n_rep; ++d)
    for (const int32_t t : ep_rows_[d])
      kernels::AddInPlace(o_.data() + t * D, ep_all_.data() + at++ * D, D);
}

// out[T, D] = the routed experts of this rank (all of them alone) for the T tokens `h`, weighted
// by their routing weights.
void DeepseekV2Model::RunRoutedExperts(const Layer& L, const float* h, int64_t T, float* out,
                                       ThreadPool* pool) {
  const DeepseekV2Config& c = cfg_;
  const int64_t D = c.base.hidden_size, E = c.n_routed_experts, k = c.num_experts_per_tok;
  L.router.Forward(h, nullptr, T, router_logits_.data(), pool, &acts_scratch_);
  Route(L, T);
  std::fill(out, out + T * D, 0.f);
  if (moe_reference_) {
    // Per-token loop: every (token, selected expert) pair on its own.
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = topk_ids_[t * k + j];
        if (!L.exp_gate[e].bound()) continue;  // another rank's expert
        RunMlp(L.exp_gate[e], L.exp_up[e], L.exp_down[e], h + t * D, 1, ye_.data(), pool);
        const float w = topk_w_[t * k + j];
        for (int64_t i = 0; i < D; ++i) out[t * D + i] += w * ye_[i];
      }
    }
  } else {
    // Group the (token, expert) pairs by expert (tokens ascending), then run every selected
    // expert once over its gathered tokens and scatter-add the weighted rows.
    expert_offsets_.assign(E + 1, 0);
    for (int64_t i = 0; i < T * k; ++i) expert_offsets_[topk_ids_[i] + 1]++;
    for (int64_t e = 0; e < E; ++e) expert_offsets_[e + 1] += expert_offsets_[e];
    std::vector<int32_t>& fill = route_.fill;
    fill.assign(expert_offsets_.begin(), expert_offsets_.end() - 1);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = topk_ids_[t * k + j];
        expert_rows_[fill[e]] = static_cast<int32_t>(t);
        expert_row_w_[fill[e]++] = topk_w_[t * k + j];
      }
    }
    int64_t n_active = 0;  // of this rank's experts
    for (int64_t e = 0; e < E; ++e)
      n_active += expert_offsets_[e + 1] > expert_offsets_[e] && L.exp_gate[e].bound();
    // Prefill: many experts with a few tokens each run faster side by side on the threads than
    // one after another with each small GEMM split across them. (Exact mode's shared weight
    // cache is not thread-safe, so it keeps the sequential path.)
    const bool spread = pool && pool->num_threads() > 1 &&
                        n_active >= 2 * pool->num_threads() && !kernels::ExactActivations();
    if (spread) RunExpertsParallel(L, h, T, out, pool);
    for (int64_t e = 0; e < E && !spread; ++e) {
      const int64_t b = expert_offsets_[e], n = expert_offsets_[e + 1] - b;
      if (n == 0 || !L.exp_gate[e].bound()) continue;
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(h + expert_rows_[b + i] * D, D, xe_.data() + i * D);
      RunMlp(L.exp_gate[e], L.exp_up[e], L.exp_down[e], xe_.data(), n, ye_.data(), pool);
      for (int64_t i = 0; i < n; ++i) {
        float* dst = out + expert_rows_[b + i] * D;
        const float* src = ye_.data() + i * D;
        const float w = expert_row_w_[b + i];
        for (int64_t d = 0; d < D; ++d) dst[d] += w * src[d];
      }
    }
  }
}

}  // namespace peng
