// MLA attention (see mla.h), in three forms:
// - absorbed, prefill chunk: each (query token, head) pair is one work item: it walks the
//   sequence's blocks in logical order, scores the block's cache rows against [q_abs | q_pe]
//   (dot products over the whole row), folds them into an online softmax (running max, running
//   sum, FP32 accumulator of latent rows rescaled when the max grows) and finally divides by the
//   sum (AttendOne);
// - absorbed, decode token: its heads are the lanes of query tiles over the same rows, its keys
//   in parts merged after (DecodeTiles);
// - expanded (long prefill chunks): a head's query tokens in tiles over its k_nope / v.
// The inner loops are the per-ISA attention primitives of ref/ops_ref.h and cpu/ops_simd.h (the
// scalar ones when no SIMD ISA is active).
#include "kernels/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "core/half.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/isa.h"
#include "kernels/attention_ops.h"
#include "kernels/ref/ops_ref.h"
#include "kernels/work_counter.h"

namespace peng::kernels {
namespace {

constexpr int kMaxBlockSize = 256;
constexpr int kMaxLatent = 4096;
constexpr int kLanes = 16;          // rows of a query tile (one a SIMD lane)
constexpr int64_t kPartKeys = 128;  // keys of a part of a decode token's attention

void CheckLayout(const KvLayerView& kv) {
  PENG_CHECK_MSG(kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kQ8_0,
                 "KV cache must be F32/F16/Q8_0");
  PENG_CHECK_MSG(kv.dtype != DType::kQ8_0 || kv.head_dim % 32 == 0,
                 "a Q8_0 KV cache needs rows of whole 32-value blocks");
  PENG_CHECK_MSG(kv.n_kv_heads == 1 && kv.v_head_dim == 0 && kv.head_dim > 0,
                 "MLA cache layer must have one kv head and no V");
  PENG_CHECK(kv.block_size > 0 && kv.block_size <= kMaxBlockSize);
}

// Element offset of (physical block, slot) in the cache of rows of kv.head_dim values.
int64_t RowOffset(const KvLayerView& kv, int64_t block, int64_t slot) {
  return (block * kv.block_size + slot) * kv.head_dim;
}

// out[0..r) = softmax-weighted sum of the latents of positions [0, pos] for query row q.
void AttendOne(const float* q, int64_t pos, const KvLayerView& kv, const int32_t* block_table,
               const MlaParams& p, const AttnOps& ops, float* out) {
  const int bs = kv.block_size;
  const int dk = kv.head_dim;
  const int r = p.kv_lora_rank;
  float scores[kMaxBlockSize];
  float acc[kMaxLatent];
  std::fill(acc, acc + r, 0.f);
  OnlineSoftmax sm;
  for (int64_t b = 0; b <= pos / bs; ++b) {
    const int64_t phys = block_table[b];
    PENG_DCHECK(phys >= 0 && phys < kv.num_blocks);
    const int64_t n = std::min(pos + 1, (b + 1) * bs) - b * bs;
    const int64_t off = RowOffset(kv, phys, 0);
    DotCacheRows(ops, kv.dtype, q, kv.k, off, dk, n, dk, scores);
    for (int64_t j = 0; j < n; ++j) scores[j] *= p.scale;
    // The values are the latent part (the first r values) of the same cache rows.
    sm.Add(ops, scores, n, kv.k, kv.dtype, off, dk, r, acc);
  }
  sm.Finish(acc, r, out);
}

}  // namespace

bool IsMlaLayout(const KvLayerView& kv, int row_dim) {
  return (kv.dtype == DType::kF32 || kv.dtype == DType::kF16 || kv.dtype == DType::kQ8_0) &&
         kv.n_kv_heads == 1 &&
         kv.v_head_dim == 0 && kv.head_dim == row_dim && kv.block_size > 0 &&
         kv.block_size <= kMaxBlockSize;
}

void MlaKvWrite(const KvLayerView& kv, const int32_t* block_table, int64_t pos, const float* row) {
  CheckLayout(kv);
  const int64_t phys = block_table[pos / kv.block_size];
  PENG_CHECK(phys >= 0 && phys < kv.num_blocks);
  const int64_t off = RowOffset(kv, phys, pos % kv.block_size);
  WriteCacheRow(SelectAttnOps(), kv.dtype, row, kv.k, off, kv.head_dim,
                RotationBlock(kv.head_dim));
}

void MlaKvRead(const KvLayerView& kv, const int32_t* block_table, int64_t pos0, int64_t n,
               float* out) {
  CheckLayout(kv);
  const AttnOps ops = SelectAttnOps();
  const int dk = kv.head_dim;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = pos0 + i;
    const int64_t phys = block_table[pos / kv.block_size];
    PENG_CHECK(phys >= 0 && phys < kv.num_blocks);
    const int64_t off = RowOffset(kv, phys, pos % kv.block_size);
    CacheRowsToF32(ops, kv.dtype, kv.k, off, dk, 1, dk, out + i * dk);
  }
  if (kv.dtype == DType::kQ8_0) ops.hadamard(out, n, dk, RotationBlock(dk));  // (rotated)
}

