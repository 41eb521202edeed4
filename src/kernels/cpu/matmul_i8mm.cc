// Int8 matrix-multiply extension matmul kernels (Isa::kNeonI8mm; built with
// armv8.2-a+dotprod+fp16+i8mm). The 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
// smmla multiplies a 2x8 int8 block of two weight rows by an 8x2 block of two tokens'
// activations into a 2x2 int32 tile (32 multiply-adds per instruction, sdot: 16), four smmla per
// 32-value block, and the tile's lanes are four outputs, scaled by {dw_r * da_t} in one FMA (no
// horizontal sums). Tiles of up to 4 rows x 4 tokens. An odd last row or token is paired with
// itself, so every output goes through the same arithmetic whatever the batch size or the row
// slice (results are bit-identical between decode and prefill and across MatMulRows slices).
// A single token (decode) goes through sdot instead (TileDot1): smmla would waste half its
// lanes on the duplicate and do no more useful work than sdot, with more shuffling -- i8mm pays
// off for batches >= 2 (prefill, batched decode); docs/arm64.md. TileDot1 reduces each block's
// sdot lanes to the exact block sum before scaling, so its outputs are bit-identical to
// TileMM's. The K-quants (Q4_K, Q5_K, Q6_K) the same way, with per-row integer scaling of each
// sub-block's tile lanes (TileMMK / TileDot1K, below). The float weights use the code of
// cpu/matmul_neon_impl.h at this level. Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/matmul_neon_impl.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "matmul_i8mm.cc must be built with +i8mm (cmake/PengLibrary.cmake)"
#endif

namespace peng::kernels {
namespace {

// {p[0..7], q[0..7]} and {p[8..15], q[8..15]}: smmla's 2x8 operands from two 16-value rows.
inline void Interleave(int8x16_t p, int8x16_t q, int8x16_t* out) {
  const int64x2_t u = vreinterpretq_s64_s8(p), v = vreinterpretq_s64_s8(q);
  out[0] = vreinterpretq_s8_s64(vzip1q_s64(u, v));
  out[1] = vreinterpretq_s8_s64(vzip2q_s64(u, v));
}

// Rows r0 .. r0 + nr - 1 x tokens t0 .. t0 + nt - 1 (nr <= 2 RP, nt <= 2 TP; missing ones
// repeat the last row / token and are not stored). acc[rp][tp] lanes: (r, t), (r, t + 1),
// (r + 1, t), (r + 1, t + 1).
template <class K, int RP, int TP>
void TileMM(const MatMulArgs& g, int64_t r0, int64_t t0, int nr, int nt) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[2 * RP];
  for (int r = 0; r < 2 * RP; ++r)
    w[r] = reinterpret_cast<const B*>(g.w + (r0 + (r < nr ? r : nr - 1)) * g.row_bytes);
  int64_t tok[2 * TP];
  for (int t = 0; t < 2 * TP; ++t) tok[t] = t0 + (t < nt ? t : nt - 1);
  float32x4_t acc[RP][TP];
  float macc[2 * RP][2 * TP] = {};
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) acc[rp][tp] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    int8x16_t xp[TP][4];
    float da[2 * TP], sa[2 * TP];
    for (int tp = 0; tp < TP; ++tp) {
      const int8_t* a0 = g.a.qs + tok[2 * tp] * g.a.qs_stride + b * kQK;
      const int8_t* a1 = g.a.qs + tok[2 * tp + 1] * g.a.qs_stride + b * kQK;
      Interleave(vld1q_s8(a0), vld1q_s8(a1), xp[tp]);
      Interleave(vld1q_s8(a0 + 16), vld1q_s8(a1 + 16), xp[tp] + 2);
      for (int j = 0; j < 2; ++j) {
        const int64_t t = tok[2 * tp + j];
        da[2 * tp + j] = g.a.d[t * g.a.d_stride + b];
        const int16_t* s = g.a.sums + t * g.a.sums_stride + 2 * b;
        sa[2 * tp + j] = static_cast<float>(s[0] + s[1]);
      }
    }
    for (int rp = 0; rp < RP; ++rp) {
      const B* b0 = w[2 * rp] + b;
      const B* b1 = w[2 * rp + 1] + b;
      const Q32 q0 = K::Q(b0), q1 = K::Q(b1);
      int8x16_t wp[4];
      Interleave(q0.lo, q1.lo, wp);
      Interleave(q0.hi, q1.hi, wp + 2);
      const float dw0 = Half(b0->d), dw1 = Half(b1->d);
      for (int tp = 0; tp < TP; ++tp) {
        int32x4_t d = vmmlaq_s32(vdupq_n_s32(0), wp[0], xp[tp][0]);
        d = vmmlaq_s32(d, wp[1], xp[tp][1]);
        d = vmmlaq_s32(d, wp[2], xp[tp][2]);
        d = vmmlaq_s32(d, wp[3], xp[tp][3]);
        const float s[4] = {dw0 * da[2 * tp], dw0 * da[2 * tp + 1], dw1 * da[2 * tp],
                            dw1 * da[2 * tp + 1]};
        acc[rp][tp] = vfmaq_f32(acc[rp][tp], vcvtq_f32_s32(d), vld1q_f32(s));
      }
      if constexpr (K::kMin) {
        const float mw[2] = {K::M(b0), K::M(b1)};
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2 * TP; ++j) macc[2 * rp + i][j] += mw[i] * da[j] * sa[j];
      }
    }
  }
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) {
      float o[4];
      vst1q_f32(o, acc[rp][tp]);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          if (2 * rp + i >= nr || 2 * tp + j >= nt) continue;
          const int64_t r = r0 + 2 * rp + i, t = t0 + 2 * tp + j;
          g.y[t * g.ldy + r] = o[2 * i + j] + macc[2 * rp + i][2 * tp + j];
        }
    }
}

