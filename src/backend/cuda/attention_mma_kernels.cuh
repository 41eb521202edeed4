// The tiled attention of prompts on the tensor cores (included by cuda_device.cu after
// attention_kernels.cuh, whose tiles' rows, cache types and rotations they share):
// AttentionMmaKernel (heads of one size up to 128 over an F16 or Q8_0 cache) and
// AttentionMmaWideKernel (MLA's latent rows, heads of up to 256), both multiplying with MmaF16
// (runtime.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/attention_kernels.cuh"

namespace peng::backend::cuda {
namespace {

// Two FP16 values at p (4-byte aligned) as one register.
__device__ __forceinline__ uint32_t SharedPair(const uint16_t* p) {
#if defined(PENG_CUDA_EMULATOR)
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#else
  return *reinterpret_cast<const uint32_t*>(p);
#endif
}

// The tiled attention on the tensor cores (AttentionMmaKernel, AttentionMmaWideKernel, and the
// helpers they share): a warp takes 16 query rows in MmaF16's layout.
constexpr int kMmaRows = 16 * kAttnWarps;  // AttentionMmaKernel's rows a block

// A warp's 16 rows' online softmax over a chunk of keys j0 .. j0 + nk - 1, in MmaF16's
// accumulator layout: the lane's rows r[0], r[1] and its columns c, c + 1 of each 8 keys, sc[n]
// holding the scores of keys 8 n + c (+1) of row r[0] in [0..1], of r[1] in [2..3]. Masks
// (rows.Sees) and soft-caps them, updates the rows' maxima m and the lane's part of their sums l
// (each row's 4 lanes hold parts of its sum), returns the factors the output is to be scaled by
// (corr) and the weights rounded to FP16 (l adds the rounded ones) as the A fragments of the
// next product, 16 keys each: the accumulator's layout of two n tiles is that of an A fragment.
template <int kNt, int kRows>
__device__ __forceinline__ void MmaChunkWeights(const TileRows<kRows>& rows, const int (&r)[2],
                                                int c, int64_t j0, int nk, float softcap,
                                                float (&sc)[kNt][4], float (&m)[2],
                                                float (&l)[2], float (&corr)[2],
                                                uint32_t (&pa)[kNt / 2][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kNt; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = r[e / 2], j = n * 8 + c + e % 2;
      float v = -INFINITY;
      if (j < nk && rows.Sees(i, j0 + j)) {
        v = sc[n][e];
        if (softcap > 0.f) v = softcap * tanhf(v / softcap);
      }
      sc[n][e] = v;
      mx[e / 2] = fmaxf(mx[e / 2], v);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // (each row's maximum over its 4 lanes)
    const float m_new = fmaxf(m[h], WarpButterfly<2>(mx[h], MaxOp{}));
    corr[h] = m_new == -INFINITY ? 1.f : expf(m[h] - m_new);  // (0 for the row's first keys)
    m[h] = m_new;
    l[h] *= corr[h];
  }
#pragma unroll
  for (int kk = 0; kk < kNt / 2; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // (pa[kk][e]: row r[e % 2], keys 16 kk + c (+8 from e = 2))
      const int h = e % 2;
      const float s0 = sc[2 * kk + e / 2][2 * h], s1 = sc[2 * kk + e / 2][2 * h + 1];
      pa[kk][e] = m[h] == -INFINITY ? 0u : HalfPair(expf(s0 - m[h]), expf(s1 - m[h]));
      l[h] += HalfOfPair(pa[kk][e], 0) + HalfOfPair(pa[kk][e], 1);
    }
  }
}

// A lane's part of a warp's 16 rows in MmaF16's layout: its rows r[0] and r[1] = r[0] + 8 (of
// the block's), its columns c and c + 1 of each 8, and the keys the warp's rows see, [kmin,
// kmax] (kmax -1: none).
struct MmaLane {
  int r[2];
  int c;
  int64_t kmin, kmax;
};

template <int kRows>
__device__ __forceinline__ MmaLane MmaLaneOf(const TileRows<kRows>& rows, int first_row) {
  const int lane = threadIdx.x % kWarp;
  MmaLane ln{{first_row + lane / 4, first_row + lane / 4 + 8}, 2 * (lane % 4), 0, 0};
  rows.Keys(first_row, first_row + 16, &ln.kmin, &ln.kmax);
  return ln;
}

// Whether the chunk of keys j0 .. j0 + nk - 1 holds one the lane's warp's rows see.
__device__ __forceinline__ bool MmaSees(const MmaLane& ln, int64_t j0, int nk) {
  return j0 <= ln.kmax && j0 + nk - 1 >= ln.kmin;
}

// The lane's A fragments of its rows' queries over values d0 + 16 kk .. d0 + 16 kk + 15 (zero
// past head_dim and in rows that are none), scaled by a.scale, then rounded to FP16. The rows
// are a.q's, or row i at staged + (i - row0) * stride where staged is set.
template <int kSteps, int kRows>
__device__ __forceinline__ void MmaQueries(const AttnArgs& a, const TileRows<kRows>& rows,
                                           const MmaLane& ln, int d0, uint32_t (&qa)[kSteps][4],
                                           const float* staged = nullptr, int stride = 0,
                                           int row0 = 0) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = ln.r[e % 2], d = d0 + kk * 16 + ln.c + (e / 2) * 8;
      const int64_t t = rows.tok[i];
      const float* q = staged ? staged + int64_t{i - row0} * stride
                              : a.q + (t * a.n_heads + rows.head[i]) * a.head_dim;
      const bool in = t >= 0 && d < a.head_dim;
      qa[kk][e] = HalfPair(in ? q[d] * a.scale : 0.f, in ? q[d + 1] * a.scale : 0.f);
    }
  }
}

