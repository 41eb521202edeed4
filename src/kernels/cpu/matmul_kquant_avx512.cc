// AVX-512 (F/BW/VL/DQ + VNNI) kernels of the K-quants (Q4_K / Q5_K / Q6_K), reached through
// matmul_avx512.cc's entry points. Q4_K and Q6_K matrices packed at load time run in 16-row
// panels (PackedQ4K, PackedQ6K: one lane per row, every super-block's exact integer sum then
// one or two FMAs); otherwise, and for Q5_K, R x T register tiles (R weight rows x T tokens:
// every super-block decoded once per tile and reused for T tokens), one 64-value chunk per
// 512-bit step. Row-major tiles and panels do the same arithmetic per (row, super-block), so
// they give the same bits (PackedPanelsGiveTheRowMajorResults).
#include "kernels/cpu/avx512.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/matmul_avx512_common.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels {
namespace {

inline __m512i Idx2() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }

inline float Half(uint16_t h) { return _cvtsh_ss(h); }

// A Q4_K super-block's contribution to a row's sum, from its exact integer sums: isc = sum over
// sub-blocks of scale * dot, imin = sum of min * (sum of the sub-block's activations). The
// row-major tiles (KQ4_K::Finish: one row, scalar) and the panels (16 rows, one lane each) do
// these same two fused multiply-adds, so both give the same bits.
inline float ScaleSuperRow(int32_t isc, int32_t imin, float d, float dmin, float da, float acc) {
  __m128 a =
      _mm_fmadd_ss(_mm_set_ss(static_cast<float>(isc)), _mm_set_ss(d * da), _mm_set_ss(acc));
  a = _mm_fmadd_ss(_mm_set_ss(static_cast<float>(imin)), _mm_set_ss(-(dmin * da)), a);
  return _mm_cvtss_f32(a);
}
// Q6_K: the super-block's exact integer sum (sum over sub-blocks of scale * (dot - 32 * sum(a)),
// |.| < 2^29) times d * d_a, one FMA; row-major tiles and panels alike.
inline float ScaleSuperRowQ6K(int32_t isum, float d, float da, float acc) {
  return _mm_cvtss_f32(
      _mm_fmadd_ss(_mm_set_ss(static_cast<float>(isum)), _mm_set_ss(d * da), _mm_set_ss(acc)));
}
inline __m512 ScaleSuper(__m512i isc, __m512i imin, __m512 d, __m512 dmin, float da, __m512 acc) {
  const __m512 vda = _mm512_set1_ps(da);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isc), _mm512_mul_ps(d, vda), acc);
  const __m512 ndm = _mm512_xor_ps(_mm512_mul_ps(dmin, vda), _mm512_set1_ps(-0.f));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), ndm, acc);
}

// ---- K-quants: one super-block (4 chunks of 64 values) at a time. Per-chunk integer sums are
// multiplied by the sub-block scales with vpmaddwd (the chunk sums fit in int16). K::Finish folds
// a super-block into the row's accumulator (K::Acc): Q5_K / Q6_K keep 16 float lanes summed at
// the end, Q4_K one float from the super-block's exact integer sums, as its panels do.
struct RowK {
  __m512i sc32;   // 16 x int32 (low 16 bits) sub-block scales, permuted per chunk
  __m256i m16;    // Q4_K/Q5_K: mins per 16 values; Q6_K: scales per 16 values (int16)
  __m512i qh2;    // Q5_K: [qh, qh]
  float d, dmin;
};

inline __m512i ChunkScales32(const RowK& p, int c) {  // 8-value... [s_2c x8, s_2c+1 x8]
  return _mm512_permutexvar_epi32(_mm512_add_epi32(Idx2(), _mm512_set1_epi32(2 * c)), p.sc32);
}