// One token (decode), rows r0 .. r0 + nr - 1 (nr <= 4; missing rows repeat the last and are
// not stored): sdot, whose per-lane partial sums are added across lanes per block (vpaddq), so
// each output is fma(acc, float(exact block sum), dw * da) -- the same arithmetic as a lane of
// TileMM, at sdot's 16 useful multiply-adds per instruction (smmla with the token paired with
// itself would do as many useful ones, with more shuffling).
template <class K>
void TileDot1(const MatMulArgs& g, int64_t r0, int64_t t, int nr) {
  using B = typename K::B;
  const int64_t nb = g.cols / kQK;
  const B* w[4];
  for (int r = 0; r < 4; ++r)
    w[r] = reinterpret_cast<const B*>(g.w + (r0 + (r < nr ? r : nr - 1)) * g.row_bytes);
  float32x4_t acc = vdupq_n_f32(0.f);
  float macc[4] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* ap = g.a.qs + t * g.a.qs_stride + b * kQK;
    const int8x16_t a0 = vld1q_s8(ap), a1 = vld1q_s8(ap + 16);
    const float da = g.a.d[t * g.a.d_stride + b];
    int32x4_t p[4];
    float dw[4];
    for (int r = 0; r < 4; ++r) {
      const Q32 q = K::Q(w[r] + b);
      p[r] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), q.lo, a0), q.hi, a1);
      dw[r] = Half(w[r][b].d);
    }
    const int32x4_t sums = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
    const float sc[4] = {dw[0] * da, dw[1] * da, dw[2] * da, dw[3] * da};
    acc = vfmaq_f32(acc, vcvtq_f32_s32(sums), vld1q_f32(sc));
    if constexpr (K::kMin) {
      const int16_t* s = g.a.sums + t * g.a.sums_stride + 2 * b;
      const float sa = static_cast<float>(s[0] + s[1]);
      for (int r = 0; r < 4; ++r) macc[r] += K::M(w[r] + b) * da * sa;
    }
  }
  float o[4];
  vst1q_f32(o, acc);
  for (int r = 0; r < nr; ++r) g.y[t * g.ldy + r0 + r] = o[r] + macc[r];
}

