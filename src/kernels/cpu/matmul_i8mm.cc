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
// TileMM's. The K-quants and the float weights use the sdot code of cpu/matmul_neon_impl.h at
// this level. Compiled only on aarch64.
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

template <class K, int RP>
void TokensMM(const MatMulArgs& g, int64_t r, int nr) {
  const int64_t n = g.n_tokens;
  for (int64_t t = 0; t < n; t += 4) {
    const int nt = n - t < 4 ? static_cast<int>(n - t) : 4;
    if (nt > 2) {
      TileMM<K, RP, 2>(g, r, t, nr, nt);
    } else {
      TileMM<K, RP, 1>(g, r, t, nr, nt);
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

template <class K>
void Kernel32MM(const MatMulArgs& g, int64_t r0, int64_t r1) {
  if (g.n_tokens == 1) {
    for (int64_t r = r0; r < r1; r += 4)
      TileDot1<K>(g, r, 0, r1 - r < 4 ? static_cast<int>(r1 - r) : 4);
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
    case DType::kQ4_0: return &Kernel32MM<KQ4_0>;
    case DType::kQ4_1: return &Kernel32MM<KQ4_1>;
    case DType::kQ5_0: return &Kernel32MM<KQ5_0>;
    case DType::kQ5_1: return &Kernel32MM<KQ5_1>;
    case DType::kQ8_0: return &Kernel32MM<KQ8_0>;
    default: return BaseMatMulKernel(t);
  }
}

}  // namespace peng::kernels

#endif  // __aarch64__
