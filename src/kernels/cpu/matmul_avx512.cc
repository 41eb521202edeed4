// AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels. Each kernel computes an R x T register tile
// (R weight rows x T tokens): every weight block is decoded once per tile and reused for T
// tokens, every activation block is loaded once and reused for R rows. Integer dot products
// use vpdpbusd (u8 weights x s8 activations); a weight offset (Q4_0: 8, Q5_0: 16, Q8_0: 128
// after flipping its sign bit) is removed exactly through a bias of -offset * sum(a) that seeds
// the accumulator. Each 512-bit step covers two 32-value blocks or one 64-value K-quant chunk.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "kernels/quant_blocks.h"

// GCC 12 warns about the deliberately undefined upper halves in the cast intrinsics.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace peng::kernels {
namespace {

inline __m512i Idx2() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }

// [f0 x8, f1 x8] from two adjacent floats.
inline __m512 Bcast2(const float* p) {
  const __m128 v = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
  return _mm512_permutexvar_ps(Idx2(), _mm512_castps128_ps512(v));
}
// [h(a) x8, h(b) x8] from two fp16 values.
inline __m512 HalfPair(uint16_t a, uint16_t b) {
  const __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(a | uint32_t{b} << 16)));
  return _mm512_permutexvar_ps(Idx2(), _mm512_castps128_ps512(v));
}
inline float Half(uint16_t h) { return _cvtsh_ss(h); }
inline uint32_t Load32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two 16-byte nibble arrays -> 64 u8 values in block order [b0 lo, b0 hi, b1 lo, b1 hi].
inline __m512i Nibbles2(const uint8_t* q0, const uint8_t* q1) {
  const __m256i x = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(q1)), 1);
  const __m512i z = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                             _mm512_castsi256_si512(x));
  const __m512i s = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
  return _mm512_and_si512(s, _mm512_set1_epi8(0x0F));
}
inline __m512i AddHighBit(__m512i q, uint32_t h0, uint32_t h1) {
  const __mmask64 m = _cvtu64_mask64(uint64_t{h0} | uint64_t{h1} << 32);
  return _mm512_mask_or_epi32(q, 0xFFFF, q, _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(16)));
}

// ---- 32-value block types: decode two blocks at once.
struct KQ4_0 {
  using B = BlockQ4_0;
  static constexpr int kOff = 8;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) { return Nibbles2(a->qs, b->qs); }
  static __m512 D(const B* a, const B* b) { return HalfPair(a->d, b->d); }
  static __m512 M(const B*, const B*) { return _mm512_setzero_ps(); }
};
struct KQ4_1 {
  using B = BlockQ4_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true;
  static __m512i Q(const B* a, const B* b) { return Nibbles2(a->qs, b->qs); }
  static __m512 D(const B* a, const B* b) { return HalfPair(a->d, b->d); }
  static __m512 M(const B* a, const B* b) { return HalfPair(a->m, b->m); }
};
struct KQ5_0 {
  using B = BlockQ5_0;
  static constexpr int kOff = 16;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) {
    return AddHighBit(Nibbles2(a->qs, b->qs), Load32(a->qh), Load32(b->qh));
  }
  static __m512 D(const B* a, const B* b) { return HalfPair(a->d, b->d); }
  static __m512 M(const B*, const B*) { return _mm512_setzero_ps(); }
};
struct KQ5_1 {
  using B = BlockQ5_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true;
  static __m512i Q(const B* a, const B* b) {
    return AddHighBit(Nibbles2(a->qs, b->qs), Load32(a->qh), Load32(b->qh));
  }
  static __m512 D(const B* a, const B* b) { return HalfPair(a->d, b->d); }
  static __m512 M(const B* a, const B* b) { return HalfPair(a->m, b->m); }
};
struct KQ8_0 {
  using B = BlockQ8_0;
  static constexpr int kOff = 128;
  static constexpr bool kMin = false;
  static __m512i Q(const B* a, const B* b) {
    const __m512i z = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a->qs))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs)), 1);
    return _mm512_xor_si512(z, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static __m512 D(const B* a, const B* b) { return HalfPair(a->d, b->d); }
  static __m512 M(const B*, const B*) { return _mm512_setzero_ps(); }
};