// ---- K-quants (Q4_K, Q5_K, Q6_K): 256-value super-blocks of kSub-value sub-blocks whose integer
// scales differ per row. The smmla tile computes each sub-block's int32 2x2 tile, multiplies it
// by the sub-block scales of its two rows ({sc_r, sc_r, sc_r+1, sc_r+1}, vmlaq_s32) into a
// per-super-block int32 tile, then scales the super-block once in FP32:
//   s = dw * float(isc);  s = s - dmin * float(imin) (Q4_K/Q5_K);  acc = fma(acc, s, da)
// Every integer is exact: isc = sum_j sc[j] * (q . a over sub-block j), imin = sum_j m[j] *
// (activation sum of sub-block j). Q6_K's values are used unsigned (0..63, no -32 per value) and
// isc gets the offset back as -32 * sum_i sc[i] * (activation sum of sub-block i). The one-token
// path (TileDot1K) computes the same integers by sdot and does the same three FP32 operations per
// output, so its results are bit-identical to the tile's.
//
// Traits. The sub-blocks are visited in kSteps steps of kPer: Values(b, s, e, v) = sub-block
// Sub(s, e) as int8 in v[0 .. kSub / 16 - 1] (the kPer sub-blocks of a step share their loads);
// Scales(b) = byte j the integer scale of sub-block j, StepScales the same bytes in step order
// (element e of step s at byte kPer s + e); Corr(b, c) / ActCorr(sums, a): the kNC int16x8
// vectors whose dot product is imin (Q4_K/Q5_K: the 8 mins and the 8 sub-block sums) or the
// offset sum (Q6_K: the 16 scales and the 16 activation sums of 16 values).
template <bool kQ5>
struct KQ45K {
  using B = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  static constexpr int kSub = 32, kSteps = 4, kPer = 2, kNC = 1, kOff = 0;
  static constexpr bool kMin = true;
  // Step s: the 32 bytes of qs chunk s, low nibbles = sub-block 2 s, high nibbles = 2 s + 1.
  static int Sub(int s, int e) { return 2 * s + e; }
  static void Values(const B* b, int s, int e, int8x16_t* v) {
    const uint8x16_t x0 = vld1q_u8(b->qs + 32 * s), x1 = vld1q_u8(b->qs + 32 * s + 16);
    uint8x16_t v0 = e ? vshrq_n_u8(x0, 4) : vandq_u8(x0, vdupq_n_u8(0x0F));
    uint8x16_t v1 = e ? vshrq_n_u8(x1, 4) : vandq_u8(x1, vdupq_n_u8(0x0F));
    if constexpr (kQ5) {  // bit j of qh[l]: the 5th bit of value 32 j + l
      const int8x16_t sh = vdupq_n_s8(static_cast<int8_t>(4 - 2 * s - e));
      v0 = vorrq_u8(v0, vandq_u8(vshlq_u8(vld1q_u8(b->qh), sh), vdupq_n_u8(16)));
      v1 = vorrq_u8(v1, vandq_u8(vshlq_u8(vld1q_u8(b->qh + 16), sh), vdupq_n_u8(16)));
    }
    v[0] = vreinterpretq_s8_u8(v0);
    v[1] = vreinterpretq_s8_u8(v1);
  }
  static int8x16_t Scales(const B* b) {
    uint64_t sc, m;
    UnpackScalesK64(b->scales, &sc, &m);
    return vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(sc), vcreate_u8(0)));
  }
  static int8x16_t StepScales(int8x16_t sc) { return sc; }
  static void Corr(const B* b, int16x8_t* c) {
    uint64_t sc, m;
    UnpackScalesK64(b->scales, &sc, &m);
    c[0] = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m)));
  }
  static void ActCorr(const int16_t* s, int16x8_t* a) {
    a[0] = vpaddq_s16(vld1q_s16(s), vld1q_s16(s + 8));  // pairs of 16-value sums
  }
  static float D(const B* b) { return Half(b->d); }
  static float Dmin(const B* b) { return Half(b->dmin); }
};
using KQ4K = KQ45K<false>;
using KQ5K = KQ45K<true>;

