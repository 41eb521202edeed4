// The CUDA backend's kernels of the paged KV cache and attention (included by cuda_device.cu
// after kernels.cuh, whose reductions and quantizer they use): the cache's element types, RoPE
// (RopeRotation, shared with MLA's absorption in mla_kernels.cuh) with the KV write
// (RopeKvKernel), and the paged attention (AttentionKernel: a block per (token, head), the
// token's own head normalized, rotated and stored inside it in decode steps: AttnRope; the
// prompts' tiles: AttentionTileKernel on the FP32 cores; on the tensor cores:
// attention_mma_kernels.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.cuh"

namespace peng::backend::cuda {
namespace {

constexpr int kMaxRopeHalf = 128;  // rot_dim / 2 (rot_dim <= head_dim <= 256)

// A Q8_0 cache's element: GGUF's block_q8_0 (an fp16 scale and 32 int8 values), the unit a
// pointer into a Q8_0 cache steps by. The rows it holds are rotated (kernels/attention_ops.h):
// runs of AttnArgs::rot_k / rot_v values multiplied by the orthonormal Walsh-Hadamard matrix
// before they are quantized, so the attention rotates its queries alike and its output back.
struct KvQ8 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(KvQ8) == 34);
template <typename KV>
constexpr bool kKvQ8 = std::is_same_v<std::remove_const_t<KV>, KvQ8>;
// Values an element of the cache type holds.
template <typename KV>
constexpr int kKvValues = kKvQ8<KV> ? 32 : 1;

// p advanced by `off` values (for Q8_0 a multiple of 32: rows and heads start at blocks).
template <typename KV>
__device__ __forceinline__ KV* KvAt(KV* p, int64_t off) {
  return p + off / kKvValues<KV>;
}

// The slot of key `key` of a sequence with block table `table`.
__device__ __forceinline__ int64_t KeySlot(const int32_t* table, int64_t key, int block_size) {
  return int64_t{table[key / block_size]} * block_size + key % block_size;
}

template <typename KV>
__device__ __forceinline__ float KvLoad(const KV* p, int64_t i) {
  if constexpr (kKvQ8<KV>) {
    const KvQ8& b = p[i / 32];
    return layout::HalfBits(b.d) * static_cast<float>(b.qs[i % 32]);
  } else if constexpr (sizeof(KV) == 2) {
    return __half2float(reinterpret_cast<const __half*>(p)[i]);
  } else {
    return p[i];
  }
}
template <typename KV>
__device__ __forceinline__ void KvStore(KV* p, int64_t i, float v) {
  if constexpr (sizeof(KV) == 2) {
    reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    p[i] = v;
  }
}

// kernels::ref::HadamardRows over one run of n values (a power of two) by one thread: its
// stages in its order (each value's sums the reference's), then the scale, so the same bits.
// A stage's n / 2 butterflies are independent: a thread starts at its lane's (the threads of a
// warp, a run each, then touch different shared-memory banks).
__device__ __forceinline__ void HadamardRun(float* v, int n) {
  const int half = n / 2, o = static_cast<int>(threadIdx.x % kWarp) % half;
  for (int h = 1; h < n; h *= 2) {
    for (int p0 = 0; p0 < half; ++p0) {
      const int p = p0 + o < half ? p0 + o : p0 + o - half;
      const int j = (p / h) * 2 * h + p % h;
      const float a = v[j], c = v[j + h];
      v[j] = a + c;
      v[j + h] = a - c;
    }
  }
  const float norm = 1.0f / sqrtf(static_cast<float>(n));
  for (int i0 = 0; i0 < n; ++i0) {
    const int i = (i0 + o) % n;
    v[i] *= norm;
  }
}

// n_rows rows of n values, `stride` apart, rotated in runs of `run` (0: none) by the block's
// threads, a run a thread; the caller syncs before and after.
__device__ __forceinline__ void HadamardRows(float* x, int n_rows, int n, int stride, int run) {
  if (run == 0) return;
  const int runs = n / run;
  for (int j = threadIdx.x; j < n_rows * runs; j += blockDim.x)
    HadamardRun(x + (j / runs) * stride + (j % runs) * run, run);
}

// x[0..32) into the block b: kernels::ref::F32ToQ8_0Row's arithmetic (ActBlockScale), so the
// same bytes. A thread starts at its lane's value (neighbouring threads' blocks: other banks).
__device__ __forceinline__ void QuantizeQ8(const float* x, KvQ8* b) {
  const int o = static_cast<int>(threadIdx.x % kWarp);
  float amax = 0.f;
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[(i + o) % 32]));
  const layout::ActScale s = layout::ActBlockScale<32>(amax);
#if defined(__CUDA_ARCH__)
  b->d = __half_as_ushort(__float2half_rn(s.d));
