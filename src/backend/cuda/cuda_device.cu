// backend::Device on one NVIDIA GPU. Weights are uploaded once in their stored type; every
// quantized format is decoded inside the kernels 32 values (one "unit") at a time:
//   GEMV (n_tokens <= kGemvMaxTokens): one warp per output row, each lane decodes whole units
//     of the row into registers and multiplies them with up to kTokenTile tokens' FP32
//     activations; warp-shuffle reduction, FP32 throughout.
//   GEMM (prefill): the matrix is decoded into an FP16 scratch copy and multiplied by the FP16
//     activations with cublasGemmEx (FP32 accumulation, CUBLAS_COMPUTE_32F).
// Paged attention runs one thread block per (token, head) over the sequence's blocks with an
// online softmax per warp, merged across warps at the end.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "backend/cuda/cuda_device.h"
#ifdef PENG_HAVE_NCCL
#include "backend/cuda/nccl_communicator.h"
#endif
#include "kernels/quant_blocks.h"

namespace peng::backend::cuda {
namespace {

using kernels::BlockQ4_0;
using kernels::BlockQ4_1;
using kernels::BlockQ4_K;
using kernels::BlockQ5_0;
using kernels::BlockQ5_1;
using kernels::BlockQ5_K;
using kernels::BlockQ6_K;
using kernels::BlockQ8_0;

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;     // GEMV: warps (rows) per thread block
constexpr int kTokenTile = 8;        // GEMV: tokens per pass over the weights
constexpr int64_t kGemvMaxTokens = 32;
constexpr int kMaxHeadDim = 256;     // attention: head_dim and v_head_dim
constexpr int kMaxMlaRow = 640;      // MLA: kv_lora_rank + rope dims of a cache row
constexpr int kMaxMlaLatent = 512;   // MLA: kv_lora_rank
constexpr int kAttnWarps = 4;

// ------------------------------------------------------------------------------------------
// Decoding one unit (32 consecutive values of a row) into registers.

__device__ __forceinline__ float Half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float Bf16(uint16_t h) { return __uint_as_float(uint32_t{h} << 16); }
__device__ __forceinline__ uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K scale field (UnpackScalesK).
__device__ __forceinline__ void ScaleMinK(const uint8_t* s, int j, float* sc, float* m) {
  if (j < 4) {
    *sc = static_cast<float>(s[j] & 63);
    *m = static_cast<float>(s[j + 4] & 63);
  } else {
    *sc = static_cast<float>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

template <DType T>
__device__ __forceinline__ void DecodeUnit(const uint8_t* row, int64_t u, float* w) {
  if constexpr (T == DType::kF32) {
    const float* p = reinterpret_cast<const float*>(row) + u * 32;
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = p[i];
  } else if constexpr (T == DType::kF16 || T == DType::kBF16) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + u * 32;
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = T == DType::kF16 ? Half(p[i]) : Bf16(p[i]);
  } else if constexpr (T == DType::kI8) {
    const int8_t* p = reinterpret_cast<const int8_t*>(row) + u * 32;
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(p[i]);
  } else if constexpr (T == DType::kQ4_0 || T == DType::kQ4_1) {
    using B = std::conditional_t<T == DType::kQ4_0, BlockQ4_0, BlockQ4_1>;
    const B& b = reinterpret_cast<const B*>(row)[u];
    const float d = Half(b.d);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int lo = b.qs[i] & 0xF, hi = b.qs[i] >> 4;
      if constexpr (T == DType::kQ4_0) {
        w[i] = d * static_cast<float>(lo - 8);
        w[i + 16] = d * static_cast<float>(hi - 8);
      } else {
        const float m = Half(b.m);
        w[i] = d * static_cast<float>(lo) + m;
        w[i + 16] = d * static_cast<float>(hi) + m;
      }
    }
  } else if constexpr (T == DType::kQ5_0 || T == DType::kQ5_1) {
    using B = std::conditional_t<T == DType::kQ5_0, BlockQ5_0, BlockQ5_1>;
    const B& b = reinterpret_cast<const B*>(row)[u];
    const float d = Half(b.d);
    const uint32_t h = Load32(b.qh);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int lo = (b.qs[i] & 0xF) | ((h >> i) & 1) << 4;
      const int hi = (b.qs[i] >> 4) | ((h >> (i + 16)) & 1) << 4;
      if constexpr (T == DType::kQ5_0) {
        w[i] = d * static_cast<float>(lo - 16);
        w[i + 16] = d * static_cast<float>(hi - 16);
      } else {
        const float m = Half(b.m);
        w[i] = d * static_cast<float>(lo) + m;
        w[i + 16] = d * static_cast<float>(hi) + m;
      }
    }
  } else if constexpr (T == DType::kQ8_0) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[u];
    const float d = Half(b.d);
#pragma unroll
    for (int i = 0; i < 32; ++i) w[i] = static_cast<float>(b.qs[i]) * d;
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    using B = std::conditional_t<T == DType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const B& b = reinterpret_cast<const B*>(row)[u / 8];
    const int j = static_cast<int>(u % 8);
    float sc, m;
    ScaleMinK(b.scales, j, &sc, &m);
    const float ds = Half(b.d) * sc, dm = Half(b.dmin) * m;
    const uint8_t* qs = b.qs + 32 * (j / 2);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int q = (j % 2 == 0) ? (qs[l] & 0xF) : (qs[l] >> 4);
      if constexpr (T == DType::kQ5_K) q |= ((b.qh[l] >> j) & 1) << 4;
      w[l] = ds * static_cast<float>(q) - dm;
    }
  } else if constexpr (T == DType::kQ6_K) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[u / 8];
    const int k = static_cast<int>(u % 8);  // values 32k .. 32k + 31 of the super-block
    const int h = k / 4, kk = k % 4;
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    const float d = Half(b.d);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int v = 32 * kk + l;  // within the half
      int q = v < 64 ? (ql[v] & 0xF) : (ql[v - 64] >> 4);
      q |= ((qh[l] >> (2 * kk)) & 3) << 4;
      const float ds = d * static_cast<float>(b.scales[(128 * h + v) / 16]);
      w[l] = ds * static_cast<float>(q - 32);
    }
  }
}