struct KQ6K {
  using B = BlockQ6_K;
  static constexpr int kSub = 16, kSteps = 4, kPer = 4, kNC = 2, kOff = 32;
  static constexpr bool kMin = false;
  // Sub-block i = 8 h + 2 k + p holds values 128 h + 32 k + 16 p + l (l < 16): 4 bits from the
  // low (k < 2) or high nibble of ql[64 h + 32 (k & 1) + 16 p + l], 2 bits from bits 2 k, 2 k + 1
  // of qh[32 h + 16 p + l]; one shift-insert (vsli / vsri) joins them. Step s = 2 h + p: the four
  // sub-blocks k = 0..3 (e = k), which share two ql and one qh loads.
  static int Sub(int s, int e) { return 8 * (s / 2) + 2 * e + s % 2; }
  static void Values(const B* b, int s, int e, int8x16_t* v) {
    const int h = s / 2, p = s % 2;
    const uint8x16_t l = vld1q_u8(b->ql + 64 * h + 32 * (e & 1) + 16 * p);
    uint8x16_t hq = vld1q_u8(b->qh + 32 * h + 16 * p);
    if (e & 1) hq = vshrq_n_u8(hq, 2);
    const uint8x16_t x = e < 2 ? vsliq_n_u8(l, hq, 4) : vsriq_n_u8(hq, l, 4);
    v[0] = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x3F)));
  }
  static int8x16_t Scales(const B* b) { return vld1q_s8(b->scales); }
  static int8x16_t StepScales(int8x16_t sc) {
    static const uint8_t kOrder[16] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    return vqtbl1q_s8(sc, vld1q_u8(kOrder));
  }
  static void Corr(const B* b, int16x8_t* c) {
    const int8x16_t sc = vld1q_s8(b->scales);
    c[0] = vmovl_s8(vget_low_s8(sc));
    c[1] = vmovl_high_s8(sc);
  }
  static void ActCorr(const int16_t* s, int16x8_t* a) {
    a[0] = vld1q_s16(s);
    a[1] = vld1q_s16(s + 8);
  }
  static float D(const B* b) { return Half(b->d); }
  static float Dmin(const B*) { return 0.f; }
};

// Bytes 4 k .. 4 k + 3 of x, sign-extended to int32 lanes.
inline int32x4_t Widen4(int8x16_t x, int k) {
  const int16x8_t h = k < 2 ? vmovl_s8(vget_low_s8(x)) : vmovl_high_s8(x);
  return k % 2 ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
}

// The scales of two rows a, b (byte j of each) as x[q] = {a_j, a_j, b_j, b_j} for
// j = 4 q .. 4 q + 3: once widened to int32, the lane layout of a smmla tile.
template <int kN>
inline void PairScales(int8x16_t a, int8x16_t b, int8x16_t* x) {
  for (int h = 0; h < kN / 8; ++h) {
    const int16x8_t aa = vreinterpretq_s16_s8(h ? vzip2q_s8(a, a) : vzip1q_s8(a, a));
    const int16x8_t bb = vreinterpretq_s16_s8(h ? vzip2q_s8(b, b) : vzip1q_s8(b, b));
    x[2 * h] = vreinterpretq_s8_s16(vzip1q_s16(aa, bb));
    x[2 * h + 1] = vreinterpretq_s8_s16(vzip2q_s16(aa, bb));
  }
}

