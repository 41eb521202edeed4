// The CUDA backend's mixture-of-experts kernels (included by cuda_device.cu after
// kernels.cuh, whose GEMV pieces they use): top-k routing (kernels::MoeRoute's arithmetic), the
// experts' GEMVs per (token, slot) pair -- over quantized activations (ExpertsQGemvKernel) or
// FP32 ones (ExpertsGemvKernel) --, the pairs grouped by expert for prefill (by dp4a here; on
// the tensor cores: qmma_kernels.cuh), and the routed experts' weighted sum (SlotSumKernel).
// INT8 experts' row scales are applied in the store.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "kernels/moe.h"

namespace peng::backend::cuda {
namespace {

// Up to two stacked expert matrices of one type and shape multiplied with the same
// activations (the gate and up projections): blockIdx.z picks one. scales: INT8's per-expert
// row scales (DeviceExperts::scales), else null.
struct ExpertMats {
  const uint8_t* const* experts[2] = {nullptr, nullptr};
  const float* const* scales[2] = {nullptr, nullptr};
  float* y[2] = {nullptr, nullptr};
};

// An expert's dot product s of row r, scaled by the row's INT8 scale where there is one (not
// for another rank's expert, whose s is 0).
__device__ __forceinline__ float ExpertRowScaled(const float* const* scales, int e, int64_t r,
                                                 float s) {
  return scales && scales[e] ? scales[e][r] * s : s;
}

// ExpertsGemvKernel over quantized activations (one activation row a token, or a (token, slot)
// pair when x_per_slot).
template <DType T>
__global__ void ExpertsQGemvKernel(ExpertMats m, size_t row_bytes, int64_t rows, QAct a,
                                   const int32_t* ids, int k, bool x_per_slot, int64_t pair0) {
  KernelStart();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + warp;
  if (r >= rows) return;
  const uint8_t* const* experts = blockIdx.z ? m.experts[1] : m.experts[0];
  float* y = blockIdx.z ? m.y[1] : m.y[0];
  const int64_t pair = pair0 + blockIdx.y;
  const int e = ids[pair];
  if (!experts[e]) {  // another rank's expert: zeros
    if (lane == 0) y[pair * rows + r] = 0.f;
    return;
  }
  float acc = 0.f;
  WarpRowQDot<T, 1>(experts[e] + r * row_bytes, a, x_per_slot ? pair : pair / k, 1, lane, kWarp,
                    &acc);
  acc = WarpSum(acc);
  if (lane == 0) y[pair * rows + r] = ExpertRowScaled(blockIdx.z ? m.scales[1] : m.scales[0], e,
                                                      r, acc);
}

// ExpertsQGemvKernel over the routed experts' gated activations (x_per_slot), which each block
// computes for its pair (f: FusedInput::kGated over the pairs' rows of f.n) and quantizes into
// its shared memory, as GatedQuantKernel would for all of them; a block takes `passes` times
// kRowsPerBlock rows (fewer blocks repeating the activation). h (f.y) is stored by the first
// block of each pair unless in place (f.y = f.x or f.up).
template <DType T>
__global__ void GatedExpertsQGemvKernel(ExpertMats m, size_t row_bytes, int64_t rows,
                                        FusedInput f, const int32_t* ids, int64_t pair0,
                                        int passes) {
  __shared__ float warp_max[8];
  alignas(16) __shared__ int8_t qs[kFusedInputValues];
  __shared__ float d[kFusedInputValues / 32];
  alignas(8) __shared__ int32_t sums[kFusedInputValues / 16];
  KernelStart();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t pair = pair0 + blockIdx.y, n = f.n;
  const float* gate = f.x + pair * n;
  const float* up = f.up + pair * n;
  float* const h = blockIdx.x == 0 && f.y != f.x && f.y != f.up ? f.y : nullptr;
  const QActOut mine{qs, d, sums, T == DType::kI8};
  for (int64_t c = 0; c < n; c += blockDim.x) {  // (every thread every round: the quantizer)
    const int64_t i = c + threadIdx.x;
    const bool valid = i < n;
    const float v = valid ? GatedValue(f.op, gate[i], up[i]) : 0.f;
    if (valid && h) h[pair * n + i] = v;
    QuantizeValue<layout::kActBlock<T>>(v, valid, 0, i, n, mine, warp_max);
  }
  __syncthreads();
  const int e = ids[pair];
  for (int p = 0; p < passes; ++p) {
    const int64_t r = (int64_t{blockIdx.x} * passes + p) * kRowsPerBlock + warp;
    if (r >= rows) return;
    float acc = 0.f;
    if (m.experts[0][e])  // (else another rank's expert: zeros)
      WarpRowQDot<T, 1>(m.experts[0][e] + r * row_bytes, QAct{qs, d, sums, n}, 0, 1, lane, kWarp,
                        &acc);
    acc = WarpSum(acc);
    if (lane == 0) m.y[0][pair * rows + r] = ExpertRowScaled(m.scales[0], e, r, acc);
  }
}

// An MoE layer's down projections in one launch (Device::MoeDown): the routed pairs' and the
// shared experts'. Block (x, y) takes `passes` times kRowsPerBlock rows from row
// x passes kRowsPerBlock of pair y -- y < T k a routed (token, slot) pair, else (with shared
// experts) token y - T k's shared experts -- computing and quantizing the pair's gated
// activation as GatedExpertsQGemvKernel does, and stores its products in ys (the shared ones in
// rows T k + t, scaled by INT8's row scales). The last of a token's blocks over the same rows to
// finish -- counted in done[t gridDim.x + x], which it sets back to 0 -- adds the shared row and
// the routed rows' weighted sum to out in Epilogue::Store's order (SlotSumKernel's without
// shared experts).
struct MoeDownArgs {
  const uint8_t* const* experts = nullptr;  // the routed experts' down projections
  const float* const* scales = nullptr;     // INT8: their row scales
  size_t row_bytes = 0;
  const float *gate = nullptr, *up = nullptr;  // the pairs' rows of n
  int64_t n = 0;
  const uint8_t* shared = nullptr;  // the shared experts' down projection; null: none
  const float* shared_scale = nullptr;  // INT8: its row scales
  size_t shared_row_bytes = 0;
  const float *shared_gate = nullptr, *shared_up = nullptr;  // the tokens' rows of shared_n
  int64_t shared_n = 0;
  int64_t rows = 0;
  Ew op = Ew::kSilu;
  const int32_t* ids = nullptr;
  const float* w = nullptr;  // [T, k]
  int k = 0;
  float* ys = nullptr;
  float* out = nullptr;
  unsigned* done = nullptr;
};
template <DType T>
__global__ void MoeDownKernel(MoeDownArgs a, int passes) {
  __shared__ float warp_max[8];
  alignas(16) __shared__ int8_t qs[kFusedInputValues];
  __shared__ float d[kFusedInputValues / 32];
  alignas(8) __shared__ int32_t sums[kFusedInputValues / 16];
  __shared__ bool last;
  const int per_token = a.k + (a.shared ? 1 : 0);
  const int64_t n_tokens = gridDim.y / per_token, pair = blockIdx.y;
  const bool shared = pair >= n_tokens * a.k;
  const int64_t t = shared ? pair - n_tokens * a.k : pair / a.k;
  const int64_t r0 = int64_t{blockIdx.x} * passes * kRowsPerBlock;
  const int64_t most_rows = int64_t{passes} * kRowsPerBlock;
  const int64_t n_rows = a.rows - r0 < most_rows ? a.rows - r0 : most_rows;
  if (shared) {  // (the routed experts' rows are known after the wait only)
    GemvStart(a.shared, a.shared_row_bytes, r0, n_rows, /*prefetch=*/t == 0);
  } else {
    KernelStart();
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n = shared ? a.shared_n : a.n;
  const float* gate = shared ? a.shared_gate + t * n : a.gate + pair * n;
  const float* up = shared ? a.shared_up + t * n : a.up + pair * n;
  const QActOut mine{qs, d, sums, T == DType::kI8};
  for (int64_t c = 0; c < n; c += blockDim.x) {  // (every thread every round: the quantizer)
    const int64_t i = c + threadIdx.x;
    const bool valid = i < n;
    const float v = valid ? GatedValue(a.op, gate[i], up[i]) : 0.f;
    QuantizeValue<layout::kActBlock<T>>(v, valid, 0, i, n, mine, warp_max);
  }
  __syncthreads();
  const int e = shared ? 0 : a.ids[pair];
  const uint8_t* matrix = shared ? a.shared : a.experts[e];  // null: another rank's expert
  const size_t row_bytes = shared ? a.shared_row_bytes : a.row_bytes;
  for (int64_t i = warp; i < n_rows; i += kRowsPerBlock) {
    const int64_t r = r0 + i;
    float acc = 0.f;
    if (matrix)
      WarpRowQDot<T, 1>(matrix + r * row_bytes, QAct{qs, d, sums, n}, 0, 1, lane, kWarp, &acc);
    acc = WarpSum(acc);
    if (lane != 0) continue;
    if (shared) {
      a.ys[pair * a.rows + r] = a.shared_scale ? a.shared_scale[r] * acc : acc;
    } else {
      a.ys[pair * a.rows + r] = ExpertRowScaled(a.scales, e, r, acc);
    }
  }
  __threadfence();  // (the rows visible to the last block before this one is counted)
  __syncthreads();
  unsigned* count = a.done + t * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) last = atomicAdd(count, 1u) == static_cast<unsigned>(per_token - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t i = threadIdx.x; i < n_rows; i += blockDim.x) {  // (read past L1: __ldcg)
    const int64_t r = r0 + i;
    float s = 0.f;
    for (int j = 0; j < a.k; ++j)
      s += a.w[t * a.k + j] * __ldcg(a.ys + (t * a.k + j) * a.rows + r);
    if (a.shared) s = __ldcg(a.ys + (n_tokens * a.k + t) * a.rows + r) + s;
    a.out[t * a.rows + r] += s;
  }
  if (threadIdx.x == 0) *count = 0;
}

constexpr int kMaxTopK = 16;
constexpr int kMaxGroups = 16;

// Index of the largest of v[0..n) not yet taken (ties: lower index), by a warp: each lane scans
// i = lane, lane + 32, ..., then the lanes' candidates are merged (larger value, ties to the
// lower index); every lane gets the index.
__device__ int WarpArgMaxFree(const float* v, int n, const bool* taken, int lane) {
  int best = -1;
  for (int i = lane; i < n; i += kWarp)
    if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
  float bv = best >= 0 ? v[best] : 0.f;
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const int ob = __shfl_xor_sync(0xffffffffu, best, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) {
      best = ob;
      bv = ov;
    }
  }
  return best;
}

// A routing warp's shared memory, for up to E experts (lg: RouterKernel's copy of the logits).
template <int E>
struct RouteScratch {
  float lg[E], s[E], choice[E];
  double ex[E];
  bool taken[E];
  float gs[kMaxGroups];
  bool gtaken[kMaxGroups], keep[kMaxGroups];
};

// Token t's routing by one warp (lane: the thread's lane): kernels::MoeRoute's arithmetic
// (softmax in double precision, summed in expert order; ties to the lower index) over its
// logits lg. The lanes share the per-expert and per-group work and the arg-max searches; the
// sums and the bookkeeping of the selection are lane 0's.
template <int kE>
__device__ void RouteToken(const float* lg, const float* bias, int64_t t,
                           const kernels::MoeRouting& p, int32_t* ids_out, float* w_out,
                           RouteScratch<kE>& sh, int lane) {
  float* const s = sh.s;
  float* const choice = sh.choice;
  double* const ex = sh.ex;
  bool* const taken = sh.taken;
  float* const gs = sh.gs;
  bool* const gtaken = sh.gtaken;
  bool* const keep = sh.keep;
  const int E = p.n_experts, k = p.k;
  if (p.sigmoid) {
    for (int e = lane; e < E; e += kWarp)
      s[e] = static_cast<float>(1.0 / (1.0 + exp(-double{lg[e]})));
  } else {
    double m = -INFINITY;
    for (int e = lane; e < E; e += kWarp) m = fmax(m, double{lg[e]});
    m = WarpButterfly(m, MaxOp{});
    for (int e = lane; e < E; e += kWarp) ex[e] = exp(lg[e] - m);
    __syncwarp();
    double sum = 0;
    if (lane == 0)
      for (int e = 0; e < E; ++e) sum += ex[e];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int e = lane; e < E; e += kWarp) s[e] = static_cast<float>(ex[e] / sum);
  }
  for (int e = lane; e < E; e += kWarp) {
    choice[e] = s[e] + (bias ? bias[e] : 0.f);
    taken[e] = false;
  }
  __syncwarp();
  const int G = p.n_group > 1 ? p.n_group : 1;
  if (p.method != kernels::MoeRouting::Method::kGreedy && G > 1) {
    const int per = E / G;
    if (lane < G) {
      const int g = lane;
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
    __syncwarp();
    for (int j = 0; j < p.topk_group; ++j) {
      const int g = WarpArgMaxFree(gs, G, gtaken, lane);
      if (lane == 0) gtaken[g] = keep[g] = true;
      __syncwarp();
    }
    for (int e = lane; e < E; e += kWarp)
      if (!keep[e / per]) choice[e] = 0.f;
    __syncwarp();
  }
  int32_t* ids = ids_out + t * k;
  float* w = w_out + t * k;
  double sum = 0;
  for (int j = 0; j < k; ++j) {
    const int e = WarpArgMaxFree(choice, E, taken, lane);
    if (lane == 0) {
      taken[e] = true;
      ids[j] = e;
      sum += w[j] = s[e];
    }
    __syncwarp();
  }
  if (lane == 0) {
    const bool norm = p.method == kernels::MoeRouting::Method::kNoauxTc && p.norm_topk_prob;
    for (int j = 0; j < k; ++j) {
      const double v = norm ? w[j] / (sum + 1e-20) : w[j];
      w[j] = static_cast<float>(v * p.routed_scaling_factor);
    }
  }
}

// One warp per token (RouteToken).
__global__ void MoeRouteKernel(const float* logits, const float* bias, int64_t T,
                               kernels::MoeRouting p, int32_t* ids_out, float* w_out) {
  KernelStart();
  __shared__ RouteScratch<kernels::kMaxRoutedExperts> sh;
  const int64_t t = blockIdx.x;
  RouteToken(logits + t * p.n_experts, bias, t, p, ids_out, w_out, sh, threadIdx.x);
}

// The routing by the last block of a router's launch, for up to kRouteTailTokens tokens and
// kRouteTailExperts experts: every block of the n_blocks that store logits [T, rows] fences
// them and counts itself done in *done; the last one sets the count back to 0 for the next
// launch and routes the tokens, a warp each, from the logits read past L1 (which may hold stale
// lines: __ldcg). sh: kRouteTailTokens scratches in shared memory.
constexpr int kRouteTailTokens = 4;
constexpr int kRouteTailExperts = 256;
__device__ void RouteInLastBlock(const float* logits, int64_t rows, int64_t n_tokens,
                                 unsigned n_blocks, const float* bias,
                                 const kernels::MoeRouting& p, int32_t* ids_out, float* w_out,
                                 unsigned* done, RouteScratch<kRouteTailExperts>* sh) {
  __shared__ bool last;
  __threadfence();  // (the logits visible to the last block before this one is counted)
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == n_blocks - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (warp < n_tokens) {
    RouteScratch<kRouteTailExperts>& mine = sh[warp];
    for (int e = lane; e < p.n_experts; e += kWarp) mine.lg[e] = __ldcg(logits + warp * rows + e);
    __syncwarp();
    RouteToken(mine.lg, bias, warp, p, ids_out, w_out, mine, lane);
  }
  if (threadIdx.x == 0) *done = 0;
}

// The router's product and the routing in one launch (Device::MatMulMoeRoute): GemvKernel<T,
// 1>'s blocks (8 rows of a token each: blockIdx.y the token) store the logits, and the last
// block to finish routes (RouteInLastBlock).
template <DType T>
__global__ void RouterKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                             const float* x, int64_t n_tokens, float* logits, const float* bias,
                             kernels::MoeRouting p, int32_t* ids_out, float* w_out,
                             unsigned* done) {
  __shared__ RouteScratch<kRouteTailExperts> sh[kRouteTailTokens];
  const int64_t r0 = int64_t{blockIdx.x} * kRowsPerBlock;
  GemvStart(w, row_bytes, r0, rows - r0 < kRowsPerBlock ? rows - r0 : kRowsPerBlock);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = r0 + warp, t = blockIdx.y;
  if (r < rows) {
    float acc = 0.f;
    const float* xs[1] = {x + t * cols};
    WarpRowDot<T, 1>(w + r * row_bytes, cols, xs, 1, lane, &acc);
    acc = WarpSum(acc);
    if (lane == 0) logits[t * rows + r] = acc;
  }
  RouteInLastBlock(logits, rows, n_tokens, gridDim.x * gridDim.y, bias, p, ids_out, w_out, done,
                   sh);
}