// Float types may have rows that are not whole units: value i of the tail, decoded alone.
template <DType T>
constexpr bool kFloatType = T == DType::kF32 || T == DType::kF16 || T == DType::kBF16;

template <DType T>
__device__ __forceinline__ float DecodeOne(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::kF32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (T == DType::kF16) {
    return Half(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    return Bf16(reinterpret_cast<const uint16_t*>(row)[i]);
  }
}

// sum_i w[i] x[i] over one unit (32 values); x 16-byte aligned when Vec4.
template <bool Vec4>
__device__ __forceinline__ float UnitDot(const float* w, const float* x) {
  float s = 0.f;
  if constexpr (Vec4) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 a = x4[i];
      s += w[4 * i] * a.x + w[4 * i + 1] * a.y + w[4 * i + 2] * a.z + w[4 * i + 3] * a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) s += w[i] * x[i];
  }
  return s;
}

// This lane's share of row . x: whole units u = lane, lane + 32, ..., then (float types) the
// values past the last whole unit, one per lane.
template <DType T, bool Vec4>
__device__ __forceinline__ float LaneRowDot(const uint8_t* row, int64_t cols, const float* x,
                                            int lane) {
  float wv[32], acc = 0.f;
  for (int64_t u = lane; u < cols / 32; u += kWarp) {
    DecodeUnit<T>(row, u, wv);
    acc += UnitDot<Vec4>(wv, x + u * 32);
  }
  if constexpr (kFloatType<T>) {
    const int64_t i = cols / 32 * 32 + lane;
    if (i < cols) acc += DecodeOne<T>(row, i) * x[i];
  }
  return acc;
}

// ------------------------------------------------------------------------------------------
// Kernels

template <DType T, int NT, bool Vec4>
__global__ void GemvKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                           const float* scales, const float* x, int64_t n_tokens, float* y) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + warp;
  if (r >= rows) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n_tokens - t0 < NT ? static_cast<int>(n_tokens - t0) : NT;
  const uint8_t* row = w + r * row_bytes;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  float wv[32];
  for (int64_t u = lane; u < cols / 32; u += kWarp) {
    DecodeUnit<T>(row, u, wv);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt) acc[t] += UnitDot<Vec4>(wv, x + (t0 + t) * cols + u * 32);
  }
  if constexpr (kFloatType<T>) {
    const int64_t i = cols / 32 * 32 + lane;
    if (i < cols) {
      const float wi = DecodeOne<T>(row, i);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] += wi * x[(t0 + t) * cols + i];
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float s = acc[t];
    for (int o = kWarp / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && t < nt) y[(t0 + t) * rows + r] = scales ? s * scales[r] : s;
  }
}

// Decodes rows x units into an FP16 [rows, cols] copy (INT8 rows scaled).
template <DType T>
__global__ void DecodeToHalfKernel(const uint8_t* w, size_t row_bytes, int64_t rows,
                                   int64_t cols, const float* scales, __half* out) {
  const int64_t units = (cols + 31) / 32;  // the last one partial for float types
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= rows * units) return;
  const int64_t r = i / units, u = i % units;
  const float s = scales ? scales[r] : 1.f;
  __half* o = out + r * cols + u * 32;
  if (u * 32 + 32 > cols) {
    if constexpr (kFloatType<T>)
      for (int64_t c = u * 32; c < cols; ++c)
        out[r * cols + c] = __float2half_rn(DecodeOne<T>(w + r * row_bytes, c) * s);
    return;
  }
  float wv[32];
  DecodeUnit<T>(w + r * row_bytes, u, wv);
#pragma unroll
  for (int k = 0; k < 32; ++k) o[k] = __float2half_rn(wv[k] * s);
}

template <DType T>
__global__ void EmbedKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                            const float* scales, const int32_t* tokens, int64_t row0, float scale,
                            float* out) {
  const int64_t t = blockIdx.x;
  const int64_t id = tokens[t] - row0;
  if (id < 0 || id >= rows) {  // another rank's row (vocabulary-parallel shard)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[t * cols + c] = 0.f;
    return;
  }
  const float s = scale * (scales ? scales[id] : 1.f);
  float wv[32];
  for (int64_t u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    DecodeUnit<T>(w + id * row_bytes, u, wv);
    for (int k = 0; k < 32; ++k) out[t * cols + u * 32 + k] = wv[k] * s;
  }
  if constexpr (kFloatType<T>)
    for (int64_t c = cols / 32 * 32 + threadIdx.x; c < cols; c += blockDim.x)
      out[t * cols + c] = DecodeOne<T>(w + id * row_bytes, c) * s;
}

