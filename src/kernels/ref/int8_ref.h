// Scalar reference of the INT8 kernels (int8_gemm.h): the oracle the SIMD paths are tested
// against (exact group dot products; FP32 accumulation within rounding).
#pragma once

#include <cstdint>

#include "kernels/int8_gemm.h"

namespace peng::kernels::ref {

// Exact int32 dot product of n int8 values.
int32_t DotI8(const int8_t* a, const int8_t* b, int64_t n);

void Int8MatMulW8A8(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);
void Int8MatMulW8A16(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

}  // namespace peng::kernels::ref