// The output fragments o scaled by their rows' factors (MmaChunkWeights' corr).
template <int kN>
__device__ __forceinline__ void MmaScaleRows(float (&o)[kN][4], const float (&corr)[2]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    o[n][0] *= corr[0], o[n][1] *= corr[0];
    o[n][2] *= corr[1], o[n][3] *= corr[1];
  }
}

// Values off .. off + 7 of the Q8_0 block b as FP16 (the scale times each value, rounded).
__device__ __forceinline__ uint4 Q8Halves(const KvQ8* b, int off) {
  const float d = layout::HalfBits(b->d);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = HalfPair(d * static_cast<float>(b->qs[off + 2 * i]),
                    d * static_cast<float>(b->qs[off + 2 * i + 1]));
  }
  return uint4{w[0], w[1], w[2], w[3]};
}

// AttentionMmaKernel: for an F16 or Q8_0 cache whose keys and values have the same size, a
// multiple of 16 up to kD, a block a tile of kMmaRows = 64 query rows (AttentionTileKernel's
// rows: a sequence's (token, head) pairs of one KV head), a warp 16 of them. Each chunk of kKeys
// keys goes into shared memory in FP16 (the keys row by row, the values transposed; a Q8_0
// cache's blocks scaled into FP16, the queries rotated as its rows are and the output rotated
// back); a warp multiplies its rows' queries -- scaled, then rounded to FP16 -- with the keys
// (MmaF16), masks and soft-caps the scores in FP32, updates its rows' online softmax and
// multiplies the weights, rounded to FP16, with the values; FP32 accumulation throughout. The
// scores and the output stay in the tensor cores' registers (the accumulator's layout of the
// scores is the layout of the weights as the next product's A).
template <int kD, int kKeys>
struct AttnMma {
  static constexpr int kThreads = kAttnWarps * kWarp;
  static constexpr int kKStride = kD + 8;     // a key's FP16 row in shared memory (+8: no bank
  static constexpr int kVStride = kKeys + 8;  // conflicts), a value column's (transposed)
  static constexpr int kLoadBytes = 2 * (kKeys * kKStride + kD * kVStride);
  static constexpr int kOutStride = kD + 4;  // the output rows, FP32, after the last chunk
  static constexpr int kOutBytes = 4 * kMmaRows * kOutStride;
  static constexpr int kBytes = kLoadBytes > kOutBytes ? kLoadBytes : kOutBytes;
  static_assert(kD % 16 == 0 && kD <= kThreads && kKeys % 16 == 0);
  static_assert(kBytes + 24 * kMmaRows <= 48 * 1024);  // (static shared memory)
};