// {x[0] . y[0], .., x[3] . y[3]}: dot products of n int16x8 vectors each, exact in int32.
template <int n>
inline int32x4_t Dot4(const int16x8_t (&x)[4][n], const int16x8_t (&y)[4][n]) {
  int32x4_t p[4];
  for (int i = 0; i < 4; ++i) {
    p[i] = vmull_s16(vget_low_s16(x[i][0]), vget_low_s16(y[i][0]));
    p[i] = vmlal_high_s16(p[i], x[i][0], y[i][0]);
    for (int k = 1; k < n; ++k) {
      p[i] = vmlal_s16(p[i], vget_low_s16(x[i][k]), vget_low_s16(y[i][k]));
      p[i] = vmlal_high_s16(p[i], x[i][k], y[i][k]);
    }
  }
  return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

// The per-super-block FP32 steps of every K-quant output, shared by TileMMK and TileDot1K (the
// same operations per lane): c is imin (kMin) or the offset sum (kOff).
template <class K>
inline float32x4_t ScaleK(float32x4_t acc, int32x4_t isc, int32x4_t c, float32x4_t dw,
                          float32x4_t dmin, float32x4_t da) {
  if constexpr (K::kOff != 0) isc = vmlsq_s32(isc, c, vdupq_n_s32(K::kOff));
  float32x4_t s = vmulq_f32(dw, vcvtq_f32_s32(isc));
  if constexpr (K::kMin) s = vfmsq_f32(s, dmin, vcvtq_f32_s32(c));
  return vfmaq_f32(acc, s, da);
}

// Rows r0 .. r0 + nr - 1 x tokens t0 .. t0 + nt - 1 (nr <= 2 RP, nt <= 2 TP; missing ones
// repeat the last row / token and are not stored), lanes as in TileMM.
template <class K, int RP, int TP>
void TileMMK(const MatMulArgs& g, int64_t r0, int64_t t0, int nr, int nt) {
  using B = typename K::B;
  constexpr int kS = K::kSub, kN = kQKK / kS, kV = kS / 16;
  const int64_t nb = g.cols / kQKK;
  const B* w[2 * RP];
  for (int r = 0; r < 2 * RP; ++r)
    w[r] = reinterpret_cast<const B*>(g.w + (r0 + (r < nr ? r : nr - 1)) * g.row_bytes);
  int64_t tok[2 * TP];
  for (int t = 0; t < 2 * TP; ++t) tok[t] = t0 + (t < nt ? t : nt - 1);
  float32x4_t acc[RP][TP];
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) acc[rp][tp] = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    // The scale lanes of each row pair, {sc_r, sc_r, sc_r+1, sc_r+1} per sub-block, in step
    // order (element e of step s = lanes 4 (e % 2) .. of scl[rp][kPer / 2 * s + e / 2]).
    int16x8_t scl[RP][kN / 2];
    for (int rp = 0; rp < RP; ++rp) {
      int8x16_t x[kN / 4];
      PairScales<kN>(K::StepScales(K::Scales(w[2 * rp] + b)),
                     K::StepScales(K::Scales(w[2 * rp + 1] + b)), x);
      for (int i = 0; i < kN / 2; ++i)
        scl[rp][i] = i % 2 ? vmovl_high_s8(x[i / 2]) : vmovl_s8(vget_low_s8(x[i / 2]));
    }
    int32x4_t isc[RP][TP];
    for (int rp = 0; rp < RP; ++rp)
      for (int tp = 0; tp < TP; ++tp) isc[rp][tp] = vdupq_n_s32(0);
    for (int s = 0; s < K::kSteps; ++s) {
#pragma GCC unroll 4
      for (int e = 0; e < K::kPer; ++e) {
        const int j = K::Sub(s, e);
        int8x16_t xp[TP][2 * kV];
        for (int tp = 0; tp < TP; ++tp) {
          const int8_t* a0 = g.a.qs + tok[2 * tp] * g.a.qs_stride + b * kQKK + j * kS;
          const int8_t* a1 = g.a.qs + tok[2 * tp + 1] * g.a.qs_stride + b * kQKK + j * kS;
          for (int v = 0; v < kV; ++v)
            Interleave(vld1q_s8(a0 + 16 * v), vld1q_s8(a1 + 16 * v), xp[tp] + 2 * v);
        }
        for (int rp = 0; rp < RP; ++rp) {
          int8x16_t q0[kV], q1[kV], wp[2 * kV];
          K::Values(w[2 * rp] + b, s, e, q0);
          K::Values(w[2 * rp + 1] + b, s, e, q1);
          for (int v = 0; v < kV; ++v) Interleave(q0[v], q1[v], wp + 2 * v);
          const int16x8_t sh = scl[rp][K::kPer / 2 * s + e / 2];
          const int32x4_t sl = e % 2 ? vmovl_high_s16(sh) : vmovl_s16(vget_low_s16(sh));
          for (int tp = 0; tp < TP; ++tp) {
            int32x4_t d = vmmlaq_s32(vdupq_n_s32(0), wp[0], xp[tp][0]);
            for (int k = 1; k < 2 * kV; ++k) d = vmmlaq_s32(d, wp[k], xp[tp][k]);
            isc[rp][tp] = vmlaq_s32(isc[rp][tp], d, sl);
          }
        }
      }
    }
    for (int tp = 0; tp < TP; ++tp) {
      const float da0 = g.a.d[tok[2 * tp] * g.a.d_stride + b];
      const float da1 = g.a.d[tok[2 * tp + 1] * g.a.d_stride + b];
      const float dav[4] = {da0, da1, da0, da1};
      int16x8_t ac[2][K::kNC];
      for (int j = 0; j < 2; ++j)
        K::ActCorr(g.a.sums + tok[2 * tp + j] * g.a.sums_stride + 16 * b, ac[j]);
      for (int rp = 0; rp < RP; ++rp) {
        const B* b0 = w[2 * rp] + b;
        const B* b1 = w[2 * rp + 1] + b;
        const float dw[4] = {K::D(b0), K::D(b0), K::D(b1), K::D(b1)};
        const float dm[4] = {K::Dmin(b0), K::Dmin(b0), K::Dmin(b1), K::Dmin(b1)};
        int16x8_t wc[4][K::kNC], acs[4][K::kNC];
        K::Corr(b0, wc[0]);
        K::Corr(b1, wc[2]);
        for (int k = 0; k < K::kNC; ++k) {
          wc[1][k] = wc[0][k];
          wc[3][k] = wc[2][k];
          acs[0][k] = acs[2][k] = ac[0][k];
          acs[1][k] = acs[3][k] = ac[1][k];
        }
        acc[rp][tp] = ScaleK<K>(acc[rp][tp], isc[rp][tp], Dot4(wc, acs), vld1q_f32(dw),
                                vld1q_f32(dm), vld1q_f32(dav));
      }
    }
  }
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) {
      float o[4];
      vst1q_f32(o, acc[rp][tp]);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          if (2 * rp + i >= nr || 2 * tp + j >= nt) continue;
          const int64_t r = r0 + 2 * rp + i, t = t0 + 2 * tp + j;
          g.y[t * g.ldy + r] = o[2 * i + j];
        }
    }
}

