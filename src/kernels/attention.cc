// Paged attention over a block-table KV cache, walking a sequence's blocks in logical order
// (ForBlocks), in two forms:
// - decode (one query token a sequence): a work item is the token, a part of up to kPartKeys of
//   its keys and the heads that share a kv head (or one head, PagedAttentionBatch says when);
//   two passes over the part's blocks -- every score (vectorised dot products over head_dim),
//   one maximum and sum a head over the whole part, then the value rows weighted by it --
//   AttendHeadsPart; the parts of a longer context are merged in order after;
// - prefill chunks: the (token, head) rows of a kv head go 16 to a tile, one row a SIMD lane,
//   so a block's keys are scored for all 16 rows by FMAs against the transposed queries and
//   folded into the rows' online softmax (running max m, running sum l, FP32 accumulator of V
//   rows rescaled by exp(m_old - m_new) when the max grows); each block's keys and values are
//   widened from F16 / Q8_0 once for up to four tiles -- AttendTiles.
// The cache is F32, F16 or Q8_0 (attention_ops.h: DotCacheRows and the other row helpers).
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
    ns::DotRowsF32, ns::DotRowsF16, ns::AxpyRowsF32, ns::AxpyRowsF16, ns::DotRowsQ8_0,     \
        ns::AxpyRowsQ8_0, ns::ExpShiftSum, ns::ScaleInPlace, ns::F32ToF16Row,              \
        ns::F16ToF32Row, ns::Q8_0ToF32Row, ns::HadamardRows, ns::ScoreTile16,              \
        ns::SoftmaxTile16, ns::AccumTile16                                                 \
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

// Calls f(physical block, first slot, position of that slot's key, key count) for the blocks
// holding keys [lo, hi] of a sequence, in order.
template <class F>
void ForBlocks(const KvLayerView& kv, const int32_t* block_table, int64_t lo, int64_t hi, F&& f) {
  const int bs = kv.block_size;
  for (int64_t b = lo / bs; b <= hi / bs; ++b) {
    const int64_t phys = block_table[b];
    PENG_DCHECK(phys >= 0 && phys < kv.num_blocks);
    const int64_t first = std::max(lo, b * bs) - b * bs;  // slots [first, last) of block b
    const int64_t last = std::min(hi + 1, (b + 1) * bs) - b * bs;
    f(phys, first, b * bs + first, last - first);
  }
}

// Keys a part of a decode token's attention at most: a longer context is attended in parts of
// kPartKeys keys (from the first key it sees), each part one work item with its own maximum and
// sum, merged in part order after the parallel region. The parts depend on nothing but the
// context's length, so a token's result is the same bits alone, in any batch and on any number
// of threads; contexts of up to kPartKeys keys are one part, attended as a whole.
constexpr int64_t kPartKeys = 256;

// Attention of query q + h * q_stride over keys [key_lo, key_hi] of kv head kvh, for h <
// n_heads (heads that share kv head kvh): each block's keys and values are read from memory once
// for all of them. Two passes over the blocks (one query row's scores fit any cache): every
// score first, then one maximum m[h] and sum l[h] = sum_j exp(s_j - m[h]) a head over the whole
// range, then the value rows weighted by exp(s_j - m[h]) into acc + h * dv (unnormalized) -- no
// per-block maximum, rescaling or call overhead.
void AttendHeadsPart(const float* q, int64_t q_stride, int n_heads, int64_t key_lo,
                     int64_t key_hi, int kvh, const KvLayerView& kv, const int32_t* block_table,
                     const AttentionParams& p, const AttnOps& ops, float* acc, float* m,
                     float* l) {
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  const int64_t len = key_hi - key_lo + 1;
  const int64_t k_stride = static_cast<int64_t>(kv.n_kv_heads) * dk;
  const int64_t v_stride = static_cast<int64_t>(kv.n_kv_heads) * dv;
  thread_local std::vector<float> scores;
  std::fill_n(acc, static_cast<size_t>(n_heads) * dv, 0.f);
  scores.resize(static_cast<size_t>(n_heads) * len);
  ForBlocks(kv, block_table, key_lo, key_hi,
            [&](int64_t phys, int64_t first, int64_t key, int64_t n) {
    const int64_t off = CacheOffset(kv, phys, first, kvh, dk);
    for (int h = 0; h < n_heads; ++h) {
      DotCacheRows(ops, kv.dtype, q + h * q_stride, kv.k, off, k_stride, n, dk,
                   scores.data() + h * len + (key - key_lo));
    }
  });
  for (int h = 0; h < n_heads; ++h) {
    float* s = scores.data() + h * len;
    ops.scale(s, p.scale, len);
    if (p.softcap > 0.f) {
      for (int64_t j = 0; j < len; ++j) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
    }
    m[h] = s[0];
    for (int64_t j = 1; j < len; ++j) m[h] = std::max(m[h], s[j]);
    l[h] = ops.exp_shift_sum(s, len, m[h]);
  }
  ForBlocks(kv, block_table, key_lo, key_hi,
            [&](int64_t phys, int64_t first, int64_t key, int64_t n) {
    const int64_t off = CacheOffset(kv, phys, first, kvh, dv);
    for (int h = 0; h < n_heads; ++h) {
      AxpyCacheRows(ops, kv.dtype, scores.data() + h * len + (key - key_lo), kv.v, off, v_stride,
                    n, dv, acc + h * dv);
    }
  });
}