#else
  b->d = F32ToF16(s.d);
#endif
  for (int i0 = 0; i0 < 32; ++i0) {
    const int i = (i0 + o) % 32;
    b->qs[i] = layout::QuantizeActValue(x[i], s.iscale);
  }
}

// x[0..n) (shared memory; n a multiple of 32) rotated in runs of `run`, then quantized into the
// blocks from `out` on, by the block's threads; x is left rotated. Every thread calls it; it
// syncs before it returns (out may be shared memory read next).
__device__ __forceinline__ void StoreQ8Row(float* x, int n, int run, KvQ8* out) {
  __syncthreads();  // (x whole)
  HadamardRows(x, 1, n, n, run);
  __syncthreads();
  for (int b = threadIdx.x; b < n / 32; b += blockDim.x) QuantizeQ8(x + 32 * b, out + b);
  __syncthreads();
}

// The rows KvWrite stores (k_cache null: none): token t's k [kd] and v [vd] into its slot; a
// Q8_0 cache's rotated in runs of rot_k / rot_v values.
template <typename KV>
struct KvRows {
  KV* k_cache = nullptr;
  KV* v_cache = nullptr;
  const int32_t* slot = nullptr;
  int64_t kd = 0, vd = 0;
  const float* k = nullptr;
  const float* v = nullptr;
  int rot_k = 0, rot_v = 0;
};

// The values a block's Q8_0 rows pass through shared memory in (whole runs).
constexpr int kQ8Chunk = 1024;

// The rotation of kernels::RopeConfig on the device: pair i of a head turned by pos *
// inv_freq[i] for i < half, cos and sin scaled by attention_factor (YaRN).
struct RopeRotation {
  const float* inv_freq = nullptr;
  int half = 0;  // rot_dim / 2
  bool interleaved = false;
  float attention_factor = 1.f;
};

// Rotates pair i of head xh by cos c / sin s (kernels::ApplyRope's pairs: interleaved or half
// apart).
__device__ __forceinline__ void RotatePair(float* xh, int i, int half, bool interleaved, float c,
                                           float s) {
  float* a = interleaved ? &xh[2 * i] : &xh[i];
  float* b = interleaved ? &xh[2 * i + 1] : &xh[i + half];
  const float x0 = *a, x1 = *b;
  *a = x0 * c - x1 * s;
  *b = x1 * c + x0 * s;
}

// Position pos's cos / sin (in double precision, as kernels::ApplyRope), by the whole block.
__device__ __forceinline__ void RopeAngles(int32_t pos, const RopeRotation& r,
                                           float (*cs)[kMaxRopeHalf]) {
  const float fpos = static_cast<float>(pos);
  for (int i = threadIdx.x; i < r.half; i += blockDim.x) {
    const float theta = fpos * r.inv_freq[i];
    cs[0][i] = static_cast<float>(cos(static_cast<double>(theta))) * r.attention_factor;
    cs[1][i] = static_cast<float>(sin(static_cast<double>(theta))) * r.attention_factor;
  }
}

// Rotates token t's heads of r with the token's cos / sin.
__device__ __forceinline__ void RotateHeads(const Device::RopeHeads& r, int64_t t, int half,
                                            bool interleaved, const float* cos_t,
                                            const float* sin_t) {
  if (!r.x) return;
  for (int64_t j = threadIdx.x; j < r.n_heads * half; j += blockDim.x) {
    const int64_t h = j / half;
    const int i = static_cast<int>(j % half);
    RotatePair(r.x + t * r.token_stride + h * r.head_stride, i, half, interleaved, cos_t[i],
               sin_t[i]);
  }
}

