// Loops and scalar helpers shared by the per-ISA kernel files (cpu/matmul_*.cc,
// cpu/matmul_neon_impl.h, cpu/int8_*.cc, cpu/int8_neon_impl.h): the row x token tile drivers and
// the scalar column tail of the float kernels. Everything is in an unnamed namespace: each ISA's
// translation unit is built with its own target flags and keeps its own copy, so the linker can
// never substitute one ISA's code for another's.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "kernels/int8_gemm.h"
#include "kernels/quant_blocks.h"

// Defines NAME<K, R, T>(args, r0, r1): rows [r0, r1) x all tokens in R x T register tiles of
// TILE<K, R, T>(args, row, token), then R x 1 tiles for the last tokens and 1 x T / 1 x 1 tiles
// for the last rows. PARAM is the kind of K (`class` for block formats, `DType` for floats).
#define PENG_DEFINE_TILE_DRIVER(NAME, TILE, PARAM)             \
  template <PARAM K, int R, int T>                             \
  void NAME(const MatMulArgs& g, int64_t r0, int64_t r1) {     \
    const int64_t n = g.n_tokens;                              \
    int64_t r = r0;                                            \
    for (; r + R <= r1; r += R) {                              \
      int64_t t = 0;                                           \
      for (; t + T <= n; t += T) TILE<K, R, T>(g, r, t);       \
      for (; t < n; ++t) TILE<K, R, 1>(g, r, t);               \
    }                                                          \
    for (; r < r1; ++r) {                                      \
      int64_t t = 0;                                           \
      for (; t + T <= n; t += T) TILE<K, 1, T>(g, r, t);       \
      for (; t < n; ++t) TILE<K, 1, 1>(g, r, t);               \
    }                                                          \
  }

namespace peng::kernels {
namespace {

// Weight c of a float row (F32 / F16 / BF16), for the scalar column tail.
template <DType kT>
inline float WeightScalar(const uint8_t* row, int64_t c) {
  if constexpr (kT == DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * c, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * c, 2);
  return kT == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
}

// INT8 tiles: tiles[nr - 1][nt - 1] computes nr rows x nt tokens from (r, t); runs rows
// [r0, r1) x tokens [t0, t1) in tiles of up to kR x kT.
using Int8TileFn = void (*)(const Int8Args& a, int64_t r0, int64_t t0);
template <int kR, int kT>
void RunInt8Tiles(const Int8TileFn (&tiles)[kR][kT], const Int8Args& a, int64_t r0, int64_t r1,
                  int64_t t0, int64_t t1) {
  for (int64_t r = r0; r < r1; r += kR) {
    const int64_t nr = r1 - r < kR ? r1 - r : kR;
    for (int64_t t = t0; t < t1; t += kT) {
      const int64_t nt = t1 - t < kT ? t1 - t : kT;
      tiles[nr - 1][nt - 1](a, r, t);
    }
  }
}

}  // namespace
}  // namespace peng::kernels
