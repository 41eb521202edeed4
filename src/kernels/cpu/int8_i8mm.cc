// Int8 matrix-multiply extension INT8 kernels (Isa::kNeonI8mm; built with
// armv8.2-a+dotprod+fp16+i8mm). W8A8: smmla multiplies a 2x8 int8 block of two weight rows by an
// 8x2 block of two tokens' activations into a 2x2 int32 tile, so each instruction does 32
// multiply-adds (sdot: 16) and the four lanes of the accumulator are four outputs (no
// horizontal sums). Tiles of up to 4 rows x 4 tokens; an odd last row or token is paired with
// itself, so every output has the same arithmetic whatever the batch size or row range. A
// chunk of a single token (decode) uses sdot (TileDot1, bit-identical to TileMM's lanes): smmla
// would spend half its lanes on the duplicate, no more useful work than sdot; i8mm pays off
// for batches >= 2. W8A16 as at the dotprod level. Compiled only on aarch64.
#if defined(__aarch64__)

#include "kernels/cpu/int8_neon_impl.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "int8_i8mm.cc must be built with +i8mm (cmake/PengLibrary.cmake)"
#endif

namespace peng::kernels {
namespace {

// The 8-value chunks 0,1 (k = 0) or 2,3 (k = 1) of the 16 values at p and at q, as smmla's
// 2x8 operand: {p[8k..8k+7], q[8k..8k+7]}.
inline void Interleave(const int8_t* p, const int8_t* q, int8x16_t* out) {
  const int64x2_t u = vreinterpretq_s64_s8(vld1q_s8(p)), v = vreinterpretq_s64_s8(vld1q_s8(q));
  out[0] = vreinterpretq_s8_s64(vzip1q_s64(u, v));
  out[1] = vreinterpretq_s8_s64(vzip2q_s64(u, v));
}

// Rows r0 .. r0 + nr - 1 x tokens t0 .. t0 + nt - 1 (nr <= 2 RP, nt <= 2 TP; missing ones
// repeat the last row / token and are not stored). acc[rp][tp] lanes: (r, t), (r, t + 1),
// (r + 1, t), (r + 1, t + 1).
template <int RP, int TP>
void TileMM(const Int8Args& a, int64_t r0, int64_t t0, int nr, int nt) {
  const int64_t cols = a.w.cols, groups = cols / kInt8ActGroup;
  int64_t row[2 * RP], tok[2 * TP];
  for (int i = 0; i < 2 * RP; ++i) row[i] = r0 + (i < nr ? i : nr - 1);
  for (int j = 0; j < 2 * TP; ++j) tok[j] = t0 + (j < nt ? j : nt - 1);
  float32x4_t acc[RP][TP];
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) acc[rp][tp] = vdupq_n_f32(0.f);
  for (int64_t c = 0; c < cols; c += 32) {  // one activation group per step
    const int64_t g = c / kInt8ActGroup;
    int8x16_t xp[TP][4];
    float32x4_t sc[TP];
    for (int tp = 0; tp < TP; ++tp) {
      const int8_t* x0 = a.xq + tok[2 * tp] * cols + c;
      const int8_t* x1 = a.xq + tok[2 * tp + 1] * cols + c;
      Interleave(x0, x1, xp[tp]);
      Interleave(x0 + 16, x1 + 16, xp[tp] + 2);
      const float s0 = a.x_scales[tok[2 * tp] * groups + g];
      const float s1 = a.x_scales[tok[2 * tp + 1] * groups + g];
      const float s[4] = {s0, s1, s0, s1};
      sc[tp] = vld1q_f32(s);
    }
    for (int rp = 0; rp < RP; ++rp) {
      const int8_t* w0 = a.w.q + row[2 * rp] * cols + c;
      const int8_t* w1 = a.w.q + row[2 * rp + 1] * cols + c;
      int8x16_t wp[4];
      Interleave(w0, w1, wp);
      Interleave(w0 + 16, w1 + 16, wp + 2);
      for (int tp = 0; tp < TP; ++tp) {
        int32x4_t d = vmmlaq_s32(vdupq_n_s32(0), wp[0], xp[tp][0]);
        d = vmmlaq_s32(d, wp[1], xp[tp][1]);
        d = vmmlaq_s32(d, wp[2], xp[tp][2]);
        d = vmmlaq_s32(d, wp[3], xp[tp][3]);
        acc[rp][tp] = vfmaq_f32(acc[rp][tp], vcvtq_f32_s32(d), sc[tp]);
      }
    }
  }
  const int64_t rows = a.w.rows;
  for (int rp = 0; rp < RP; ++rp)
    for (int tp = 0; tp < TP; ++tp) {
      float o[4];
      vst1q_f32(o, acc[rp][tp]);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
          if (2 * rp + i >= nr || 2 * tp + j >= nt) continue;
          const int64_t r = r0 + 2 * rp + i, t = t0 + 2 * tp + j;
          a.y[t * rows + r] = o[2 * i + j] * a.w.scales[r];
        }
    }
}

template <int RP>
void TokensMM(const Int8Args& a, int64_t r, int nr, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; t += 4) {
    const int nt = t1 - t < 4 ? static_cast<int>(t1 - t) : 4;
    if (nt > 2) {
      TileMM<RP, 2>(a, r, t, nr, nt);
    } else {
      TileMM<RP, 1>(a, r, t, nr, nt);
    }
  }
}

// One token, rows r0 .. r0 + nr - 1 (nr <= 4; missing rows repeat the last, not stored): sdot
// with each group's lanes added up (vpaddq) before scaling, so every output is
// fma(acc, float(exact group sum), x_scale) as in a lane of TileMM (bit-identical), at sdot's
// 16 useful multiply-adds per instruction.
void TileDot1(const Int8Args& a, int64_t r0, int64_t t, int nr) {
  const int64_t cols = a.w.cols, groups = cols / kInt8ActGroup;
  const int8_t* w[4];
  for (int r = 0; r < 4; ++r) w[r] = a.w.q + (r0 + (r < nr ? r : nr - 1)) * cols;
  const int8_t* x = a.xq + t * cols;
  float32x4_t acc = vdupq_n_f32(0.f);
  for (int64_t c = 0; c < cols; c += 32) {
    const int8x16_t x0 = vld1q_s8(x + c), x1 = vld1q_s8(x + c + 16);
    int32x4_t p[4];
    for (int r = 0; r < 4; ++r)
      p[r] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[r] + c), x0), vld1q_s8(w[r] + c + 16),
                       x1);
    const int32x4_t sums = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
    acc = vfmaq_f32(acc, vcvtq_f32_s32(sums), vdupq_n_f32(a.x_scales[t * groups + c / 32]));
  }
  float o[4];
  vst1q_f32(o, acc);
  for (int r = 0; r < nr; ++r) a.y[t * a.w.rows + r0 + r] = o[r] * a.w.scales[r0 + r];
}

void W8A8MM(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  if (t1 - t0 == 1) {
    for (int64_t r = r0; r < r1; r += 4)
      TileDot1(a, r, t0, r1 - r < 4 ? static_cast<int>(r1 - r) : 4);
    return;
  }
  for (int64_t r = r0; r < r1; r += 4) {
    const int nr = r1 - r < 4 ? static_cast<int>(r1 - r) : 4;
    if (nr > 2) {
      TokensMM<2>(a, r, nr, t0, t1);
    } else {
      TokensMM<1>(a, r, nr, t0, t1);
    }
  }
}

}  // namespace

Int8Kernels NeonI8mmInt8Kernels() { return {&W8A8MM, &W8A16}; }

}  // namespace peng::kernels

#endif  // __aarch64__