__global__ void ToHalfKernel(const float* x, int64_t n, __half* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

__device__ float BlockSum(float v, float* shared) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x / kWarp); ++i) s += shared[i];
  __syncthreads();
  return s;
}

__global__ void RmsNormKernel(const float* x, const float* w, float w_offset, float* y, int64_t n,
                              float eps, int64_t stride) {
  __shared__ float shared[32];
  const float* xr = x + int64_t{blockIdx.x} * stride;
  float* yr = y + int64_t{blockIdx.x} * stride;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, shared);
  const float s = static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / n + eps));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] * s) * (w[i] + w_offset);
}

enum class Ew { kAdd, kScale, kSoftcap, kSilu, kGelu };

__global__ void ElementwiseKernel(Ew op, float* y, const float* a, const float* b, float s,
                                  int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  switch (op) {
    case Ew::kAdd: y[i] += a[i]; break;
    case Ew::kScale: y[i] *= s; break;
    case Ew::kSoftcap: y[i] = s * tanhf(y[i] / s); break;
    case Ew::kSilu: {
      const float z = a[i];
      y[i] = z / (1.0f + expf(-z)) * b[i];
      break;
    }
    case Ew::kGelu: {
      const float z = a[i];
      const float u = 0.7978845608028654f * (z + 0.044715f * ((z * z) * z));
      y[i] = 0.5f * z * (1.0f + tanhf(u)) * b[i];
      break;
    }
  }
}

__global__ void BiasRowsKernel(float* y, const float* b, int64_t n_rows, int64_t n) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n_rows * n) y[i] += b[i % n];
}

__global__ void RopeKernel(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
                           const int32_t* pos, int half, bool interleaved, float attention_factor,
                           const float* inv_freq) {
  const int64_t t = blockIdx.x;
  const float fpos = static_cast<float>(pos[t]);
  for (int64_t k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
    const int64_t h = k / half;
    const int i = static_cast<int>(k % half);
    const float theta = fpos * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(theta))) * attention_factor;
    const float s = static_cast<float>(sin(static_cast<double>(theta))) * attention_factor;
    float* xh = x + t * token_stride + h * head_stride;
    float* a = interleaved ? &xh[2 * i] : &xh[i];
    float* b = interleaved ? &xh[2 * i + 1] : &xh[i + half];
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x1 * c + x0 * s;
  }
}

template <typename KV>
__device__ __forceinline__ float KvLoad(const KV* p, int64_t i) {
  if constexpr (sizeof(KV) == 2) {
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

template <typename KV>
__global__ void KvWriteKernel(KV* k_cache, KV* v_cache, const int32_t* slot, int64_t kd,
                              int64_t vd, const float* k, const float* v) {
  const int64_t t = blockIdx.x;
  const int64_t s = slot[t];
  for (int64_t i = threadIdx.x; i < kd; i += blockDim.x) KvStore(k_cache, s * kd + i, k[t * kd + i]);
  for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) KvStore(v_cache, s * vd + i, v[t * vd + i]);
}

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
  float scale, softcap;
  int sliding_window;
};

