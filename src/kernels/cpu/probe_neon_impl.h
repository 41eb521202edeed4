// The ARM64 machine-peak probe loops (cpu/probe_simd.h) shared by the three ARM64 levels:
// included by cpu/probe_neon.cc, cpu/probe_dotprod.cc and cpu/probe_i8mm.cc, each compiled with
// its own target flags; the levels differ only in the int8 multiply-add step. Everything is in
// an anonymous namespace (internal linkage, no ODR merging across levels).
#pragma once
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstdint>

namespace peng::kernels {
namespace {

// 4 x 16-byte loads per step.
uint64_t ReadSumImpl(const void* p, int64_t n) {
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

// 12 independent chains of 4-wide FMAs.
int64_t FmaLoopImpl(int64_t iters, float* sink) {
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

// 12 independent chains of step(acc, u, s): kMacs int8 multiply-adds each.
template <int kMacs, class Step>
int64_t Int8DotLoopImpl(int64_t iters, int32_t* sink, Step step) {
  const int8x16_t u = vdupq_n_s8(3), s8 = vdupq_n_s8(-2);
  int32x4_t a[12];
  for (int k = 0; k < 12; ++k) a[k] = vdupq_n_s32(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = step(a[k], u, s8);
  }
  int32x4_t s = a[0];
  for (int k = 1; k < 12; ++k) s = vaddq_s32(s, a[k]);
  *sink = vaddvq_s32(s);
  return iters * 12 * kMacs * 2;
}

}  // namespace
}  // namespace peng::kernels

#endif  // defined(__aarch64__)
