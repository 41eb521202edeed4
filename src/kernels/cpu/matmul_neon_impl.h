// The NEON matmul kernels shared by the three ARM64 levels (kernels/isa.h): included by
// cpu/matmul_neon.cc (-march=armv8-a), cpu/matmul_dotprod.cc (+dotprod+fp16) and
// cpu/matmul_i8mm.cc (+i8mm), each compiling it with its own target flags. Everything here is in
// an anonymous namespace (internal linkage), so no instruction of a higher level can reach a
// lower level's code through ODR merging. Weights are decoded to signed int8 (the format
// offsets removed, so no bias term is needed) and multiplied with the int8 activations by
// Dot(): sdot where the file is built with the dot-product extension, a vmull/vpadal pair (the
// same exact int32 sums) on plain ARMv8.0 NEON. R x T register tiles as in the x86 files.
#pragma once
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstring>
#include <type_traits>

#include "core/half.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/tile_driver.h"
#include "kernels/cpu/neon_dot.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels {
namespace {

// The block scales: one hardware conversion (fcvt, part of ARMv8.0 FP; exact, like F16ToF32)
// instead of the portable bit-twiddling of core/half.h, whose branches cost more than the
// int8 dot products of a whole block.
inline float Half(uint16_t h) {
  __fp16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}

struct Q32 {
  int8x16_t lo, hi;  // values 0..15, 16..31
};
inline Q32 Nibbles(const uint8_t* qs, int off) {
  const uint8x16_t x = vld1q_u8(qs);
  const int8x16_t o = vdupq_n_s8(static_cast<int8_t>(off));
  return {vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F))), o),
          vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), o)};
}
// 16 where bit i of the 32-bit little-endian qh is set.
inline Q32 HighBits(const uint8_t* qh) {
  const uint32_t h = Load32(qh);
  const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(h));
  static const uint8_t kIdxLo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  static const uint8_t kIdxHi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bit = vld1q_u8(kBit), sixteen = vdupq_n_u8(16);
  return {vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(kIdxLo)), bit), sixteen)),
          vreinterpretq_s8_u8(vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(kIdxHi)), bit), sixteen))};
}
inline Q32 AddQ(Q32 a, Q32 b) { return {vaddq_s8(a.lo, b.lo), vaddq_s8(a.hi, b.hi)}; }

struct KQ4_0 {
  using B = BlockQ4_0;
  static constexpr bool kMin = false;
  static Q32 Q(const B* b) { return Nibbles(b->qs, 8); }
  static float M(const B*) { return 0.f; }
};
struct KQ4_1 {
  using B = BlockQ4_1;
  static constexpr bool kMin = true;
  static Q32 Q(const B* b) { return Nibbles(b->qs, 0); }
  static float M(const B* b) { return Half(b->m); }
};
struct KQ5_0 {
  using B = BlockQ5_0;
  static constexpr bool kMin = false;
  // (q | h) - 16 == (q - 16) + h
  static Q32 Q(const B* b) { return AddQ(Nibbles(b->qs, 16), HighBits(b->qh)); }
  static float M(const B*) { return 0.f; }
};
struct KQ5_1 {
  using B = BlockQ5_1;
  static constexpr bool kMin = true;
  static Q32 Q(const B* b) { return AddQ(Nibbles(b->qs, 0), HighBits(b->qh)); }
  static float M(const B* b) { return Half(b->m); }
};
struct KQ8_0 {
  using B = BlockQ8_0;
  static constexpr bool kMin = false;
  static Q32 Q(const B* b) { return {vld1q_s8(b->qs), vld1q_s8(b->qs + 16)}; }
  static float M(const B*) { return 0.f; }
};