// One block a token: the token's row of `norm` normalized in place (RmsNormKernel's
// arithmetic, w_offset 0), its cos / sin (in double precision, as kernels::ApplyRope) once into
// shared memory, then the heads of q and k rotated, then the token's k and v rows stored into
// its cache slot.
template <typename KV>
__global__ void RopeKvKernel(Device::RopeHeads q, Device::RopeHeads k, const int32_t* pos,
                             RopeRotation rot, KvRows<KV> kv, RowNorm norm) {
  KernelStart();
  __shared__ float cs[2][kMaxRopeHalf];
  __shared__ float shared[32];
  const int64_t t = blockIdx.x;
  if (norm.x) {
    float* xr = norm.x + t * norm.stride;
    const float s = RmsScale(xr, norm.n, norm.eps, shared);
    for (int64_t i = threadIdx.x; i < norm.n; i += blockDim.x) xr[i] = (xr[i] * s) * norm.w[i];
    __syncthreads();  // (the row is read back below)
  }
  if (q.x || k.x) {
    RopeAngles(pos[t], rot, cs);
    __syncthreads();
    RotateHeads(q, t, rot.half, rot.interleaved, cs[0], cs[1]);
    RotateHeads(k, t, rot.half, rot.interleaved, cs[0], cs[1]);
    __syncthreads();  // (the rotated k is read back below)
  }
  if (!kv.k_cache) return;
  const int64_t slot = kv.slot[t];
  if constexpr (kKvQ8<KV>) {  // (the row rotated and quantized a chunk at a time)
    __shared__ float x[kQ8Chunk];
    for (int part = 0; part < 2; ++part) {
      const int64_t n = part ? kv.vd : kv.kd;
      if (n == 0) continue;
      const float* row = (part ? kv.v : kv.k) + t * n;
      KvQ8* out = KvAt(part ? kv.v_cache : kv.k_cache, slot * n);
      for (int64_t c = 0; c < n; c += kQ8Chunk) {
        const int len = static_cast<int>(n - c < kQ8Chunk ? n - c : kQ8Chunk);
        for (int i = threadIdx.x; i < len; i += blockDim.x) x[i] = row[c + i];
        StoreQ8Row(x, len, part ? kv.rot_v : kv.rot_k, KvAt(out, c));
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < kv.kd; i += blockDim.x)
      KvStore(kv.k_cache, slot * kv.kd + i, kv.k[t * kv.kd + i]);
    for (int64_t i = threadIdx.x; i < kv.vd; i += blockDim.x)
      KvStore(kv.v_cache, slot * kv.vd + i, kv.v[t * kv.vd + i]);
  }
}

// RoPE and the KV write inside the attention (AttnArgs::rope; steps of one token a sequence, so
// that no other token of the step reads a token's slot): each block normalizes (Device::HeadNorms:
// RmsNormKernel's arithmetic) and rotates (RopeKvKernel's) its query head and its KV head's key
// of the token, takes the token's own key and
// value from those rows -- rounded to the cache's type, as the cache returns them -- and the
// first query head of each KV head stores them into the token's slot.
struct AttnRope {
  const float* k = nullptr;  // null: none; the tokens' k rows [n_kv_heads * head_dim], unrotated
  const float* v = nullptr;  // their v rows [n_kv_heads * v_head_dim]
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* slot = nullptr;
  RopeRotation rot;
  // The heads' norms before the rotation (Device::HeadNorms over head_dim values); null: none.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_offset = 0.f, norm_eps = 0.f;
};

// Attention of query rows over the paged cache. Standard layers: K and V arrays, slot s of KV
// head g at s * k_stride + g * head_dim (V likewise). MLA: one array of cache rows, the key is
// the whole row and the value its first v_head_dim (= kv_lora_rank) values (v = k, strides the
// row length).
struct AttnArgs {
  const float* q;
  float* out;
  const void* k;
  const void* v;
  int64_t k_stride, v_stride;
  const int32_t* pos;
  const int32_t* seq_of_token;
  const int32_t* table_offset;
  const int32_t* tables;
  int n_heads, n_kv_heads, head_dim, v_head_dim, block_size;
  // A Q8_0 cache's rotation runs (KvQ8): the keys' (and the queries') and the values' (and the
  // output's); 0 for the other caches.
  int rot_k, rot_v;
  float scale, softcap;
  int sliding_window;
  QActOut quant;  // where set, the output also quantized in blocks of 32 (v_head_dim % 32 == 0)
  AttnRope rope;   // (standard layers)
  // AttentionTileKernel: the first token of each sequence [n_seqs + 1] (StepBatch).
  const int32_t* seq_first = nullptr;
  int n_seqs = 0;
  // AttentionKernel with gridDim.z > 1 (a long context split over blocks): each part's maximum,
  // sum and unnormalized output [(t n_heads + h) gridDim.z + z][2 + v_head_dim], and each
  // (token, head)'s count of parts done (0 between launches).
  float* part = nullptr;
  unsigned* done = nullptr;
};

// A decode token's keys are split into parts of at least this many, over up to gridDim.z
// (<= kAttnMaxSplits) blocks.
constexpr int kAttnSplitMin = 256;
constexpr int kAttnMaxSplits = 16;

// q . k over n values: 16-byte loads where `wide` (the cache row is 16-byte aligned; k then is).
template <typename KV>
__device__ __forceinline__ float KeyDot(const float* q, const KV* k, int n, bool wide) {
  float s = 0.f;
  if constexpr (kKvQ8<KV>) {  // (a block's scale once; its values two at a time)
    for (int b = 0; b < n / 32; ++b) {
      // The block as 17 2-byte words (a block starts at an even byte): the scale, then the
      // values in pairs, the first in the low byte (little-endian, as every target is).
      const uint16_t* w = reinterpret_cast<const uint16_t*>(k + b);
      const float* qb = q + 32 * b;
      float sb = 0.f;
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const uint16_t u = w[1 + c];
        sb += qb[2 * c] * static_cast<float>(static_cast<int8_t>(u & 0xff));
        sb += qb[2 * c + 1] * static_cast<float>(static_cast<int8_t>(u >> 8));
      }
      s += layout::HalfBits(w[0]) * sb;
    }
  } else {
    int i = 0;
    if (wide) {
      if constexpr (sizeof(KV) == 2) {
        for (; i + 8 <= n; i += 8) {
          const uint4 u = LoadVector<uint4>(k + i);
          const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float2 f = __half22float2(h[c]);
            s += q[i + 2 * c] * f.x + q[i + 2 * c + 1] * f.y;
          }
        }
      } else {
        for (; i + 4 <= n; i += 4) {
          const float4 f = LoadVector<float4>(k + i);
          s += q[i] * f.x + q[i + 1] * f.y + q[i + 2] * f.z + q[i + 3] * f.w;
        }
      }
    }
    for (; i < n; ++i) s += q[i] * KvLoad(k, i);
  }
  return s;
}