struct KQ4_K {
  using B = BlockQ4_K;
  using Acc = float;
  static void Prep(const B* b, RowK* p) {
    uint64_t sc, m;
    UnpackScalesK64(b->scales, &sc, &m);
    p->sc32 = _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const __m128i mm = _mm_cvtsi64_si128(static_cast<int64_t>(m));
    p->m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mm, mm));
    p->d = Half(b->d);
    p->dmin = Half(b->dmin);
  }
  static __m512i Q(const B* b, const RowK&, int c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
    const __m256i f = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, f)),
                              _mm256_and_si256(_mm256_srli_epi16(x, 4), f), 1);
  }
  static __m512i S(const RowK& p, int c) { return ChunkScales32(p, c); }
  static float Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, float acc) {
    const int32_t isc = _mm512_reduce_add_epi32(iacc);
    const int32_t imin =
        _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, p.m16)));
    return ScaleSuperRow(isc, imin, p.d, p.dmin, da, acc);
  }
};
struct KQ5_K {
  using B = BlockQ5_K;
  using Acc = __m512;
  static void Prep(const B* b, RowK* p) {
    KQ4_K::Prep(reinterpret_cast<const BlockQ4_K*>(b), p);  // same d/dmin/scales prefix
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh));
    p->qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
  }
  static __m512i Q(const B* b, const RowK& p, int c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs + 32 * c));
    const __m256i f = _mm256_set1_epi8(0x0F);
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, f)),
                                         _mm256_and_si256(_mm256_srli_epi16(x, 4), f), 1);
    const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                           _mm256_set1_epi8(static_cast<char>(2 << (2 * c))), 1);
    const __mmask64 m = _mm512_test_epi8_mask(p.qh2, bit);
    return _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16));
  }
  static __m512i S(const RowK& p, int c) { return ChunkScales32(p, c); }
  static __m512 Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, __m512 facc) {
    const __m256i mins = _mm256_madd_epi16(bsums, p.m16);
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(p.d * da), facc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)),
                           _mm512_set1_ps(-p.dmin * da), facc);
  }
};
struct KQ6_K {
  using B = BlockQ6_K;
  using Acc = float;
  static void Prep(const B* b, RowK* p) {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
    p->sc32 = _mm512_and_si512(_mm512_cvtepi8_epi32(s), _mm512_set1_epi32(0xFFFF));
    p->m16 = _mm256_cvtepi8_epi16(s);
    p->d = Half(b->d);
  }
  static __m512i Q(const B* b, const RowK&, int c) {
    const int h = c >> 1;
    const __m512i l = _mm512_loadu_si512(b->ql + 64 * h);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qh + 32 * h));
    const __m512i hz = _mm512_inserti64x4(_mm512_castsi256_si512(x), _mm256_srli_epi16(x, 2), 1);
    const __m512i m30 = _mm512_set1_epi8(0x30), f = _mm512_set1_epi8(0x0F);
    if (c & 1) {
      return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), f),
                             _mm512_and_si512(hz, m30));
    }
    return _mm512_or_si512(_mm512_and_si512(l, f),
                           _mm512_and_si512(_mm512_slli_epi16(hz, 4), m30));
  }
  static __m512i S(const RowK& p, int c) {
    const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32(4 * c)), p.sc32);
  }
  static float Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, float acc) {
    const int32_t isc = _mm512_reduce_add_epi32(iacc);
    const int32_t off =  // sum of scale * (sum of the sub-block's activations)
        _mm512_reduce_add_epi32(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, p.m16)));
    return ScaleSuperRowQ6K(isc - 32 * off, p.d, da, acc);
  }
};

inline float RowTotal(float acc) { return acc; }
inline float RowTotal(__m512 acc) { return _mm512_reduce_add_ps(acc); }

