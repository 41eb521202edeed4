// The CUDA backend's kernels (included by cuda_device.cu only: one translation unit; the KV
// cache's and attention's are in attention_kernels.cuh, the mixture-of-experts ones in
// moe_kernels.cuh, MLA's in mla_kernels.cuh, the logit rows' in logits_kernels.cuh). Weights
// are in the device layout (weight_layout.h). The quantized GEMVs (QGemvKernel,
// moe_kernels.cuh's ExpertsQGemvKernel) take a unit (32 values) a lane and multiply it with int8
// activations by dp4a (layout::DecodeUnit, UnitDot); the FP32 paths decode one value at a time
// (layout::DecodeValue): the FP32 GEMVs a value a lane, the FP16 copies of prefill GEMMs and
// the embedding a unit at a time (DecodeUnit). FP32 accumulation throughout.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/runtime.h"
#include "backend/cuda/weight_layout.h"
#include "backend/device.h"
#include "core/dtype.h"

namespace peng::backend::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;     // GEMV: warps (rows) per thread block
constexpr int kTokenTile = 8;        // GEMV: tokens per pass over the weights
constexpr int64_t kGemvMaxTokens = 64;         // GEMV up to here, GEMM (cuBLAS) past it
constexpr int64_t kExpertsGemvMaxTokens = 32;  // experts: a GEMV a (token, slot) up to here
constexpr int kMaxHeadDim = 256;     // attention: head_dim and v_head_dim
constexpr int kMaxMlaRow = 640;      // MLA: kv_lora_rank + rope dims of a cache row
constexpr int kMaxMlaLatent = 512;   // MLA: kv_lora_rank
constexpr int kAttnWarps = 4;

// The sum / the maximum of v over the warp's lanes (butterfly: every lane gets it).
struct AddOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
  __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MinOp {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
__device__ __forceinline__ float WarpSum(float v) { return WarpButterfly(v, AddOp{}); }
__device__ __forceinline__ float WarpMax(float v) { return WarpButterfly(v, MaxOp{}); }

// What a GEMV does with the dot product s of row r (of `rows`) and token t
// (Device::MatMulOut): y = s + bias[r], or y += s + bias[r] when accumulating (the residual
// add folded into the product), plus the slots' weighted rows where set (SlotSum folded in).
// The integer GEMV of INT8 weights (W8A8) scales s by the row's weight scale first.
struct Epilogue {
  const float* bias = nullptr;
  bool accumulate = false;
  SlotRows slots;
  const float* row_scale = nullptr;
  __device__ __forceinline__ void Store(float* y, int64_t t, int64_t r, int64_t rows,
                                        float s) const {
    if (row_scale) s = row_scale[r] * s;
    if (bias) s += bias[r];
    if (slots.rows) {
      float a = 0.f;
      for (int j = 0; j < slots.k; ++j)
        a += slots.w[t * slots.k + j] * slots.rows[(t * slots.k + j) * rows + r];
      s += a;
    }
    *y = accumulate ? *y + s : s;
  }
};

// ------------------------------------------------------------------------------------------
// Decoding (weight_layout.h): a unit is 32 consecutive values of a row in the device layout;
// n the units of a row.

// The whole unit u into registers (the embedding and the FP16 copies of prefill GEMMs).
template <DType T>
__device__ __forceinline__ void DecodeUnit(const uint8_t* row, int64_t n, int64_t u, float* w) {
#pragma unroll
  for (int l = 0; l < 32; ++l) w[l] = layout::DecodeValue<T>(row, n, u, l);
}

// Float types may have rows that are not whole units: the values of the tail are decoded one
// at a time (DecodeOne).
template <DType T>
constexpr bool kFloatType = T == DType::kF32 || T == DType::kF16 || T == DType::kBF16;

template <DType T>
__device__ __forceinline__ float DecodeOne(const uint8_t* row, int64_t n, int64_t i) {
  return layout::DecodeValue<T>(row, n, i / 32, static_cast<int>(i % 32));
}

// acc[t] += this lane's share of row . xs[t] for the nt (<= NT) FP32 activation rows xs[t]:
// unit by unit, lane l decodes value l and multiplies it with value l of the unit's
// activations (one coalesced 128-byte load a token). The values past the last whole unit
// (float types) come last, one a lane.
// (WarpRowDotOf: value i of activation row t is x(t, i).)
template <DType T, int NT, typename X>
__device__ __forceinline__ void WarpRowDotOf(const uint8_t* row, int64_t cols, X x, int nt,
                                             int lane, float* acc) {
  const int64_t units = cols / 32;
#pragma unroll 4
  for (int64_t c = 0; c < units; ++c) {
    const float w = layout::DecodeValue<T>(row, units, c, lane);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt) acc[t] += w * x(t, c * 32 + lane);
  }
  if constexpr (kFloatType<T>) {
    const int64_t i = units * 32 + lane;
    if (i < cols) {
      const float wi = DecodeOne<T>(row, units, i);
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < nt) acc[t] += wi * x(t, i);
    }
  }
}
template <DType T, int NT>
__device__ __forceinline__ void WarpRowDot(const uint8_t* row, int64_t cols,
                                           const float* const* xs, int nt, int lane, float* acc) {
  WarpRowDotOf<T, NT>(row, cols, [xs](int t, int64_t i) { return xs[t][i]; }, nt, lane, acc);
}