// The token's own key and value for AttentionKernel (AttnArgs::rope): q_s and k_s (the key, as
// FP32) normalized (where the heads have norms) and rotated, k_self / v_self the key and value
// as the cache holds them, stored into the token's slot by the first query head of the KV
// head.
template <typename KV>
__device__ void AttnRopeSelf(const AttnArgs& a, int64_t t, int h, int kvh, float* q_s,
                             float* k_s, KV* k_self, KV* v_self, float (*cs)[kMaxRopeHalf],
                             bool store) {
  const AttnRope& r = a.rope;
  const float* k = r.k + (t * a.n_kv_heads + kvh) * a.head_dim;
  for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) k_s[i] = k[i];
  if (r.q_norm) {  // (RmsNormKernel's arithmetic: Device::RmsNorm runs heads at this block size)
    __shared__ float red[32];
    __syncthreads();  // (q_s and k_s whole)
    const float sq = RmsScale(q_s, a.head_dim, r.norm_eps, red);
    const float sk = RmsScale(k_s, a.head_dim, r.norm_eps, red);
    for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) {
      q_s[i] = (q_s[i] * sq) * (r.q_norm[i] + r.norm_offset);
      k_s[i] = (k_s[i] * sk) * (r.k_norm[i] + r.norm_offset);
    }
  }
  RopeAngles(a.pos[t], r.rot, cs);
  __syncthreads();
  for (int i = threadIdx.x; i < r.rot.half; i += blockDim.x) {
    RotatePair(q_s, i, r.rot.half, r.rot.interleaved, cs[0][i], cs[1][i]);
    RotatePair(k_s, i, r.rot.half, r.rot.interleaved, cs[0][i], cs[1][i]);
  }
  __syncthreads();
  const float* v = r.v + (t * a.n_kv_heads + kvh) * a.v_head_dim;
  if constexpr (kKvQ8<KV>) {  // (k_s rotated and quantized, then the value through k_s)
    StoreQ8Row(k_s, a.head_dim, a.rot_k, k_self);
    for (int i = threadIdx.x; i < a.v_head_dim; i += blockDim.x) k_s[i] = v[i];
    StoreQ8Row(k_s, a.v_head_dim, a.rot_v, v_self);
  } else {
    for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) KvStore(k_self, i, k_s[i]);
    for (int i = threadIdx.x; i < a.v_head_dim; i += blockDim.x) KvStore(v_self, i, v[i]);
  }
  __syncthreads();
  if (!store || h % (a.n_heads / a.n_kv_heads) != 0) return;
  const int64_t slot = r.slot[t];
  KV* kc = KvAt(static_cast<KV*>(r.k_cache), slot * a.k_stride + int64_t{kvh} * a.head_dim);
  KV* vc = KvAt(static_cast<KV*>(r.v_cache), slot * a.v_stride + int64_t{kvh} * a.v_head_dim);
  for (int i = threadIdx.x; i < a.head_dim / kKvValues<KV>; i += blockDim.x) kc[i] = k_self[i];
  for (int i = threadIdx.x; i < a.v_head_dim / kKvValues<KV>; i += blockDim.x) vc[i] = v_self[i];
}