template <class K, int R, int T>
void TileK(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQKK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  typename K::Acc facc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) facc[r][t] = typename K::Acc{};
  const __m512i zero = _mm512_setzero_si512();
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    RowK p[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) K::Prep(w[r] + b, &p[r]);
    __m512i iacc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) iacc[r][t] = zero;
    for (int c = 0; c < 4; ++c) {
      __m512i q[R], s[R];
      for (int r = 0; r < R; ++r) {
        q[r] = K::Q(w[r] + b, p[r], c);
        s[r] = K::S(p[r], c);
      }
      for (int t = 0; t < T; ++t) {
        const __m512i a = _mm512_loadu_si512(g.a.qs + (t0 + t) * g.a.qs_stride + b * kQKK + 64 * c);
        for (int r = 0; r < R; ++r)
          iacc[r][t] = _mm512_add_epi32(
              iacc[r][t], _mm512_madd_epi16(_mm512_dpbusd_epi32(zero, q[r], a), s[r]));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float da = g.a.d[(t0 + t) * g.a.d_stride + b];
      const __m256i bs = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(g.a.sums + (t0 + t) * g.a.sums_stride + b * 16));
      for (int r = 0; r < R; ++r) facc[r][t] = K::Finish(p[r], iacc[r][t], bs, da, facc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = RowTotal(facc[r][t]);
}

// ---- Q4_K panels, packed at load time: per 16-row panel and super-block, exactly the 16 rows'
// bytes rearranged (2304 = 16 x 144): the rows' 12 scale bytes as three vectors (dwords 0, 1, 2
// of every row), the 16 d and the 16 dmin (fp16), then 32 nibble vectors (chunk c, vector k:
// bytes qs[32c + 4k .. 32c + 4k + 3] of every row, low nibbles values 64c + 4k.. of sub-block 2c,
// high nibbles values 64c + 32 + 4k.. of sub-block 2c + 1). The scales lead, as the kernel reads
// them first (with them at the end the single-token GEMV read 13-15 GB/s from memory instead of
// 15.5-16, one core; Q6_K the same, PackedQ6K). A sub-block's
// dot goes as two 16-value halves of 4 vpdpbusd each (|dot| <= 16 * 15 * 127 fits int16), and
// each half is scaled and summed by one vpdpwssd against (scale, 0) per lane; the mins term is
// one vpdpwssd of (min, min) against the token's two 16-value sums of the sub-block. The integer
// sums are exact, so they equal the row-major tile's, and ScaleSuper matches ScaleSuperRow.
struct PackedQ4K {
  static constexpr int64_t kScaleVectors = 0;
  static constexpr int64_t kHeads = kScaleVectors + 64 * 3;
  static constexpr int64_t kQuants = kHeads + 64;
  static constexpr int64_t kBlockBytes = kQuants + 64 * 32;
  static_assert(kBlockBytes == 16 * static_cast<int64_t>(sizeof(BlockQ4_K)));
};

// Calls pack(block, out, i) for row i (rows past the end repeat the last) of every 16-row panel
// and super-block of a K-quant matrix, out stepping kBlockBytes a panel's super-block.
template <class B, int64_t kBlockBytes, class F>
void PackSuperBlockPanels(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                          uint8_t* out, F&& pack) {
  const int64_t nb = cols / kQKK;
  for (int64_t r = 0; r < rows; r += 16) {
    for (int64_t b = 0; b < nb; ++b, out += kBlockBytes) {
      for (int i = 0; i < 16; ++i)
        pack(reinterpret_cast<const B*>(w + std::min(r + i, rows - 1) * row_bytes) + b, out, i);
    }
  }
}

void PackPanelsQ4K(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  PackSuperBlockPanels<BlockQ4_K, PackedQ4K::kBlockBytes>(
      w, row_bytes, rows, cols, out, [](const BlockQ4_K* blk, uint8_t* o, int i) {
        for (int v = 0; v < 32; ++v)
          std::memcpy(o + PackedQ4K::kQuants + 64 * v + 4 * i, blk->qs + 4 * v, 4);
        for (int v = 0; v < 3; ++v)
          std::memcpy(o + PackedQ4K::kScaleVectors + 64 * v + 4 * i, blk->scales + 4 * v, 4);
        std::memcpy(o + PackedQ4K::kHeads + 2 * i, &blk->d, 2);
        std::memcpy(o + PackedQ4K::kHeads + 32 + 2 * i, &blk->dmin, 2);
      });
}

// Sub-block j's scale (low 16 bits of each row's dword) and min (both 16-bit halves), from the
// rows' unpacked 6-bit scales (UnpackScalesK64's arithmetic, one row a lane): sc[0] / sc[1]
// bytes 0-3 = scales of sub-blocks 0-3 / 4-7, m[0] / m[1] the mins.
inline void ScalesQ4K(const uint8_t* p, __m512i sc[2], __m512i m[2]) {
  const __m512i lo = _mm512_loadu_si512(p), hi = _mm512_loadu_si512(p + 64),
                b = _mm512_loadu_si512(p + 128);
  const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F);
  sc[0] = _mm512_and_si512(lo, m3f);
  m[0] = _mm512_and_si512(hi, m3f);
  // Bits 0-3 from b (0xD8: c ? b : a, c the 0x0F mask), bits 4-5 from lo / hi >> 2, then the
  // 6 bits kept.
  sc[1] = _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 2), b, m0f, 0xD8), m3f);
  m[1] = _mm512_and_si512(
      _mm512_ternarylogic_epi32(_mm512_srli_epi32(hi, 2), _mm512_srli_epi32(b, 4), m0f, 0xD8), m3f);
}
// Byte j of each dword as a 16-bit value in the dword's low half (both: in both halves).
inline __m512i ByteToWord(__m512i v, int j, bool both) {
  const int x = j, z = 0x80;
  const __m512i idx = _mm512_set4_epi32(
      (both ? x + 12 : z) << 16 | z << 24 | (x + 12) | z << 8,
      (both ? x + 8 : z) << 16 | z << 24 | (x + 8) | z << 8,
      (both ? x + 4 : z) << 16 | z << 24 | (x + 4) | z << 8,
      (both ? x : z) << 16 | z << 24 | x | z << 8);
  return _mm512_shuffle_epi8(v, idx);
}