// out + h * out_stride = attention of query q + h * q_stride (at position pos) over keys
// [lo, pos] of kv head kvh, for h < n_heads: AttendHeadsPart over all of them, normalized.
void AttendHeads(const float* q, int64_t q_stride, int n_heads, int64_t pos, int kvh,
                 const KvLayerView& kv, const int32_t* block_table, const AttentionParams& p,
                 const AttnOps& ops, float* out, int64_t out_stride) {
  const int dv = VHeadDim(kv);
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
  thread_local std::vector<float> acc, m, l;
  acc.resize(static_cast<size_t>(n_heads) * dv);
  m.resize(n_heads);
  l.resize(n_heads);
  AttendHeadsPart(q, q_stride, n_heads, lo, pos, kvh, kv, block_table, p, ops, acc.data(),
                  m.data(), l.data());
  for (int h = 0; h < n_heads; ++h) {
    const float* a = acc.data() + h * dv;
    const float inv = 1.0f / l[h];
    float* o = out + h * out_stride;
    for (int d = 0; d < dv; ++d) o[d] = a[d] * inv;
  }
}

// Prefill (a sequence with several query tokens). The rows of one kv head -- its (token, head)
// pairs, token-major: row r is token r / group, head kvh * group + r % group -- go 16 to a
// tile, one a lane (kernels/cpu/attn_tile.h). AttendTiles attends rows [row0, row_end) of
// sequence sq, at most kTilesPerItem tiles: it converts each block's keys and values once for
// all its tiles, and each tile scores the block's keys for its 16 rows at once (queries
// transposed, pre-scaled), masks per lane (causal, sliding window) only in the blocks where a
// key falls outside some row's range, and folds the block into its rows' online softmax.
// Masked keys add exact zeros, so a row's result does not depend on the other rows of its
// tile.
constexpr int kLanes = 16;
constexpr int kTilesPerItem = 4;