// One block per (token, head); warp w takes keys start + w, start + w + kAttnWarps, ... with its
// own running maximum, sum and accumulator; the warps' states are merged at the end.
template <typename KV, int kMaxK, int kMaxV>
__global__ void AttentionKernel(AttnArgs a) {
  constexpr int kPerLane = kMaxV / kWarp;
  __shared__ float q_s[kMaxK];
  __shared__ float m_s[kAttnWarps], l_s[kAttnWarps];
  __shared__ float acc_s[kAttnWarps][kMaxV];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t p = a.pos[t];
  const int32_t* table = a.tables + a.table_offset[a.seq_of_token[t]];
  const float* q = a.q + (t * a.n_heads + h) * a.head_dim;
  for (int i = threadIdx.x; i < a.head_dim; i += blockDim.x) q_s[i] = q[i];
  __syncthreads();
  const int64_t first = p - a.sliding_window + 1;
  const int64_t start = a.sliding_window > 0 && first > 0 ? first : 0;
  const KV* kc = static_cast<const KV*>(a.k);
  const KV* vc = static_cast<const KV*>(a.v);
  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.f;
  for (int64_t j = start + warp; j <= p; j += kAttnWarps) {
    const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
    const KV* kr = kc + slot * a.k_stride + int64_t{kvh} * a.head_dim;
    float s = 0.f;
    for (int i = lane; i < a.head_dim; i += kWarp) s += q_s[i] * KvLoad(kr, i);
    for (int o = kWarp / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= a.scale;
    if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
    const KV* vr = vc + slot * a.v_stride + int64_t{kvh} * a.v_head_dim;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + i * kWarp;
      if (d < a.v_head_dim) acc[i] = acc[i] * corr + e * KvLoad(vr, d);
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
  float* out = a.out + (t * a.n_heads + h) * a.v_head_dim;
  for (int d = threadIdx.x; d < a.v_head_dim; d += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (l_s[w] > 0.f) s += acc_s[w][d] * expf(m_s[w] - mm);
    out[d] = s / ll;
  }
}

// out[t, h, j] = sum_i W_UK[h][i][j] q_nope[t, h, i] for j < r, then q_pe.
__global__ void MlaAbsorbKernel(const float* q, const float* w_kvb, int H, int r, int dn, int dr,
                                int dv, float* out) {
  const int64_t th = blockIdx.x;  // token * H + head
  const int h = static_cast<int>(th % H);
  const float* qh = q + th * (dn + dr);
  const float* w = w_kvb + int64_t{h} * (dn + dv) * r;
  float* o = out + th * (r + dr);
  for (int j = threadIdx.x; j < r; j += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < dn; ++i) s += w[int64_t{i} * r + j] * qh[i];
    o[j] = s;
  }
  for (int j = threadIdx.x; j < dr; j += blockDim.x) o[r + j] = qh[dn + j];
}

// out[t, h * dv + i] = sum_j W_UV[h][i][j] o_lat[t, h, j]: one warp per output value.
__global__ void MlaProjectKernel(const float* o_lat, const float* w_kvb, int H, int r, int dn,
                                 int dv, float* out) {
  const int64_t th = blockIdx.x;
  const int h = static_cast<int>(th % H);
  const int i = blockIdx.y * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (i >= dv) return;
  const float* w = w_kvb + (int64_t{h} * (dn + dv) + dn + i) * r;
  const float* ol = o_lat + th * r;
  float s = 0.f;
  for (int j = lane; j < r; j += kWarp) s += w[j] * ol[j];
  for (int o = kWarp / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[th * dv + i] = s;
}

constexpr int kMaxTopK = 16;
constexpr int kMaxGroups = 16;

// Index of the largest of v[0..n) not yet taken (ties: lower index).
__device__ int ArgMaxFree(const float* v, int n, const bool* taken) {
  int best = -1;
  for (int i = 0; i < n; ++i)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  return best;
}

// One thread per token: kernels::MoeRoute's arithmetic (softmax in double precision, ties to the
// lower index).
__global__ void MoeRouteKernel(const float* logits, const float* bias, int64_t T,
                               kernels::MoeRouting p, int32_t* ids_out, float* w_out) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int E = p.n_experts, k = p.k;
  float s[kernels::kMaxRoutedExperts], choice[kernels::kMaxRoutedExperts];
  bool taken[kernels::kMaxRoutedExperts];
  const float* lg = logits + t * E;
  if (p.sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(1.0 / (1.0 + exp(-double{lg[e]})));
  } else {
    double m = lg[0], sum = 0;
    for (int e = 1; e < E; ++e) m = fmax(m, double{lg[e]});
    for (int e = 0; e < E; ++e) sum += exp(lg[e] - m);
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(exp(lg[e] - m) / sum);
  }
  for (int e = 0; e < E; ++e) {
    choice[e] = s[e] + (bias ? bias[e] : 0.f);
    taken[e] = false;
  }
  const int G = p.n_group > 1 ? p.n_group : 1;
  if (p.method != kernels::MoeRouting::Method::kGreedy && G > 1) {
    const int per = E / G;
    float gs[kMaxGroups];
    bool gtaken[kMaxGroups], keep[kMaxGroups];
    for (int g = 0; g < G; ++g) {
      const float* v = choice + g * per;
      float a = -INFINITY, b = -INFINITY;
      for (int e = 0; e < per; ++e) {
        if (v[e] > a) {
          b = a;
          a = v[e];
        } else if (v[e] > b) {
          b = v[e];
        }
      }
      gs[g] = p.method == kernels::MoeRouting::Method::kNoauxTc && per >= 2 ? a + b : a;
      gtaken[g] = keep[g] = false;
    }
    for (int j = 0; j < p.topk_group; ++j) {
      const int g = ArgMaxFree(gs, G, gtaken);
      gtaken[g] = keep[g] = true;
    }
    for (int e = 0; e < E; ++e)
      if (!keep[e / per]) choice[e] = 0.f;
  }
  int32_t* ids = ids_out + t * k;
  float* w = w_out + t * k;
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    const int e = ArgMaxFree(choice, E, taken);
    taken[e] = true;
    ids[j] = e;
    sum += w[j] = s[e];
  }
  const bool norm = p.method == kernels::MoeRouting::Method::kNoauxTc && p.norm_topk_prob;
  for (int j = 0; j < k; ++j) {
    const double v = norm ? w[j] / (sum + 1e-20) : w[j];
    w[j] = static_cast<float>(v * p.routed_scaling_factor);
  }
}

// GEMV of each (token, slot) pair with its expert's matrix: one warp per row; blockIdx.y is the
// pair. Only the selected experts' rows are read.
template <DType T, bool Vec4>
__global__ void ExpertsGemvKernel(const uint8_t* const* experts, size_t row_bytes, int64_t rows,
                                  int64_t cols, const float* x, const int32_t* ids, int k,
                                  bool x_per_slot, int64_t pair0, float* y) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + warp;
  if (r >= rows) return;
  const int64_t pair = pair0 + blockIdx.y;
  const uint8_t* row = experts[ids[pair]] + r * row_bytes;
  const float* xp = x + (x_per_slot ? pair : pair / k) * cols;
  float acc = LaneRowDot<T, Vec4>(row, cols, xp, lane);
  for (int o = kWarp / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[pair * rows + r] = acc;
}