// Runs fn(i) for i < n_items, dealt round-robin over the pool (long causal rows at the end of
// a prefill chunk spread over all workers).
template <typename Fn>
void ForItems(ThreadPool* pool, int64_t n_items, Fn&& fn) {
  if (pool == nullptr || pool->num_threads() == 1 || n_items < 2) {
    for (int64_t i = 0; i < n_items; ++i) fn(i);
    return;
  }
  pool->Run([&](int ti, int nt) {
    for (int64_t i = ti; i < n_items; i += nt) fn(i);
  });
}

void MlaAbsorbQuery(const float* q, int64_t n_q, const float* w_kvb, const MlaParams& p, float* out,
                    ThreadPool* pool) {
  const AttnOps ops = SelectAttnOps();
  const int64_t H = p.n_heads, dn = p.d_nope, dr = p.d_rope, r = p.kv_lora_rank;
  const int64_t dqk = dn + dr, row = r + dr, head_rows = dn + p.d_v;
  WorkCounts& work = ThreadWork();  // W_UK: H x dn x r FP32, read once
  work.weight_bytes += H * dn * r * static_cast<int64_t>(sizeof(float));
  work.flops_f32 += 2 * n_q * H * dn * r;
  ForItems(pool, n_q * H, [&](int64_t i) {
    const int64_t h = i % H;
    const float* qn = q + i * dqk;
    float* o = out + i * row;
    std::fill(o, o + r, 0.f);
    ops.axpy_f32(qn, w_kvb + h * head_rows * r, r, dn, r, o);  // sum_j q_nope[j] W_UK[h][j][:]
    std::copy_n(qn + dn, dr, o + r);
  });
}

void MlaProjectOutput(const float* o_lat, int64_t n_q, const float* w_kvb, const MlaParams& p,
                      float* out, ThreadPool* pool) {
  const AttnOps ops = SelectAttnOps();
  const int64_t H = p.n_heads, dn = p.d_nope, dv = p.d_v, r = p.kv_lora_rank;
  const int64_t head_rows = dn + dv;
  WorkCounts& work = ThreadWork();  // W_UV: H x dv x r FP32, read once
  work.weight_bytes += H * dv * r * static_cast<int64_t>(sizeof(float));
  work.flops_f32 += 2 * n_q * H * dv * r;
  ForItems(pool, n_q * H, [&](int64_t i) {
    const int64_t h = i % H;
    ops.dot_f32(o_lat + i * r, w_kvb + (h * head_rows + dn) * r, r, dv, r, out + i * dv);
  });
}

void MlaAbsorbQueryHeads(const float* q, const TensorView* const* k_b, const MlaParams& p,
                         float* out, ThreadPool* pool) {
  const int64_t H = p.n_heads, dn = p.d_nope, dr = p.d_rope, row = p.kv_lora_rank + dr;
  PENG_CHECK(H <= kMaxMatMulGroup);
  MatMulOut heads[kMaxMatMulGroup];
  for (int64_t h = 0; h < H; ++h) {
    heads[h] = {k_b[h], out + h * row, q + h * (dn + dr)};
    std::copy_n(q + h * (dn + dr) + dn, dr, out + h * row + p.kv_lora_rank);
  }
  MatMulGroup(heads, static_cast<int>(H), nullptr, 1, pool);
}