// ------------------------------------------------------------------------------------------
// Kernels

// The start of every kernel (runtime.h, programmatic dependent launch): the next kernel on the
// stream may be launched; then this one waits for the kernels before it.
__device__ __forceinline__ void KernelStart() {
  GridLaunchDependents();
  GridWait();
}

// A GEMV block's start: its n_rows rows from row r0 of w (rows of row_bytes, contiguous) are
// prefetched into L2 -- by the block's first token tile, or where `prefetch` says -- before it
// waits: the weights are written by no kernel, so they stream in while the kernel before
// finishes.
__device__ __forceinline__ void GemvStart(const uint8_t* w, size_t row_bytes, int64_t r0,
                                          int64_t n_rows, bool prefetch = blockIdx.y == 0) {
  GridLaunchDependents();
  if (prefetch && n_rows > 0) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(w + r0 * row_bytes) / 128;
    const uintptr_t last = (reinterpret_cast<uintptr_t>(w + (r0 + n_rows) * row_bytes) - 1) / 128;
    for (uintptr_t l = first + threadIdx.x; l <= last; l += blockDim.x)
      PrefetchL2(reinterpret_cast<const void*>(l * 128));
  }
  GridWait();
}

template <DType T, int NT>
__global__ void GemvKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                           const float* scales, const float* x, int64_t n_tokens, float* y,
                           Epilogue ep) {
  const int64_t r0 = int64_t{blockIdx.x} * kRowsPerBlock;
  GemvStart(w, row_bytes, r0, rows - r0 < kRowsPerBlock ? rows - r0 : kRowsPerBlock);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = r0 + warp;
  if (r >= rows) return;
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n_tokens - t0 < NT ? static_cast<int>(n_tokens - t0) : NT;
  float acc[NT];
  const float* xs[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    acc[t] = 0.f;
    xs[t] = x + (t0 + t) * cols;
  }
  WarpRowDot<T, NT>(w + r * row_bytes, cols, xs, nt, lane, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = WarpSum(acc[t]);
    if (lane == 0 && t < nt)
      ep.Store(&y[(t0 + t) * rows + r], t0 + t, r, rows, scales ? s * scales[r] : s);
  }
}

// ------------------------------------------------------------------------------------------
// The quantized path of the GEMVs (weight_layout.h): the activations quantized as the CPU
// kernels quantize them, the weights' units multiplied with them by dp4a.

