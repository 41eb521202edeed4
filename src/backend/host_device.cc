// HostDevice: the Device interface over peng's CPU kernels in host memory -- the reference the
// accelerator backends are checked against, and the device graph's runner in CI.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <set>
#include <vector>

#include "backend/device.h"
#include "kernels/int8_gemm.h"
#include "kernels/probe.h"

namespace peng::backend {
namespace {

class HostDevice final : public Device {
 public:
  explicit HostDevice(ThreadPool* pool) : pool_(pool) {}
  ~HostDevice() override {
    for (void* p : blocks_) std::free(p);
  }

  std::string Name() const override { return "host"; }
  int64_t FreeMemoryBytes() const override { return int64_t{1} << 40; }
  bool CountsMemory() const override { return false; }

  StatusOr<void*> Alloc(int64_t bytes) override {
    if (bytes < 0) return InvalidArgument("negative allocation");
    const size_t n = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, n == 0 ? 64 : n);
    if (!p) return ResourceExhausted("host device: cannot allocate " + std::to_string(bytes));
    blocks_.insert(p);
    return p;
  }
  void Free(void* p) override {
    if (blocks_.erase(p)) std::free(p);
  }
  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return OkStatus();
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void Fill(void* dst, uint8_t value, int64_t bytes) override { std::memset(dst, value, bytes); }
  Status Synchronize() override { return OkStatus(); }
  // Host memory: the host group itself serves.
  StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Communicator*) override {
    return std::unique_ptr<Communicator>();
  }
  double MeasureReadBandwidth(int64_t bytes) override {
    return kernels::MeasureReadBandwidth(pool_, bytes, 3);
  }

  bool SupportsWeights(DType t) const override {
    return t == DType::kI8 || kernels::MatMulSupports(t);
  }
  // The matrix stays where it is (the mapped file); nothing is copied.
  StatusOr<DeviceMatrix> Upload(const TensorView& w, const float* int8_scales) override {
    return Describe(w, int8_scales);
  }

