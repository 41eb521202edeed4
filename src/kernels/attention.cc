// Paged attention over a block-table KV cache. A work item is one query token and the heads
// that share a kv head (PagedAttentionBatch says when it is one head): it walks the sequence's
// blocks in logical order and, for each head, scores a block's keys at once (vectorised dot
// products over head_dim) and folds the block into that head's online softmax (running max m,
// running sum l, FP32 accumulator of V rows rescaled by exp(m_old - m_new) when the max grows).
// The inner loops are the per-ISA primitives of ref/ops_ref.h and cpu/ops_simd.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/attention_ops.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/work_counter.h"

namespace peng::kernels {
namespace {

constexpr int kMaxBlockSize = 256;
constexpr int kMaxVHeadDim = 2048;

#define PENG_ATTN_OPS_(ns)                                                                 \
  AttnOps {                                                                                \
    ns::DotRowsF32, ns::DotRowsF16, ns::AxpyRowsF32, ns::AxpyRowsF16, ns::ExpShiftSum,     \
        ns::ScaleInPlace, ns::F32ToF16Row                                                  \
  }

}  // namespace

AttnOps SelectAttnOps() {
  switch (ActiveIsa()) {
#if defined(__x86_64__)
    case Isa::kAvx512: return PENG_ATTN_OPS_(avx512);
    case Isa::kAvx2: return PENG_ATTN_OPS_(avx2);
#endif
#if defined(__aarch64__)
    // The attention loops are FP32 / F16 FMAs: plain NEON at every ARM64 level.
    case Isa::kNeon:
    case Isa::kNeonDot:
    case Isa::kNeonI8mm: return PENG_ATTN_OPS_(neon);
#endif
    default: return PENG_ATTN_OPS_(ref);
  }
}
#undef PENG_ATTN_OPS_

namespace {

int VHeadDim(const KvLayerView& kv) { return kv.v_head_dim > 0 ? kv.v_head_dim : kv.head_dim; }

// Offset in elements of (physical block, slot, kv head) in a cache of rows of `dim` values.
int64_t CacheOffset(const KvLayerView& kv, int64_t block, int64_t slot, int64_t head, int dim) {
  return ((block * kv.block_size + slot) * kv.n_kv_heads + head) * dim;
}

// out + h * out_stride = attention of query q + h * q_stride (at position pos) over keys
// [lo, pos] of kv head kvh, for h < n_heads (heads that share kv head kvh): each block's keys
// and values are read from memory once for all of them.
void AttendHeads(const float* q, int64_t q_stride, int n_heads, int64_t pos, int kvh,
                 const KvLayerView& kv, const int32_t* block_table, const AttentionParams& p,
                 const AttnOps& ops, float* out, int64_t out_stride) {
  const int bs = kv.block_size;
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
  const int64_t k_stride = static_cast<int64_t>(kv.n_kv_heads) * dk;
  const int64_t v_stride = static_cast<int64_t>(kv.n_kv_heads) * dv;
  thread_local std::vector<float> acc_buf;
  thread_local std::vector<OnlineSoftmax> sms;
  acc_buf.assign(static_cast<size_t>(n_heads) * dv, 0.f);
  sms.assign(n_heads, OnlineSoftmax{});
  float scores[kMaxBlockSize];
  for (int64_t b = lo / bs; b <= pos / bs; ++b) {
    const int64_t phys = block_table[b];
    PENG_DCHECK(phys >= 0 && phys < kv.num_blocks);
    const int64_t first = std::max(lo, b * bs) - b * bs;      // slots [first, last) of block b
    const int64_t last = std::min(pos + 1, (b + 1) * bs) - b * bs;
    const int64_t n = last - first;
    const int64_t k_off = CacheOffset(kv, phys, first, kvh, dk);
    const int64_t v_off = CacheOffset(kv, phys, first, kvh, dv);
    const void* values = kv.dtype == DType::kF16
                             ? static_cast<const void*>(static_cast<const uint16_t*>(kv.v) + v_off)
                             : static_cast<const void*>(static_cast<const float*>(kv.v) + v_off);
    for (int h = 0; h < n_heads; ++h) {
      if (kv.dtype == DType::kF16) {
        ops.dot_f16(q + h * q_stride, static_cast<const uint16_t*>(kv.k) + k_off, k_stride, n, dk,
                    scores);
      } else {
        ops.dot_f32(q + h * q_stride, static_cast<const float*>(kv.k) + k_off, k_stride, n, dk,
                    scores);
      }
      for (int64_t j = 0; j < n; ++j) {
        float s = scores[j] * p.scale;
        if (p.softcap > 0.f) s = p.softcap * std::tanh(s / p.softcap);
        scores[j] = s;
      }
      sms[h].Add(ops, scores, n, values, kv.dtype, v_stride, dv, acc_buf.data() + h * dv);
    }
  }
  for (int h = 0; h < n_heads; ++h)
    sms[h].Finish(acc_buf.data() + h * dv, dv, out + h * out_stride);
}

void CheckLayout(const KvLayerView& kv) {
  PENG_CHECK_MSG(kv.dtype == DType::kF32 || kv.dtype == DType::kF16, "KV cache must be F32/F16");
  PENG_CHECK(kv.block_size > 0 && kv.block_size <= kMaxBlockSize);
  PENG_CHECK(kv.n_kv_heads > 0 && kv.head_dim > 0 && VHeadDim(kv) <= kMaxVHeadDim);
}

}  // namespace

void KvWrite(const KvLayerView& kv, const int32_t* block_table, int64_t pos, const float* k,
             const float* v) {
  CheckLayout(kv);
  const int64_t phys = block_table[pos / kv.block_size];
  PENG_CHECK(phys >= 0 && phys < kv.num_blocks);
  const int64_t slot = pos % kv.block_size;
  const int dv = VHeadDim(kv);
  // All kv heads of one token are contiguous: one row of n_kv_heads * dim values.
  const int64_t nk = static_cast<int64_t>(kv.n_kv_heads) * kv.head_dim;
  const int64_t nv = static_cast<int64_t>(kv.n_kv_heads) * dv;
  const int64_t k_off = CacheOffset(kv, phys, slot, 0, kv.head_dim);
  const int64_t v_off = CacheOffset(kv, phys, slot, 0, dv);
  if (kv.dtype == DType::kF16) {
    const AttnOps ops = SelectAttnOps();
    ops.to_f16(k, static_cast<uint16_t*>(kv.k) + k_off, nk);
    ops.to_f16(v, static_cast<uint16_t*>(kv.v) + v_off, nv);
  } else {
    std::memcpy(static_cast<float*>(kv.k) + k_off, k, nk * sizeof(float));
    std::memcpy(static_cast<float*>(kv.v) + v_off, v, nv * sizeof(float));
  }
}

void PagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                    const int32_t* block_table, const AttentionParams& p, float* out,
                    ThreadPool* pool) {
  const AttentionSeq seq{q, n_q, pos0, block_table, out};
  PagedAttentionBatch(&seq, 1, kv, p, pool);
}