// Quantized activation rows: row t's int8 values at qs + t * cols (in layout::ActIndex's
// order), its block scales (one per ab = 32 or 256 values) at d + t * (cols / ab), its sums of
// every 16 values at s + t * (cols / 16).
struct QAct {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const int32_t* s = nullptr;
  int64_t cols = 0;  // (ab, the values a scale covers, is the weight type's: kActBlock)
};

// Where QuantizeValue writes (the QAct it fills); null qs: nothing to quantize. w8a8: blocks
// of 32 with INT8 W8A8's arithmetic (layout::W8A8ActScale) instead of the GGUF formats'.
struct QActOut {
  int8_t* qs = nullptr;
  float* d = nullptr;
  int32_t* s = nullptr;
  bool w8a8 = false;
};

// Quantizes value v, element i of activation row t of `cols` (kernels::ref::QuantizeAct's
// arithmetic, or kernels::QuantizeActivations' for o.w8a8). Every thread of a 256-thread block
// calls it together for the 256 consecutive elements 256 c .. 256 c + 255 (a thread's
// i = 256 c + threadIdx.x; valid: i < cols, v = 0 past the end; cols is a multiple of AB, so
// whole warps are past it).
template <int AB>
__device__ __forceinline__ void QuantizeValue(float v, bool valid, int64_t t, int64_t i,
                                              int64_t cols, const QActOut& o,
                                              float* warp_max /* [8], shared */) {
  static_assert(AB == 32 || AB == 256);
  float amax = WarpMax(fabsf(v));
  if constexpr (AB == 256) {
    if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = amax;
    __syncthreads();
    amax = 0.f;
    for (int w = 0; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
    __syncthreads();  // (read by all before the next call writes)
  }
  layout::ActScale scale;
  int8_t q;
  if (AB == 32 && o.w8a8) {
    scale = layout::W8A8ActScale(amax);
    q = layout::QuantizeW8A8Value(v, scale.d);
  } else {
    scale = layout::ActBlockScale<AB>(amax);
    q = layout::QuantizeActValue(v, scale.iscale);
  }
  const int sum = WarpButterfly<8>(int{q}, AddOp{});  // (over each 16 lanes)
  if (!valid) return;
  o.qs[t * cols + layout::ActIndex(i, cols)] = q;
  if (i % 16 == 0) o.s[t * (cols / 16) + i / 16] = sum;
  if (i % AB == 0) o.d[t * (cols / AB) + i / AB] = scale.d;
}

// v quantized into the QActs asked for (q32 / q256 with non-null qs).
__device__ __forceinline__ void QuantizeValues(float v, bool valid, int64_t t, int64_t i,
                                               int64_t cols, const QActOut& q32,
                                               const QActOut& q256, float* warp_max) {
  if (q32.qs) QuantizeValue<32>(v, valid, t, i, cols, q32, warp_max);
  if (q256.qs) QuantizeValue<256>(v, valid, t, i, cols, q256, warp_max);
}

// x [rows, cols] -> QActs: block (c, t) quantizes values 256 c .. 256 c + 255 of row t.
__global__ void QuantizeActKernel(const float* x, int64_t cols, QActOut q32, QActOut q256) {
  KernelStart();
  __shared__ float warp_max[8];
  const int64_t t = blockIdx.y;
  const int64_t i = int64_t{blockIdx.x} * 256 + threadIdx.x;
  const bool valid = i < cols;
  QuantizeValues(valid ? x[t * cols + i] : 0.f, valid, t, i, cols, q32, q256, warp_max);
}

// acc[t] += this lane's share of row . activation row row_of(t) for t < nt: the lane takes
// units first, first + stride, ...; each unit is decoded once for all nt tokens.
template <DType T, int NT, typename RowOf>
__device__ __forceinline__ void WarpRowQDotRows(const uint8_t* row, const QAct& a, RowOf row_of,
                                                int nt, int first, int stride, float* acc) {
  constexpr int kPerScale = layout::kActBlock<T> / 32;  // units an activation scale covers
  const int64_t units = a.cols / 32, d_stride = a.cols / layout::kActBlock<T>;
#pragma unroll 2
  for (int64_t u = first; u < units; u += stride) {
    const layout::Unit w = layout::DecodeUnit<T>(row, units, u);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const int64_t at = row_of(t);
      uint32_t words[8];
      layout::ActWords(a.qs + at * a.cols, a.cols, u, words);
      const int2 sums = LoadVector<int2>(a.s + at * (a.cols / 16) + 2 * u);
      acc[t] += layout::UnitDot<T>(w, words, a.d[at * d_stride + u / kPerScale], sums.x, sums.y);
    }
  }
}