// One block per (token, head) -- or, with gridDim.z > 1, per part of a long context's keys
// (kAttnSplitMin keys a part at least, up to gridDim.z parts; blocks past the token's parts
// return at once). Warp w takes the block's keys in chunks of 32 (chunk w, w + kAttnWarps,
// ...): each lane scores one key of the chunk, the warp updates its running maximum, sum and
// accumulator once a chunk, then adds the chunk's values (lane d holds output values d, d + 32,
// ...). The warps' states are merged at the end; the parts' by the last part to finish
// (AttnArgs::part, done). With a.rope, the token's own key and value (position p) come from the
// block's shared memory (AttnRopeSelf), not the cache, and the last part stores them.
template <typename KV, int kMaxK, int kMaxV>
__global__ void AttentionKernel(AttnArgs a) {
  KernelStart();
  constexpr int kPerLane = kMaxV / kWarp;
  __shared__ float q_s[kMaxK];
  __shared__ float m_s[kAttnWarps], l_s[kAttnWarps];
  __shared__ float acc_s[kAttnWarps][kMaxV];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t p = a.pos[t];
  const int64_t first = p - a.sliding_window + 1;
  const int64_t start = a.sliding_window > 0 && first > 0 ? first : 0;
  // The block's keys: part z of `parts`, lo..hi.
  const int64_t len = p - start + 1;
  int64_t parts = 1;
  if (gridDim.z > 1) {
    parts = (len + kAttnSplitMin - 1) / kAttnSplitMin;
    parts = parts < gridDim.z ? parts : gridDim.z;
  }
  const int z = static_cast<int>(blockIdx.z);
  if (z >= parts) return;
  const int64_t lo = start + len * z / parts, hi = start + len * (z + 1) / parts - 1;
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[t]];
  const float* q = a.q + (t * a.n_heads + h) * a.head_dim;
  for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) q_s[i] = q[i];
  const bool rope = a.rope.k != nullptr;
  alignas(16) __shared__ KV k_self[kMaxK / kKvValues<KV>];
  __shared__ KV v_self[kMaxV / kKvValues<KV>];
  static_assert(kMaxV <= kMaxK);  // (a Q8_0 value passes through k_s, the output through q_s)
  if (rope) {
    __shared__ float k_s[kMaxK];
    __shared__ float cs[2][kMaxRopeHalf];
    AttnRopeSelf(a, t, h, kvh, q_s, k_s, k_self, v_self, cs, z == parts - 1);
  }
  __syncthreads();
  if constexpr (kKvQ8<KV>) {  // (the query rotated as the keys are)
    HadamardRows(q_s, 1, a.head_dim, a.head_dim, a.rot_k);
    __syncthreads();
  }
  const KV* kc = static_cast<const KV*>(a.k);
  const KV* vc = static_cast<const KV*>(a.v);
  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  for (int64_t j0 = lo + int64_t{warp} * kWarp; j0 <= hi; j0 += kAttnWarps * kWarp) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    int64_t slot = 0;
    if (j <= hi) {
      slot = KeySlot(table, j, a.block_size);
      const KV* kr = KvAt(kc, slot * a.k_stride + int64_t{kvh} * a.head_dim);
      const bool self = rope && j == p;
      if (self) slot = -1;  // (its value: v_self)
      s = KeyDot(q_s, self ? k_self : kr, a.head_dim,
                 (reinterpret_cast<uintptr_t>(kr) & 15) == 0) * a.scale;
      if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    }
    const float m_new = fmaxf(m, WarpMax(s));  // finite: key j0 exists
    const float corr = expf(m - m_new);  // 0 for the first chunk (m = -inf)
    const float e = j <= hi ? expf(s - m_new) : 0.f;
    l = l * corr + WarpSum(e);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= corr;
    const int n_chunk = hi - j0 + 1 < kWarp ? static_cast<int>(hi - j0 + 1) : kWarp;
    for (int c = 0; c < n_chunk; ++c) {
      const float ec = __shfl_sync(0xffffffffu, e, c);
      const long long sc = __shfl_sync(0xffffffffu, static_cast<long long>(slot), c);
      const KV* vr = sc < 0 ? v_self : KvAt(vc, sc * a.v_stride + int64_t{kvh} * a.v_head_dim);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d < a.v_head_dim) acc[i] += ec * KvLoad(vr, d);
      }
    }
    m = m_new;
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < a.v_head_dim) acc_s[warp][d] = acc[i];
  }
  __syncthreads();
  float mm = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mm = fmaxf(mm, m_s[w]);
  float ll = 0.f;
  for (int w = 0; w < kAttnWarps; ++w)
    if (l_s[w] > 0.f) ll += l_s[w] * expf(m_s[w] - mm);
  // The block's unnormalized output value d.
  auto sum = [&](int d) {
    float s = 0.f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (l_s[w] > 0.f) s += acc_s[w][d] * expf(m_s[w] - mm);
    return s;
  };
  const int64_t th = t * a.n_heads + h;
  const int64_t part_len = 2 + a.v_head_dim;
  const float* parts_of = parts > 1 ? a.part + th * gridDim.z * part_len : nullptr;
  __shared__ float part_w[kAttnMaxSplits];
  if (parts > 1) {  // this part's state out; the last part to finish merges them all
    float* mine = a.part + (th * gridDim.z + z) * part_len;
    if (threadIdx.x == 0) {
      mine[0] = mm;
      mine[1] = ll;
    }
    for (int d = threadIdx.x; d < a.v_head_dim; d += blockDim.x) mine[2 + d] = sum(d);
    __threadfence();  // (visible to the last part before this one is counted)
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(a.done + th, 1u) == static_cast<unsigned>(parts - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Each part's weight exp(m_y - M) once (0 for a part without keys), M the parts' maximum
    // (their states read past L1: __ldcg).
    mm = -INFINITY;
    for (int64_t y = 0; y < parts; ++y) mm = fmaxf(mm, __ldcg(parts_of + y * part_len));
    if (threadIdx.x < parts) {
      const float* py = parts_of + threadIdx.x * part_len;
      part_w[threadIdx.x] = __ldcg(py + 1) > 0.f ? expf(__ldcg(py) - mm) : 0.f;
    }
    __syncthreads();
    ll = 0.f;
    for (int64_t y = 0; y < parts; ++y) ll += __ldcg(parts_of + y * part_len + 1) * part_w[y];
    if (threadIdx.x == 0) a.done[th] = 0;
  }
  // Output value d.
  auto value = [&](int d) {
    float s = 0.f;
    if (parts == 1) {
      s = sum(d);
    } else {
      for (int64_t y = 0; y < parts; ++y) s += __ldcg(parts_of + y * part_len + 2 + d) * part_w[y];
    }
    return s / ll;
  };
  if constexpr (kKvQ8<KV>) {  // (the values rotated back, in q_s)
    for (int d = threadIdx.x; d < a.v_head_dim; d += blockDim.x) q_s[d] = value(d);
    __syncthreads();
    HadamardRows(q_s, 1, a.v_head_dim, a.v_head_dim, a.rot_v);
    __syncthreads();
  }
  float* out = a.out + th * a.v_head_dim;
  const int64_t cols = int64_t{a.n_heads} * a.v_head_dim;  // (a token's row of out)
  for (int d0 = 0; d0 < a.v_head_dim; d0 += blockDim.x) {  // (every thread every round)
    const int d = d0 + threadIdx.x;
    const bool valid = d < a.v_head_dim;
    float v = 0.f;
    if (valid) out[d] = v = kKvQ8<KV> ? q_s[d] : value(d);
    if (a.quant.qs)
      QuantizeValue<32>(v, valid, t, int64_t{h} * a.v_head_dim + d, cols, a.quant, nullptr);
  }
}

