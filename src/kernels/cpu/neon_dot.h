// Dot(): four int32 lanes += the int8 products of a and b, summed in groups of four -- sdot
// where the including file is built with the dot-product extension, a vmull/vpadal pair (the
// same exact int32 sums) on plain ARMv8.0 NEON. Shared by the NEON matmul and INT8 kernels
// (matmul_neon_impl.h, int8_neon_impl.h); like them it lives in an anonymous namespace, so
// every ARM64 level's file gets its own copy built with its own target flags.
#pragma once
#if defined(__aarch64__)

#include <arm_neon.h>

namespace peng::kernels {
namespace {

inline int32x4_t Dot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_high_s8(a, b);
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

}  // namespace
}  // namespace peng::kernels

#endif  // defined(__aarch64__)