// WarpRowQDotRows over the activation rows t0 .. t0 + nt - 1.
template <DType T, int NT>
__device__ __forceinline__ void WarpRowQDot(const uint8_t* row, const QAct& a, int64_t t0,
                                            int nt, int first, int stride, float* acc) {
  WarpRowQDotRows<T, NT>(row, a, [t0](int t) { return t0 + t; }, nt, first, stride, acc);
}

// One matrix of a QGemvKernel launch: its rows, where they go and the store's epilogue.
struct QMat {
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int64_t rows = 0;
  float* y = nullptr;
  Epilogue ep;
};
// Up to three matrices of one type over the same activations (q / k / v, gate / up): blockIdx.z
// picks one.
constexpr int kMaxQMats = 3;
struct QMats {
  QMat m[kMaxQMats];
};

// y[t * rows + r] = row r . activation row t for the matrix blockIdx.z: WPR warps a row (their
// lanes take every (32 WPR)-th unit; partial sums added in shared memory), blockIdx.y a tile
// of NT tokens. Several warps a row keep a matrix of few, long rows from leaving most of the
// GPU idle. Blocks past a smaller matrix's rows have nothing to do. The tile's activations are
// rows a_t0 .. of a (the tokens t0 .. : a_t0 = t0, or 0 where the block holds its tile's own).
template <DType T, int NT, int WPR>
__device__ __forceinline__ void QGemvBlock(const QMat& m, const QAct& a, int64_t a_t0,
                                           int64_t t0, int nt, int64_t r0,
                                           float (*part)[NT]) {
  static_assert(kRowsPerBlock % WPR == 0);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, slot = warp % WPR;
  const int64_t r = r0 + warp / WPR;
  if (WPR == 1 && r >= m.rows) return;  // (with WPR > 1 every warp reaches the barrier)
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  if (r < m.rows)
    WarpRowQDot<T, NT>(m.w + r * m.row_bytes, a, a_t0, nt, slot * kWarp + lane, WPR * kWarp, acc);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = WarpSum(acc[t]);
    if constexpr (WPR == 1) {
      if (lane == 0 && t < nt) m.ep.Store(&m.y[(t0 + t) * m.rows + r], t0 + t, r, m.rows, s);
    } else {
      if (lane == 0) part[warp][t] = s;
    }
  }
  if constexpr (WPR > 1) {
    __syncthreads();
    if (slot == 0 && lane < nt && r < m.rows) {
      float s = 0.f;
      for (int i = 0; i < WPR; ++i) s += part[warp + i][lane];
      m.ep.Store(&m.y[(t0 + lane) * m.rows + r], t0 + lane, r, m.rows, s);
    }
  }
}

// The block's matrix: blockIdx.z's.
__device__ __forceinline__ QMat BlockMat(const QMats& ms) {
  return blockIdx.z == 0 ? ms.m[0] : blockIdx.z == 1 ? ms.m[1] : ms.m[2];
}