// The tiled attention of steps with prompt tokens (AttentionTiles): a block a tile of kRows
// query rows -- (token, head) pairs of one sequence and one KV head, token by token and the
// KV head's query heads within a token -- that reads each key and value of the sequence once
// for all its rows, kKeys keys at a time, into shared memory. AttentionKernel reads them once a
// (token, head). kLatent: MLA's cache rows, the value the first v_head_dim values of the key.
template <int kDk, int kDv, int kRows, int kKeys, bool kLatent>
struct AttnTile {
  static constexpr int kThreads = kAttnWarps * kWarp;
  static constexpr int kScores = kRows * kKeys;
  // A score's dot product by kSplit threads (kScores < kThreads) or kPer scores a thread.
  static constexpr int kSplit = kScores < kThreads ? kThreads / kScores : 1;
  static constexpr int kPer = kScores < kThreads ? 1 : kScores / kThreads;
  static constexpr int kCols = (kDv + kThreads - 1) / kThreads;  // output values a thread a row
  static constexpr int kWarpRows = kRows / kAttnWarps;             // softmax rows a warp
  static_assert(kKeys <= kWarp && kRows % kAttnWarps == 0 && kThreads % kKeys == 0);
  static_assert(kScores % kThreads == 0 || kThreads % kScores == 0);
};

// Tiles of sequence s: ceil(n_s * group / kRows). Their sum is at most
// (n_tokens * group - n_seqs) / kRows + n_seqs (AttentionTiles' grid: the step's shape alone).
__device__ __forceinline__ int64_t SeqTiles(const int32_t* seq_first, int s, int group,
                                            int rows) {
  const int64_t pairs = int64_t{seq_first[s + 1] - seq_first[s]} * group;
  return (pairs + rows - 1) / rows;
}

// A tile's query rows (shared memory): row i's token (-1: no row), query head, position and
// first key (the sliding window's; causal: the last is its position).
template <int kRows>
struct TileRows {
  int64_t tok[kRows];
  int32_t head[kRows], pos[kRows], start[kRows];
  // Whether row i sees key `key` (a row that is none sees no key).
  __device__ bool Sees(int i, int64_t key) const { return key >= start[i] && key <= pos[i]; }
  // The keys rows [from, to) see: [*kmin, *kmax] (*kmax = -1: none).
  __device__ void Keys(int from, int to, int64_t* kmin, int64_t* kmax) const {
    *kmin = INT64_MAX;
    *kmax = -1;
    for (int i = from; i < to; ++i) {
      if (tok[i] < 0) continue;
      *kmin = start[i] < *kmin ? start[i] : *kmin;
      *kmax = pos[i] > *kmax ? pos[i] : *kmax;
    }
  }
};