template <typename KV, int kD, int kKeys>
__global__ void __launch_bounds__(kAttnWarps * kWarp, 2) AttentionMmaKernel(AttnArgs a) {
  KernelStart();
  using Mma = AttnMma<kD, kKeys>;
  constexpr int kThreads = Mma::kThreads, kNt = kKeys / 8, kSteps = kD / 16;
  __shared__ float4 buf[Mma::kBytes / 16];
  uint16_t* k_h = reinterpret_cast<uint16_t*>(buf);  // [kKeys][kKStride]
  uint16_t* vt_h = k_h + kKeys * Mma::kKStride;      // [kD][kVStride]
  float* o_s = reinterpret_cast<float*>(buf);        // [kMmaRows][kOutStride], at the end
  __shared__ TileRows<kMmaRows> rows;
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  const int g = blockIdx.y, hd = a.head_dim;
  const int64_t first = LoadTileRows(a, &rows);
  if (first < 0) return;  // (past the step's tiles)
  __syncthreads();
  int64_t kmin, kmax;  // (the keys the block reads)
  rows.Keys(0, kMmaRows, &kmin, &kmax);
  const MmaLane ln = MmaLaneOf(rows, warp * 16);
  const int c = ln.c;
  uint32_t qa[kSteps][4];
  if constexpr (kKvQ8<KV>) {  // (the queries rotated as the keys are, in o_s first)
    for (int x = tid; x < kMmaRows * hd; x += kThreads) {
      const int i = x / hd, d = x % hd;
      const int64_t t = rows.tok[i];
      o_s[i * Mma::kOutStride + d] = t < 0 ? 0.f : a.q[(t * a.n_heads + rows.head[i]) * hd + d];
    }
    __syncthreads();
    HadamardRows(o_s, kMmaRows, hd, Mma::kOutStride, a.rot_k);
    __syncthreads();
    MmaQueries(a, rows, ln, 0, qa, o_s, Mma::kOutStride);
  } else {
    MmaQueries(a, rows, ln, 0, qa);
  }
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[first]];
  const KV* kc = KvAt(static_cast<const KV*>(a.k), int64_t{g} * hd);
  const KV* vc = KvAt(static_cast<const KV*>(a.v), int64_t{g} * hd);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  for (int64_t j0 = kmin; j0 <= kmax; j0 += kKeys) {
    const int nk = kmax - j0 + 1 < kKeys ? static_cast<int>(kmax - j0 + 1) : kKeys;
    __syncthreads();  // (the chunk before is read)
    // The chunk: 8 values (16 bytes of FP16) a thread at a time -- a Q8_0 cache's scaled into
    // FP16 --; zeros past the last key and the head.
    for (int p = tid; p < kKeys * (kD / 8); p += kThreads) {
      const int j = p / (kD / 8), d0 = (p % (kD / 8)) * 8;
      uint4 kv{0, 0, 0, 0}, vv{0, 0, 0, 0};
      if (j < nk && d0 < hd) {
        const int64_t slot = KeySlot(table, j0 + j, a.block_size);
        if constexpr (kKvQ8<KV>) {
          kv = Q8Halves(KvAt(kc, slot * a.k_stride + d0), d0 % 32);
          vv = Q8Halves(KvAt(vc, slot * a.v_stride + d0), d0 % 32);
        } else {
          kv = LoadVector<uint4>(kc + slot * a.k_stride + d0);
          vv = LoadVector<uint4>(vc + slot * a.v_stride + d0);
        }
      }
      StoreVector(k_h + j * Mma::kKStride + d0, kv);
      uint16_t v8[8];
      std::memcpy(v8, &vv, 16);
#pragma unroll
      for (int i = 0; i < 8; ++i) vt_h[(d0 + i) * Mma::kVStride + j] = v8[i];
    }
    __syncthreads();
    if (!MmaSees(ln, j0, nk)) continue;  // (no key of the chunk in the warp's rows)
    // Scores: 8 keys (an n tile) at a time, over the head in steps of 16.
    float sc[kNt][4];
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
      const uint16_t* kr = k_h + (n * 8 + lane / 4) * Mma::kKStride + c;
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        if (kk * 16 >= hd) break;
        const uint32_t b[2] = {SharedPair(kr + kk * 16), SharedPair(kr + kk * 16 + 8)};
        MmaF16(sc[n], qa[kk], b);
      }
    }
    uint32_t pa[kKeys / 16][4];
    float corr[2];
    MmaChunkWeights(rows, ln.r, c, j0, nk, a.softcap, sc, m, l, corr, pa);
    MmaScaleRows(o, corr);
    // The values, 8 columns (an n tile) at a time, 16 keys a product.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        if (n * 8 >= hd) break;
        const uint16_t* vr = vt_h + (n * 8 + lane / 4) * Mma::kVStride + kk * 16 + c;
        const uint32_t b[2] = {SharedPair(vr), SharedPair(vr + 8)};
        MmaF16(o[n], pa[kk], b);
      }
    }
  }
  // Each row's sum over its 4 lanes, then the output through shared memory (the block's rows
  // stored a row at a time, quantized where asked, as AttentionTileKernel stores them).
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = WarpButterfly<2>(l[h], AddOp{});
  __syncthreads();  // (the last chunk is read)
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2;
      o_s[ln.r[h] * Mma::kOutStride + n * 8 + c + e % 2] = l[h] > 0.f ? o[n][e] / l[h] : 0.f;
    }
  }
  __syncthreads();
  if constexpr (kKvQ8<KV>) {  // (the rows' values rotated back)
    HadamardRows(o_s, kMmaRows, hd, Mma::kOutStride, a.rot_v);
    __syncthreads();
  }
  const int64_t cols = int64_t{a.n_heads} * hd;  // (a token's row of out)
  const int d = tid;
  for (int i = 0; i < kMmaRows; ++i) {  // (every thread every round: the quantizer's shuffles)
    const int64_t t = rows.tok[i];
    const bool valid = t >= 0 && d < hd;
    const float v = valid ? o_s[i * Mma::kOutStride + d] : 0.f;
    if (valid) a.out[(t * a.n_heads + rows.head[i]) * hd + d] = v;
    if (a.quant.qs)
      QuantizeValue<32>(v, valid, t, int64_t{rows.head[i]} * hd + d, cols, a.quant, nullptr);
  }
}

