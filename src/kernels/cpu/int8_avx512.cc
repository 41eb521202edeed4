// AVX-512 VNNI INT8 kernels. W8A8: vpdpbusd multiplies unsigned by signed bytes, so the
// activations are flipped to u8 (q + 128, an xor of the sign bit) and 128 * row_sums[r] is
// removed from the exact int32 result. W8A16: int8 weights widened to FP32 and FMA'd with the
// activations. Both compute R x T register tiles (R weight rows x T tokens, up to 4 x 4): every
// weight vector is loaded once per tile and reused for T tokens. The column tail (cols a
// multiple of 32, not 64) uses masked loads.
#include <immintrin.h>

#include "kernels/int8_gemm.h"
#include "kernels/ref/int8_ref.h"

// GCC 12 warns about the deliberately undefined upper halves in the cast intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace peng::kernels {
namespace {

using TileFn = void (*)(const Int8Args& a, int64_t r0, int64_t t0);

template <int R, int T>
void TileW8A8(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols;
  const int8_t* wq = a.w.q + r0 * cols;
  const int8_t* xq = a.xq + t0 * cols;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_si512();
  int64_t c = 0;
  for (; c + 64 <= cols; c += 64) {
    __m512i x[T];
    for (int t = 0; t < T; ++t) x[t] = _mm512_xor_si512(_mm512_loadu_si512(xq + t * cols + c), flip);
    for (int r = 0; r < R; ++r) {
      const __m512i w = _mm512_loadu_si512(wq + r * cols + c);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], x[t], w);
    }
  }
  if (c < cols) {  // 32 remaining columns; masked-off weights are 0, so the flipped 0x80 adds 0
    const __mmask64 m = _cvtu64_mask64((uint64_t{1} << (cols - c)) - 1);
    __m512i x[T];
    for (int t = 0; t < T; ++t)
      x[t] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, xq + t * cols + c), flip);
    for (int r = 0; r < R; ++r) {
      const __m512i w = _mm512_maskz_loadu_epi8(m, wq + r * cols + c);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], x[t], w);
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r) {
    // Wrapping uint32 arithmetic: the true result fits in int32 (kInt8MaxCols).
    const uint32_t bias = 128u * static_cast<uint32_t>(a.w.row_sums[r0 + r]);
    for (int t = 0; t < T; ++t) {
      const uint32_t s = static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[r][t])) - bias;
      a.y[(t0 + t) * rows + r0 + r] =
          ref::ScaleI8Dot(static_cast<int32_t>(s), a.x_scales[t0 + t], a.w.scales[r0 + r]);
    }
  }
}

template <int R, int T>
void TileW8A16(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols;
  const int8_t* wq = a.w.q + r0 * cols;
  const float* x = a.x + t0 * cols;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t c = 0; c < cols; c += 16) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * cols + c);
    for (int r = 0; r < R; ++r) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wq + r * cols + c));
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(w, xv[t], acc[r][t]);
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]) * a.w.scales[r0 + r];
}

#define PENG_TILE_ROW(K, R) {&K<R, 1>, &K<R, 2>, &K<R, 3>, &K<R, 4>}
constexpr int kR = 4, kT = 4;
constexpr TileFn kW8A8Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A8, 1), PENG_TILE_ROW(TileW8A8, 2),
                                       PENG_TILE_ROW(TileW8A8, 3), PENG_TILE_ROW(TileW8A8, 4)};
constexpr TileFn kW8A16Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A16, 1), PENG_TILE_ROW(TileW8A16, 2),
                                        PENG_TILE_ROW(TileW8A16, 3), PENG_TILE_ROW(TileW8A16, 4)};
#undef PENG_TILE_ROW

void Tiled(const TileFn (&tiles)[kR][kT], const Int8Args& a, int64_t r0, int64_t r1, int64_t t0,
           int64_t t1) {
  for (int64_t r = r0; r < r1; r += kR) {
    const int64_t nr = r1 - r < kR ? r1 - r : kR;
    for (int64_t t = t0; t < t1; t += kT) {
      const int64_t nt = t1 - t < kT ? t1 - t : kT;
      tiles[nr - 1][nt - 1](a, r, t);
    }
  }
}

void W8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  Tiled(kW8A8Tiles, a, r0, r1, t0, t1);
}
void W8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  Tiled(kW8A16Tiles, a, r0, r1, t0, t1);
}

}  // namespace

Int8Kernels Avx512Int8Kernels() { return {&W8A8, &W8A16}; }

}  // namespace peng::kernels