template <class K, int R, int T>
void Tile32(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; b += 2) {
    const bool tail = b + 1 == nb;
    const int64_t b1 = tail ? b : b + 1;
    __m512i q[R];
    __m512 dw[R], mw[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<2 * sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) {
      q[r] = K::Q(w[r] + b, w[r] + b1);
      dw[r] = K::D(w[r] + b, w[r] + b1);
      if constexpr (K::kMin) mw[r] = K::M(w[r] + b, w[r] + b1);
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* ap = g.a.qs + (t0 + t) * g.a.qs_stride + b * kQK;
      const __m512i a = tail ? _mm512_maskz_loadu_epi8(0xFFFFFFFFull, ap) : _mm512_loadu_si512(ap);
      const __m512 da = Bcast2(g.a.d + (t0 + t) * g.a.d_stride + b);
      if constexpr (K::kMin) {
        const __m512i s8 = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), a);
        const __m512 asum = _mm512_mul_ps(_mm512_cvtepi32_ps(s8), da);
        for (int r = 0; r < R; ++r) {
          const __m512i s = _mm512_dpbusd_epi32(zero, q[r], a);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], da), acc[r][t]);
          acc[r][t] = _mm512_fmadd_ps(mw[r], asum, acc[r][t]);
        }
      } else {
        const __m512i bias = _mm512_sub_epi32(
            zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(static_cast<char>(K::kOff)), a));
        for (int r = 0; r < R; ++r) {
          const __m512i s = _mm512_dpbusd_epi32(bias, q[r], a);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], da), acc[r][t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// ---- K-quants: one super-block (4 chunks of 64 values) at a time. Per-chunk integer sums are
// multiplied by the sub-block scales with vpmaddwd (the chunk sums fit in int16).
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
  static __m512 Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, __m512 facc) {
    const __m256i mins = _mm256_madd_epi16(bsums, p.m16);
    facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(p.d * da), facc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)),
                           _mm512_set1_ps(-p.dmin * da), facc);
  }
};
struct KQ5_K {
  using B = BlockQ5_K;
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
    return KQ4_K::Finish(p, iacc, bsums, da, facc);
  }
};
struct KQ6_K {
  using B = BlockQ6_K;
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
  static __m512 Finish(const RowK& p, __m512i iacc, __m256i bsums, float da, __m512 facc) {
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bsums, p.m16), 5);  // 32 * sc * sum
    iacc = _mm512_sub_epi32(iacc, _mm512_zextsi256_si512(off));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc), _mm512_set1_ps(p.d * da), facc);
  }
};

template <class K, int R, int T>
void TileK(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQKK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  __m512 facc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) facc[r][t] = _mm512_setzero_ps();
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
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = _mm512_reduce_add_ps(facc[r][t]);
}