// Rows too wide for one warp's registers on the tensor cores (AttentionMmaWideKernel), over an
// F16 or Q8_0 cache: MLA's latent rows (kLatent: the key the whole cache row, kDk = 576 values
// for V2's shapes, the value its first kDv = 512) and heads of up to 256. A
// block is kWideWarps / kSplit groups of 16 rows (AttentionMmaKernel's rows of a tile), each
// taken by kSplit warps: a warp multiplies its rows' queries with its part of the key's values,
// the kSplit partial scores meet in shared memory and are summed in the same order by each of
// them, which then keep the same online softmax and each multiply the weights with their part of
// the value's values. Chunks of 16 keys, the cache rows as stored (a Q8_0 cache's blocks scaled
// into FP16, the queries rotated as its rows are). The output leaves through shared memory,
// kPassRows rows at a time: rotated back for a Q8_0 cache, stored and quantized where asked as
// AttentionMmaKernel stores it.
constexpr int kWideWarps = 8;
constexpr int kWideKeys = 16;
constexpr int kMlaMmaRow = 576;     // the MLA instance: cache rows of up to 576 values
constexpr int kMlaMmaLatent = 512;  // (DeepSeek-V2 / V3: 512 latent + 64 RoPE), values of 512

template <int kDk, int kDv, int kSplit, bool kLatent, bool kQ8>
struct AttnMmaWide {
  static constexpr int kThreads = kWideWarps * kWarp;
  static constexpr int kRows = 16 * (kWideWarps / kSplit);
  static constexpr int kPartK = kDk / kSplit, kPartV = kDv / kSplit;  // a warp's values
  static constexpr int kKStride = kDk + 8;                              // a chunk's FP16 rows:
  static constexpr int kVStride = kLatent ? kKStride : kDv + 8;         // (+8: no bank conflicts)
  static constexpr int kChunkBytes = 2 * kWideKeys * (kKStride + (kLatent ? 0 : kVStride));
  // The staged FP32 rows: the queries to rotate (Q8_0), then the output.
  static constexpr int kStageStride = (kQ8 && kDk > kDv ? kDk : kDv) + 4;
  static constexpr int PassRows() {
    int r = kRows;
    while (r > 16 && 4 * r * kStageStride > 36 * 1024) r /= 2;
    return r;
  }
  static constexpr int kPassRows = PassRows();
  static constexpr int kStageBytes = 4 * kPassRows * kStageStride;
  static constexpr int kBytes = kChunkBytes > kStageBytes ? kChunkBytes : kStageBytes;
  static_assert(kSplit >= 2 && kWideWarps % kSplit == 0);
  static_assert(kPartK % 16 == 0 && kPartV % 8 == 0 && kRows % kPassRows == 0);
  static_assert(kBytes + 4 * kWideWarps * 4 * (kWideKeys / 8) * kWarp + 24 * kRows <=
                48 * 1024);  // (static shared memory: the chunk or the stage, part, rows)
};

