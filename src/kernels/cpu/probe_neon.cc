// ARM64 NEON machine-peak probe loops (cpu/probe_simd.h): 4 x 16-byte loads per step, 4-wide
// FMAs, and sdot (the dot-product extension the NEON quantized matmuls are built with).
#if defined(__aarch64__)

#include <arm_neon.h>

#include "kernels/cpu/probe_simd.h"

namespace peng::kernels::neon {

uint64_t ReadSum(const void* p, int64_t n) {
  const auto* v = static_cast<const uint64_t*>(p);
  uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n / 8; i += 8) {
    a0 = vaddq_u64(a0, vld1q_u64(v + i));
    a1 = vaddq_u64(a1, vld1q_u64(v + i + 2));
    a2 = vaddq_u64(a2, vld1q_u64(v + i + 4));
    a3 = vaddq_u64(a3, vld1q_u64(v + i + 6));
  }
  return vaddvq_u64(vaddq_u64(vaddq_u64(a0, a1), vaddq_u64(a2, a3)));
}

int64_t FmaLoop(int64_t iters, float* sink) {
  const float32x4_t m = vdupq_n_f32(0.999f), c = vdupq_n_f32(0.001f);
  float32x4_t a[12];
  for (int k = 0; k < 12; ++k) a[k] = vdupq_n_f32(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = vfmaq_f32(c, a[k], m);
  }
  float32x4_t s = a[0];
  for (int k = 1; k < 12; ++k) s = vaddq_f32(s, a[k]);
  *sink = vaddvq_f32(s);
  return iters * 12 * 4 * 2;
}

int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  const int8x16_t u = vdupq_n_s8(3), s8 = vdupq_n_s8(-2);
  int32x4_t a[12];
  for (int k = 0; k < 12; ++k) a[k] = vdupq_n_s32(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = vdotq_s32(a[k], u, s8);
  }
  int32x4_t s = a[0];
  for (int k = 1; k < 12; ++k) s = vaddq_s32(s, a[k]);
  *sink = vaddvq_s32(s);
  return iters * 12 * 16 * 2;
}

}  // namespace peng::kernels::neon

#endif  // defined(__aarch64__)
