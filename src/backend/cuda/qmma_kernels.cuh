// The quantized products of a step of kQMmaMinTokens .. kGemvMaxTokens tokens, and the routed
// experts' products with their pairs grouped by expert, on the tensor cores (included by
// cuda_device.cu after kernels.cuh and moe_kernels.cuh). The same arithmetic as QGemvKernel --
// the weights' units decoded by layout::DecodeUnit, the activations quantized as the CPU
// quantizes them, each unit's part by layout::HalvesDot -- with the integer dots of a unit's
// two halves summed by mma.sync m16n8k16 (int8, int32 accumulation: the same integers as dp4a)
// for 16 rows and 8 tokens at once, instead of by dp4a a (row, token).
//
// A block takes 16 rows (one tile's) and up to kQMmaTileTokens tokens (four tiles of 8); its 8
// warps split the row's units, 4 at a time: a lane decodes one unit of two rows (lane (g, c),
// g = lane / 4, c = lane % 4: unit u0 + c of rows g and g + 8) into the warp's shared memory,
// from which each lane takes its fragments (runtime.h, MmaS8); each warp's sums are added in
// warp order at the end. The tiles' weights are thus decoded once for 32 tokens (the dp4a GEMV
// decodes them once for kTokenTile), and a (row, token)'s unit costs its epilogue (HalvesDot)
// and no dot products.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/moe_kernels.cuh"
#include "backend/cuda/runtime.h"
#include "backend/cuda/weight_layout.h"
#include "core/dtype.h"

namespace peng::backend::cuda {
namespace {

constexpr int64_t kQMmaMinTokens = 16;  // the tensor cores' products from here (LaunchQGemv)
constexpr int kQMmaWarps = 8;            // a block's warps (splitting its rows' units)
constexpr int kQMmaRows = 16;            // a block's rows: one tile's
constexpr int kQMmaTiles = 4;            // a block's tiles of 8 tokens at most
constexpr int kQMmaTileTokens = 8 * kQMmaTiles;
constexpr int kQMmaUnits = 4;  // units a warp decodes at a time (a lane one, of two rows)
// A row's words in a warp's shared memory: 4 units of 8, padded so that the lanes reading one
// fragment register (rows g, words c of one unit) fall in 32 banks.
constexpr int kQMmaRowWords = kQMmaUnits * 8 + 4;

// One block's tile: rows r0 .. r0 + 15 of the matrix at w_rows (rows of row_bytes; null: another
// rank's expert, whose products are zeros) times the tile's nt (<= kQMmaTileTokens) activation
// rows act_row(0) .. act_row(nt - 1) of a; store(tt, r, s) takes each product s of the tile's
// token tt and row r < rows. Every thread of the block calls it.
template <DType T, typename ActRow, typename StoreFn>
__device__ __forceinline__ void QMmaTile(const uint8_t* w_rows, size_t row_bytes, int64_t rows,
                                         int64_t r0, const QAct& a, int nt, ActRow act_row,
                                         StoreFn store) {
  alignas(16) __shared__ uint32_t words[kQMmaWarps][kQMmaRows * kQMmaRowWords];
  __shared__ layout::UnitScale scales[kQMmaWarps][kQMmaRows][kQMmaUnits];
  // act_row(tt) of every column, asked once (the experts' is a division); past nt the last's.
  __shared__ int64_t tile_rows[kQMmaTileTokens];
  static_assert(sizeof(words) >= sizeof(float) * kQMmaWarps * 4 * kQMmaTiles * kWarp);
  if (const int tt = static_cast<int>(threadIdx.x); tt < kQMmaTileTokens)
    tile_rows[tt] = act_row(tt < nt ? tt : nt - 1);
  __syncthreads();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  constexpr int kPerScale = layout::kActBlock<T> / 32;  // units an activation scale covers
  const int64_t units = w_rows ? a.cols / 32 : 0, d_stride = a.cols / layout::kActBlock<T>;
  uint32_t* const wq = words[warp];
  float acc[kQMmaTiles][4];
#pragma unroll
  for (int b = 0; b < kQMmaTiles; ++b)
    for (int i = 0; i < 4; ++i) acc[b][i] = 0.f;
  for (int64_t u0 = int64_t{warp} * kQMmaUnits; u0 < units; u0 += kQMmaWarps * kQMmaUnits) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // unit u0 + c of rows g and g + 8 (zeros past the ends)
      const int rr = g + 8 * h;
      const int64_t r = r0 + rr, u = u0 + c;
      layout::Unit w{};
      if (r < rows && u < units) w = layout::DecodeUnit<T>(w_rows + r * row_bytes, units, u);
      uint32_t* const to = wq + rr * kQMmaRowWords + c * 8;
      StoreVector(to, uint4{w.q[0], w.q[1], w.q[2], w.q[3]});
      StoreVector(to + 4, uint4{w.q[4], w.q[5], w.q[6], w.q[7]});
      scales[warp][rr][c] = w.s;
    }
    __syncwarp();
    const int n_units = units - u0 < kQMmaUnits ? static_cast<int>(units - u0) : kQMmaUnits;
    for (int j = 0; j < n_units; ++j) {
      const int64_t u = u0 + j;
      const uint32_t* const row_g = wq + g * kQMmaRowWords + j * 8;
      const uint32_t lo_a[2] = {row_g[c], row_g[8 * kQMmaRowWords + c]};
      const uint32_t hi_a[2] = {row_g[4 + c], row_g[8 * kQMmaRowWords + 4 + c]};
      const layout::UnitScale w0 = scales[warp][g][j], w1 = scales[warp][g + 8][j];
#pragma unroll
      for (int b = 0; b < kQMmaTiles; ++b) {
        if (8 * b >= nt) break;
        // B's column g: token 8 b + g of the tile (the last one's again past nt).
        const int64_t tb = tile_rows[8 * b + g];
        const int8_t* const at = a.qs + tb * a.cols + u * 16 + 4 * c;
        int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
        MmaS8(lo, lo_a, LoadVector<uint32_t>(at));
        MmaS8(hi, hi_a, LoadVector<uint32_t>(at + a.cols / 2));
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // D's columns 2 c + e: token 8 b + 2 c + e
          const int64_t t = tile_rows[8 * b + 2 * c + e];
          const int2 s = LoadVector<int2>(a.s + t * (a.cols / 16) + 2 * u);
          const float ad = a.d[t * d_stride + u / kPerScale];
          acc[b][e] += layout::HalvesDot<T>(w0, lo[e], hi[e], ad, s.x, s.y);
          acc[b][2 + e] += layout::HalvesDot<T>(w1, lo[2 + e], hi[2 + e], ad, s.x, s.y);
        }
      }
    }
    __syncwarp();  // (the words are read before the next units overwrite them)
  }
  // The warps' sums, added in warp order: part[warp][b][i][lane] in the words' memory.
  __syncthreads();
  float* const part = reinterpret_cast<float*>(&words[0][0]);
