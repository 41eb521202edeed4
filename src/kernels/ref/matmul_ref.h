// Scalar reference (the oracle) for the matmul kernels: weight dequantization, activation
// quantization into the companion formats and per-row dot products for every weight type
// MatMul supports. Plain, obviously-correct loops; the SIMD kernels in cpu/ must agree with
// these exactly in their integer parts (see quant_blocks.h). Pure functions, thread-safe.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels::ref {

// dst[0..n) = values of the first n weights at src (the formulas of the GGUF format, FP32).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantizes n values (n a multiple of ab = 32 or 256): per block of ab, d = max|x| / 127 and
// qs = round-half-even(x * (1 / d)); sums[i] = sum of qs[16 i .. 16 i + 15].
void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d, int16_t* sums);

// Dot product of one weight row of n values (quantized type t) with one activation row.
float VecDotQ(DType t, int64_t n, const void* w, const int8_t* qs, const float* d,
              const int16_t* sums);

// Dot product of one float-typed weight row (F32, F16, BF16) with FP32 x.
float VecDotF(DType t, int64_t n, const void* w, const float* x);

}  // namespace peng::kernels::ref