// Block (x, g)'s rows: tile x of the step's tiles in sequence order, KV head g -- the sequence's
// (token, head) pairs of that KV head, token by token and the KV head's query heads within a
// token. The first kRows threads fill a row each (the caller syncs before reading). Returns the
// sequence's first token, or -1 where the block is past the step's tiles (for every thread).
template <int kRows>
__device__ __forceinline__ int64_t LoadTileRows(const AttnArgs& a, TileRows<kRows>* r) {
  const int group = a.n_heads / a.n_kv_heads;
  int64_t x = blockIdx.x;
  int s = 0;
  for (; s < a.n_seqs; ++s) {
    const int64_t n = SeqTiles(a.seq_first, s, group, kRows);
    if (x < n) break;
    x -= n;
  }
  if (s == a.n_seqs) return -1;
  const int64_t first = a.seq_first[s];
  const int64_t pairs = int64_t{a.seq_first[s + 1] - a.seq_first[s]} * group;
  const int i = threadIdx.x;
  if (i < kRows) {
    const int64_t pair = x * kRows + i;
    r->tok[i] = -1;
    r->head[i] = 0;
    r->pos[i] = -1;
    r->start[i] = INT32_MAX;
    if (pair < pairs) {
      const int64_t t = first + pair / group;
      const int32_t p = a.pos[t];
      r->tok[i] = t;
      r->head[i] = static_cast<int>(blockIdx.y) * group + static_cast<int>(pair % group);
      r->pos[i] = p;
      r->start[i] = a.sliding_window > 0 && p - a.sliding_window + 1 > 0
                        ? p - a.sliding_window + 1 : 0;
    }
  }
  return first;
}

// Block (x, g): tile x of the step's tiles in sequence order, KV head g. The rows' scores are
// masked as AttentionKernel's keys are (causal, the sliding window); the online softmax keeps a
// row's maximum, sum and output through the key chunks (a warp a row for the maximum and the
// sum, a thread kCols output values of every row).
template <typename KV, int kDk, int kDv, int kRows, int kKeys, bool kLatent>
__global__ void __launch_bounds__(kAttnWarps * kWarp, 3) AttentionTileKernel(AttnArgs a) {
  KernelStart();
  using Tile = AttnTile<kDk, kDv, kRows, kKeys, kLatent>;
  constexpr int kThreads = Tile::kThreads;
  __shared__ float q_s[kRows][kDk + 1];
  __shared__ float k_s[kKeys][kDk + 1];
  __shared__ float v_s[kLatent ? 1 : kKeys][kLatent ? 1 : kDv];
  __shared__ float p_s[kRows][kKeys];
  __shared__ float c_s[kRows], l_s[kRows];
  __shared__ TileRows<kRows> rows;
  const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
  const int g = blockIdx.y;
  const int64_t first = LoadTileRows(a, &rows);
  if (first < 0) return;  // (past the step's tiles)
  __syncthreads();
  int64_t kmin, kmax;
  rows.Keys(0, kRows, &kmin, &kmax);
  for (int i = warp; i < kRows; i += kAttnWarps) {  // (a warp a row)
    const int64_t t = rows.tok[i];
    for (int d = lane; d < a.head_dim; d += kWarp)
      q_s[i][d] = t < 0 ? 0.f : a.q[(t * a.n_heads + rows.head[i]) * a.head_dim + d];
  }
  if constexpr (kKvQ8<KV>) {  // (the queries rotated as the keys are)
    __syncthreads();
    HadamardRows(&q_s[0][0], kRows, a.head_dim, kDk + 1, a.rot_k);
  }
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[first]];
  const KV* kc = KvAt(static_cast<const KV*>(a.k), int64_t{g} * a.head_dim);
  const KV* vc = KvAt(static_cast<const KV*>(a.v), int64_t{g} * a.v_head_dim);
  float m[Tile::kWarpRows], l[Tile::kWarpRows], acc[kRows][Tile::kCols];
#pragma unroll
  for (int r = 0; r < Tile::kWarpRows; ++r) m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
  for (int i = 0; i < kRows; ++i)
