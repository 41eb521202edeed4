// INT8 GEMM/GEMV for the W8A8 and W8A16 schemes (issue 5): int8 weights, symmetric, one float
// scale per output channel (row). W8A8 multiplies them with int8 activations quantized per token
// (exact int32 dot products, then FP32 scaling); W8A16 dequantizes the weights on the fly and
// multiplies them with FP32 activations (FP32 accumulation).
//
// Layouts: weights [rows, cols] row-major int8 with scales[rows] and row_sums[rows]; activations
// [n_tokens, cols] row-major; y [n_tokens, rows] row-major (y[t * rows + r], as kernels::MatMul).
// Requirements: cols a multiple of 32 (kInt8ColAlign) and at most kInt8MaxCols, so that every
// exact dot product fits in int32.
//
// Each call dispatches on kernels::ActiveIsa() to AVX-512 VNNI (vpdpbusd), AVX2
// (vpmaddubsw/vpmaddwd), NEON (vdotq_s32) or the scalar reference in ref/int8_ref.h. Every path
// produces bit-identical W8A8 results: the int32 accumulators are exact and the final scaling is
// the same expression float(acc) * (x_scale * w_scale) everywhere. The weight rows are split
// across the ThreadPool (nullptr = single thread). The structs only point at caller-owned
// memory; all functions are re-entrant.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace peng::kernels {

inline constexpr int64_t kInt8ColAlign = 32;
inline constexpr int64_t kInt8MaxCols = 131072;  // 127 * 127 * cols < 2^31

// A borrowed view of an INT8 weight matrix. row_sums[r] = sum_c q[r, c] (ComputeInt8RowSums):
// the VNNI path multiplies unsigned activations (q + 128) and removes 128 * row_sums[r].
struct Int8Weights {
  const int8_t* q = nullptr;         // [rows, cols]
  const float* scales = nullptr;     // [rows]
  const int32_t* row_sums = nullptr; // [rows]
  int64_t rows = 0;
  int64_t cols = 0;
};

// row_sums[r] = sum_c q[r * cols + c].
void ComputeInt8RowSums(const int8_t* q, int64_t rows, int64_t cols, int32_t* row_sums);

// Symmetric per-row quantization of x [n_rows, cols]: scale = max|x| / 127 (0 for an all-zero
// row), q = round-to-nearest-even(x / scale) clamped to [-127, 127]. sums (may be null) receives
// the int32 sum of each row's q. Used per token for activations (QuantizeRowsPerToken) and per
// output channel for weights (QuantizeWeightsPerRow), so both have the same rounding.
void QuantizeRowsPerToken(const float* x, int64_t n_tokens, int64_t cols, int8_t* q,
                          float* scales, int32_t* sums = nullptr);
inline void QuantizeWeightsPerRow(const float* w, int64_t rows, int64_t cols, int8_t* q,
                                  float* scales, int32_t* row_sums) {
  QuantizeRowsPerToken(w, rows, cols, q, scales, row_sums);
}

// W8A8: y[t, r] = float(sum_c w.q[r, c] * xq[t, c]) * (x_scales[t] * w.scales[r]).
void Int8MatMul(const Int8Weights& w, const int8_t* xq, const float* x_scales, int64_t n_tokens,
                float* y, ThreadPool* pool);

// W8A16: y[t, r] = w.scales[r] * sum_c float(w.q[r, c]) * x[t, c], FP32 accumulation (the row
// scale is applied once per dot product; row_sums are not used).
void Int8MatMulW8A16(const Int8Weights& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool* pool);

// ---------------------------------------------------------------------------------------------
// Kernel interface between int8_gemm.cc (dispatch, threading, token chunks) and the
// implementations in ref/ and cpu/. A kernel computes y for rows [r0, r1) x tokens [t0, t1).
struct Int8Args {
  Int8Weights w;
  const int8_t* xq = nullptr;       // W8A8: [n_tokens, cols]
  const float* x_scales = nullptr;  // W8A8: [n_tokens]
  const float* x = nullptr;         // W8A16: [n_tokens, cols]
  float* y = nullptr;               // [n_tokens, w.rows]
};
using Int8Kernel = void (*)(const Int8Args& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1);

struct Int8Kernels {
  Int8Kernel w8a8 = nullptr;
  Int8Kernel w8a16 = nullptr;
};

#if defined(__x86_64__)
Int8Kernels Avx2Int8Kernels();    // cpu/int8_avx2.cc
Int8Kernels Avx512Int8Kernels();  // cpu/int8_avx512.cc
#endif
#if defined(__aarch64__)
Int8Kernels NeonInt8Kernels();    // cpu/int8_neon.cc
#endif

}  // namespace peng::kernels