void AttendTiles(const AttentionSeq& sq, int64_t row0, int64_t row_end, int kvh, int group,
                 const KvLayerView& kv, const AttentionParams& p, const AttnOps& ops) {
  const int bs = kv.block_size;
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  const int64_t n_rows = row_end - row0;
  const int n_tiles = static_cast<int>((n_rows + kLanes - 1) / kLanes);
  PENG_DCHECK(n_tiles >= 1 && n_tiles <= kTilesPerItem);
  thread_local std::vector<float> qt, acc, m, l, k_f32, v_f32;
  qt.assign(static_cast<size_t>(n_tiles) * dk * kLanes, 0.f);
  acc.assign(static_cast<size_t>(n_tiles) * dv * kLanes, 0.f);
  m.assign(static_cast<size_t>(n_tiles) * kLanes, -std::numeric_limits<float>::infinity());
  l.assign(static_cast<size_t>(n_tiles) * kLanes, 0.f);
  int64_t pos[kTilesPerItem * kLanes], lo[kTilesPerItem * kLanes];
  for (int64_t i = 0; i < n_tiles * kLanes; ++i) {
    const int64_t r = row0 + std::min(i, n_rows - 1);  // padding lanes repeat the last row
    const int64_t t = r / group;
    pos[i] = sq.pos0 + t;
    lo[i] = p.sliding_window > 0 ? std::max<int64_t>(0, pos[i] - p.sliding_window + 1) : 0;
    if (i >= n_rows) continue;  // padding lanes keep zero queries
    const float* q = sq.q + (t * p.n_heads + kvh * group + r % group) * dk;
    float* col = qt.data() + (i / kLanes) * dk * kLanes + i % kLanes;
    for (int d = 0; d < dk; ++d) col[d * kLanes] = q[d] * p.scale;
  }
  const int64_t k_stride = static_cast<int64_t>(kv.n_kv_heads) * dk;
  const int64_t v_stride = static_cast<int64_t>(kv.n_kv_heads) * dv;
  k_f32.resize(static_cast<size_t>(bs) * dk);
  v_f32.resize(static_cast<size_t>(bs) * dv);
  float s[kMaxBlockSize * kLanes], corr[kLanes];
  const int64_t key_lo = lo[0], key_hi = pos[n_tiles * kLanes - 1];  // keys [key_lo, key_hi]
  ForBlocks(kv, sq.block_table, key_lo, key_hi, [&](int64_t phys, int64_t first, int64_t key0,
                                                     int64_t n_keys) {
    const float* keys;
    const float* values;
    int64_t ks = k_stride, vs = v_stride;
    if (kv.dtype != DType::kF32) {  // widened once for all the item's tiles
      CacheRowsToF32(ops, kv.dtype, kv.k, CacheOffset(kv, phys, first, kvh, dk), k_stride, n_keys,
                     dk, k_f32.data());
      CacheRowsToF32(ops, kv.dtype, kv.v, CacheOffset(kv, phys, first, kvh, dv), v_stride, n_keys,
                     dv, v_f32.data());
      keys = k_f32.data();
      values = v_f32.data();
      ks = dk;
      vs = dv;
    } else {
      keys = static_cast<const float*>(kv.k) + CacheOffset(kv, phys, first, kvh, dk);
      values = static_cast<const float*>(kv.v) + CacheOffset(kv, phys, first, kvh, dv);
    }
    for (int tile = 0; tile < n_tiles; ++tile) {
      const int64_t* tpos = pos + tile * kLanes;
      const int64_t* tlo = lo + tile * kLanes;
      // The block's keys that some row of the tile sees: [key0 + j0, key0 + j1).
      const int64_t j0 = std::max<int64_t>(0, tlo[0] - key0);
      const int64_t j1 = std::min(n_keys, tpos[kLanes - 1] + 1 - key0);
      if (j1 <= j0) continue;
      const int64_t n = j1 - j0;
      ops.score_tile(qt.data() + tile * dk * kLanes, keys + j0 * ks, ks, n, dk, s);
      if (p.softcap > 0.f) {
        for (int64_t i = 0; i < n * kLanes; ++i) s[i] = p.softcap * std::tanh(s[i] / p.softcap);
      }
      if (key0 + j1 - 1 > tpos[0] || key0 + j0 < tlo[kLanes - 1]) {
        const float ninf = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const int64_t key = key0 + j0 + j;
          for (int i = 0; i < kLanes; ++i)
            if (key > tpos[i] || key < tlo[i]) s[j * kLanes + i] = ninf;
        }
      }
      ops.softmax_tile(s, n, m.data() + tile * kLanes, l.data() + tile * kLanes, corr);
      ops.accum_tile(s, values + j0 * vs, vs, n, dv, corr, acc.data() + tile * dv * kLanes);
    }
  });
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t r = row0 + i;
    const float inv = 1.0f / l[i];
    const float* col = acc.data() + (i / kLanes) * dv * kLanes + i % kLanes;
    float* o = sq.out + ((r / group) * p.n_heads + kvh * group + r % group) * dv;
    for (int d = 0; d < dv; ++d) o[d] = col[d * kLanes] * inv;
  }
}

void CheckLayout(const KvLayerView& kv) {
  PENG_CHECK_MSG(kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kQ8_0,
                 "KV cache must be F32/F16/Q8_0");
  PENG_CHECK(kv.block_size > 0 && kv.block_size <= kMaxBlockSize);
  PENG_CHECK(kv.n_kv_heads > 0 && kv.head_dim > 0 && VHeadDim(kv) <= kMaxVHeadDim);
  PENG_CHECK_MSG(kv.dtype != DType::kQ8_0 || (kv.head_dim % 32 == 0 && VHeadDim(kv) % 32 == 0),
                 "a Q8_0 KV cache needs head dimensions that are multiples of 32");
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
  const AttnOps ops = SelectAttnOps();
  WriteCacheRow(ops, kv.dtype, k, kv.k, k_off, nk, RotationBlock(kv.head_dim));
  WriteCacheRow(ops, kv.dtype, v, kv.v, v_off, nv, RotationBlock(dv));
}

void PagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                    const int32_t* block_table, const AttentionParams& p, float* out,
                    ThreadPool* pool) {
  const AttentionSeq seq{q, n_q, pos0, block_table, out};
  PagedAttentionBatch(&seq, 1, kv, p, pool);
}

namespace {

void AttendBatch(const AttentionSeq* seqs, int64_t n_seqs, const KvLayerView& kv,
                 const AttentionParams& p, ThreadPool* pool) {
  PENG_CHECK(p.n_heads > 0 && p.n_heads % kv.n_kv_heads == 0);
  const AttnOps ops = SelectAttnOps();
  const int group = p.n_heads / kv.n_kv_heads;
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  for (int64_t s = 0; s < n_seqs; ++s) {
    // Per (query, key): a dk-dot for the score and a dv-axpy for the output, in every head.
    CountAttentionWork(seqs[s].n_q, seqs[s].pos0, p.sliding_window,
                       static_cast<int64_t>(RowBytes(kv.dtype, int64_t{kv.n_kv_heads} * (dk + dv))),
                       2 * int64_t{p.n_heads} * (dk + dv));
  }
  // Work items, in order of sequence:
  // - a prefill chunk (n_q > 1): its rows in items of up to kTilesPerItem tiles a kv head
  //   (AttendTiles);
  // - a decode token (n_q == 1): one part of its keys (kPartKeys) and the heads of one kv head
  //   (each block's keys and values are read from memory once for them), in order of heads,
  //   part -- or a single head when the step is all decode tokens and the heads of a kv head
  //   would leave fewer than 4 items a thread (one decode token of a model with few kv heads and
  //   a short context still spreads over every thread). A token of one part writes its output;
  //   the parts of a longer context write their heads' sums to part_* and are merged after.
  // The calling thread's lists, kept between layers; the workers reach them through these
  // references (a thread_local named in the lambda would be each worker's own).
  struct Item {
    int64_t seq;
    int64_t row0;  // prefill: the item's first row; decode: its part
    int h0;        // prefill: the kv head; decode: the first head
    int n_parts;   // decode: the token's parts
    int64_t slot;  // decode of several parts: the token's first (part, head) slot in part_*
  };
  struct SplitToken {  // a decode token of several parts
    int64_t seq;
    int n_parts;
    int64_t slot;
  };
  thread_local std::vector<Item> items_buf;
  thread_local std::vector<SplitToken> split_buf;
  thread_local std::vector<float> part_acc_buf, part_m_buf, part_l_buf;
  std::vector<Item>& items = items_buf;
  std::vector<SplitToken>& split = split_buf;
  std::vector<float>& part_acc = part_acc_buf;
  std::vector<float>& part_m = part_m_buf;
  std::vector<float>& part_l = part_l_buf;
  const int threads = pool ? pool->num_threads() : 1;
  auto key_lo = [&](const AttentionSeq& sq) {
    return p.sliding_window > 0 ? std::max<int64_t>(0, sq.pos0 - p.sliding_window + 1) : 0;
  };
  auto parts_of = [&](const AttentionSeq& sq) {
    return static_cast<int>((sq.pos0 - key_lo(sq) + kPartKeys) / kPartKeys);
  };
  bool decode = true;
  int64_t units = 0;  // decode tokens' (token, kv head, part)s
  for (int64_t s = 0; s < n_seqs; ++s) {
    decode = decode && seqs[s].n_q == 1;
    if (seqs[s].n_q == 1) units += int64_t{parts_of(seqs[s])} * kv.n_kv_heads;
  }
  const int per_item = !decode || units >= 4 * threads ? group : 1;
  items.clear();
  split.clear();
  int64_t slots = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const AttentionSeq& sq = seqs[s];
    if (sq.n_q > 1) {
      for (int kvh = 0; kvh < kv.n_kv_heads; ++kvh)
        for (int64_t r = 0; r < sq.n_q * group; r += kTilesPerItem * kLanes)
          items.push_back({s, r, kvh, 0, 0});
      continue;
    }
    const int n_parts = parts_of(sq);
    for (int h0 = 0; h0 < p.n_heads; h0 += per_item)
      for (int part = 0; part < n_parts; ++part) items.push_back({s, part, h0, n_parts, slots});
    if (n_parts > 1) {
      split.push_back({s, n_parts, slots});
      slots += int64_t{n_parts} * p.n_heads;
    }
  }
  part_acc.resize(slots * dv);
  part_m.resize(slots);
  part_l.resize(slots);
  auto attend = [&](const Item& it) {
    const AttentionSeq& sq = seqs[it.seq];
    if (sq.n_q > 1) {
      const int64_t end = std::min(sq.n_q * group, it.row0 + kTilesPerItem * kLanes);
      AttendTiles(sq, it.row0, end, it.h0, group, kv, p, ops);
    } else if (it.n_parts == 1) {
      AttendHeads(sq.q + it.h0 * dk, dk, per_item, sq.pos0, it.h0 / group, kv, sq.block_table, p,
                  ops, sq.out + it.h0 * dv, dv);
    } else {
      const int64_t lo = key_lo(sq) + it.row0 * kPartKeys;
      const int64_t hi = std::min(lo + kPartKeys - 1, sq.pos0);
      const int64_t at = it.slot + it.row0 * p.n_heads + it.h0;
      AttendHeadsPart(sq.q + it.h0 * dk, dk, per_item, lo, hi, it.h0 / group, kv,
                      sq.block_table, p, ops, part_acc.data() + at * dv, part_m.data() + at,
                      part_l.data() + at);
    }
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (pool == nullptr || pool->num_threads() == 1 || n_items <= 1) {
    for (const Item& it : items) attend(it);
  } else if (!decode) {
    // Dealt round-robin, so that a chunk's long rows (its last tokens see the most keys) spread
    // over all workers.
    pool->Run([&](int ti, int nt) {
      for (int64_t i = ti; i < n_items; i += nt) attend(items[i]);
    });
  } else {
    // Contiguous ranges: thread k attends for the tokens whose RoPE and cache rows it has just
    // written (the model's per-token step splits tokens the same way, ThreadPool::ParallelFor),
    // so their queries and new keys are in its own cache, not the other core's.
    pool->ParallelFor(n_items, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) attend(items[i]);
    });
  }
  if (slots == 0) return;
  // The split tokens' heads, their parts merged in order (MergeParts).
  auto merge = [&](int64_t begin, int64_t end) {  // (split token, head) pairs
    for (int64_t j = begin; j < end; ++j) {
      const SplitToken& t = split[j / p.n_heads];
      const int h = static_cast<int>(j % p.n_heads);
      const int64_t first = t.slot + h;  // part k's slot: first + k * n_heads
      MergeParts(t.n_parts, part_m.data() + first, part_l.data() + first, p.n_heads,
                 part_acc.data() + first * dv, int64_t{p.n_heads} * dv, 1, dv,
                 seqs[t.seq].out + h * dv);
    }
  };
  const int64_t pairs = static_cast<int64_t>(split.size()) * p.n_heads;
  if (pool == nullptr || pool->num_threads() == 1 || slots * dv < (int64_t{1} << 15)) {
    merge(0, pairs);
  } else {
    pool->ParallelFor(pairs, merge);
  }
}

}  // namespace