void MlaProjectOutputHeads(const float* o_lat, const TensorView* const* v_b, const MlaParams& p,
                           float* out, ThreadPool* pool) {
  const int64_t H = p.n_heads;
  PENG_CHECK(H <= kMaxMatMulGroup);
  MatMulOut heads[kMaxMatMulGroup];
  for (int64_t h = 0; h < H; ++h) heads[h] = {v_b[h], out + h * p.d_v, o_lat + h * p.kv_lora_rank};
  MatMulGroup(heads, static_cast<int>(H), nullptr, 1, pool);
}

namespace {

// qt[d][lane] = q[lane * stride + d] * scale for the n rows of a query tile (d < dim), lanes
// past n zero: the transposed, pre-scaled queries the tile ops take.
void TransposeQueries(const float* q, int64_t stride, int n, int64_t dim, float scale,
                      std::vector<float>* qt) {
  qt->assign(static_cast<size_t>(dim) * kLanes, 0.f);
  for (int i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) (*qt)[d * kLanes + i] = q[i * stride + d] * scale;
}

// One decode token's attention (query rows q + h * dk at position pos, out + h * r): the heads,
// which all read the same latent rows, are the lanes of query tiles, so a key's row is read and
// widened from F16 / Q8_0 once for 16 heads, its scores for all of them are FMAs against the
// transposed, pre-scaled queries (no horizontal sums) and the softmax is lane-wise. The keys go
// in parts of kPartKeys, each with its own maximum and sum, merged in part order; a work item is
// (tile, part). The parts depend only on the position, and a lane's result does not depend on
// the other lanes of its tile, so when there are fewer items than threads the heads go in
// smaller tiles (more items, the same bits).
void DecodeTiles(const float* q, int64_t pos, const KvLayerView& kv, const int32_t* block_table,
                 const MlaParams& p, const AttnOps& ops, float* out, ThreadPool* pool) {
  const int H = p.n_heads, dk = kv.head_dim, r = p.kv_lora_rank, bs = kv.block_size;
  const int n_parts = static_cast<int>(pos / kPartKeys + 1);
  const int threads = pool ? pool->num_threads() : 1;
  int lanes = kLanes;
  while (lanes > 1 && int64_t{(H + lanes - 1) / lanes} * n_parts < threads)
    lanes = (lanes + 1) / 2;
  const int tiles = (H + lanes - 1) / lanes;
  // Each (tile, part)'s m and l (16 lanes) and acc ([r][16]), merged after when n_parts > 1.
  thread_local std::vector<float> part_buf;
  std::vector<float>& part = part_buf;
  const int64_t slot = 2 * kLanes + int64_t{r} * kLanes;
  if (n_parts > 1) part.resize(static_cast<size_t>(tiles) * n_parts * slot);
  ForItems(pool, int64_t{tiles} * n_parts, [&](int64_t item) {
    const int tile = static_cast<int>(item / n_parts), k = static_cast<int>(item % n_parts);
    const int h0 = tile * lanes, n_heads = std::min(lanes, H - h0);
    thread_local std::vector<float> qt, keys, acc_buf;
    TransposeQueries(q + int64_t{h0} * dk, dk, n_heads, dk, p.scale, &qt);
    float* shared = n_parts > 1 ? part.data() + item * slot : nullptr;  // else this item's own
    float m_own[kLanes], l_own[kLanes];
    if (shared == nullptr) acc_buf.resize(static_cast<size_t>(r) * kLanes);
    float* m = shared ? shared : m_own;
    float* l = shared ? shared + kLanes : l_own;
    float* acc = shared ? shared + 2 * kLanes : acc_buf.data();
    std::fill_n(m, kLanes, -std::numeric_limits<float>::infinity());
    std::fill_n(l, kLanes, 0.f);
    std::fill_n(acc, static_cast<size_t>(r) * kLanes, 0.f);
    keys.resize(static_cast<size_t>(bs) * dk);
    float s[kMaxBlockSize * kLanes], corr[kLanes];
    const int64_t lo = int64_t{k} * kPartKeys, hi = std::min(lo + kPartKeys - 1, pos);
    for (int64_t key0 = lo; key0 <= hi;) {
      const int64_t b = key0 / bs, first = key0 - b * bs;
      const int64_t n = std::min(hi + 1, (b + 1) * bs) - key0;
      const int64_t phys = block_table[b];
      PENG_DCHECK(phys >= 0 && phys < kv.num_blocks);
      const int64_t off = RowOffset(kv, phys, first);
      const float* rows;
      if (kv.dtype != DType::kF32) {
        CacheRowsToF32(ops, kv.dtype, kv.k, off, dk, n, dk, keys.data());
        rows = keys.data();
      } else {
        rows = static_cast<const float*>(kv.k) + off;
      }
      ops.score_tile(qt.data(), rows, dk, n, dk, s);
      ops.softmax_tile(s, n, m, l, corr);
      // The values are the latent part (the first r values) of the same rows.
      ops.accum_tile(s, rows, dk, n, r, corr, acc);
      key0 += n;
    }
    if (n_parts > 1) return;
    for (int i = 0; i < n_heads; ++i) {
      const float inv = 1.0f / l[i];
      float* o = out + int64_t{h0 + i} * r;
      for (int d = 0; d < r; ++d) o[d] = acc[d * kLanes + i] * inv;
    }
  });
  if (n_parts == 1) return;
  // Each head's parts, merged in order (MergeParts).
  ForItems(pool, H, [&](int64_t h) {
    const float* first = part.data() + h / lanes * n_parts * slot + h % lanes;
    MergeParts(n_parts, first, first + kLanes, slot, first + 2 * kLanes, slot, kLanes, r,
               out + h * r);
  });
}

// The absorbed attention of n_q queries from pos0 over the cache as it is (MlaPagedAttention).
void AttendLatents(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                   const int32_t* block_table, const MlaParams& p, const AttnOps& ops, float* out,
                   ThreadPool* pool) {
  const int dk = kv.head_dim;
  const int r = p.kv_lora_rank;
  // Per (query, key) in every head: a dk-dot for the score and an r-axpy for the latent output.
  CountAttentionWork(n_q, pos0, 0, static_cast<int64_t>(RowBytes(kv.dtype, dk)),
                     2 * int64_t{p.n_heads} * (dk + r));
  if (n_q == 1) {
    DecodeTiles(q, pos0, kv, block_table, p, ops, out, pool);
    return;
  }
  ForItems(pool, n_q * p.n_heads, [&](int64_t i) {
    const int64_t t = i / p.n_heads;
    AttendOne(q + i * dk, pos0 + t, kv, block_table, p, ops, out + i * r);
  });
}

}  // namespace