__global__ void SlotSumKernel(const float* y, const float* w, int64_t T, int k, int64_t n,
                              float* out) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= T * n) return;
  const int64_t t = i / n, c = i % n;
  float s = 0.f;
  for (int j = 0; j < k; ++j) s += w[t * k + j] * y[(t * k + j) * n + c];
  out[i] += s;
}

// Sums every float4 of x (grid-stride): the read-bandwidth probe.
__global__ void ReadKernel(const float4* x, int64_t n, float* sink) {
  float s = 0.f;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = x[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 1234.5f) *sink = s;  // (keeps the loads)
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, int64_t n_cols, float* dst) {
  const int64_t i = blockIdx.x;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x)
    dst[i * n_cols + c] = src[int64_t{rows[i]} * n_cols + c];
}

// ------------------------------------------------------------------------------------------

// Calls f.template operator()<T>() for the weight type t; false when unsupported.
template <typename F>
bool WithType(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f.template operator()<DType::kF32>(); return true;
    case DType::kF16: f.template operator()<DType::kF16>(); return true;
    case DType::kBF16: f.template operator()<DType::kBF16>(); return true;
    case DType::kI8: f.template operator()<DType::kI8>(); return true;
    case DType::kQ4_0: f.template operator()<DType::kQ4_0>(); return true;
    case DType::kQ4_1: f.template operator()<DType::kQ4_1>(); return true;
    case DType::kQ5_0: f.template operator()<DType::kQ5_0>(); return true;
    case DType::kQ5_1: f.template operator()<DType::kQ5_1>(); return true;
    case DType::kQ8_0: f.template operator()<DType::kQ8_0>(); return true;
    case DType::kQ4_K: f.template operator()<DType::kQ4_K>(); return true;
    case DType::kQ5_K: f.template operator()<DType::kQ5_K>(); return true;
    case DType::kQ6_K: f.template operator()<DType::kQ6_K>(); return true;
    default: return false;
  }
}

struct Nothing {
  template <DType>
  void operator()() const {}
};

int64_t Blocks(int64_t n, int64_t per) { return (n + per - 1) / per; }

