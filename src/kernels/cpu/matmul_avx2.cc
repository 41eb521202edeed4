// AVX2 (+FMA, F16C) matmul kernels: the same R x T register tiling as the AVX-512 file, one
// 32-value block (or K-quant sub-block pair) per 256-bit step. Integer dots use vpmaddubsw
// (u8 weights x s8 activations -> int16 pairs, which cannot saturate for weights <= 63) then
// vpmaddwd, which for the K-quants multiplies by the sub-block scales in the same instruction.
// Q8_0 uses |w| x sign(a, w). Weight offsets are removed exactly with -offset * sum(a).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels {
namespace {

inline float Half(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i Ld(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// int32 x8 sums of u8 x s8 products, 4 per lane.
inline __m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline __m256i Nibbles(const uint8_t* qs) {  // 16 bytes -> 32 values [lo nibbles, hi nibbles]
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
  return _mm256_and_si256(y, _mm256_set1_epi8(0x0F));
}
// Byte i = 16 where bit i of h is set, else 0.
inline __m256i HighBits(const uint8_t* qh) {
  const uint32_t h = Load32(qh);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                         0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i is = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(is, _mm256_set1_epi8(16));
}

struct KQ4_0 {
  using B = BlockQ4_0;
  static constexpr int kOff = 8;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i Q(const B* b) { return Nibbles(b->qs); }
};
struct KQ4_1 {
  using B = BlockQ4_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i Q(const B* b) { return Nibbles(b->qs); }
};
struct KQ5_0 {
  using B = BlockQ5_0;
  static constexpr int kOff = 16;
  static constexpr bool kMin = false, kSigned = false;
  static __m256i Q(const B* b) { return _mm256_or_si256(Nibbles(b->qs), HighBits(b->qh)); }
};
struct KQ5_1 {
  using B = BlockQ5_1;
  static constexpr int kOff = 0;
  static constexpr bool kMin = true, kSigned = false;
  static __m256i Q(const B* b) { return _mm256_or_si256(Nibbles(b->qs), HighBits(b->qh)); }
};
struct KQ8_0 {
  using B = BlockQ8_0;
  static constexpr int kOff = 0;
  static constexpr bool kMin = false, kSigned = true;
  static __m256i Q(const B* b) { return Ld(b->qs); }
};

template <class K, int R, int T>
void Tile32(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i q[R];
    __m256 dw[R], mw[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) {
      q[r] = K::Q(w[r] + b);
      dw[r] = _mm256_set1_ps(Half(w[r][b].d));
      if constexpr (K::kMin) mw[r] = _mm256_set1_ps(Half(w[r][b].m));
    }
    for (int t = 0; t < T; ++t) {
      const __m256i a = Ld(g.a.qs + (t0 + t) * g.a.qs_stride + b * kQK);
      const __m256 da = _mm256_set1_ps(g.a.d[(t0 + t) * g.a.d_stride + b]);
      __m256 asum = _mm256_setzero_ps();
      __m256i bias = _mm256_setzero_si256();
      if constexpr (K::kMin) asum = _mm256_mul_ps(_mm256_cvtepi32_ps(DotU8S8(_mm256_set1_epi8(1), a)), da);
      if constexpr (K::kOff != 0) bias = DotU8S8(_mm256_set1_epi8(K::kOff), a);
      for (int r = 0; r < R; ++r) {
        __m256i s;
        if constexpr (K::kSigned) {
          s = DotU8S8(_mm256_abs_epi8(q[r]), _mm256_sign_epi8(a, q[r]));
        } else {
          s = _mm256_sub_epi32(DotU8S8(q[r], a), bias);
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], da), acc[r][t]);
        if constexpr (K::kMin) acc[r][t] = _mm256_fmadd_ps(mw[r], asum, acc[r][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = Hsum(acc[r][t]);
}

// ---- K-quants: 32 values a step; vpmaddwd applies the int16 sub-block scales.
struct RowK {
  uint8_t sc[8];
  const int8_t* sc6;  // Q6_K: the block's 16 scales
  __m256i m16;  // Q4_K/Q5_K: mins per 16 values; Q6_K: scales per 16 values
  float d, dmin;
};

struct KQ4_K {
  using B = BlockQ4_K;
  static void Prep(const B* b, RowK* p) {
    uint64_t sc, m;
    UnpackScalesK64(b->scales, &sc, &m);
    std::memcpy(p->sc, &sc, 8);
    const __m128i mm = _mm_cvtsi64_si128(static_cast<int64_t>(m));
    p->m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mm, mm));
    p->d = Half(b->d);
    p->dmin = Half(b->dmin);
  }
  // Quants of the 32 values j (0..7) and their int16 scales.
  static __m256i Q(const B* b, const RowK&, int j) {
    const __m256i x = Ld(b->qs + 32 * (j >> 1));
    return _mm256_and_si256(j & 1 ? _mm256_srli_epi16(x, 4) : x, _mm256_set1_epi8(0x0F));
  }
  static __m256i S(const RowK& p, int j) { return _mm256_set1_epi16(p.sc[j]); }
  static __m256 Finish(const RowK& p, __m256i iacc, __m256i bsums, float da, __m256 facc) {
    const __m256i mins = _mm256_madd_epi16(bsums, p.m16);
    facc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc), _mm256_set1_ps(p.d * da), facc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_set1_ps(-p.dmin * da), facc);
  }
};
struct KQ5_K {
  using B = BlockQ5_K;
  static void Prep(const B* b, RowK* p) { KQ4_K::Prep(reinterpret_cast<const BlockQ4_K*>(b), p); }
  static __m256i Q(const B* b, const RowK&, int j) {
    const __m256i x = Ld(b->qs + 32 * (j >> 1));
    const __m256i lo = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(x, 4) : x, _mm256_set1_epi8(0x0F));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
    const __m256i hb = _mm256_cmpeq_epi8(_mm256_and_si256(Ld(b->qh), bit), bit);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
  }
  static __m256i S(const RowK& p, int j) { return _mm256_set1_epi16(p.sc[j]); }
  static __m256 Finish(const RowK& p, __m256i iacc, __m256i bsums, float da, __m256 facc) {
    return KQ4_K::Finish(p, iacc, bsums, da, facc);
  }
};
struct KQ6_K {
  using B = BlockQ6_K;
  static void Prep(const B* b, RowK* p) {
    p->m16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)));
    p->sc6 = b->scales;
    p->d = Half(b->d);
  }
  static __m256i Q(const B* b, const RowK&, int j) {
    const int h = j >> 2, k = j & 3;
    const __m256i l = Ld(b->ql + 64 * h + 32 * (k & 1));
    const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0x0F));
    const __m256i hq = _mm256_srl_epi16(Ld(b->qh + 32 * h), _mm_cvtsi32_si128(2 * k));
    return _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hq, 4), _mm256_set1_epi8(0x30)));
  }
  static __m256i S(const RowK& p, int j) {  // [sc_2j x8, sc_2j+1 x8] as int16
    return _mm256_setr_m128i(_mm_set1_epi16(p.sc6[2 * j]), _mm_set1_epi16(p.sc6[2 * j + 1]));
  }
  static __m256 Finish(const RowK& p, __m256i iacc, __m256i bsums, float da, __m256 facc) {
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bsums, p.m16), 5);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(iacc, off)),
                           _mm256_set1_ps(p.d * da), facc);
  }
};