// A router block of a FusedQGemvKernel launch (RouteTail, kernels.cuh): rows blockIdx.x * 8 ..
// of the F32 router, a warp each, for every token -- the normalized row computed from x as the
// kernel's norm computes it (FusedInput::kNorm; the same values as the y it stores) --, then the
// routing by the last of the Blocks(rows, 8) router blocks to finish (its scratch over smem, the
// quantized tile the router blocks do not use). The launch has one tile of tokens.
static_assert(kRouteTailTokens * sizeof(RouteScratch<kRouteTailExperts>) <= kFusedSmemBytes);
__device__ void RouterTailBlock(const FusedInput& f, int64_t n_tokens, uint8_t* smem,
                                float* shared) {
  const RouteTail& rt = f.route;
  const int64_t r0 = int64_t{blockIdx.x} * kRowsPerBlock;
  if (r0 >= rt.rows) {  // (past the router's rows: not counted)
    KernelStart();
    return;
  }
  GemvStart(rt.w, rt.row_bytes, r0, rt.rows - r0 < kRowsPerBlock ? rt.rows - r0 : kRowsPerBlock);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = r0 + warp, n = f.n;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xr = f.x + t * n;
    const float s = RmsScale(xr, n, f.eps, shared);
    if (r >= rt.rows) continue;
    float acc = 0.f;
    WarpRowDotOf<DType::kF32, 1>(
        rt.w + r * rt.row_bytes, n,
        [&](int, int64_t i) { return (xr[i] * s) * (f.w[i] + f.w_offset); }, 1, lane, &acc);
    acc = WarpSum(acc);
    if (lane == 0) rt.logits[t * rt.rows + r] = acc;
  }
  RouteInLastBlock(rt.logits, rt.rows, n_tokens,
                   static_cast<unsigned>((rt.rows + kRowsPerBlock - 1) / kRowsPerBlock), rt.bias,
                   rt.p, rt.ids, rt.weights, rt.done,
                   reinterpret_cast<RouteScratch<kRouteTailExperts>*>(smem));
}