void PagedAttentionBatch(const AttentionSeq* seqs, int64_t n_seqs, const KvLayerView& kv,
                         const AttentionParams& p, ThreadPool* pool) {
  CheckLayout(kv);
  PENG_CHECK(p.n_heads > 0 && p.n_heads % kv.n_kv_heads == 0);
  const AttnOps ops = SelectAttnOps();
  const int group = p.n_heads / kv.n_kv_heads;
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  int64_t n_rows = 0;  // query tokens
  for (int64_t s = 0; s < n_seqs; ++s) {
    n_rows += seqs[s].n_q;
    // Per (query, key): a dk-dot for the score and a dv-axpy for the output, in every head.
    CountAttentionWork(seqs[s].n_q, seqs[s].pos0, p.sliding_window,
                       static_cast<int64_t>(RowBytes(kv.dtype, int64_t{kv.n_kv_heads} * (dk + dv))),
                       2 * int64_t{p.n_heads} * (dk + dv));
  }
  // A work item is one query token and the heads of one kv head (their keys and values are read
  // from memory once) -- or a single head when that leaves fewer than 4 items a thread (one
  // decode token of a model with few kv heads still spreads over every thread).
  const int threads = pool ? pool->num_threads() : 1;
  const int per_item = n_rows * kv.n_kv_heads >= 4 * threads ? group : 1;
  const int items_per_row = p.n_heads / per_item;
  const int64_t n_items = n_rows * items_per_row;
  // Item i of sequence s = (token i / items_per_row, heads from (i % items_per_row) * per_item).
  // A prefill chunk's items are dealt round-robin, so that its long rows (the last tokens see
  // the most keys) spread over all workers. Decode items (one token a sequence, similar costs)
  // go in contiguous ranges instead: thread k then attends for the tokens whose RoPE and cache
  // rows it has just written (the model's per-token step splits tokens the same way,
  // ThreadPool::ParallelFor), so their queries and new keys are in its own cache, not the
  // other core's.
  bool decode = true;
  for (int64_t s = 0; s < n_seqs; ++s) decode = decode && seqs[s].n_q == 1;
  auto run = [&](int64_t begin, int64_t end, int64_t step) {
    int64_t s = 0, s_first = 0;  // sequence of item i and its first item
    for (int64_t i = begin; i < end; i += step) {
      while (i >= s_first + seqs[s].n_q * items_per_row) s_first += seqs[s++].n_q * items_per_row;
      const AttentionSeq& sq = seqs[s];
      const int64_t t = (i - s_first) / items_per_row;
      const int h = static_cast<int>((i - s_first) % items_per_row) * per_item;
      AttendHeads(sq.q + (t * p.n_heads + h) * dk, dk, per_item, sq.pos0 + t, h / group, kv,
                  sq.block_table, p, ops, sq.out + (t * p.n_heads + h) * dv, dv);
    }
  };
  if (pool == nullptr || pool->num_threads() == 1 || n_items <= 1) {
    run(0, n_items, 1);
  } else if (decode) {  // the same split of the tokens as the per-token step's ParallelFor
    pool->ParallelFor(n_rows, [&](int64_t b, int64_t e) {
      run(b * items_per_row, e * items_per_row, 1);
    });
  } else {
    pool->Run([&](int ti, int nt) { run(ti, n_items, nt); });
  }
}

}  // namespace peng::kernels
