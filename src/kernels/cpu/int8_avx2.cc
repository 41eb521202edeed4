// AVX2 INT8 kernels. W8A8: vpmaddubsw multiplies unsigned by signed bytes with int16 saturation,
// so each step feeds it |w| and sign(x, w) (x negated where w < 0): pair sums stay within
// 2 * 127 * 127 < 2^15, exact; vpmaddwd then widens them to int32. No row-sum correction is
// needed; each 32-byte step is one activation group, converted to FP32 and FMA'd with its scale.
// W8A16: int8 weights widened to FP32 and FMA'd with the activations. Both compute
// R x T register tiles (up to 4 rows x 2 tokens, within the 16 ymm registers).
#include <immintrin.h>

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/int8_gemm.h"
#include "kernels/ref/int8_ref.h"

namespace peng::kernels {
namespace {


inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R, int T>
void TileW8A8(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols, groups = cols / kInt8ActGroup;
  const int8_t* wq = a.w.q + r0 * cols;
  const int8_t* xq = a.xq + t0 * cols;
  const float* xs = a.x_scales + t0 * groups;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 32) {  // one activation group per step
    if constexpr (T == 1)
      if (c % 64 == 0)
        for (int r = 0; r < R; ++r) PrefetchStream<64>(wq + r * cols + c, ahead);
    const int64_t g = c / kInt8ActGroup;
    __m256i x[T];
    __m256 sc[T];
    for (int t = 0; t < T; ++t) {
      x[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * cols + c));
      sc[t] = _mm256_broadcast_ss(xs + t * groups + g);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + r * cols + c));
      const __m256i w_abs = _mm256_abs_epi8(w);
      for (int t = 0; t < T; ++t) {
        const __m256i p16 = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x[t], w));
        const __m256i d = _mm256_madd_epi16(p16, ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc[t], acc[r][t]);
      }
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = HSum(acc[r][t]) * a.w.scales[r0 + r];
}

template <int R, int T>
void TileW8A16(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols;
  const int8_t* wq = a.w.q + r0 * cols;
  const float* x = a.x + t0 * cols;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 8) {
    if constexpr (T == 1)
      if (c % 64 == 0)
        for (int r = 0; r < R; ++r) PrefetchStream<64>(wq + r * cols + c, ahead);
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * cols + c);
    for (int r = 0; r < R; ++r) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wq + r * cols + c));
      const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(w, xv[t], acc[r][t]);
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = HSum(acc[r][t]) * a.w.scales[r0 + r];
}

#define PENG_TILE_ROW(K, R) {&K<R, 1>, &K<R, 2>}
constexpr int kR = 4, kT = 2;
constexpr Int8TileFn kW8A8Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A8, 1), PENG_TILE_ROW(TileW8A8, 2),
                                       PENG_TILE_ROW(TileW8A8, 3), PENG_TILE_ROW(TileW8A8, 4)};
constexpr Int8TileFn kW8A16Tiles[kR][kT] = {PENG_TILE_ROW(TileW8A16, 1), PENG_TILE_ROW(TileW8A16, 2),
                                        PENG_TILE_ROW(TileW8A16, 3), PENG_TILE_ROW(TileW8A16, 4)};
#undef PENG_TILE_ROW


void W8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  RunInt8Tiles(kW8A8Tiles, a, r0, r1, t0, t1);
}
void W8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  RunInt8Tiles(kW8A16Tiles, a, r0, r1, t0, t1);
}

}  // namespace

Int8Kernels Avx2Int8Kernels() { return {&W8A8, &W8A16}; }

}  // namespace peng::kernels