template <class K, int R, int T>
void Tile32(const MatMulArgs& g, int64_t r0, int64_t t0) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const B*>(g.w + (r0 + r) * g.row_bytes);
  float32x4_t acc[R][T];
  float macc[R][T] = {};
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vdupq_n_f32(0.f);
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    Q32 q[R];
    float dw[R], mw[R];
    if (T == 1 && g.n_tokens == 1)
      for (int r = 0; r < R; ++r) PrefetchStream<sizeof(B)>(w[r] + b, ahead);
    for (int r = 0; r < R; ++r) {
      q[r] = K::Q(w[r] + b);
      dw[r] = Half(w[r][b].d);
      mw[r] = K::M(w[r] + b);
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* ap = g.a.qs + (t0 + t) * g.a.qs_stride + b * kQK;
      const int8x16_t a0 = vld1q_s8(ap), a1 = vld1q_s8(ap + 16);
      const float da = g.a.d[(t0 + t) * g.a.d_stride + b];
      const int16_t* s = g.a.sums + (t0 + t) * g.a.sums_stride + 2 * b;
      for (int r = 0; r < R; ++r) {
        const int32x4_t d = Dot(Dot(vdupq_n_s32(0), q[r].lo, a0), q[r].hi, a1);
        acc[r][t] = vfmaq_n_f32(acc[r][t], vcvtq_f32_s32(d), dw[r] * da);
        if constexpr (K::kMin) macc[r][t] += mw[r] * da * static_cast<float>(s[0] + s[1]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r)
      g.y[(t0 + t) * g.ldy + r0 + r] = vaddvq_f32(acc[r][t]) + macc[r][t];
}

// ---- K-quants: per super-block integer sums scaled by the sub-block scales (vmlaq_n_s32).
template <bool kQ5>
inline float DotQ45K(const uint8_t* sc12, const uint8_t* qs, const uint8_t* qh, const int8_t* a,
                     const int16_t* bs, float d, float dmin, float da) {
  uint8_t sc[8], m[8];
  UnpackScalesK(sc12, sc, m);
  int32x4_t iacc = vdupq_n_s32(0);
  uint8x16_t h0 = vdupq_n_u8(0), h1 = vdupq_n_u8(0);
  if (kQ5) {
    h0 = vld1q_u8(qh);
    h1 = vld1q_u8(qh + 16);
  }
  for (int c = 0; c < 4; ++c) {
    const uint8x16_t x0 = vld1q_u8(qs + 32 * c), x1 = vld1q_u8(qs + 32 * c + 16);
    uint8x16_t v[4] = {vandq_u8(x0, vdupq_n_u8(0x0F)), vandq_u8(x1, vdupq_n_u8(0x0F)),
                       vshrq_n_u8(x0, 4), vshrq_n_u8(x1, 4)};
    if (kQ5) {
      for (int k = 0; k < 4; ++k) {
        const uint8x16_t bit = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * c + k / 2)));
        v[k] = vorrq_u8(v[k], vandq_u8(vtstq_u8(k & 1 ? h1 : h0, bit), vdupq_n_u8(16)));
      }
    }
    const int8_t* ac = a + 64 * c;
    int32x4_t s0 = Dot(Dot(vdupq_n_s32(0), vreinterpretq_s8_u8(v[0]), vld1q_s8(ac)),
                       vreinterpretq_s8_u8(v[1]), vld1q_s8(ac + 16));
    int32x4_t s1 = Dot(Dot(vdupq_n_s32(0), vreinterpretq_s8_u8(v[2]), vld1q_s8(ac + 32)),
                       vreinterpretq_s8_u8(v[3]), vld1q_s8(ac + 48));
    iacc = vmlaq_n_s32(iacc, s0, sc[2 * c]);
    iacc = vmlaq_n_s32(iacc, s1, sc[2 * c + 1]);
  }
  int imin = 0;
  for (int j = 0; j < 8; ++j) imin += m[j] * (bs[2 * j] + bs[2 * j + 1]);
  return da * (d * static_cast<float>(vaddvq_s32(iacc)) - dmin * static_cast<float>(imin));
}

inline float DotQ6K(const BlockQ6_K& b, const int8_t* a, float da) {
  int32x4_t iacc = vdupq_n_s32(0);
  const int8x16_t off = vdupq_n_s8(32);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      for (int p = 0; p < 2; ++p) {  // 16 values: l = 16 p .. 16 p + 15
        const uint8x16_t l = vld1q_u8(b.ql + 64 * h + 32 * (k & 1) + 16 * p);
        const uint8x16_t hq = vld1q_u8(b.qh + 32 * h + 16 * p);
        const uint8x16_t lo = k >= 2 ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(0x0F));
        const uint8x16_t hi = vandq_u8(vshlq_u8(hq, vdupq_n_s8(static_cast<int8_t>(4 - 2 * k))),
                                       vdupq_n_u8(0x30));
        const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), off);
        const int i = 8 * h + 2 * k + p;  // sub-block of 16
        iacc = vmlaq_n_s32(iacc, Dot(vdupq_n_s32(0), q, vld1q_s8(a + 16 * i)), b.scales[i]);
      }
    }
  }
  return da * Half(b.d) * static_cast<float>(vaddvq_s32(iacc));
}

template <class B>
void KernelK(const MatMulArgs& g, int64_t r0, int64_t r1) {
  const int64_t nb = g.cols / kQKK;
  const int64_t ahead = PrefetchAhead(g.row_bytes);
  for (int64_t r = r0; r < r1; ++r) {
    const B* w = reinterpret_cast<const B*>(g.w + r * g.row_bytes);
    if (g.n_tokens == 1)
      for (int64_t b = 0; b < nb; ++b) PrefetchStream<sizeof(B)>(w + b, ahead);
    for (int64_t t = 0; t < g.n_tokens; ++t) {
      const int8_t* a = g.a.qs + t * g.a.qs_stride;
      const float* d = g.a.d + t * g.a.d_stride;
      const int16_t* s = g.a.sums + t * g.a.sums_stride;
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        if constexpr (std::is_same_v<B, BlockQ6_K>) {
          acc += DotQ6K(w[b], a + b * kQKK, d[b]);
        } else if constexpr (std::is_same_v<B, BlockQ5_K>) {
          acc += DotQ45K<true>(w[b].scales, w[b].qs, w[b].qh, a + b * kQKK, s + 16 * b,
                               Half(w[b].d), Half(w[b].dmin), d[b]);
        } else {
          acc += DotQ45K<false>(w[b].scales, w[b].qs, nullptr, a + b * kQKK, s + 16 * b,
                                Half(w[b].d), Half(w[b].dmin), d[b]);
        }
      }
      g.y[t * g.ldy + r] = acc;
    }
  }
}