template <DType T, int NT, int WPR>
__global__ void QGemvKernel(QMats ms, QAct a, int64_t n_tokens) {
  __shared__ float part[kRowsPerBlock][NT];
  const QMat m = BlockMat(ms);
  constexpr int kRows = kRowsPerBlock / WPR;  // the block's rows
  const int64_t r0 = int64_t{blockIdx.x} * kRows;
  GemvStart(m.w, m.row_bytes, r0, m.rows - r0 < kRows ? m.rows - r0 : kRows);
  const int64_t t0 = int64_t{blockIdx.y} * NT;
  const int nt = n_tokens - t0 < NT ? static_cast<int>(n_tokens - t0) : NT;
  QGemvBlock<T, NT, WPR>(m, a, t0, t0, nt, r0, part);
}

// Decodes rows x units into an FP16 [rows, cols] copy (INT8 rows scaled).
template <DType T>
__global__ void DecodeToHalfKernel(const uint8_t* w, size_t row_bytes, int64_t rows,
                                   int64_t cols, const float* scales, __half* out) {
  KernelStart();
  const int64_t units = (cols + 31) / 32;  // the last one partial for float types
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= rows * units) return;
  const int64_t r = i / units, u = i % units;
  const float s = scales ? scales[r] : 1.f;
  __half* o = out + r * cols + u * 32;
  if (u * 32 + 32 > cols) {
    if constexpr (kFloatType<T>)
      for (int64_t c = u * 32; c < cols; ++c)
        out[r * cols + c] = __float2half_rn(DecodeOne<T>(w + r * row_bytes, cols / 32, c) * s);
    return;
  }
  float wv[32];
  DecodeUnit<T>(w + r * row_bytes, cols / 32, u, wv);
#pragma unroll
  for (int k = 0; k < 32; ++k) o[k] = __float2half_rn(wv[k] * s);
}

template <DType T>
__global__ void EmbedKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                            const float* scales, const int32_t* tokens, int64_t row0, float scale,
                            float* out) {
  KernelStart();
  const int64_t t = blockIdx.x;
  const int64_t id = tokens[t] - row0;
  if (id < 0 || id >= rows) {  // another rank's row (vocabulary-parallel shard)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[t * cols + c] = 0.f;
    return;
  }
  const float s = scale * (scales ? scales[id] : 1.f);
  float wv[32];
  for (int64_t u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    DecodeUnit<T>(w + id * row_bytes, cols / 32, u, wv);
    for (int k = 0; k < 32; ++k) out[t * cols + u * 32 + k] = wv[k] * s;
  }
  if constexpr (kFloatType<T>)
    for (int64_t c = cols / 32 * 32 + threadIdx.x; c < cols; c += blockDim.x)
      out[t * cols + c] = DecodeOne<T>(w + id * row_bytes, cols / 32, c) * s;
}

// op (AddOp, MaxOp) over v of every thread of the block, in warp order (shared: 32 floats).
template <typename Op>
__device__ float BlockReduce(float v, float* shared, Op op) {
  v = WarpButterfly(v, op);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float s = shared[0];
  for (int i = 1; i < static_cast<int>(blockDim.x / kWarp); ++i) s = op(s, shared[i]);
  __syncthreads();
  return s;
}
__device__ float BlockSum(float v, float* shared) { return BlockReduce(v, shared, AddOp{}); }

