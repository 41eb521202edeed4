// ARMv8.0 NEON machine-peak probe loops (cpu/probe_simd.h, built with -march=armv8-a): 4 x
// 16-byte loads per step, 4-wide FMAs, and the int8 multiply-add the ARMv8.0 quantized matmuls
// use (vmull_s8 + vpadal: 16 multiply-adds per pair of steps).
#if defined(__aarch64__)

#include "kernels/cpu/probe_neon_impl.h"
#include "kernels/cpu/probe_simd.h"

namespace peng::kernels::neon {

uint64_t ReadSum(const void* p, int64_t n) { return ReadSumImpl(p, n); }
int64_t FmaLoop(int64_t iters, float* sink) { return FmaLoopImpl(iters, sink); }
int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  return Int8DotLoopImpl<16>(iters, sink, [](int32x4_t acc, int8x16_t a, int8x16_t b) {
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    return vpadalq_s16(vpadalq_s16(acc, lo), vmull_high_s8(a, b));
  });
}

}  // namespace peng::kernels::neon

#endif  // defined(__aarch64__)