void MlaPagedAttention(const float* q, int64_t n_q, int64_t pos0, const KvLayerView& kv,
                       const int32_t* block_table, const MlaParams& p, float* out,
                       ThreadPool* pool) {
  CheckLayout(kv);
  PENG_CHECK(p.n_heads > 0 && p.kv_lora_rank > 0 && p.kv_lora_rank <= kv.head_dim &&
             p.kv_lora_rank <= kMaxLatent);
  const AttnOps ops = SelectAttnOps();
  if (kv.dtype != DType::kQ8_0) {
    AttendLatents(q, n_q, pos0, kv, block_table, p, ops, out, pool);
    return;
  }
  // The rows are rotated in runs of RotationBlock(dk) (attention_ops.h), which must not straddle
  // the latent's end: the queries are rotated alike, in a copy, and the outputs rotated back.
  const int dk = kv.head_dim;
  const int block = RotationBlock(dk);
  PENG_CHECK_MSG(p.kv_lora_rank % block == 0,
                 "a Q8_0 MLA cache needs kv_lora_rank a multiple of its rotation's runs");
  thread_local std::vector<float> q_rot;
  q_rot.assign(q, q + n_q * p.n_heads * dk);
  ops.hadamard(q_rot.data(), n_q * p.n_heads, dk, block);
  AttendLatents(q_rot.data(), n_q, pos0, kv, block_table, p, ops, out, pool);
  ops.hadamard(out, n_q * p.n_heads, p.kv_lora_rank, block);
}

