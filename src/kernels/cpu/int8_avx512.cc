// AVX-512 VNNI INT8 kernels. W8A8: vpdpbusd multiplies unsigned by signed bytes, so it is fed
// |x| and w with the sign of x (exact int32 group sums), converted to FP32 and FMA'd with each
// group's activation scale. W8A16: int8 weights widened to FP32 and FMA'd with the
// activations. Both compute R x T register tiles (R weight rows x T tokens, up to 4 x 4): every
// weight vector is loaded once per tile and reused for T tokens. The column tail (cols a
// multiple of 32, not 64) uses masked loads. Weights packed at load time (Int8Weights::panels:
// row groups of 64-byte chunks, cpu/matmul_avx512_common.h) are read as one stream per tile,
// with the same operations in the same order (Rows), so with or without them the results are
// bit-identical.
#include "kernels/cpu/avx512.h"

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/int8_gemm.h"
#include "kernels/ref/int8_ref.h"

namespace peng::kernels {
namespace {

// Where the tile of rows r0.. reads row r's columns c..: row-major, or the packed row group of
// r0 (r0 a multiple of 4: the tile drivers step by 4 from thread ranges of whole panels).
template <bool kPacked>
struct Rows {
  const int8_t* base;
  int64_t cols;
  Rows(const Int8Weights& w, int64_t r0) : cols(w.cols) {
    base = kPacked ? reinterpret_cast<const int8_t*>(w.panels) +
                         r0 / 4 * RowGroupBytes(cols, kInt8ChunkBytes)
                   : w.q + r0 * cols;
  }
  const int8_t* At(int r, int64_t c) const {
    constexpr int64_t kC = kInt8ChunkBytes;
    return kPacked ? base + c / kC * 4 * kC + r * kC + c % kC : base + r * cols + c;
  }
};

template <bool kPacked, int R, int T>
void TileW8A8(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols, groups = cols / kInt8ActGroup;
  const Rows<kPacked> wq(a.w, r0);
  const int8_t* xq = a.xq + t0 * cols;
  const float* xs = a.x_scales + t0 * groups;
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 64) {
    if constexpr (T == 1 && !kPacked)  // (one stream when packed: the hardware follows it)
      for (int r = 0; r < R; ++r) PrefetchStream<64>(wq.At(r, c), ahead);
    // 64 columns = two activation groups (lanes 0-7 and 8-15 of the int32 dot); the last step
    // may hold one group (cols a multiple of 32): masked loads give zeros above it.
    const int64_t g = c / kInt8ActGroup;
    const bool two = c + 64 <= cols;
    const __mmask64 m = two ? ~__mmask64{0} : _cvtu64_mask64((uint64_t{1} << 32) - 1);
    __m512i x_abs[T];
    __mmask64 x_neg[T];
    __m512 sc[T];
    for (int t = 0; t < T; ++t) {
      const __m512i x = _mm512_maskz_loadu_epi8(m, xq + t * cols + c);
      x_abs[t] = _mm512_abs_epi8(x);  // |x| <= 127 fits the unsigned operand
      x_neg[t] = _mm512_movepi8_mask(x);
      const float s0 = xs[t * groups + g], s1 = two ? xs[t * groups + g + 1] : 0.f;
      sc[t] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1),
                                 1);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i w = _mm512_maskz_loadu_epi8(m, wq.At(r, c));
      for (int t = 0; t < T; ++t) {
        // |x| * (w with the sign of x) == x * w, exact in int32.
        const __m512i w_signed = _mm512_mask_sub_epi8(w, x_neg[t], zero, w);
        const __m512i d = _mm512_dpbusd_epi32(zero, x_abs[t], w_signed);
        acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc[t], acc[r][t]);
      }
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]) * a.w.scales[r0 + r];
}

template <bool kPacked, int R, int T>
void TileW8A16(const Int8Args& a, int64_t r0, int64_t t0) {
  const int64_t cols = a.w.cols;
  const Rows<kPacked> wq(a.w, r0);
  const float* x = a.x + t0 * cols;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * cols);
  for (int64_t c = 0; c < cols; c += 16) {
    if constexpr (T == 1 && !kPacked)
      if (c % 64 == 0)
        for (int r = 0; r < R; ++r) PrefetchStream<64>(wq.At(r, c), ahead);
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm512_loadu_ps(x + t * cols + c);
    for (int r = 0; r < R; ++r) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wq.At(r, c)));
      const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(w, xv[t], acc[r][t]);
    }
  }
  const int64_t rows = a.w.rows;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      a.y[(t0 + t) * rows + r0 + r] = _mm512_reduce_add_ps(acc[r][t]) * a.w.scales[r0 + r];
}

#define PENG_TILE_ROW(K, P, R) {&K<P, R, 1>, &K<P, R, 2>, &K<P, R, 3>, &K<P, R, 4>}
#define PENG_TILES(K, P) \
  {PENG_TILE_ROW(K, P, 1), PENG_TILE_ROW(K, P, 2), PENG_TILE_ROW(K, P, 3), PENG_TILE_ROW(K, P, 4)}
constexpr int kR = 4, kT = 4;
constexpr Int8TileFn kW8A8Tiles[2][kR][kT] = {PENG_TILES(TileW8A8, false),
                                             PENG_TILES(TileW8A8, true)};
constexpr Int8TileFn kW8A16Tiles[2][kR][kT] = {PENG_TILES(TileW8A16, false),
                                              PENG_TILES(TileW8A16, true)};
#undef PENG_TILES
#undef PENG_TILE_ROW

bool Packed(const Int8Args& a, int64_t r0) { return a.w.panels && r0 % 16 == 0; }

void W8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  RunInt8Tiles(kW8A8Tiles[Packed(a, r0)], a, r0, r1, t0, t1);
}
void W8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  RunInt8Tiles(kW8A16Tiles[Packed(a, r0)], a, r0, r1, t0, t1);
}

}  // namespace

Int8Kernels Avx512Int8Kernels() { return {&W8A8, &W8A16}; }

}  // namespace peng::kernels