// GEMV of each (token, slot) pair with its expert's matrix: one warp per row; blockIdx.y is the
// pair. Only the selected experts' rows are read.
template <DType T>
__global__ void ExpertsGemvKernel(const uint8_t* const* experts, const float* const* scales,
                                  size_t row_bytes, int64_t rows, int64_t cols, const float* x,
                                  const int32_t* ids, int k, bool x_per_slot, int64_t pair0,
                                  float* y) {
  KernelStart();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + warp;
  if (r >= rows) return;
  const int64_t pair = pair0 + blockIdx.y;
  if (!experts[ids[pair]]) {  // another rank's expert
    if (lane == 0) y[pair * rows + r] = 0.f;
    return;
  }
  const uint8_t* row = experts[ids[pair]] + r * row_bytes;
  const float* xp = x + (x_per_slot ? pair : pair / k) * cols;
  float acc = 0.f;
  WarpRowDot<T, 1>(row, cols, &xp, 1, lane, &acc);
  acc = WarpSum(acc);
  if (lane == 0) y[pair * rows + r] = ExpertRowScaled(scales, ids[pair], r, acc);
}

// Steps past the GEMV per pair (CudaDevice::PerPairExperts: more than kExpertsGemvMaxTokens
// tokens, or from kQMmaMinTokens on the tensor cores) group the (token, slot) pairs by expert,
// so that an expert's matrix is read once per tile of up to tile_pairs of its pairs
// (kTokenTile for the GEMVs, kQMmaTileTokens on the tensor cores):
//   ExpertTiles (one block: the pairs counted per expert, then offsets[e]: the expert's first
//   place in the list, tile_start[e]: its first tile; E + 1 entries each) -> ScatterPairs (the
//   list of pairs, expert by expert; their order within an expert does not matter: each pair's
//   products are its own) -> GroupedExpertsGemv (block y = one tile). (No memset: the counts
//   live in the block's shared memory.)
__global__ void ExpertTilesKernel(const int32_t* ids, int64_t n_pairs, int E, int tile_pairs,
                                  int32_t* offsets, int32_t* tile_start, int32_t* cursor) {
  KernelStart();
  __shared__ int32_t counts[kernels::kMaxRoutedExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_pairs; i += blockDim.x) atomicAdd(&counts[ids[i]], 1);
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t o = 0, g = 0;
  for (int e = 0; e < E; ++e) {
    offsets[e] = o;
    tile_start[e] = g;
    cursor[e] = 0;
    o += counts[e];
    g += (counts[e] + tile_pairs - 1) / tile_pairs;
  }
  offsets[E] = o;
  tile_start[E] = g;
}

