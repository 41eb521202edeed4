// The NEON INT8 kernels shared by the three ARM64 levels (kernels/isa.h): included by
// cpu/int8_neon.cc (-march=armv8-a), cpu/int8_dotprod.cc (+dotprod+fp16) and cpu/int8_i8mm.cc
// (+i8mm), each compiling it with its own target flags; everything is in an anonymous namespace
// (internal linkage, no ODR merging across levels). W8A8: signed x signed int8 dot products per
// 32-value activation group -- sdot where the file has the dot-product extension, a
// vmull/vpadal pair (the same exact int32 sums) on ARMv8.0 -- converted to FP32 and FMA'd with
// the group's scale. W8A16: int8 weights widened to FP32 and FMA'd with the activations. R x T
// register tiles up to 4 x 4.
#pragma once
#if defined(__aarch64__)

#include <arm_neon.h>

#include "kernels/cpu/neon_dot.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/int8_gemm.h"
#include "kernels/ref/int8_ref.h"

namespace peng::kernels {
namespace {


template <int R, int T>
void TileW8A8(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols, groups = cols / kInt8ActGroup;
  const int8_t* wq = a.w.q + r0 * cols;
  const int8_t* xq = a.xq + t0 * cols;
  const float* xs = a.x_scales + t0 * groups;
  float32x4_t acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vdupq_n_f32(0.f);
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 32) {  // one activation group per step
    if constexpr (T == 1)
      if (c % 64 == 0)
        for (int r = 0; r < R; ++r) PrefetchStream<64>(wq + r * cols + c, ahead);
    const int64_t g = c / kInt8ActGroup;
    int8x16_t x0[T], x1[T];
    for (int t = 0; t < T; ++t) {
      x0[t] = vld1q_s8(xq + t * cols + c);
      x1[t] = vld1q_s8(xq + t * cols + c + 16);
    }
    for (int r = 0; r < R; ++r) {
      const int8x16_t w0 = vld1q_s8(wq + r * cols + c);
      const int8x16_t w1 = vld1q_s8(wq + r * cols + c + 16);
      for (int t = 0; t < T; ++t) {
        const int32x4_t d = Dot(Dot(vdupq_n_s32(0), w0, x0[t]), w1, x1[t]);
        acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(d), xs[t * groups + g]);
      }
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = vaddvq_f32(acc[r][t]) * a.w.scales[r0 + r];
}

template <int R, int T>
void TileW8A16(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols;
  const int8_t* wq = a.w.q + r0 * cols;
  const float* x = a.x + t0 * cols;
  float32x4_t acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vdupq_n_f32(0.f);
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 8) {
    if constexpr (T == 1)
      if (c % 64 == 0)
        for (int r = 0; r < R; ++r) PrefetchStream<64>(wq + r * cols + c, ahead);
    float32x4_t x0[T], x1[T];
    for (int t = 0; t < T; ++t) {
      x0[t] = vld1q_f32(x + t * cols + c);
      x1[t] = vld1q_f32(x + t * cols + c + 4);
    }
    for (int r = 0; r < R; ++r) {
      const int16x8_t q = vmovl_s8(vld1_s8(wq + r * cols + c));
      const float32x4_t w0 = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
      const float32x4_t w1 = vcvtq_f32_s32(vmovl_high_s16(q));
      for (int t = 0; t < T; ++t)
        acc[r][t] = vfmaq_f32(vfmaq_f32(acc[r][t], w0, x0[t]), w1, x1[t]);
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = vaddvq_f32(acc[r][t]) * a.w.scales[r0 + r];
}

#define PENG_TILE_ROW(K, R) {&K<R, 1>, &K<R, 2>, &K<R, 3>, &K<R, 4>}
constexpr int kR = 4, kT = 4;
constexpr Int8TileFn kW8A8Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A8, 1), PENG_TILE_ROW(TileW8A8, 2),
                                       PENG_TILE_ROW(TileW8A8, 3), PENG_TILE_ROW(TileW8A8, 4)};
constexpr Int8TileFn kW8A16Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A16, 1), PENG_TILE_ROW(TileW8A16, 2),
                                        PENG_TILE_ROW(TileW8A16, 3), PENG_TILE_ROW(TileW8A16, 4)};
#undef PENG_TILE_ROW


[[maybe_unused]] void W8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0,
                           int64_t t1) {
  RunInt8Tiles(kW8A8Tiles, a, r0, r1, t0, t1);
}
void W8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  RunInt8Tiles(kW8A16Tiles, a, r0, r1, t0, t1);
}

[[maybe_unused]] Int8Kernels BaseInt8Kernels() { return {&W8A8, &W8A16}; }

}  // namespace
}  // namespace peng::kernels

#endif  // __aarch64__
