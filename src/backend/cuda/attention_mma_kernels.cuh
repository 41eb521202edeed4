// The tiled attention of prompts on the tensor cores (included by cuda_device.cu after
// attention_kernels.cuh, whose tiles' rows, cache types and rotations they share):
// AttentionMmaKernel (heads of one size up to 128 over an F16 or Q8_0 cache) and
// AttentionMmaLatentKernel (MLA's latent rows), both multiplying with MmaF16 (runtime.h).
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

// The tiled attention on the tensor cores (AttentionMmaKernel, AttentionMmaLatentKernel, and the
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
// are a.q's, or row i at staged + i * stride where staged is set.
template <int kSteps, int kRows>
__device__ __forceinline__ void MmaQueries(const AttnArgs& a, const TileRows<kRows>& rows,
                                           const MmaLane& ln, int d0, uint32_t (&qa)[kSteps][4],
                                           const float* staged = nullptr, int stride = 0) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = ln.r[e % 2], d = d0 + kk * 16 + ln.c + (e / 2) * 8;
      const int64_t t = rows.tok[i];
      const float* q = staged ? staged + int64_t{i} * stride
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

// MLA's latent rows on the tensor cores (AttentionMmaLatentKernel; an F16 cache outside exact
// mode): the key is the whole cache row (kDk = 576 values for V2's shapes), the value its first
// kDv (512), too wide for one warp's registers. A block is two groups of 16 rows (a token's
// query heads), each taken by four warps: a warp multiplies its rows' queries with a quarter of
// the key's values, the four partial scores meet in shared memory and are summed in the same
// order by each of the four, which then keep the same online softmax and each multiply the
// weights with a quarter of the value's values. Chunks of 16 keys, the cache rows as stored.
constexpr int kLatentRows = 32;
constexpr int kLatentWarps = 8;
constexpr int kLatentKeys = 16;
constexpr int kMlaMmaRow = 576;     // the kernel's instance: cache rows of up to 576 values
constexpr int kMlaMmaLatent = 512;  // (DeepSeek-V2 / V3: 512 latent + 64 RoPE), values of 512

template <int kDk, int kDv>
struct AttnMmaLatent {
  static constexpr int kThreads = kLatentWarps * kWarp;
  static constexpr int kQuarterK = kDk / 4, kQuarterV = kDv / 4;  // a warp's values
  static constexpr int kKStride = kDk + 8;                         // a key's FP16 row
  static_assert(kQuarterK % 16 == 0 && kQuarterV % 8 == 0);
  static_assert(2 * kLatentKeys * kKStride + 4 * kThreads * 8 + 24 * kLatentRows <= 48 * 1024);
};

template <int kDk, int kDv>
__global__ void __launch_bounds__(kLatentWarps * kWarp, 1) AttentionMmaLatentKernel(AttnArgs a) {
  KernelStart();
  using Lat = AttnMmaLatent<kDk, kDv>;
  constexpr int kThreads = Lat::kThreads, kSteps = Lat::kQuarterK / 16;
  constexpr int kNv = Lat::kQuarterV / 8, kNt = kLatentKeys / 8;
  __shared__ float4 buf[(2 * kLatentKeys * Lat::kKStride + 15) / 16];
  __shared__ float part[kLatentWarps][4 * kNt][kWarp];  // each lane's partial scores
  __shared__ TileRows<kLatentRows> rows;
  uint16_t* k_h = reinterpret_cast<uint16_t*>(buf);  // [kLatentKeys][kKStride]
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  const int rg = warp / 4, quarter = warp % 4;  // the warp's rows (16 of 32) and values
  const int hd = a.head_dim, vd = a.v_head_dim;
  const int64_t first = LoadTileRows(a, &rows);
  if (first < 0) return;  // (past the step's tiles)
  __syncthreads();
  int64_t kmin, kmax;  // (the keys the block reads)
  rows.Keys(0, kLatentRows, &kmin, &kmax);
  const MmaLane ln = MmaLaneOf(rows, rg * 16);
  const int c = ln.c;
  const int k0 = quarter * Lat::kQuarterK, v0 = quarter * Lat::kQuarterV;
  uint32_t qa[kSteps][4];
  MmaQueries(a, rows, ln, k0, qa);
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[first]];
  const uint16_t* kc = static_cast<const uint16_t*>(a.k);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[kNv][4];
#pragma unroll
  for (int n = 0; n < kNv; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  for (int64_t j0 = kmin; j0 <= kmax; j0 += kLatentKeys) {
    const int nk = kmax - j0 + 1 < kLatentKeys ? static_cast<int>(kmax - j0 + 1) : kLatentKeys;
    __syncthreads();  // (the chunk before and its partial scores are read)
    for (int p = tid; p < kLatentKeys * (kDk / 8); p += kThreads) {
      const int j = p / (kDk / 8), d0 = (p % (kDk / 8)) * 8;
      uint4 kv{0, 0, 0, 0};
      if (j < nk && d0 < hd) {
        kv = LoadVector<uint4>(kc + KeySlot(table, j0 + j, a.block_size) * a.k_stride + d0);
      }
      StoreVector(k_h + j * Lat::kKStride + d0, kv);
    }
    __syncthreads();
    // (the same for the row group's four warps)
    const bool seen = MmaSees(ln, j0, nk);
    float sc[kNt][4];
    if (seen) {
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        const uint16_t* kr = k_h + (n * 8 + lane / 4) * Lat::kKStride + k0 + c;
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
      for (int e = 0; e < 4; ++e) {  // (the quarters in order: each warp gets the same bits)
        float v = 0.f;
        for (int w = 0; w < 4; ++w) v += part[rg * 4 + w][4 * n + e][lane];
        sc[n][e] = v;
      }
    }
    uint32_t pa[kNt / 2][4];
    float corr[2];
    MmaChunkWeights(rows, ln.r, c, j0, nk, a.softcap, sc, m, l, corr, pa);
    MmaScaleRows(o, corr);
    // The values: the rows' first vd values, column v0 + 8 n + lane / 4 of keys c, c + 1,
    // c + 8, c + 9 (B's layout; the rows are not transposed, so two loads a register).
#pragma unroll
    for (int n = 0; n < kNv; ++n) {
      if (v0 + n * 8 >= vd) break;
      const uint16_t* col = k_h + v0 + n * 8 + lane / 4;
      uint32_t b[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int j = c + 8 * h;
        b[h] = uint32_t{col[j * Lat::kKStride]} | (uint32_t{col[(j + 1) * Lat::kKStride]} << 16);
      }
      MmaF16(o[n], pa[0], b);
    }
  }
  // Each row's sum over its 4 lanes; the lane's values of its two rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = WarpButterfly<2>(l[h], AddOp{});
#pragma unroll
  for (int n = 0; n < kNv; ++n) {
    if (v0 + n * 8 >= vd) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = rows.tok[ln.r[h]];
      if (t < 0) continue;
      float* out = a.out + (t * a.n_heads + rows.head[ln.r[h]]) * vd + v0 + n * 8 + c;
      out[0] = l[h] > 0.f ? o[n][2 * h] / l[h] : 0.f;
      out[1] = l[h] > 0.f ? o[n][2 * h + 1] / l[h] : 0.f;
    }
  }
}

}  // namespace
}  // namespace peng::backend::cuda