// The prefill GEMM's 16-bit copy of x (a block a row of n values), in BF16 (kBf16: for BF16
// weights, which the GEMM reads as they are) or FP16. FP16 ends at 65504: a row whose largest
// |value| reaches 2^15 (a gated FFN's outlier) is divided by the power of two 2^e that brings
// it below, and row_scale[row] = 2^e multiplies its products in GemmStoreKernel (exact: a row
// under 2^15, or with an inf or a NaN, keeps e = 0 and its values). BF16 has FP32's range: no
// scaling, no row_scale.
// `y` (its rows of y_cols; null: none): what the GEMM adds its products to, divided by 2^e
// too, so that the store's multiplication gives it back.
template <bool kBf16>
__global__ void RowsTo16Kernel(const float* x, int64_t n, uint16_t* out, float* row_scale,
                               float* y, int64_t y_cols) {
  KernelStart();
  const float* xr = x + int64_t{blockIdx.x} * n;
  int e = 0;
  if constexpr (!kBf16) {
    __shared__ float shared[32];
    float m = 0.f;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) m = fmaxf(m, fabsf(xr[c]));
    m = BlockReduce(m, shared, MaxOp{});
    if (m < HUGE_VALF) {  // (fmaxf drops NaNs)
      frexpf(m, &e);      // m in [2^(e-1), 2^e)
      e = e > 15 ? e - 15 : 0;
    }
  }
  const float inv = ldexpf(1.f, -e);
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = xr[c] * inv;
    out[int64_t{blockIdx.x} * n + c] =
        kBf16 ? layout::Bf16FromFloat(v) : __half_as_ushort(__float2half_rn(v));
  }
  if (e > 0 && y)
    for (int64_t c = threadIdx.x; c < y_cols; c += blockDim.x)
      y[int64_t{blockIdx.x} * y_cols + c] *= inv;
  if (!kBf16 && threadIdx.x == 0) row_scale[blockIdx.x] = ldexpf(1.f, e);
}

// The prefill GEMM's store, over n_rows rows of n: y = row_scale[t] * y + bias[r].
__global__ void GemmStoreKernel(const float* row_scale, const float* bias, int64_t n_rows,
                                int64_t n, float* y) {
  KernelStart();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n_rows * n) return;
  float v = row_scale[i / n] * y[i];
  if (bias) v += bias[i % n];
  y[i] = v;
}

// 1 / sqrt(mean(x^2) + eps) over the n values of x, by the whole block (kernels::RmsNorm's
// scale; shared: 32 floats).
__device__ float RmsScale(const float* x, int64_t n, float eps, float* shared) {
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
  ss = BlockSum(ss, shared);
  return static_cast<float>(1.0 / sqrt(static_cast<double>(ss) / n + eps));
}

// One 256-thread block a row; the normalized row also quantized into q32 / q256 where their qs
// are set (rows then contiguous: stride n); with `add`, added to y's row, not stored (then not
// quantized).
__global__ void RmsNormKernel(const float* x, const float* w, float w_offset, float* y, int64_t n,
                              float eps, int64_t stride, QActOut q32, QActOut q256,
                              bool add) {
  KernelStart();
  __shared__ float shared[32];
  __shared__ float warp_max[8];
  const float* xr = x + int64_t{blockIdx.x} * stride;
  float* yr = y + int64_t{blockIdx.x} * stride;
  const float s = RmsScale(xr, n, eps, shared);
  const bool quantize = q32.qs || q256.qs;
  for (int64_t c = 0; c < n; c += blockDim.x) {  // (every thread every round: the quantizer)
    const int64_t i = c + threadIdx.x;
    const bool valid = i < n;
    float v = 0.f;
    if (valid) {
      v = (xr[i] * s) * (w[i] + w_offset);
      if (add) {
        yr[i] += v;
      } else {
        yr[i] = v;
      }
    }
    if (quantize) QuantizeValues(v, valid, blockIdx.x, i, n, q32, q256, warp_max);
  }
}

enum class Ew { kAdd, kScale, kSoftcap, kSilu, kGelu };

// act(gate) * up for Ew::kSilu / kGelu (the tanh approximation).
__device__ __forceinline__ float GatedValue(Ew op, float z, float up) {
  if (op == Ew::kSilu) return z / (1.0f + expf(-z)) * up;
  const float u = 0.7978845608028654f * (z + 0.044715f * ((z * z) * z));
  return 0.5f * z * (1.0f + tanhf(u)) * up;
}