// One token (decode), rows r0 .. r0 + nr - 1 (nr <= 4; missing rows repeat the last and are
// not stored): sdot per sub-block and row, four sub-blocks' lanes added up (vpaddq) and scaled
// by their four scales in one vmlaq_s32, the rows' super-block sums gathered into one vector
// (lane r = row r), then ScaleK -- lane for lane the arithmetic of TileMMK.
template <class K>
void TileDot1K(const MatMulArgs& g, int64_t r0, int64_t t, int nr) {
  using B = typename K::B;
  constexpr int kS = K::kSub, kN = kQKK / kS, kV = kS / 16;
  const int64_t nb = g.cols / kQKK;
  const B* w[4];
  for (int r = 0; r < 4; ++r)
    w[r] = reinterpret_cast<const B*>(g.w + (r0 + (r < nr ? r : nr - 1)) * g.row_bytes);
  const int64_t ahead = PrefetchAhead(4 * g.row_bytes);
  float32x4_t acc = vdupq_n_f32(0.f);
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* ap = g.a.qs + t * g.a.qs_stride + b * kQKK;
    int32x4_t iacc[4];
    for (int r = 0; r < 4; ++r) {
      PrefetchStream<sizeof(B)>(w[r] + b, ahead);
      const int8x16_t sc = K::StepScales(K::Scales(w[r] + b));
      iacc[r] = vdupq_n_s32(0);
      // Sub-blocks in step order, four at a time: their sdot lanes added up, times their scales.
#pragma GCC unroll 4
      for (int q = 0; q < kN / 4; ++q) {
        int32x4_t p[4];
        for (int k = 0; k < 4; ++k) {
          const int n = 4 * q + k, s = n / K::kPer, e = n % K::kPer, j = K::Sub(s, e);
          int8x16_t v[kV];
          K::Values(w[r] + b, s, e, v);
          p[k] = vdotq_s32(vdupq_n_s32(0), v[0], vld1q_s8(ap + kS * j));
          for (int i = 1; i < kV; ++i) p[k] = vdotq_s32(p[k], v[i], vld1q_s8(ap + kS * j + 16 * i));
        }
        const int32x4_t sums = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
        iacc[r] = vmlaq_s32(iacc[r], sums, Widen4(sc, q));
      }
    }
    const int32x4_t isc =
        vpaddq_s32(vpaddq_s32(iacc[0], iacc[1]), vpaddq_s32(iacc[2], iacc[3]));
    int16x8_t wc[4][K::kNC], acs[4][K::kNC];
    K::ActCorr(g.a.sums + t * g.a.sums_stride + 16 * b, acs[0]);
    for (int r = 0; r < 4; ++r) {
      K::Corr(w[r] + b, wc[r]);
      for (int k = 0; k < K::kNC; ++k) acs[r][k] = acs[0][k];
    }
    const float dw[4] = {K::D(w[0] + b), K::D(w[1] + b), K::D(w[2] + b), K::D(w[3] + b)};
    const float dm[4] = {K::Dmin(w[0] + b), K::Dmin(w[1] + b), K::Dmin(w[2] + b),
                         K::Dmin(w[3] + b)};
    acc = ScaleK<K>(acc, isc, Dot4(wc, acs), vld1q_f32(dw), vld1q_f32(dm),
                    vdupq_n_f32(g.a.d[t * g.a.d_stride + b]));
  }
  float o[4];
  vst1q_f32(o, acc);
  for (int r = 0; r < nr; ++r) g.y[t * g.ldy + r0 + r] = o[r];
}