// ---- Float weights: FP32 activations, 16 columns per step, masked tail.
template <DType kT>
inline __m512 LoadW(const uint8_t* row, int64_t c, __mmask16 m) {
  if constexpr (kT == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + c);
    if constexpr (kT == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType kT, int R, int T>
void TileF(const MatMulArgs& g, int64_t r0, int64_t t0) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  constexpr int64_t kElem = kT == DType::kF32 ? 4 : 2;
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t c = 0; c < g.cols; c += 16) {
    const __mmask16 m = g.cols - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (g.cols - c)) - 1);
    if (T == 1 && g.n_tokens == 1 && (c * kElem) % 64 == 0)
      for (int r = 0; r < R; ++r)
        PrefetchStream<64>(g.w + (r0 + r) * g.row_bytes + c * kElem, ahead);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW<kT>(g.w + (r0 + r) * g.row_bytes, c, m);
    for (int t = 0; t < T; ++t) {
      const __m512 x = _mm512_maskz_loadu_ps(m, g.x + (t0 + t) * g.cols + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], x, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// Runs the tile function over rows [r0, r1) x all tokens: R x T tiles, then edges.
template <template <class, int, int> class Tile, class K, int R, int T>
struct Driver;

#define PENG_DEFINE_DRIVER(NAME, TILE, PARAM)                                   \
  template <PARAM K, int R, int T>                                              \
  void NAME(const MatMulArgs& g, int64_t r0, int64_t r1) {                      \
    const int64_t n = g.n_tokens;                                               \
    int64_t r = r0;                                                             \
    for (; r + R <= r1; r += R) {                                               \
      int64_t t = 0;                                                            \
      for (; t + T <= n; t += T) TILE<K, R, T>(g, r, t);                        \
      for (; t < n; ++t) TILE<K, R, 1>(g, r, t);                                \
    }                                                                           \
    for (; r < r1; ++r) {                                                       \
      int64_t t = 0;                                                            \
      for (; t + T <= n; t += T) TILE<K, 1, T>(g, r, t);                        \
      for (; t < n; ++t) TILE<K, 1, 1>(g, r, t);                                \
    }                                                                           \
  }

PENG_DEFINE_DRIVER(Run32, Tile32, class)
PENG_DEFINE_DRIVER(RunK, TileK, class)
PENG_DEFINE_DRIVER(RunF, TileF, DType)
#undef PENG_DEFINE_DRIVER

// GEMV (one token) is memory bound: 4 rows in flight. GEMM tiles are sized to the 32 zmm.
template <class K>
void Kernel32(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return Run32<K, 4, 1>(g, r0, r1);
  if constexpr (K::kMin) return Run32<K, 4, 3>(g, r0, r1);
  return Run32<K, 4, 4>(g, r0, r1);
}
template <class K>
void KernelK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return RunK<K, 4, 1>(g, r0, r1);
  return RunK<K, 2, 4>(g, r0, r1);
}
template <DType kT>
void KernelF(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return RunF<kT, 4, 1>(g, r0, r1);
  return RunF<kT, 4, 4>(g, r0, r1);
}

// Same arithmetic as ref::QuantizeAct (x * (1/d) rounded to nearest even), 16 values a step.
void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d, int16_t* sums) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t b = 0; b < n / ab; ++b) {
    const float* xb = x + b * ab;
    __m512 mx = _mm512_setzero_ps();
    for (int i = 0; i < ab; i += 16) mx = _mm512_max_ps(mx, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + i)));
    const float amax = _mm512_reduce_max_ps(mx);
    float id;
    ActBlockScale(amax, ab, &d[b], &id);
    const __m512 vid = _mm512_set1_ps(id);
    for (int i = 0; i < ab; i += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + i), vid));
      v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * ab + i), _mm512_cvtepi32_epi8(v));
      sums[(b * ab + i) / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
    }
  }
}

}  // namespace

MatMulKernel Avx512MatMulKernel(DType t) {
  switch (t) {
    case DType::kF32: return &KernelF<DType::kF32>;
    case DType::kF16: return &KernelF<DType::kF16>;
    case DType::kBF16: return &KernelF<DType::kBF16>;
    case DType::kQ4_0: return &Kernel32<KQ4_0>;
    case DType::kQ4_1: return &Kernel32<KQ4_1>;
    case DType::kQ5_0: return &Kernel32<KQ5_0>;
    case DType::kQ5_1: return &Kernel32<KQ5_1>;
    case DType::kQ8_0: return &Kernel32<KQ8_0>;
    case DType::kQ4_K: return &KernelK<KQ4_K>;
    case DType::kQ5_K: return &KernelK<KQ5_K>;
    case DType::kQ6_K: return &KernelK<KQ6_K>;
    default: return nullptr;
  }
}

QuantizeActFn Avx512QuantizeAct() { return &QuantizeAct; }

}  // namespace peng::kernels