#pragma unroll
    for (int c = 0; c < Tile::kCols; ++c) acc[i][c] = 0.f;
  for (int64_t j0 = kmin; j0 <= kmax; j0 += kKeys) {
    const int nk = kmax - j0 + 1 < kKeys ? static_cast<int>(kmax - j0 + 1) : kKeys;
    __syncthreads();  // (the chunk before is read)
    for (int j = warp; j < kKeys; j += kAttnWarps) {  // (a warp a key; 0 past the last)
      const int64_t key = j0 + j;
      const int64_t slot = j < nk ? KeySlot(table, key, a.block_size) : -1;
      for (int d = lane; d < a.head_dim; d += kWarp)
        k_s[j][d] = slot < 0 ? 0.f : KvLoad(kc, slot * a.k_stride + d);
      if constexpr (!kLatent) {
        for (int d = lane; d < a.v_head_dim; d += kWarp)
          v_s[j][d] = slot < 0 ? 0.f : KvLoad(vc, slot * a.v_stride + d);
      }
    }
    __syncthreads();
    // Scores: kPer a thread, or one by kSplit threads (neighbouring lanes) summed by shuffles.
#pragma unroll
    for (int e = 0; e < Tile::kPer; ++e) {
      const int sc = (tid / Tile::kSplit) + e * (kThreads / Tile::kSplit);
      const int i = sc / kKeys, j = sc % kKeys;
      float dot = 0.f;
      for (int d = tid % Tile::kSplit; d < a.head_dim; d += Tile::kSplit)
        dot += q_s[i][d] * k_s[j][d];
      if constexpr (Tile::kSplit > 1) dot = WarpButterfly<Tile::kSplit / 2>(dot, AddOp{});
      const int64_t key = j0 + j;
      float v = -INFINITY;
      if (j < nk && rows.Sees(i, key)) {
        v = dot * a.scale;
        if (a.softcap > 0.f) v = a.softcap * tanhf(v / a.softcap);
      }
      if (tid % Tile::kSplit == 0) p_s[i][j] = v;
    }
    __syncthreads();
    // The online softmax, a warp a row: lane j holds key j's score.
#pragma unroll
    for (int r = 0; r < Tile::kWarpRows; ++r) {
      const int i = warp + r * kAttnWarps;
      const float sc = lane < kKeys ? p_s[i][lane] : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(sc));
      float corr = 1.f, e = 0.f;
      if (m_new != -INFINITY) {  // (else no key of the row yet)
        corr = expf(m[r] - m_new);  // 0 for the row's first keys (m = -inf)
        e = sc == -INFINITY ? 0.f : expf(sc - m_new);
      }
      l[r] = l[r] * corr + WarpSum(e);
      m[r] = m_new;
      if (lane < kKeys) p_s[i][lane] = e;
      if (lane == 0) c_s[i] = corr;
    }
    __syncthreads();
    // The output: each row's sum corrected, then the chunk's values added in key order (a
    // value read once for all rows).
#pragma unroll
    for (int c = 0; c < Tile::kCols; ++c) {
      const int d = tid + c * kThreads;
      if (d >= a.v_head_dim) continue;
#pragma unroll
      for (int i = 0; i < kRows; ++i) acc[i][c] *= c_s[i];
      for (int j = 0; j < nk; ++j) {
        const float v = kLatent ? k_s[j][d] : v_s[j][d];
#pragma unroll
        for (int i = 0; i < kRows; ++i) acc[i][c] += p_s[i][j] * v;
      }
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < Tile::kWarpRows; ++r) l_s[warp + r * kAttnWarps] = l[r];
  }
  __syncthreads();
  if constexpr (kKvQ8<KV>) {  // (the rows' values rotated back, in q_s)
    static_assert(kDv <= kDk);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int c = 0; c < Tile::kCols; ++c) {
        const int d = tid + c * kThreads;
        if (d < a.v_head_dim) q_s[i][d] = acc[i][c] / l_s[i];
      }
    }
    __syncthreads();
    HadamardRows(&q_s[0][0], kRows, a.v_head_dim, kDk + 1, a.rot_v);
    __syncthreads();
  }
  const int64_t cols = int64_t{a.n_heads} * a.v_head_dim;  // (a token's row of out)
#pragma unroll
  for (int i = 0; i < kRows; ++i) {  // (every thread every round: the quantizer's shuffles)
    const int64_t t = rows.tok[i];
    const int h = rows.head[i];
#pragma unroll
    for (int c = 0; c < Tile::kCols; ++c) {
      const int d = tid + c * kThreads;
      const bool valid = t >= 0 && d < a.v_head_dim;
      float v = 0.f;
      if (valid) {
        v = kKvQ8<KV> ? q_s[i][d] : acc[i][c] / l_s[i];
        a.out[(t * a.n_heads + h) * a.v_head_dim + d] = v;
      }
      if (a.quant.qs)
        QuantizeValue<32>(v, valid, t, int64_t{h} * a.v_head_dim + d, cols, a.quant, nullptr);
    }
  }
}

}  // namespace
}  // namespace peng::backend::cuda