__global__ void ScatterPairsKernel(const int32_t* ids, int64_t n_pairs, const int32_t* offsets,
                                   int32_t* cursor, int32_t* list) {
  KernelStart();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n_pairs) list[offsets[ids[i]] + atomicAdd(&cursor[ids[i]], 1)] = static_cast<int32_t>(i);
}

// Tile g of the grouped pairs: its expert (the last whose tiles start at or before g), its
// first place in the list and its pairs (up to tile_pairs).
struct ExpertTile {
  int expert, n;
  int64_t first;
};
__device__ __forceinline__ ExpertTile FindTile(int64_t g, int E, const int32_t* offsets,
                                               const int32_t* tile_start, int tile_pairs) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t first = offsets[lo] + (g - tile_start[lo]) * tile_pairs;
  const int n = offsets[lo + 1] - first < tile_pairs ? static_cast<int>(offsets[lo + 1] - first)
                                                    : tile_pairs;
  return {lo, n, first};
}

// The grouped kernels' work for this thread's warp (grid: x the rows, a warp each; y the tiles
// from tile0): its row r and its tile; false past the rows or the tiles.
__device__ __forceinline__ bool GroupedWork(int64_t rows, int E, const int32_t* offsets,
                                            const int32_t* tile_start, int64_t tile0, int64_t* r,
                                            ExpertTile* tile) {
  *r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kWarp;
  const int64_t g = tile0 + blockIdx.y;
  if (*r >= rows || g >= tile_start[E]) return false;
  *tile = FindTile(g, E, offsets, tile_start, kTokenTile);
  return true;
}