class CudaDevice final : public Device {
 public:
  ~CudaDevice() override {
    cudaSetDevice(index_);
    cudaStreamSynchronize(stream_);
    for (void* p : blocks_) cudaFree(p);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  static StatusOr<std::unique_ptr<Device>> Open(int index) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
      return NotFound(std::string("no CUDA device: ") + cudaGetErrorString(e));
    if (index >= n)
      return InvalidArgument("cuda:" + std::to_string(index) + ": this machine has " +
                             std::to_string(n) + " CUDA device(s)");
    std::unique_ptr<CudaDevice> d(new CudaDevice());
    d->index_ = index;
    PENG_RETURN_IF_ERROR(Check(cudaSetDevice(index), "cudaSetDevice"));
    cudaDeviceProp prop{};
    PENG_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties"));
    char mem[32];
    std::snprintf(mem, sizeof mem, "%.1f GiB", prop.totalGlobalMem / 1073741824.0);
    d->name_ = "cuda:" + std::to_string(index) + " (" + prop.name + ", " + mem + ", sm_" +
               std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    PENG_RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking),
                               "cudaStreamCreate"));
    if (cublasCreate(&d->blas_) != CUBLAS_STATUS_SUCCESS) return Internal("cublasCreate failed");
    cublasSetStream(d->blas_, d->stream_);
    return std::unique_ptr<Device>(std::move(d));
  }

  std::string Name() const override { return name_; }
  int64_t FreeMemoryBytes() const override {
    size_t free = 0, total = 0;
    cudaSetDevice(index_);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return static_cast<int64_t>(free);
  }

  StatusOr<void*> Alloc(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<int64_t>(bytes, 256));
    if (e != cudaSuccess)
      return ResourceExhausted(name_ + ": cannot allocate " + std::to_string(bytes) +
                               " bytes: " + cudaGetErrorString(e));
    blocks_.insert(p);
    return p;
  }
  void Free(void* p) override {
    if (blocks_.erase(p)) {
      cudaStreamSynchronize(stream_);
      cudaFree(p);
    }
  }
  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    return Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    PENG_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download"));
    return Synchronize();
  }
  void CopyOnDevice(void* dst, const void* src, int64_t bytes) override {
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void Fill(void* dst, uint8_t value, int64_t bytes) override {
    Note(cudaMemsetAsync(dst, value, bytes, stream_));
  }
  Status Synchronize() override {
    Note(cudaStreamSynchronize(stream_));
    Status s = error_;
    (void)(error_ = OkStatus());
    return s;
  }

  double MeasureReadBandwidth(int64_t bytes) override {
    StatusOr<void*> buf = Alloc(bytes + 256);
    if (!buf.ok()) return 0;
    Fill(*buf, 0, bytes + 256);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, index_);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    double best = 0;
    for (int pass = 0; pass < 4; ++pass) {  // the first is a warm-up
      cudaEventRecord(a, stream_);
      ReadKernel<<<prop.multiProcessorCount * 8, 512, 0, stream_>>>(
          static_cast<const float4*>(*buf), bytes / 16, static_cast<float*>(*buf) + bytes / 4);
      cudaEventRecord(b, stream_);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      if (pass > 0 && ms > 0) best = std::max(best, bytes / (ms * 1e-3));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    Free(*buf);
    return Synchronize().ok() ? best : 0;
  }

  StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(Communicator* group) override {
#ifdef PENG_HAVE_NCCL
    return CreateNcclCommunicator(group, index_, stream_);
#else
    return Unimplemented(name_ + ": built without NCCL, no collectives across GPUs");
#endif
  }

  bool SupportsWeights(DType t) const override {
    return WithType(t, Nothing{});
  }
  StatusOr<DeviceMatrix> Upload(const TensorView& w, const float* int8_scales) override {
    if (w.ndim() != 2) return InvalidArgument(w.name + ": a device matrix must be 2-D");
    if (!SupportsWeights(w.dtype))
      return Unimplemented(w.name + ": weights of type " + DTypeName(w.dtype) + " on " + name_);
    if (w.dtype == DType::kI8 && !int8_scales)
      return InvalidArgument(w.name + ": INT8 weights need their scales");
    DeviceMatrix m;
    m.dtype = w.dtype;
    m.rows = w.rows();
    m.cols = w.cols();
    m.row_bytes = w.row_bytes();
    m.host = w;
    const int64_t bytes = static_cast<int64_t>(m.row_bytes) * m.rows;
    PENG_ASSIGN_OR_RETURN(void* p, Alloc(bytes));
    PENG_RETURN_IF_ERROR(CopyToDevice(p, w.data, bytes));
    m.data = p;
    if (int8_scales) {
      PENG_ASSIGN_OR_RETURN(m.scales, UploadFloats(int8_scales, m.rows));
    }
    return m;
  }

  void MatMul(const DeviceMatrix& w, const float* x, int64_t T, float* y) override {
    if (T <= 0) return;
    const uint8_t* wd = static_cast<const uint8_t*>(w.data);
    if (T <= kGemvMaxTokens) {
      const bool vec4 = w.cols % 4 == 0;
      WithType(w.dtype, [&]<DType D>() {
        const dim3 block(kRowsPerBlock * kWarp);
        const dim3 one(Blocks(w.rows, kRowsPerBlock), 1);
        const dim3 tiles(Blocks(w.rows, kRowsPerBlock), Blocks(T, kTokenTile));
        auto args = [&](auto kernel, dim3 grid) {
          kernel<<<grid, block, 0, stream_>>>(wd, w.row_bytes, w.rows, w.cols, w.scales, x, T, y);
        };
        if (T == 1) {
          vec4 ? args(GemvKernel<D, 1, true>, one) : args(GemvKernel<D, 1, false>, one);
        } else {
          vec4 ? args(GemvKernel<D, kTokenTile, true>, tiles)
               : args(GemvKernel<D, kTokenTile, false>, tiles);
        }
      });
      Note(cudaGetLastError());
      return;
    }
    // Prefill: FP16 copies of W and x, cuBLAS with FP32 accumulation.
    if (!Grow(&w_half_, &w_half_bytes_, w.rows * w.cols * 2) ||
        !Grow(&x_half_, &x_half_bytes_, T * w.cols * 2))
      return;
    __half* wh = static_cast<__half*>(w_half_);
    __half* xh = static_cast<__half*>(x_half_);
    WithType(w.dtype, [&]<DType D>() {
      DecodeToHalfKernel<D><<<Blocks(w.rows * ((w.cols + 31) / 32), 256), 256, 0, stream_>>>(
          wd, w.row_bytes, w.rows, w.cols, w.scales, wh);
    });
    ToHalfKernel<<<Blocks(T * w.cols, 256), 256, 0, stream_>>>(x, T * w.cols, xh);
    Note(cudaGetLastError());
    const float one = 1.f, zero = 0.f;
    // Column-major: Y^T [rows, T] = W^T^T [rows, cols] x X^T [cols, T].
    const cublasStatus_t s = cublasGemmEx(
        blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), static_cast<int>(T),
        static_cast<int>(w.cols), &one, wh, CUDA_R_16F, static_cast<int>(w.cols), xh, CUDA_R_16F,
        static_cast<int>(w.cols), &zero, y, CUDA_R_32F, static_cast<int>(w.rows),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
      Keep(Internal(name_ + ": cublasGemmEx failed (" + std::to_string(s) + ")"));
  }

  void EmbedRows(const DeviceMatrix& w, const StepBatch& b, float scale, float* out,
                 int64_t row0) override {
    if (b.n_tokens == 0) return;
    WithType(w.dtype, [&]<DType D>() {
      EmbedKernel<D><<<b.n_tokens, 128, 0, stream_>>>(static_cast<const uint8_t*>(w.data),
                                                      w.row_bytes, w.rows, w.cols, w.scales,
                                                      b.d_tokens, row0, scale, out);
    });
    Note(cudaGetLastError());
  }
  void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows,
               int64_t n, float eps, int64_t stride) override {
    if (n_rows == 0) return;
    RmsNormKernel<<<n_rows, 256, 0, stream_>>>(x, w, w_offset, y, n, eps, stride ? stride : n);
    Note(cudaGetLastError());
  }
  void AddBiasRows(float* y, const float* b, int64_t n_rows, int64_t n) override {
    if (!b || n_rows * n == 0) return;
    BiasRowsKernel<<<Blocks(n_rows * n, 256), 256, 0, stream_>>>(y, b, n_rows, n);
    Note(cudaGetLastError());
  }
  void Add(float* y, const float* x, int64_t n) override { Elementwise(Ew::kAdd, y, x, nullptr, 0, n); }
  void Scale(float* y, float s, int64_t n) override { Elementwise(Ew::kScale, y, nullptr, nullptr, s, n); }
  void Softcap(float* y, float cap, int64_t n) override {
    Elementwise(Ew::kSoftcap, y, nullptr, nullptr, cap, n);
  }
  void Gated(GatedActivation act, const float* gate, const float* up, float* out,
             int64_t n) override {
    Elementwise(act == GatedActivation::kSilu ? Ew::kSilu : Ew::kGelu, out, gate, up, 0, n);
  }
  void Rope(float* x, int64_t n_heads, int64_t head_stride, int64_t token_stride,
            const StepBatch& b, const kernels::RopeConfig& cfg, const float* inv_freq) override {
    if (b.n_tokens == 0) return;
    RopeKernel<<<b.n_tokens, 128, 0, stream_>>>(x, n_heads, head_stride, token_stride, b.d_pos,
                                                cfg.rot_dim / 2,
                                                cfg.style == kernels::RopeStyle::kInterleaved,
                                                cfg.attention_factor, inv_freq);
    Note(cudaGetLastError());
  }
  void KvWrite(const kernels::KvLayerView& kv, const StepBatch& b, const float* k,
               const float* v) override {
    if (b.n_tokens == 0) return;
    const int64_t kd = int64_t{kv.n_kv_heads} * kv.head_dim;
    const int64_t vd = int64_t{kv.n_kv_heads} * kv.v_head_dim;
    if (kv.dtype == DType::kF16) {
      KvWriteKernel<uint16_t><<<b.n_tokens, 128, 0, stream_>>>(
          static_cast<uint16_t*>(kv.k), static_cast<uint16_t*>(kv.v), b.d_slot, kd, vd, k, v);
    } else {
      KvWriteKernel<float><<<b.n_tokens, 128, 0, stream_>>>(
          static_cast<float*>(kv.k), static_cast<float*>(kv.v), b.d_slot, kd, vd, k, v);
    }
    Note(cudaGetLastError());
  }
  void PagedAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                      const kernels::AttentionParams& p, float* out) override {
    if (b.n_tokens == 0) return;
    if (kv.head_dim > kMaxHeadDim || kv.v_head_dim > kMaxHeadDim) {
      Keep(Unimplemented(name_ + ": head_dim above 256"));
      return;
    }
    AttnArgs a = Args(q, out, kv, b);
    a.k_stride = int64_t{kv.n_kv_heads} * kv.head_dim;
    a.v_stride = int64_t{kv.n_kv_heads} * kv.v_head_dim;
    a.n_heads = p.n_heads;
    a.scale = p.scale;
    a.softcap = p.softcap;
    a.sliding_window = p.sliding_window;
    const dim3 grid(static_cast<unsigned>(b.n_tokens), static_cast<unsigned>(p.n_heads));
    if (kv.dtype == DType::kF16) {
      AttentionKernel<uint16_t, kMaxHeadDim, kMaxHeadDim>
          <<<grid, kAttnWarps * kWarp, 0, stream_>>>(a);
    } else {
      AttentionKernel<float, kMaxHeadDim, kMaxHeadDim><<<grid, kAttnWarps * kWarp, 0, stream_>>>(a);
    }
    Note(cudaGetLastError());
  }
  void MlaAttention(const float* q, const kernels::KvLayerView& kv, const StepBatch& b,
                    const kernels::MlaParams& p, float* out) override {
    if (b.n_tokens == 0) return;
    if (kv.head_dim > kMaxMlaRow || p.kv_lora_rank > kMaxMlaLatent) {
      Keep(Unimplemented(name_ + ": MLA rows above 640 or latents above 512 values"));
      return;
    }
    AttnArgs a = Args(q, out, kv, b);
    a.v = kv.k;  // the value is the latent part of the same row
    a.k_stride = a.v_stride = kv.head_dim;
    a.n_heads = p.n_heads;
    a.n_kv_heads = 1;
    a.v_head_dim = p.kv_lora_rank;
    a.scale = p.scale;
    const dim3 grid(static_cast<unsigned>(b.n_tokens), static_cast<unsigned>(p.n_heads));
    if (kv.dtype == DType::kF16) {
      AttentionKernel<uint16_t, kMaxMlaRow, kMaxMlaLatent>
          <<<grid, kAttnWarps * kWarp, 0, stream_>>>(a);
    } else {
      AttentionKernel<float, kMaxMlaRow, kMaxMlaLatent>
          <<<grid, kAttnWarps * kWarp, 0, stream_>>>(a);
    }
    Note(cudaGetLastError());
  }
  void MlaAbsorbQuery(const float* q, int64_t T, const float* w_kvb, const kernels::MlaParams& p,
                      float* out) override {
    if (T == 0) return;
    MlaAbsorbKernel<<<T * p.n_heads, 256, 0, stream_>>>(q, w_kvb, p.n_heads, p.kv_lora_rank,
                                                        p.d_nope, p.d_rope, p.d_v, out);
    Note(cudaGetLastError());
  }
  void MlaProjectOutput(const float* o_lat, int64_t T, const float* w_kvb,
                        const kernels::MlaParams& p, float* out) override {
    if (T == 0) return;
    MlaProjectKernel<<<dim3(T * p.n_heads, Blocks(p.d_v, kRowsPerBlock)), kRowsPerBlock * kWarp, 0,
                       stream_>>>(o_lat, w_kvb, p.n_heads, p.kv_lora_rank, p.d_nope, p.d_v, out);
    Note(cudaGetLastError());
  }
  void MoeRoute(const float* logits, const float* bias, int64_t T, const kernels::MoeRouting& p,
                int32_t* ids, float* w) override {
    if (T == 0) return;
    if (p.n_experts > kernels::kMaxRoutedExperts || p.k > kMaxTopK || p.n_group > kMaxGroups) {
      Keep(Unimplemented(name_ + ": routing over more than 512 experts, 16 groups or top-16"));
      return;
    }
    MoeRouteKernel<<<Blocks(T, 64), 64, 0, stream_>>>(logits, bias, T, p, ids, w);
    Note(cudaGetLastError());
  }
  void ExpertsMatMul(const DeviceExperts& w, const float* x, int64_t T, const int32_t* ids, int k,
                     bool x_per_slot, float* y) override {
    if (T == 0) return;
    const bool vec4 = w.cols % 4 == 0;
    WithType(w.dtype, [&]<DType D>() {
      auto kernel = vec4 ? ExpertsGemvKernel<D, true> : ExpertsGemvKernel<D, false>;
      constexpr int64_t kMaxGridY = 65535;
      for (int64_t p0 = 0; p0 < T * k; p0 += kMaxGridY) {
        const dim3 grid(Blocks(w.rows, kRowsPerBlock), std::min(kMaxGridY, T * k - p0));
        kernel<<<grid, kRowsPerBlock * kWarp, 0, stream_>>>(w.data, w.row_bytes, w.rows, w.cols,
                                                            x, ids, k, x_per_slot, p0, y);
      }
    });
    Note(cudaGetLastError());
  }
  void SlotSum(const float* y, const float* w, int64_t T, int k, int64_t n, float* out) override {
    if (T == 0) return;
    SlotSumKernel<<<Blocks(T * n, 256), 256, 0, stream_>>>(y, w, T, k, n, out);
    Note(cudaGetLastError());
  }
  void GatherRows(const float* src, const int32_t* rows, int64_t n, int64_t n_cols,
                  float* dst) override {
    if (n == 0) return;
    GatherRowsKernel<<<n, 256, 0, stream_>>>(src, rows, n_cols, dst);
    Note(cudaGetLastError());
  }

 private:
  CudaDevice() = default;

  AttnArgs Args(const float* q, float* out, const kernels::KvLayerView& kv, const StepBatch& b) {
    AttnArgs a{};
    a.q = q;
    a.out = out;
    a.k = kv.k;
    a.v = kv.v;
    a.pos = b.d_pos;
    a.seq_of_token = b.d_seq_of_token;
    a.table_offset = b.d_table_offset;
    a.tables = b.d_tables;
    a.n_kv_heads = kv.n_kv_heads;
    a.head_dim = kv.head_dim;
    a.v_head_dim = kv.v_head_dim;
    a.block_size = kv.block_size;
    return a;
  }
  static Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return OkStatus();
    return Internal(std::string(what) + ": " + cudaGetErrorString(e));
  }
  // Keeps the first asynchronous error for Synchronize().
  void Note(cudaError_t e) {
    if (e != cudaSuccess) Keep(Internal(name_ + ": " + cudaGetErrorString(e)));
  }
  void Keep(Status s) {
    if (error_.ok()) (void)(error_ = std::move(s));
  }
  void Elementwise(Ew op, float* y, const float* a, const float* b, float s, int64_t n) {
    if (n == 0) return;
    ElementwiseKernel<<<Blocks(n, 256), 256, 0, stream_>>>(op, y, a, b, s, n);
    Note(cudaGetLastError());
  }
  // Scratch that grows to the largest request (freed after the stream's pending work).
  bool Grow(void** p, int64_t* have, int64_t need) {
    if (need <= *have) return true;
    if (*p) Free(*p);
    *p = nullptr;
    *have = 0;
    StatusOr<void*> q = Alloc(need);
    if (!q.ok()) {
      Keep(q.status());
      return false;
    }
    *p = *q;
    *have = need;
    return true;
  }

  int index_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::set<void*> blocks_;
  Status error_;
  void* w_half_ = nullptr;
  void* x_half_ = nullptr;
  int64_t w_half_bytes_ = 0, x_half_bytes_ = 0;
};

}  // namespace

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

StatusOr<std::unique_ptr<Device>> CreateDevice(int index) { return CudaDevice::Open(index); }

}  // namespace peng::backend::cuda