template <typename KV, int kDk, int kDv, int kSplit, bool kLatent>
__global__ void __launch_bounds__(kWideWarps * kWarp, 1) AttentionMmaWideKernel(AttnArgs a) {
  KernelStart();
  using W = AttnMmaWide<kDk, kDv, kSplit, kLatent, kKvQ8<KV>>;
  constexpr int kThreads = W::kThreads, kRows = W::kRows, kPass = W::kPassRows;
  constexpr int kSteps = W::kPartK / 16, kNv = W::kPartV / 8, kNt = kWideKeys / 8;
  __shared__ float4 buf[W::kBytes / 16];
  __shared__ float part[kWideWarps][4 * kNt][kWarp];  // each lane's partial scores
  __shared__ TileRows<kRows> rows;
  uint16_t* k_h = reinterpret_cast<uint16_t*>(buf);  // [kWideKeys][kKStride]
  uint16_t* v_h = kLatent ? k_h : k_h + kWideKeys * W::kKStride;  // [kWideKeys][kVStride]
  float* stage = reinterpret_cast<float*>(buf);  // [kPass][kStageStride], outside the chunks
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  const int rg = warp / kSplit, piece = warp % kSplit;  // the warp's rows (16) and values
  const int g = blockIdx.y, hd = a.head_dim, vd = a.v_head_dim;
  const int64_t first = LoadTileRows(a, &rows);
  if (first < 0) return;  // (past the step's tiles)
  __syncthreads();
  int64_t kmin, kmax;  // (the keys the block reads)
  rows.Keys(0, kRows, &kmin, &kmax);
  const MmaLane ln = MmaLaneOf(rows, rg * 16);
  const int c = ln.c;
  const int k0 = piece * W::kPartK, v0 = piece * W::kPartV;
  uint32_t qa[kSteps][4];
  if constexpr (kKvQ8<KV>) {  // (the queries rotated as the keys are, kPass rows at a time)
    for (int p0 = 0; p0 < kRows; p0 += kPass) {
      for (int x = tid; x < kPass * hd; x += kThreads) {
        const int i = x / hd, d = x % hd;
        const int64_t t = rows.tok[p0 + i];
        stage[i * W::kStageStride + d] =
            t < 0 ? 0.f : a.q[(t * a.n_heads + rows.head[p0 + i]) * hd + d];
      }
      __syncthreads();
      HadamardRows(stage, kPass, hd, W::kStageStride, a.rot_k);
      __syncthreads();
      if (rg * 16 >= p0 && rg * 16 < p0 + kPass)
        MmaQueries(a, rows, ln, k0, qa, stage, W::kStageStride, p0);
      __syncthreads();
    }
  } else {
    MmaQueries(a, rows, ln, k0, qa);
  }
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[first]];
  const KV* kc = KvAt(static_cast<const KV*>(a.k), int64_t{g} * hd);
  const KV* vc = kLatent ? kc : KvAt(static_cast<const KV*>(a.v), int64_t{g} * vd);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[kNv][4];
