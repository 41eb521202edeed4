// The quantized products of a step of kQMmaMinTokens .. kGemvMaxTokens tokens on the tensor
// cores (included by cuda_device.cu after kernels.cuh). The same arithmetic as QGemvKernel --
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

// A decoded unit's numbers but its words (the HalvesDot arithmetic; off is the type's).
struct QMmaUnitScales {
  int sc0, sc1;
  float dw, mw;
};

template <DType T>
__global__ void __launch_bounds__(kQMmaWarps * kWarp, 2) QMmaKernel(QMats ms, QAct a,
                                                                int64_t n_tokens) {
  alignas(16) __shared__ uint32_t words[kQMmaWarps][kQMmaRows * kQMmaRowWords];
  __shared__ QMmaUnitScales scales[kQMmaWarps][kQMmaRows][kQMmaUnits];
  static_assert(sizeof(words) >= sizeof(float) * kQMmaWarps * 4 * kQMmaTiles * kWarp);
  const QMat m = BlockMat(ms);
  const int64_t r0 = int64_t{blockIdx.x} * kQMmaRows;
  GemvStart(m.w, m.row_bytes, r0, m.rows - r0 < kQMmaRows ? m.rows - r0 : kQMmaRows);
  if (r0 >= m.rows) return;  // (a smaller matrix's: the whole block)
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, c = lane % 4;
  const int64_t t0 = int64_t{blockIdx.y} * kQMmaTileTokens;
  const int nt = n_tokens - t0 < kQMmaTileTokens ? static_cast<int>(n_tokens - t0)
                                                : kQMmaTileTokens;
  constexpr int kPerScale = layout::kActBlock<T> / 32;  // units an activation scale covers
  const int64_t units = a.cols / 32, d_stride = a.cols / layout::kActBlock<T>;
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
      if (r < m.rows && u < units) w = layout::DecodeUnit<T>(m.w + r * m.row_bytes, units, u);
      uint32_t* const to = wq + rr * kQMmaRowWords + c * 8;
      StoreVector(to, uint4{w.q[0], w.q[1], w.q[2], w.q[3]});
      StoreVector(to + 4, uint4{w.q[4], w.q[5], w.q[6], w.q[7]});
      scales[warp][rr][c] = {w.sc0, w.sc1, w.dw, w.mw};
    }
    __syncwarp();
    const int n_units = units - u0 < kQMmaUnits ? static_cast<int>(units - u0) : kQMmaUnits;
    for (int j = 0; j < n_units; ++j) {
      const int64_t u = u0 + j;
      const uint32_t* const row_g = wq + g * kQMmaRowWords + j * 8;
      const uint32_t lo_a[2] = {row_g[c], row_g[8 * kQMmaRowWords + c]};
      const uint32_t hi_a[2] = {row_g[4 + c], row_g[8 * kQMmaRowWords + 4 + c]};
      // Rows g and g + 8: their numbers (HalvesDot reads no words); the sub-block scales of
      // the K-quants only (the others' are 1, as their mw is unread: constants to the compiler).
      constexpr bool kSubScales =
          T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K;
      layout::Unit w[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const QMmaUnitScales s = scales[warp][g + 8 * h][j];
        w[h].sc0 = kSubScales ? s.sc0 : 1;
        w[h].sc1 = kSubScales ? s.sc1 : 1;
        w[h].off = layout::kUnitOff<T>;
        w[h].dw = s.dw;
        w[h].mw = layout::kHasMin<T> ? s.mw : 0.f;
      }
#pragma unroll
      for (int b = 0; b < kQMmaTiles; ++b) {
        if (8 * b >= nt) break;
        // B's column g: token 8 b + g of the tile (the last one's again past nt).
        const int tb = 8 * b + g < nt ? 8 * b + g : nt - 1;
        const int8_t* const at = a.qs + (t0 + tb) * a.cols + u * 16 + 4 * c;
        int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
        MmaS8(lo, lo_a, LoadVector<uint32_t>(at));
        MmaS8(hi, hi_a, LoadVector<uint32_t>(at + a.cols / 2));
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // D's columns 2 c + e: token 8 b + 2 c + e
          const int te = 8 * b + 2 * c + e < nt ? 8 * b + 2 * c + e : nt - 1;
          const int64_t t = t0 + te;
          const int2 s = LoadVector<int2>(a.s + t * (a.cols / 16) + 2 * u);
          const float ad = a.d[t * d_stride + u / kPerScale];
          acc[b][e] += layout::HalvesDot<T>(w[0], lo[e], hi[e], ad, s.x, s.y);
          acc[b][2 + e] += layout::HalvesDot<T>(w[1], lo[2 + e], hi[2 + e], ad, s.x, s.y);
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
    if (tt >= nt || r >= m.rows) continue;
    float s = 0.f;
    for (int k = 0; k < kQMmaWarps; ++k) s += part[(k * kQMmaTiles * 4 + bi) * kWarp + l];
    m.ep.Store(&m.y[(t0 + tt) * m.rows + r], t0 + tt, r, m.rows, s);
  }
}

}  // namespace
}  // namespace peng::backend::cuda