template <class K, int R, int T>
void TileK(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQKK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  __m256 facc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) facc[r][t] = _mm256_setzero_ps();
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    RowK p[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) K::Prep(w[r] + b, &p[r]);
    __m256i iacc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) iacc[r][t] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      __m256i q[R], s[R];
      for (int r = 0; r < R; ++r) {
        q[r] = K::Q(w[r] + b, p[r], j);
        s[r] = K::S(p[r], j);
      }
      for (int t = 0; t < T; ++t) {
        const __m256i a = Ld(g.a.qs + (t0 + t) * g.a.qs_stride + b * kQKK + 32 * j);
        for (int r = 0; r < R; ++r)
          iacc[r][t] = _mm256_add_epi32(iacc[r][t],
                                        _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], a), s[r]));
      }
    }
    for (int t = 0; t < T; ++t) {
      const float da = g.a.d[(t0 + t) * g.a.d_stride + b];
      const __m256i bs = Ld(g.a.sums + (t0 + t) * g.a.sums_stride + b * 16);
      for (int r = 0; r < R; ++r) facc[r][t] = K::Finish(p[r], iacc[r][t], bs, da, facc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) g.y[(t0 + t) * g.ldy + r0 + r] = Hsum(facc[r][t]);
}

// ---- Float weights, 8 columns a step, scalar tail.
template <DType kT>
inline __m256 LoadW(const uint8_t* row, int64_t c) {
  if constexpr (kT == DType::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c));
  if constexpr (kT == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <DType kT, int R, int T>
void TileF(const MatMulArgs& g, int64_t r0, int64_t t0) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  const int64_t main = g.cols & ~int64_t{7};
  constexpr int64_t kElem = kT == DType::kF32 ? 4 : 2;
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t c = 0; c < main; c += 8) {
    if (T == 1 && g.n_tokens == 1 && (c * kElem) % 64 == 0)
      for (int r = 0; r < R; ++r)
        PrefetchStream<64>(g.w + (r0 + r) * g.row_bytes + c * kElem, ahead);
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW<kT>(g.w + (r0 + r) * g.row_bytes, c);
    for (int t = 0; t < T; ++t) {
      const __m256 x = _mm256_loadu_ps(g.x + (t0 + t) * g.cols + c);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], x, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      float s = Hsum(acc[r][t]);
      for (int64_t c = main; c < g.cols; ++c)
        s += WeightScalar<kT>(g.w + (r0 + r) * g.row_bytes, c) * g.x[(t0 + t) * g.cols + c];
      g.y[(t0 + t) * g.ldy + r0 + r] = s;
    }
}