// The expanded form in query tiles, as prefill's paged attention (attention.cc): the rows of one
// head -- consecutive query tokens, whose keys (k_nope of the head, k_pe shared) are the same --
// go 16 to a tile, one a SIMD lane. A chunk of keys is scored for all 16 rows by FMAs against the
// transposed, pre-scaled queries (no horizontal sums), masked per lane only where a key lies
// past some row's position, and folded into the rows' online softmax; masked keys add exact
// zeros, so a row's result does not depend on the other rows of its tile. A work item is one
// tile of one head.
constexpr int64_t kChunkKeys = 32;

void MlaExpandedAttention(const float* q, int64_t n_q, int64_t pos0, const float* kv,
                          const float* rows, const MlaParams& p, float* out, ThreadPool* pool) {
  PENG_CHECK(p.n_heads > 0 && p.d_nope > 0 && p.d_rope > 0 && p.d_v > 0 && p.d_v <= kMaxLatent);
  const AttnOps ops = SelectAttnOps();
  const int64_t H = p.n_heads, dn = p.d_nope, dr = p.d_rope, dv = p.d_v, r = p.kv_lora_rank;
  const int64_t dqk = dn + dr, row = r + dr, kv_stride = H * (dn + dv);
  // Reads every position's expanded k_nope | v (FP32) and its k_pe; per (query, key) in every
  // head a (dn + dr)-dot and a dv-axpy.
  CountAttentionWork(n_q, pos0, 0, (kv_stride + dr) * static_cast<int64_t>(sizeof(float)),
                     2 * H * (dqk + dv));
  const int64_t tiles = (n_q + kLanes - 1) / kLanes;
  ForItems(pool, H * tiles, [&](int64_t item) {
    const int64_t h = item % H, t0 = item / H * kLanes;
    const int64_t n_rows = std::min<int64_t>(kLanes, n_q - t0);
    thread_local std::vector<float> qt, acc;
    TransposeQueries(q + (t0 * H + h) * dqk, H * dqk, static_cast<int>(n_rows), dqk, p.scale,
                     &qt);
    acc.assign(static_cast<size_t>(dv) * kLanes, 0.f);
    float m[kLanes], l[kLanes], corr[kLanes], s[kChunkKeys * kLanes], pe[kChunkKeys * kLanes];
    int64_t pos[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      m[i] = -std::numeric_limits<float>::infinity();
      l[i] = 0.f;
      pos[i] = pos0 + t0 + std::min<int64_t>(i, n_rows - 1);  // padding lanes repeat the last
    }
    const float* k_nope = kv + h * (dn + dv);
    const float* v = k_nope + dn;
    for (int64_t u0 = 0; u0 <= pos[kLanes - 1]; u0 += kChunkKeys) {
      const int64_t n = std::min(kChunkKeys, pos[kLanes - 1] + 1 - u0);
      ops.score_tile(qt.data(), k_nope + u0 * kv_stride, kv_stride, n, dn, s);
      ops.score_tile(qt.data() + dn * kLanes, rows + u0 * row + r, row, n, dr, pe);
      for (int64_t i = 0; i < n * kLanes; ++i) s[i] += pe[i];
      if (u0 + n - 1 > pos[0]) {  // a key past some row's position
        for (int64_t j = 0; j < n; ++j)
          for (int i = 0; i < kLanes; ++i)
            if (u0 + j > pos[i]) s[j * kLanes + i] = -std::numeric_limits<float>::infinity();
      }
      ops.softmax_tile(s, n, m, l, corr);
      ops.accum_tile(s, v + u0 * kv_stride, kv_stride, n, dv, corr, acc.data());
    }
    for (int64_t i = 0; i < n_rows; ++i) {
      const float inv = 1.0f / l[i];
      float* o = out + ((t0 + i) * H + h) * dv;
      for (int64_t d = 0; d < dv; ++d) o[d] = acc[d * kLanes + i] * inv;
    }
  });
}

}  // namespace peng::kernels