template <DType T>
__global__ void GroupedExpertsGemvKernel(const uint8_t* const* experts,
                                         const float* const* scales, size_t row_bytes,
                                         int64_t rows, int64_t cols, const float* x, int k,
                                         bool x_per_slot, int E, const int32_t* offsets,
                                         const int32_t* tile_start, const int32_t* list,
                                         int64_t tile0, float* y) {
  KernelStart();
  const int lane = threadIdx.x % kWarp;
  int64_t r;
  ExpertTile tile;
  if (!GroupedWork(rows, E, offsets, tile_start, tile0, &r, &tile)) return;
  const int e = tile.expert, nt = tile.n;
  const int64_t first = tile.first;
  int32_t pairs[kTokenTile];
  const float* xs[kTokenTile];
  float acc[kTokenTile];
#pragma unroll
  for (int t = 0; t < kTokenTile; ++t) {
    pairs[t] = t < nt ? list[first + t] : 0;
    xs[t] = x + (x_per_slot ? pairs[t] : pairs[t] / k) * cols;
    acc[t] = 0.f;
  }
  if (experts[e])  // (else another rank's expert: zeros)
    WarpRowDot<T, kTokenTile>(experts[e] + r * row_bytes, cols, xs, nt, lane, acc);
#pragma unroll
  for (int t = 0; t < kTokenTile; ++t) {
    const float s = WarpSum(acc[t]);
    if (lane == 0 && t < nt) y[int64_t{pairs[t]} * rows + r] = ExpertRowScaled(scales, e, r, s);
  }
}