#pragma unroll
  for (int b = 0; b < kQMmaTiles; ++b)
    for (int i = 0; i < 4; ++i) part[((warp * kQMmaTiles + b) * 4 + i) * kWarp + lane] = acc[b][i];
  __syncthreads();
  for (int o = threadIdx.x; o < kQMmaTiles * 4 * kWarp; o += blockDim.x) {
    const int l = o % kWarp, bi = o / kWarp, b = bi / 4, i = bi % 4;
    const int tt = 8 * b + 2 * (l % 4) + i % 2;
    const int64_t r = r0 + l / 4 + 8 * (i / 2);
    if (tt >= nt || r >= rows) continue;
    float s = 0.f;
    for (int k = 0; k < kQMmaWarps; ++k) s += part[(k * kQMmaTiles * 4 + bi) * kWarp + l];
    store(tt, r, s);
  }
}

// The products of up to three matrices (blockIdx.z) over the step's T tokens: block (x, y)
// takes row tile x and tokens tile_tokens y ... (tile_tokens: 8, 16 or kQMmaTileTokens,
// LaunchQGemv's choice). (Both kernels' bounds ask for two blocks a multiprocessor, at most
// 128 registers a thread: ptxas gives them 78-106, no spills, on sm_80 and sm_90; without the
// bound sm_80 spilled Q5_0's at 80.)
template <DType T>
__global__ void __launch_bounds__(kQMmaWarps * kWarp, 2)
    QMmaKernel(QMats ms, QAct a, int64_t n_tokens, int tile_tokens) {
  const QMat m = BlockMat(ms);
  const int64_t r0 = int64_t{blockIdx.x} * kQMmaRows;
  GemvStart(m.w, m.row_bytes, r0, m.rows - r0 < kQMmaRows ? m.rows - r0 : kQMmaRows);
  if (r0 >= m.rows) return;  // (a smaller matrix's: the whole block)
  const int64_t t0 = int64_t{blockIdx.y} * tile_tokens;
  const int nt = n_tokens - t0 < tile_tokens ? static_cast<int>(n_tokens - t0) : tile_tokens;
  QMmaTile<T>(
      m.w, m.row_bytes, m.rows, r0, a, nt, [t0](int tt) { return t0 + tt; },
      [&m, t0](int tt, int64_t r, float s) {
        m.ep.Store(&m.y[(t0 + tt) * m.rows + r], t0 + tt, r, m.rows, s);
      });
}

// The routed experts' products with their (token, slot) pairs grouped by expert in tiles of
// up to kQMmaTileTokens pairs (GroupedExpertsMatMul; moe_kernels.cuh's ExpertTilesKernel):
// block (x, y) takes row tile x of tile tile0 + y's expert; a's row of pair p is p
// (x_per_slot) or its token p / k. Blocks past the last tile return at once.
template <DType T>
__global__ void __launch_bounds__(kQMmaWarps * kWarp, 2)
    GroupedExpertsQMmaKernel(const uint8_t* const* experts, const float* const* scales,
                             size_t row_bytes, int64_t rows, QAct a, int k, bool x_per_slot,
                             int E, const int32_t* offsets, const int32_t* tile_start,
                             const int32_t* list, int64_t tile0, float* y) {
  KernelStart();
  const int64_t r0 = int64_t{blockIdx.x} * kQMmaRows, g = tile0 + blockIdx.y;
  if (r0 >= rows || g >= tile_start[E]) return;
  const ExpertTile tile = FindTile(g, E, offsets, tile_start, kQMmaTileTokens);
  const int e = tile.expert;
  const int32_t* const pairs = list + tile.first;
  QMmaTile<T>(
      experts[e], row_bytes, rows, r0, a, tile.n,
      [pairs, k, x_per_slot](int tt) -> int64_t {
        return x_per_slot ? pairs[tt] : pairs[tt] / k;
      },
      [=](int tt, int64_t r, float s) {
        y[int64_t{pairs[tt]} * rows + r] = ExpertRowScaled(scales, e, r, s);
      });
}

}  // namespace
}  // namespace peng::backend::cuda