PENG_DEFINE_TILE_DRIVER(Run32, Tile32, class)
PENG_DEFINE_TILE_DRIVER(RunK, TileK, class)
PENG_DEFINE_TILE_DRIVER(RunF, TileF, DType)

template <class K>
void Kernel32(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return Run32<K, 4, 1>(g, r0, r1);
  return Run32<K, 2, 3>(g, r0, r1);
}
template <class K>
void KernelK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return RunK<K, 2, 1>(g, r0, r1);
  return RunK<K, 2, 2>(g, r0, r1);
}
template <DType kT>
void KernelF(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return RunF<kT, 4, 1>(g, r0, r1);
  return RunF<kT, 4, 3>(g, r0, r1);
}

// Same arithmetic as ref::QuantizeAct, 16 values a step.
void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d, int16_t* sums) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < n / ab; ++b) {
    const float* xb = x + b * ab;
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < ab; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float id;
    ActBlockScale(_mm_cvtss_f32(m4), ab, &d[b], &id);
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int i = 0; i < ab; i += 16) {
      __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), vid));
      __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), vid));
      v0 = _mm256_min_epi32(_mm256_max_epi32(v0, nlim), lim);
      v1 = _mm256_min_epi32(_mm256_max_epi32(v1, nlim), lim);
      const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8);
      const __m128i b8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + b * ab + i), b8);
      const __m256i s = _mm256_add_epi32(v0, v1);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      sums[(b * ab + i) / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
    }
  }
}

}  // namespace

MatMulKernel Avx2MatMulKernel(DType t) {
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

QuantizeActFn Avx2QuantizeAct() { return &QuantizeAct; }

}  // namespace peng::kernels