// The tiles of either kind of block format: K-quants (K::kSub) or the 32-value blocks.
template <class K, int RP, int TP>
void TileAny(const MatMulArgs& g, int64_t r0, int64_t t0, int nr, int nt) {
  if constexpr (requires { K::kSub; }) {
    TileMMK<K, RP, TP>(g, r0, t0, nr, nt);
  } else {
    TileMM<K, RP, TP>(g, r0, t0, nr, nt);
  }
}

template <class K, int RP>
void TokensMM(const MatMulArgs& g, int64_t r, int nr) {
  const int64_t n = g.n_tokens;
  for (int64_t t = 0; t < n; t += 4) {
    const int nt = n - t < 4 ? static_cast<int>(n - t) : 4;
    if (nt > 2) {
      TileAny<K, RP, 2>(g, r, t, nr, nt);
    } else {
      TileAny<K, RP, 1>(g, r, t, nr, nt);
    }
  }
}

template <class K>
void KernelMM(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) {
    for (int64_t r = r0; r < r1; r += 4) {
      const int nr = r1 - r < 4 ? static_cast<int>(r1 - r) : 4;
      if constexpr (requires { K::kSub; }) {
        TileDot1K<K>(g, r, 0, nr);
      } else {
        TileDot1<K>(g, r, 0, nr);
      }
    }
    return;
  }
  for (int64_t r = r0; r < r1; r += 4) {
    const int nr = r1 - r < 4 ? static_cast<int>(r1 - r) : 4;
    if (nr > 2) {
      TokensMM<K, 2>(g, r, nr);
    } else {
      TokensMM<K, 1>(g, r, nr);
    }
  }
}

}  // namespace

MatMulKernel NeonI8mmMatMulKernel(DType t) {
  switch (t) {
    case DType::kQ4_0: return &KernelMM<KQ4_0>;
    case DType::kQ4_1: return &KernelMM<KQ4_1>;
    case DType::kQ5_0: return &KernelMM<KQ5_0>;
    case DType::kQ5_1: return &KernelMM<KQ5_1>;
    case DType::kQ8_0: return &KernelMM<KQ8_0>;
    case DType::kQ4_K: return &KernelMM<KQ4K>;
    case DType::kQ5_K: return &KernelMM<KQ5K>;
    case DType::kQ6_K: return &KernelMM<KQ6K>;
    default: return BaseMatMulKernel(t);
  }
}

}  // namespace peng::kernels

#endif  // __aarch64__