#pragma unroll
  for (int n = 0; n < kNv; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  constexpr int kK8 = kDk / 8, kRow8 = kK8 + (kLatent ? 0 : kDv / 8);  // (8 values a load)
  for (int64_t j0 = kmin; j0 <= kmax; j0 += kWideKeys) {
    const int nk = kmax - j0 + 1 < kWideKeys ? static_cast<int>(kmax - j0 + 1) : kWideKeys;
    __syncthreads();  // (the chunk before and its partial scores are read)
    // The chunk: 8 values (16 bytes of FP16) a thread at a time, the keys' then the values';
    // zeros past the last key and the row.
    for (int p = tid; p < kWideKeys * kRow8; p += kThreads) {
      const int j = p / kRow8, x = p % kRow8;
      const bool value = x >= kK8;
      const int d0 = (value ? x - kK8 : x) * 8;
      uint4 kv{0, 0, 0, 0};
      if (j < nk && d0 < (value ? vd : hd)) {
        const int64_t slot = KeySlot(table, j0 + j, a.block_size);
        const KV* src = value ? KvAt(vc, slot * a.v_stride + d0) : KvAt(kc, slot * a.k_stride + d0);
        if constexpr (kKvQ8<KV>) {
          kv = Q8Halves(src, d0 % 32);
        } else {
          kv = LoadVector<uint4>(src);
        }
      }
      StoreVector((value ? v_h + j * W::kVStride : k_h + j * W::kKStride) + d0, kv);
    }
    __syncthreads();
    // (the same for the row group's kSplit warps)
    const bool seen = MmaSees(ln, j0, nk);
    float sc[kNt][4];
    if (seen) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        const uint16_t* kr = k_h + (n * 8 + lane / 4) * W::kKStride + k0 + c;
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) {
          if (k0 + kk * 16 >= hd) break;
          const uint32_t b[2] = {SharedPair(kr + kk * 16), SharedPair(kr + kk * 16 + 8)};
          MmaF16(sc[n], qa[kk], b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp][4 * n + e][lane] = sc[n][e];
      }
    }
    __syncthreads();
    if (!seen) continue;
#pragma unroll
    for (int n = 0; n < kNt; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // (the parts in order: each warp gets the same bits)
        float v = 0.f;
        for (int w = 0; w < kSplit; ++w) v += part[rg * kSplit + w][4 * n + e][lane];
        sc[n][e] = v;
      }
    }
    uint32_t pa[kNt / 2][4];
    float corr[2];
    MmaChunkWeights(rows, ln.r, c, j0, nk, a.softcap, sc, m, l, corr, pa);
    MmaScaleRows(o, corr);
    // The values: column v0 + 8 n + lane / 4 of keys c, c + 1, c + 8, c + 9 (B's layout; the
    // rows are not transposed, so two loads a register).
#pragma unroll
    for (int n = 0; n < kNv; ++n) {
      if (v0 + n * 8 >= vd) break;
      const uint16_t* col = v_h + v0 + n * 8 + lane / 4;
      uint32_t b[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = c + 8 * h;
        b[h] = uint32_t{col[j * W::kVStride]} | (uint32_t{col[(j + 1) * W::kVStride]} << 16);
      }
      MmaF16(o[n], pa[0], b);
    }
  }
  // Each row's sum over its 4 lanes; then the output, kPass rows at a time through the stage.
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = WarpButterfly<2>(l[h], AddOp{});
  const int64_t cols = int64_t{a.n_heads} * vd;  // (a token's row of out)
  for (int p0 = 0; p0 < kRows; p0 += kPass) {
    __syncthreads();  // (the last chunk, or the pass before, is read)
    if (rg * 16 >= p0 && rg * 16 < p0 + kPass) {
#pragma unroll
      for (int n = 0; n < kNv; ++n) {
        if (v0 + n * 8 >= vd) break;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          stage[(ln.r[h] - p0) * W::kStageStride + v0 + n * 8 + c + e % 2] =
              l[h] > 0.f ? o[n][e] / l[h] : 0.f;
        }
      }
    }
    __syncthreads();
    if constexpr (kKvQ8<KV>) {  // (the rows' values rotated back)
      HadamardRows(stage, kPass, vd, W::kStageStride, a.rot_v);
      __syncthreads();
    }
    for (int i = 0; i < kPass; ++i) {
      const int64_t t = rows.tok[p0 + i];
      const int head = rows.head[p0 + i];
      for (int round = 0; round < (kDv + kThreads - 1) / kThreads; ++round) {
        const int d = round * kThreads + tid;  // (all threads each round: the quantizer's)
        const bool valid = t >= 0 && d < vd;
        const float v = valid ? stage[i * W::kStageStride + d] : 0.f;
        if (valid) a.out[(t * a.n_heads + head) * vd + d] = v;
        if (a.quant.qs)
          QuantizeValue<32>(v, valid, t, int64_t{head} * vd + d, cols, a.quant, nullptr);
      }
    }
  }
}

}  // namespace
}  // namespace peng::backend::cuda