  void MatMul(const DeviceMatrix& w, const float* x, int64_t T, float* y) override {
    if (w.dtype == DType::kI8 && w.int8_activations && !kernels::ExactActivations()) {
      // W8A8 as Linear::Forward runs it: the activations quantized per token in groups of 32.
      act_q_.resize(static_cast<size_t>(T * w.cols));
      act_scales_.resize(static_cast<size_t>(T * (w.cols / kernels::kInt8ActGroup)));
      kernels::QuantizeActivations(x, T, w.cols, act_q_.data(), act_scales_.data());
      kernels::Int8MatMul(Int8(w), act_q_.data(), act_scales_.data(), T, y, pool_);
    } else if (w.dtype == DType::kI8) {
      kernels::Int8MatMulW8A16(Int8(w), x, T, y, pool_);
    } else {
      kernels::MatMul(w.host, x, T, y, pool_);
    }
  }
  void MatMuls(const float* x, int64_t T, std::initializer_list<MatMulOut> outs) override {
    for (const MatMulOut& o : outs) {
      const int64_t n = T * o.w->rows;
      if (o.slots.rows) SlotSum(o.slots.rows, o.slots.w, T, o.slots.k, o.w->rows, o.y);
      float* y = o.y;
      if (o.accumulate) {  // the product apart, then added (as the CPU engine does)
        product_.resize(static_cast<size_t>(n));
        y = product_.data();
      }
      MatMul(*o.w, x, T, y);
      if (o.bias) AddBiasRows(y, o.bias, T, o.w->rows);
      if (o.accumulate) Add(o.y, y, n);
    }
  }
  void EmbedRows(const DeviceMatrix& w, const StepBatch& b, float scale, float* out,
                 int64_t row0) override {
    for (int64_t t = 0; t < b.n_tokens; ++t) {
      float* o = out + t * w.cols;
      const int64_t id = b.d_tokens[t] - row0;  // (host memory)
      if (id < 0 || id >= w.rows) {
        std::fill_n(o, w.cols, 0.f);
        continue;
      }
      if (w.dtype == DType::kI8) {
        const int8_t* q = static_cast<const int8_t*>(w.data) + id * w.cols;
        for (int64_t c = 0; c < w.cols; ++c) o[c] = static_cast<float>(q[c]) * w.scales[id];
      } else {
        kernels::DequantizeRow(w.dtype, w.host.row(id), o, w.cols);
      }
      if (scale != 1.f) kernels::ScaleInPlace(o, scale, w.cols);
    }
  }
  void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows,
               int64_t n, float eps, int64_t stride) override {
    if (stride == 0 || stride == n) {
      kernels::RmsNorm(x, w, w_offset, y, n_rows, n, eps);
      return;
    }
    for (int64_t r = 0; r < n_rows; ++r)
      kernels::RmsNorm(x + r * stride, w, w_offset, y + r * stride, 1, n, eps);
  }
  void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) override {
    kernels::AddBiasRows(y, b, n_rows, n);
  }
  void Add(float* y, const float* x, int64_t n) override { kernels::AddInPlace(y, x, n); }
  void Scale(float* y, float s, int64_t n) override { kernels::ScaleInPlace(y, s, n); }
  void Softcap(float* y, float cap, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = cap * std::tanh(y[i] / cap);
  }
  void Gated(GatedActivation act, const float* gate, const float* up, float* out,
             int64_t n) override {
    if (act == GatedActivation::kSilu) {
      kernels::SiluMul(gate, up, out, n);
    } else {
      kernels::GeluTanhMul(gate, up, out, n);
    }
  }
  void Rope(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
            const StepBatch& b, const kernels::RopeConfig& cfg, const float* inv_freq) override {
    for (int64_t t = 0; t < b.n_tokens; ++t)
      kernels::ApplyRope(x + t * token_stride, n_heads, head_stride, b.pos[t], cfg, inv_freq);
  }
  void KvWrite(const kernels::KvLayerView& kv, const StepBatch& b, const float* k,
               const float* v) override {
    const int64_t kd = int64_t{kv.n_kv_heads} * kv.head_dim;
    const int64_t vd = int64_t{kv.n_kv_heads} * kv.v_head_dim;
    for (int64_t t = 0; t < b.n_tokens; ++t) {
      const int32_t* table = b.block_tables[b.seq_of_token[t]];
      if (kv.v_head_dim == 0) {
        kernels::MlaKvWrite(kv, table, b.pos[t], k + t * kd);
      } else {
        kernels::KvWrite(kv, table, b.pos[t], k + t * kd, v + t * vd);
      }
    }
  }
  void PagedAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                      const kernels::AttentionParams& p, float* out) override {
    const int64_t qd = int64_t{p.n_heads} * kv.head_dim, od = int64_t{p.n_heads} * kv.v_head_dim;
    seqs_.clear();
    for (int64_t s = 0; s < b.n_seqs; ++s) {
      const int64_t t0 = b.seq_first_token[s];
      seqs_.push_back({q + t0 * qd, b.seq_n_tokens[s], b.pos[t0], b.block_tables[s],
                       out + t0 * od});
    }
    kernels::PagedAttentionBatch(seqs_.data(), b.n_seqs, kv, p, pool_);
  }
  void MlaAbsorbQuery(const float* q, const StepBatch& b, const MlaWeights& w,
                      const kernels::MlaParams& p, float* out) override {
    const int64_t qd = int64_t{p.n_heads} * (p.d_nope + p.d_rope);
    const int64_t od = int64_t{p.n_heads} * (p.kv_lora_rank + p.d_rope);
    ForMlaRuns(b, w.k_b, [&](int64_t t0, int64_t n, const TensorView* const* heads) {
      if (heads) {
        kernels::MlaAbsorbQueryHeads(q + t0 * qd, heads, p, out + t0 * od, pool_);
      } else {
        kernels::MlaAbsorbQuery(q + t0 * qd, n, w.kvb, p, out + t0 * od, pool_);
      }
    });
  }
  void MlaAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                    const kernels::MlaParams& p, float* out) override {
    const int64_t qd = int64_t{p.n_heads} * kv.head_dim, od = int64_t{p.n_heads} * p.kv_lora_rank;
    for (int64_t s = 0; s < b.n_seqs; ++s) {
      const int64_t t0 = b.seq_first_token[s];
      kernels::MlaPagedAttention(q + t0 * qd, b.seq_n_tokens[s], b.pos[t0], kv, b.block_tables[s],
                                 p, out + t0 * od, pool_);
    }
  }
  void MlaProjectOutput(const float* o_lat, const StepBatch& b, const MlaWeights& w,
                        const kernels::MlaParams& p, float* out) override {
    const int64_t ld = int64_t{p.n_heads} * p.kv_lora_rank, od = int64_t{p.n_heads} * p.d_v;
    ForMlaRuns(b, w.v_b, [&](int64_t t0, int64_t n, const TensorView* const* heads) {
      if (heads) {
        kernels::MlaProjectOutputHeads(o_lat + t0 * ld, heads, p, out + t0 * od, pool_);
      } else {
        kernels::MlaProjectOutput(o_lat + t0 * ld, n, w.kvb, p, out + t0 * od, pool_);
      }
    });
  }
  // MlaWeights' rule: fn(t0, 1, heads) for each token of a one-token sequence when `stored`
  // holds the per-head matrices, fn(t0, n, nullptr) for each run of n other tokens.
  template <typename Fn>
  void ForMlaRuns(const StepBatch& b, const DeviceExperts& stored, Fn&& fn) {
    if (stored.rows == 0) {
      fn(0, b.n_tokens, nullptr);
      return;
    }
    std::vector<const TensorView*>& heads = mla_heads_;  // (a member: no allocation a step)
    heads.clear();
    for (const DeviceMatrix& m : stored.experts) heads.push_back(&m.host);
    int64_t run = 0, run_n = 0;  // the run of FP32 tokens being gathered
    for (int64_t s = 0; s < b.n_seqs; ++s) {
      const int64_t t0 = b.seq_first_token[s], n = b.seq_n_tokens[s];
      if (n != 1) {
        if (run_n == 0) run = t0;
        run_n += n;
        continue;
      }
      if (run_n > 0) fn(run, run_n, nullptr);
      run_n = 0;
      fn(t0, 1, heads.data());
    }
    if (run_n > 0) fn(run, run_n, nullptr);
  }
  void MoeRoute(const float* logits, const float* bias, int64_t T, const kernels::MoeRouting& p,
                int32_t* ids, float* w) override {
    kernels::MoeRoute(logits, bias, T, p, ids, w);
  }
  void ExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T, const int32_t* ids, int k,
                     bool x_per_slot, float* y) override {
    for (int64_t i = 0; i < T * k; ++i) {
      const DeviceMatrix& e = w.experts[ids[i]];
      if (!e.data) {  // another rank's expert
        std::fill_n(y + i * w.rows, w.rows, 0.f);
        continue;
      }
      MatMul(e, x + (x_per_slot ? i : i / k) * w.cols, 1, y + i * w.rows);
    }
  }
  void SlotSum(const float* y, const float* w, int64_t T, int k, int64_t n, float* out) override {
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        const float wj = w[t * k + j];
        const float* yj = y + (t * k + j) * n;
        for (int64_t i = 0; i < n; ++i) out[t * n + i] += wj * yj[i];
      }
  }
  void TopLogits(const float* x, int64_t n_rows, int64_t n, int k, float* val, int32_t* idx,
                 int32_t* first_bad, void*) override {
    for (int64_t r = 0; r < n_rows; ++r) {
      kernels::TopK(x + r * n, n, k, val + r * k, idx + r * k);
      first_bad[r] = static_cast<int32_t>(kernels::FindNanOrPosInf(x + r * n, n));
    }
  }
  void EditLogits(float* x, int64_t n_rows, int64_t n, const LogitEditRow* rows,
                  const LogitEdit* edits, const uint32_t* masks) override {
    for (int64_t r = 0; r < n_rows; ++r) {
      const LogitEditRow& e = rows[r];
      float* row = x + r * n;
      for (int32_t i = e.bias; i < e.ban; ++i)
        if (edits[i].id >= 0 && edits[i].id < n) row[edits[i].id] += edits[i].value;
      if (e.mask >= 0) {
        const uint32_t* m = masks + e.mask;
        for (int64_t id = 0; id < n; ++id)
          if (!(m[id / 32] >> (id % 32) & 1u)) row[id] = -std::numeric_limits<float>::infinity();
      }
      for (int32_t i = e.ban; i < e.history; ++i)
        if (edits[i].id >= 0 && edits[i].id < n)
          row[edits[i].id] = -std::numeric_limits<float>::infinity();
      for (int32_t i = e.history; i < e.end; ++i)
        if (edits[i].id >= 0 && edits[i].id < n)
          row[edits[i].id] = kernels::PenalizedLogit(row[edits[i].id], e.repetition, e.presence,
                                                     e.frequency, edits[i].value);
    }
  }
  void DrawTokens(const float* x, int64_t n_rows, int64_t n, const float* best, int best_stride,
                  const TokenDraw* draws, const DrawResults& out) override {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = x + r * n;
      const float m = best[r * best_stride], inv_t = draws[r].inv_temperature;
      const bool on = std::isfinite(m), sums = on && inv_t > 0;
      const bool draw = sums && draws[r].uniform >= 0;
      out.total[r] = sums ? kernels::TemperatureTotal(row, n, m, inv_t) : 0.0;
      out.drawn[r] = draw ? kernels::DrawInIdOrder(row, n, m, inv_t, draws[r].uniform) : -1;
      out.drawn_logit[r] = draw ? row[out.drawn[r]] : 0.f;
      out.log_total[r] =
          on && (draws[r].flags & kLogSoftmaxTotal) ? kernels::LogSoftmaxTotal(row, n, m) : 0.0;
    }
  }
  void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t n_cols,
                  float* dst) override {
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(dst + i * n_cols, src + int64_t{rows[i]} * n_cols, n_cols * sizeof(float));
  }

 private:
  static kernels::Int8Weights Int8(const DeviceMatrix& w) {
    return {static_cast<const int8_t*>(w.data), w.scales, w.rows, w.cols};
  }

  ThreadPool* pool_;
  std::set<void*> blocks_;
  std::vector<kernels::AttentionSeq> seqs_;
  std::vector<const TensorView*> mla_heads_;  // ForMlaRuns' stored per-head matrices
  std::vector<float> product_;  // MatMuls' product before its residual add
  std::vector<int8_t> act_q_;   // W8A8 activations and their scales
  std::vector<float> act_scales_;
};

}  // namespace

std::unique_ptr<Device> CreateHostDevice(ThreadPool* pool) {
  return std::make_unique<HostDevice>(pool);
}

}  // namespace peng::backend