void PagedAttentionBatch(const AttentionSeq* seqs, int64_t n_seqs, const KvLayerView& kv,
                         const AttentionParams& p, ThreadPool* pool) {
  CheckLayout(kv);
  if (kv.dtype != DType::kQ8_0) {
    AttendBatch(seqs, n_seqs, kv, p, pool);
    return;
  }
  // A Q8_0 cache's rows are rotated (RotationBlock): the queries are rotated alike, in a copy,
  // and the outputs rotated back.
  const int dk = kv.head_dim;
  const int dv = VHeadDim(kv);
  thread_local std::vector<float> q_rot;
  thread_local std::vector<AttentionSeq> rot_seqs;
  int64_t rows = 0;
  for (int64_t s = 0; s < n_seqs; ++s) rows += seqs[s].n_q * p.n_heads;
  q_rot.resize(static_cast<size_t>(rows) * dk);
  rot_seqs.assign(seqs, seqs + n_seqs);
  float* q = q_rot.data();
  for (AttentionSeq& sq : rot_seqs) {
    const int64_t n = sq.n_q * p.n_heads * dk;
    std::copy_n(sq.q, n, q);
    sq.q = q;
    q += n;
  }
  const AttnOps ops = SelectAttnOps();
  ops.hadamard(q_rot.data(), rows, dk, RotationBlock(dk));
  AttendBatch(rot_seqs.data(), n_seqs, kv, p, pool);
  for (int64_t s = 0; s < n_seqs; ++s)
    ops.hadamard(seqs[s].out, seqs[s].n_q * p.n_heads, dv, RotationBlock(dv));
}

}  // namespace peng::kernels