// T tokens from t0 against the Q4_K panel of rows [r, r_end). No software prefetch: a thread's
// panels are one contiguous stream, which the hardware prefetchers follow; prefetching 4 or 8
// super-blocks ahead (to L1 or L2) made the single-token GEMV slower (one core, weights from
// memory: 14-18 GB/s with, 18-20.5 without).
template <int T>
void PanelTileQ4K(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end,
                  int64_t t0) {
  const int64_t nb = g.cols / kQKK;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t bb = 0; bb < nb; ++bb) {
    const uint8_t* p = panel + bb * PackedQ4K::kBlockBytes;
    __m512i sc[2], mn[2];
    ScalesQ4K(p + PackedQ4K::kScaleVectors, sc, mn);
    // Two accumulators of each kind a token (even / odd sub-blocks; integer sums, so the split
    // changes nothing) keep the dependent chains short when there are few tokens.
    __m512i isc[2][T], imin[2][T];
    for (int t = 0; t < T; ++t)
      isc[0][t] = isc[1][t] = imin[0][t] = imin[1][t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;  // sub-block
        const __m512i s = ByteToWord(sc[j >> 2], j & 3, false);
        const __m512i mm = ByteToWord(mn[j >> 2], j & 3, true);
        __m512i v[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m512i q = _mm512_loadu_si512(p + PackedQ4K::kQuants + 64 * (8 * c + k));
          v[k] = _mm512_and_si512(h ? _mm512_srli_epi16(q, 4) : q, m4);
        }
        for (int t = 0; t < T; ++t) {
          const int8_t* a = g.a.qs + (t0 + t) * g.a.qs_stride + bb * kQKK + 32 * j;
          __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            d0 = _mm512_dpbusd_epi32(d0, v[k], _mm512_set1_epi32(static_cast<int>(Load32(a + 4 * k))));
            d1 = _mm512_dpbusd_epi32(d1, v[4 + k],
                                     _mm512_set1_epi32(static_cast<int>(Load32(a + 16 + 4 * k))));
          }
          isc[h][t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isc[h][t], d0, s), d1, s);
          const int16_t* sums = g.a.sums + (t0 + t) * g.a.sums_stride + bb * 16 + 2 * j;
          imin[h][t] = _mm512_dpwssd_epi32(imin[h][t], mm,
                                           _mm512_set1_epi32(static_cast<int>(Load32(sums))));
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ4K::kHeads)));
    const __m512 dmw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ4K::kHeads + 32)));
    for (int t = 0; t < T; ++t)
      acc[t] = ScaleSuper(_mm512_add_epi32(isc[0][t], isc[1][t]),
                          _mm512_add_epi32(imin[0][t], imin[1][t]), dw, dmw,
                          g.a.d[(t0 + t) * g.a.d_stride + bb], acc[t]);
  }
  for (int t = 0; t < T; ++t)
    StoreRows(g.y + (t0 + t) * g.ldy + r, acc[t], static_cast<int>(r_end - r));
}