// GroupedExpertsGemvKernel over quantized activations: a's row of pair p is p (x_per_slot) or
// its token p / k.
template <DType T>
__global__ void GroupedExpertsQGemvKernel(const uint8_t* const* experts,
                                          const float* const* scales, size_t row_bytes,
                                          int64_t rows, QAct a, int k, bool x_per_slot, int E,
                                          const int32_t* offsets, const int32_t* tile_start,
                                          const int32_t* list, int64_t tile0, float* y) {
  KernelStart();
  const int lane = threadIdx.x % kWarp;
  int64_t r;
  ExpertTile tile;
  if (!GroupedWork(rows, E, offsets, tile_start, tile0, &r, &tile)) return;
  const int e = tile.expert, nt = tile.n;
  const int64_t first = tile.first;
  const int32_t* pairs = list + first;
  float acc[kTokenTile];
#pragma unroll
  for (int t = 0; t < kTokenTile; ++t) acc[t] = 0.f;
  if (experts[e])  // (else another rank's expert: zeros)
    WarpRowQDotRows<T, kTokenTile>(
        experts[e] + r * row_bytes, a,
        [&](int t) { return x_per_slot ? pairs[t] : pairs[t] / k; }, nt, lane, kWarp, acc);
#pragma unroll
  for (int t = 0; t < kTokenTile; ++t) {
    const float s = WarpSum(acc[t]);
    if (lane == 0 && t < nt) y[int64_t{pairs[t]} * rows + r] = ExpertRowScaled(scales, e, r, s);
  }
}

__global__ void SlotSumKernel(const float* y, const float* w, int64_t T, int k, int64_t n,
                              float* out) {
  KernelStart();
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= T * n) return;
  const int64_t t = i / n, c = i % n;
  float s = 0.f;
  for (int j = 0; j < k; ++j) s += w[t * k + j] * y[(t * k + j) * n + c];
  out[i] += s;
}

}  // namespace
}  // namespace peng::backend::cuda