// The kernel that produces a GEMV's activations, run by the GEMV's blocks (FusedQGemvKernel;
// Device::NormMatMuls, GatedMatMuls, MatMuls) -- rows [T, n] of
//   kNorm:  y = (x * RmsScale) * (w + w_offset), as RmsNormKernel computes them;
//   kGated: y = act(x) * up (x the gate; op Ew::kSilu / kGelu), as GatedQuantKernel;
//   kPlain: x itself (y null), quantized as QuantizeActKernel does.
// Each block computes its tile of tokens into shared memory, quantized for its matrices; the
// first block of a tile also stores what the kernel of its own would for those tokens -- y,
// and the quantized rows in q32 / q256 where their qs are set -- for whatever reads them next;
// y in place (y = x or up, which the other blocks read) is not stored.
// An MoE layer's router and routing riding on a FusedQGemvKernel launch of a norm's products
// (Device::NormMatMuls' `route`; RouterTailBlock, moe_kernels.cuh): the blocks of z index z
// multiply the F32 router's rows with the normalized rows, which they compute from x as the
// norm does, into logits; the last of them to finish -- counted in *done, which it sets back to
// 0 -- routes the tokens (RouterKernel's tail). w null: none.
struct RouteTail {
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int64_t rows = 0;
  unsigned z = 0;
  float* logits = nullptr;
  const float* bias = nullptr;
  kernels::MoeRouting p;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  unsigned* done = nullptr;
};
struct FusedInput {
  enum Kind { kNorm, kGated, kPlain } kind = kNorm;
  const float* x = nullptr;
  const float* up = nullptr;  // kGated
  Ew op = Ew::kSilu;          // kGated
  const float* w = nullptr;   // kNorm
  float w_offset = 0.f, eps = 0.f;
  float* y = nullptr;
  int64_t n = 0;
  QActOut q32, q256;
  RouteTail route;  // kNorm
};
constexpr int kFusedInputValues = 16384;  // a block's tile of input values at most (NT n)
// A FusedQGemvKernel block's shared memory: the tile quantized -- int8 values, a scale every 32,
// a sum every 16 -- or, in a router block, RouterTailBlock's routing scratch.
constexpr int kFusedSmemBytes = kFusedInputValues + kFusedInputValues / 32 * 4 +
                                kFusedInputValues / 16 * 4;
__device__ void RouterTailBlock(const FusedInput& f, int64_t n_tokens, uint8_t* smem,
                                float* shared);

