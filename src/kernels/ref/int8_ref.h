// Scalar reference of the INT8 kernels (int8_gemm.h): the oracle the SIMD paths are tested
// against. W8A8 results must match it bit for bit; W8A16 within FP32 rounding.
#pragma once

#include <cstdint>

#include "kernels/int8_gemm.h"

namespace peng::kernels::ref {

// Exact int32 dot product of n int8 values.
int32_t DotI8(const int8_t* a, const int8_t* b, int64_t n);

// The final W8A8 scaling shared by every path.
inline float ScaleI8Dot(int32_t acc, float x_scale, float w_scale) {
  return static_cast<float>(acc) * (x_scale * w_scale);
}

void Int8MatMulW8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
void Int8MatMulW8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

}  // namespace peng::kernels::ref