// ---- Q6_K panels, packed at load time: per 16-row panel and super-block, exactly the 16 rows'
// bytes rearranged (3360 = 16 x 210), every vector one dword a row. First the rows' 16 int8
// scales as four vectors, scales 4q, 4q + 2, 4q + 1, 4q + 3 in vector q (two shifts give the
// int16 pairs (4q, 4q + 1) and (4q + 2, 4q + 3)); they lead the block so that the block reads
// front to back (with them at the end, their load missed the cache at every super-block: the
// GEMV read 9-10 GB/s from memory instead of 11-15). Then 4 groups of 12 vectors: group
// 2 * half + k16 holds values 128 * half + 32 * s + 16 * k16 + 0..15, s = 0..3 (sub-blocks
// 8 * half + 2 * s + k16): 4 vectors of ql bytes 64 * half + 16 * k16 + 4k.. (low nibbles:
// s = 0, high: s = 2), 4 of the ql bytes 32 further (s = 1, 3), 4 of qh bytes 32 * half +
// 16 * k16 + 4k.. (bits 2s, 2s + 1: value s). Then the 16 d (fp16). A value decodes to u = q + 32
// in 0..63 (nibble | high bits << 4: an and, a shift, a vpternlogd); a sub-block's dot of u
// against the token's int8 values is 4 vpdpbusd, times the row's scale with vpmulld (the dot
// does not fit int16), and the -32 offset is one vpdpwssd per two sub-blocks of the scales
// against the token's 16-value sums: the super-block's exact integer sum, as KQ6_K::Finish
// computes it one row at a time, so packed and row-major results are the same bits.
struct PackedQ6K {
  static constexpr int64_t kScales = 0;
  static constexpr int64_t kGroups = kScales + 4 * 64;
  static constexpr int64_t kGroupBytes = 12 * 64;
  static constexpr int64_t kHeads = kGroups + 4 * kGroupBytes;
  static constexpr int64_t kBlockBytes = kHeads + 32;
  static_assert(kBlockBytes == 16 * static_cast<int64_t>(sizeof(BlockQ6_K)));
};

void PackPanelsQ6K(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols, uint8_t* out) {
  PackSuperBlockPanels<BlockQ6_K, PackedQ6K::kBlockBytes>(
      w, row_bytes, rows, cols, out, [](const BlockQ6_K* blk, uint8_t* o, int i) {
        for (int g = 0; g < 4; ++g) {
          const int half = g >> 1, k16 = g & 1;
          uint8_t* grp = o + PackedQ6K::kGroups + g * PackedQ6K::kGroupBytes + 4 * i;
          for (int k = 0; k < 4; ++k) {
            std::memcpy(grp + 64 * k, blk->ql + 64 * half + 16 * k16 + 4 * k, 4);
            std::memcpy(grp + 64 * (4 + k), blk->ql + 64 * half + 32 + 16 * k16 + 4 * k, 4);
            std::memcpy(grp + 64 * (8 + k), blk->qh + 32 * half + 16 * k16 + 4 * k, 4);
          }
        }
        for (int q = 0; q < 4; ++q) {
          const int8_t* sc = blk->scales + 4 * q;
          const int8_t v[4] = {sc[0], sc[2], sc[1], sc[3]};
          std::memcpy(o + PackedQ6K::kScales + 64 * q + 4 * i, v, 4);
        }
        std::memcpy(o + PackedQ6K::kHeads + 2 * i, &blk->d, 2);
      });
}