// A block takes `passes` times its rows of QGemvKernel, one set after the other (fewer blocks
// repeating the input's kernel). kRoute: with f.route's blocks (an instance of its own, so that
// the router's registers do not crowd the others').
template <DType T, int NT, int WPR, bool kRoute = false>
__global__ void FusedQGemvKernel(QMats ms, FusedInput f, int64_t n_tokens, int passes) {
  __shared__ float part[kRowsPerBlock][NT];
  __shared__ float shared[32];
  __shared__ float warp_max[8];
  alignas(16) __shared__ uint8_t smem[kFusedSmemBytes];
  if constexpr (kRoute) {
    if (blockIdx.z == f.route.z) {
      RouterTailBlock(f, n_tokens, smem, shared);
      return;
    }
  }
  int8_t* const qs = reinterpret_cast<int8_t*>(smem);
  float* const d = reinterpret_cast<float*>(smem + kFusedInputValues);
  int32_t* const sums = reinterpret_cast<int32_t*>(smem + kFusedInputValues * 9 / 8);
  const QMat m = BlockMat(ms);
  const int64_t rows = int64_t{kRowsPerBlock / WPR} * passes;  // the block's
  const int64_t r0 = int64_t{blockIdx.x} * rows;
  GemvStart(m.w, m.row_bytes, r0, m.rows - r0 < rows ? m.rows - r0 : rows);
  const int64_t t0 = int64_t{blockIdx.y} * NT, n = f.n;
  const int nt = n_tokens - t0 < NT ? static_cast<int>(n_tokens - t0) : NT;
  const bool first = blockIdx.x == 0 && blockIdx.z == 0;
  float* const y = f.y == f.x || f.y == f.up ? nullptr : f.y;
  const QActOut mine{qs, d, sums, T == DType::kI8};
  for (int k = 0; k < nt; ++k) {
    const int64_t t = t0 + k;
    const float* xr = f.x + t * n;
    const float s = f.kind == FusedInput::kNorm ? RmsScale(xr, n, f.eps, shared) : 0.f;
    for (int64_t c = 0; c < n; c += blockDim.x) {  // (every thread every round: the quantizer)
      const int64_t i = c + threadIdx.x;
      const bool valid = i < n;
      float v = 0.f;
      if (valid) {
        v = f.kind == FusedInput::kNorm    ? (xr[i] * s) * (f.w[i] + f.w_offset)
            : f.kind == FusedInput::kGated ? GatedValue(f.op, xr[i], f.up[t * n + i])
                                           : xr[i];
      }
      QuantizeValue<layout::kActBlock<T>>(v, valid, k, i, n, mine, warp_max);
      if (!first) continue;
      if (valid && y) y[t * n + i] = v;
      QuantizeValues(v, valid, t, i, n, f.q32, f.q256, warp_max);
    }
  }
  __syncthreads();
  for (int p = 0; p < passes; ++p)
    QGemvBlock<T, NT, WPR>(m, QAct{qs, d, sums, n}, 0, t0, nt, r0 + p * (kRowsPerBlock / WPR),
                           part);
}

// h = act(gate) * up over rows of n, quantized into q32 / q256 (as QuantizeActKernel).
__global__ void GatedQuantKernel(Ew op, const float* gate, const float* up, float* h, int64_t n,
                                 QActOut q32, QActOut q256) {
  KernelStart();
  __shared__ float warp_max[8];
  const int64_t t = blockIdx.y;
  const int64_t i = int64_t{blockIdx.x} * 256 + threadIdx.x;
  const bool valid = i < n;
  float v = 0.f;
  if (valid) h[t * n + i] = v = GatedValue(op, gate[t * n + i], up[t * n + i]);
  QuantizeValues(v, valid, t, i, n, q32, q256, warp_max);
}

__global__ void ElementwiseKernel(Ew op, float* y, const float* a, const float* b, float s,
                                  int64_t n) {
  KernelStart();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= n) return;
  switch (op) {
    case Ew::kAdd: y[i] += a[i]; break;
    case Ew::kScale: y[i] *= s; break;
    case Ew::kSoftcap: y[i] = s * tanhf(y[i] / s); break;
    case Ew::kSilu:
    case Ew::kGelu: y[i] = GatedValue(op, a[i], b[i]); break;
  }
}

__global__ void BiasRowsKernel(float* y, const float* b, int64_t n_rows, int64_t n) {
  KernelStart();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n_rows * n) y[i] += b[i % n];
}

// Starts, waits for the kernel before and ends: the kernel floor's probe.
__global__ void EmptyKernel() { KernelStart(); }

// Sums every float4 of x (grid-stride): the read-bandwidth probe, kReadThreads a block.
constexpr int kReadThreads = 512;
__global__ void __launch_bounds__(kReadThreads) ReadKernel(const float4* x, int64_t n,
                                                           float* sink) {
  KernelStart();
  float s = 0.f;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float4 v = x[i];
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 1234.5f) *sink = s;  // (keeps the loads)
}

__global__ void GatherRowsKernel(const float* src, const int32_t* rows, int64_t n_cols,
                                 float* dst) {
  KernelStart();
  const int64_t i = blockIdx.x;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x)
    dst[i * n_cols + c] = src[int64_t{rows[i]} * n_cols + c];
}

// ------------------------------------------------------------------------------------------

}  // namespace
}  // namespace peng::backend::cuda
