// Int8 matrix-multiply extension machine-peak probe loops (cpu/probe_simd.h, built with
// armv8.2-a+dotprod+fp16+i8mm): the ARMv8.0 loads and FMAs, and smmla (a 2x8 by 8x2 int8 block,
// 32 multiply-adds each).
#if defined(__aarch64__)

#include "kernels/cpu/probe_neon_impl.h"
#include "kernels/cpu/probe_simd.h"

namespace peng::kernels::i8mm {

uint64_t ReadSum(const void* p, int64_t n) { return ReadSumImpl(p, n); }
int64_t FmaLoop(int64_t iters, float* sink) { return FmaLoopImpl(iters, sink); }
int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  return Int8DotLoopImpl<32>(iters, sink, [](int32x4_t acc, int8x16_t a, int8x16_t b) {
    return vmmlaq_s32(acc, a, b);
  });
}

}  // namespace peng::kernels::i8mm

#endif  // defined(__aarch64__)