// T tokens from t0 against the Q6_K panel of rows [r, r_end) (no software prefetch, as for Q4_K).
template <int T>
void PanelTileQ6K(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end,
                  int64_t t0) {
  const int64_t nb = g.cols / kQKK;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t bb = 0; bb < nb; ++bb) {
    const uint8_t* p = panel + bb * PackedQ6K::kBlockBytes;
    const uint8_t* scales = p + PackedQ6K::kScales;
    __m512i isc[T], off[T];
    for (int t = 0; t < T; ++t) off[t] = isc[t] = zero;
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {  // the -32 offset: scale pairs (4q, 4q + 1), (4q + 2, 4q + 3)
      const __m512i v = _mm512_loadu_si512(scales + 64 * q);
      const __m512i w0 = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 8), w1 = _mm512_srai_epi16(v, 8);
      for (int t = 0; t < T; ++t) {
        const int16_t* sums = g.a.sums + (t0 + t) * g.a.sums_stride + bb * 16 + 4 * q;
        off[t] = _mm512_dpwssd_epi32(off[t], w0, _mm512_set1_epi32(static_cast<int>(Load32(sums))));
        off[t] = _mm512_dpwssd_epi32(off[t], w1,
                                     _mm512_set1_epi32(static_cast<int>(Load32(sums + 2))));
      }
    }
#pragma GCC unroll 4
    for (int grp = 0; grp < 4; ++grp) {
      const uint8_t* q = p + PackedQ6K::kGroups + grp * PackedQ6K::kGroupBytes;
      __m512i xs[8], hs[4];
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) xs[k] = _mm512_loadu_si512(q + 64 * k);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) hs[k] = _mm512_loadu_si512(q + 64 * (8 + k));
#pragma GCC unroll 2
      for (int sp = 0; sp < 2; ++sp) {  // s = sp (low nibbles) and s = sp + 2 (high nibbles)
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m512i x = xs[4 * sp + k];
          const __m512i h = hs[k];
          // high bits 2s, 2s + 1 of each byte moved to bits 4, 5; | nibble (ternary 0xEA).
          const __m512i hl = sp ? _mm512_slli_epi16(h, 2) : _mm512_slli_epi16(h, 4);
          const __m512i hh = sp ? _mm512_srli_epi16(h, 2) : h;
          lo[k] = _mm512_ternarylogic_epi32(hl, m30, _mm512_and_si512(x, m4), 0xEA);
          hi[k] = _mm512_ternarylogic_epi32(hh, m30, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4),
                                            0xEA);
        }
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int s = sp + 2 * e;
          const int j = 8 * (grp >> 1) + 2 * s + (grp & 1);  // sub-block
          // Sub-block j's scale as int32: byte (0, 2, 1, 3)[j % 4] of scale vector j / 4.
          constexpr int kByte[4] = {0, 2, 1, 3};
          const __m512i sc = _mm512_srai_epi32(
              _mm512_slli_epi32(_mm512_loadu_si512(scales + 64 * (j >> 2)), 24 - 8 * kByte[j & 3]),
              24);
          const __m512i* v = e ? hi : lo;
          for (int t = 0; t < T; ++t) {
            const int8_t* a = g.a.qs + (t0 + t) * g.a.qs_stride + bb * kQKK + 16 * j;
            const __m512i d0 = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(zero, v[0], _mm512_set1_epi32(static_cast<int>(Load32(a)))),
                v[1], _mm512_set1_epi32(static_cast<int>(Load32(a + 4))));
            const __m512i d1 = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(zero, v[2], _mm512_set1_epi32(static_cast<int>(Load32(a + 8)))),
                v[3], _mm512_set1_epi32(static_cast<int>(Load32(a + 12))));
            isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(_mm512_add_epi32(d0, d1), sc));
          }
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + PackedQ6K::kHeads)));
    for (int t = 0; t < T; ++t) {
      const __m512i isum = _mm512_sub_epi32(isc[t], _mm512_slli_epi32(off[t], 5));
      const __m512 da = _mm512_set1_ps(g.a.d[(t0 + t) * g.a.d_stride + bb]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, da), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t)
    StoreRows(g.y + (t0 + t) * g.ldy + r, acc[t], static_cast<int>(r_end - r));
}