// ---- Float weights, 4 columns a step.
template <DType kT>
inline float32x4_t LoadW(const uint8_t* row, int64_t c) {
  if constexpr (kT == DType::kF32) return vld1q_f32(reinterpret_cast<const float*>(row) + c);
  const uint16x4_t h = vld1_u16(reinterpret_cast<const uint16_t*>(row) + c);
  if constexpr (kT == DType::kF16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
  return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

template <DType kT, int R, int T>
void TileF(const MatMulArgs& g, int64_t r0, int64_t t0) {
  float32x4_t acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = vdupq_n_f32(0.f);
  const int64_t main = g.cols & ~int64_t{3};
  constexpr int64_t kElem = kT == DType::kF32 ? 4 : 2;
  const int64_t ahead = PrefetchAhead(R * g.row_bytes);
  for (int64_t c = 0; c < main; c += 4) {
    if (T == 1 && g.n_tokens == 1 && (c * kElem) % 64 == 0)
        for (int r = 0; r < R; ++r)
          PrefetchStream<64>(g.w + (r0 + r) * g.row_bytes + c * kElem, ahead);
    float32x4_t wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW<kT>(g.w + (r0 + r) * g.row_bytes, c);
    for (int t = 0; t < T; ++t) {
      const float32x4_t x = vld1q_f32(g.x + (t0 + t) * g.cols + c);
      for (int r = 0; r < R; ++r) acc[r][t] = vfmaq_f32(acc[r][t], wv[r], x);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) {
      float s = vaddvq_f32(acc[r][t]);
      for (int64_t c = main; c < g.cols; ++c)
        s += WeightScalar<kT>(g.w + (r0 + r) * g.row_bytes, c) * g.x[(t0 + t) * g.cols + c];
      g.y[(t0 + t) * g.ldy + r0 + r] = s;
    }
}

PENG_DEFINE_TILE_DRIVER(Run32, Tile32, class)
PENG_DEFINE_TILE_DRIVER(RunF, TileF, DType)

template <class K>
void Kernel32(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return Run32<K, 4, 1>(g, r0, r1);
  return Run32<K, 2, 4>(g, r0, r1);
}
template <DType kT>
void KernelF(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) return RunF<kT, 4, 1>(g, r0, r1);
  return RunF<kT, 4, 4>(g, r0, r1);
}

// Same arithmetic as ref::QuantizeAct (vcvtnq rounds to nearest even), 16 values a step.
[[maybe_unused]] void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d,
                                 int16_t* sums) {
  for (int64_t b = 0; b < n / ab; ++b) {
    const float* xb = x + b * ab;
    float32x4_t mx = vdupq_n_f32(0.f);
    for (int i = 0; i < ab; i += 4) mx = vmaxq_f32(mx, vabsq_f32(vld1q_f32(xb + i)));
    float id;
    ActBlockScale(vmaxvq_f32(mx), ab, &d[b], &id);
    for (int i = 0; i < ab; i += 16) {
      int32x4_t v[4];
      for (int k = 0; k < 4; ++k) {
        v[k] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xb + i + 4 * k), id));
        v[k] = vminq_s32(vmaxq_s32(v[k], vdupq_n_s32(-127)), vdupq_n_s32(127));
      }
      const int16x8_t h0 = vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]));
      const int16x8_t h1 = vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]));
      vst1q_s8(qs + b * ab + i, vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
      sums[(b * ab + i) / 16] =
          static_cast<int16_t>(vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3]))));
    }
  }
}


// The kernel of each weight type at this file's level.
[[maybe_unused]] MatMulKernel BaseMatMulKernel(DType t) {
  switch (t) {
    case DType::kF32: return &KernelF<DType::kF32>;
    case DType::kF16: return &KernelF<DType::kF16>;
    case DType::kBF16: return &KernelF<DType::kBF16>;
    case DType::kQ4_0: return &Kernel32<KQ4_0>;
    case DType::kQ4_1: return &Kernel32<KQ4_1>;
    case DType::kQ5_0: return &Kernel32<KQ5_0>;
    case DType::kQ5_1: return &Kernel32<KQ5_1>;
    case DType::kQ8_0: return &Kernel32<KQ8_0>;
    case DType::kQ4_K: return &KernelK<BlockQ4_K>;
    case DType::kQ5_K: return &KernelK<BlockQ5_K>;
    case DType::kQ6_K: return &KernelK<BlockQ6_K>;
    default: return nullptr;
  }
}

}  // namespace
}  // namespace peng::kernels

#endif  // __aarch64__