struct TilesQ4K {
  template <int T>
  static void Run(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end, int64_t t0) {
    PanelTileQ4K<T>(g, panel, r, r_end, t0);
  }
};
struct TilesQ6K {
  template <int T>
  static void Run(const MatMulArgs& g, const uint8_t* panel, int64_t r, int64_t r_end, int64_t t0) {
    PanelTileQ6K<T>(g, panel, r, r_end, t0);
  }
};

// Every token of the call against the K-quant panels of rows [r0, r1), 4 tokens a tile.
template <class Tiles>
void PanelsK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += 16) {
    const uint8_t* panel = g.panels + (r / 16) * g.panel_bytes;
    const int64_t r_end = std::min(r + 16, r1);
    int64_t t = 0;
    for (; t + 4 <= g.n_tokens; t += 4) Tiles::template Run<4>(g, panel, r, r_end, t);
    switch (g.n_tokens - t) {
      case 3: Tiles::template Run<3>(g, panel, r, r_end, t); break;
      case 2: Tiles::template Run<2>(g, panel, r, r_end, t); break;
      case 1: Tiles::template Run<1>(g, panel, r, r_end, t); break;
      default: break;
    }
  }
}

PENG_DEFINE_TILE_DRIVER(RunK, TileK, class)

// K-quant GEMV (one token) is memory bound: 4 rows in flight. GEMM tiles are sized to the 32 zmm.
template <class K>
void KernelK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if constexpr (std::is_same_v<K, KQ4_K>) {
    if (g.panels && r0 % 16 == 0) return PanelsK<TilesQ4K>(g, r0, r1);
  }
  if constexpr (std::is_same_v<K, KQ6_K>) {
    if (g.panels && r0 % 16 == 0) return PanelsK<TilesQ6K>(g, r0, r1);
  }
  if (g.n_tokens == 1) return RunK<K, 4, 1>(g, r0, r1);
  return RunK<K, 2, 4>(g, r0, r1);
}

}  // namespace

MatMulKernel Avx512KQuantKernel(DType t) {
  switch (t) {
    case DType::kQ4_K: return &KernelK<KQ4_K>;
    case DType::kQ5_K: return &KernelK<KQ5_K>;
    case DType::kQ6_K: return &KernelK<KQ6_K>;
    default: return nullptr;
  }
}

size_t Avx512KQuantPanelBytes(DType t, int64_t cols) {
  switch (t) {
    case DType::kQ4_K: return cols / kQKK * PackedQ4K::kBlockBytes;
    case DType::kQ6_K: return cols / kQKK * PackedQ6K::kBlockBytes;
    default: return 0;
  }
}

void Avx512PackKQuantPanels(DType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                            uint8_t* out) {
  switch (t) {
    case DType::kQ4_K: return PackPanelsQ4K(w, row_bytes, rows, cols, out);
    case DType::kQ6_K: return PackPanelsQ6K(w, row_bytes, rows, cols, out);
    default: return;
  }
}

}  // namespace peng::kernels
