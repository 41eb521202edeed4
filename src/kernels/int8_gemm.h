// INT8 GEMM/GEMV for the W8A8 and W8A16 schemes (issue 5): int8 weights, symmetric, one float
// scale per output channel (row). W8A8 multiplies them with int8 activations quantized per token
// in groups of kInt8ActGroup = 32 values (one scale per token and group, like llama.cpp's Q8_0
// activations: a single outlier channel only coarsens its own group, which keeps perplexity
// within 0.2% where one scale per token loses 3-4%); each group's dot product is an exact int32,
// scaled by the group's activation scale and accumulated in FP32, then multiplied by the row
// scale. W8A16 dequantizes the weights on the fly and multiplies them with FP32 activations
// (FP32 accumulation).
//
// Layouts: weights [rows, cols] row-major int8 with scales[rows]; activations [n_tokens, cols]
// row-major (W8A8 scales [n_tokens, cols / 32]); y [n_tokens, rows] row-major (y[t * rows + r],
// as kernels::MatMul). Requirements: cols a multiple of 32 (kInt8ColAlign) and at most
// kInt8MaxCols.
//
// Each call dispatches on kernels::ActiveIsa() to AVX-512 VNNI (vpdpbusd), AVX2
// (vpmaddubsw/vpmaddwd), NEON (vmull/vpadal, sdot, smmla by level) or the scalar reference in ref/int8_ref.h. The int32
// group dot products are exact on every path; only the FP32 accumulation order differs (so
// with unit scales and |sums| < 2^24 every path gives identical results, which the conformance
// tests check). The weight rows are split across the ThreadPool (nullptr = single thread). The
// structs only point at caller-owned memory; all functions are re-entrant.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace peng::kernels {

inline constexpr int64_t kInt8ColAlign = 32;
inline constexpr int64_t kInt8ActGroup = 32;     // activation values per W8A8 scale
inline constexpr int64_t kInt8MaxCols = 131072;  // 127 * 127 * cols < 2^31

// A borrowed view of an INT8 weight matrix.
struct Int8Weights {
  const int8_t* q = nullptr;      // [rows, cols]
  const float* scales = nullptr;  // [rows]
  int64_t rows = 0;
  int64_t cols = 0;
  // The same weights packed for the active ISA's kernels (kernels::PackPanels of the kI8
  // tensor; AVX-512: 4-row groups), or null. The results do not depend on it.
  const uint8_t* panels = nullptr;
};

// Symmetric quantization of each of n_rows rows of x [n_rows, cols]: scale = max|x| / 127 (0 for
// an all-zero row), q = round-to-nearest-even(x / scale) clamped to [-127, 127].
void QuantizeRowsPerToken(const float* x, int64_t n_rows, int64_t cols, int8_t* q,
                          float* scales);
// Weights: one scale per output channel (row).
inline void QuantizeWeightsPerRow(const float* w, int64_t rows, int64_t cols, int8_t* q,
                                  float* scales) {
  QuantizeRowsPerToken(w, rows, cols, q, scales);
}
// W8A8 activations: every group of 32 values of each token quantized as a row of its own;
// scales [n_tokens, cols / 32]. cols must be a multiple of 32.
void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int8_t* q,
                         float* scales);

// W8A8 input of a projection that follows an RMSNorm: y = RmsNorm(x) * (w + w_offset) exactly as
// kernels::RmsNorm computes it (y may alias x) and, in the same pass over each row while it is
// in L1, its activation quantization exactly as QuantizeActivations(y) would give. The FP32 y
// stays available for consumers that need it (exact mode, non-INT8 weights).
void RmsNormQuantize(const float* x, const float* w, float w_offset, float* y, int8_t* q,
                     float* scales, int64_t n_rows, int64_t n, float eps);

// W8A8: y[t, r] = w.scales[r] * sum_g x_scales[t, g] * float(sum_{c in g} w.q[r, c] * xq[t, c]).
void Int8MatMul(const Int8Weights& w, const int8_t* xq, const float* x_scales, int64_t n_tokens,
                float* y, ThreadPool* pool);

// W8A16: y[t, r] = w.scales[r] * sum_c float(w.q[r, c]) * x[t, c], FP32 accumulation (the row
// scale is applied once per dot product).
void Int8MatMulW8A16(const Int8Weights& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool* pool);

// ---------------------------------------------------------------------------------------------
// Kernel interface between int8_gemm.cc (dispatch, threading, token chunks) and the
// implementations in ref/ and cpu/. A kernel computes y for rows [r0, r1) x tokens [t0, t1).
struct Int8Args {
  Int8Weights w;
  const int8_t* xq = nullptr;       // W8A8: [n_tokens, cols]
  const float* x_scales = nullptr;  // W8A8: [n_tokens, cols / kInt8ActGroup]
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
Int8Kernels NeonInt8Kernels();      // cpu/int8_neon.cc (ARMv8.0: vmull/vpadal)
Int8Kernels NeonDotInt8Kernels();   // cpu/int8_dotprod.cc (sdot)
Int8Kernels NeonI8mmInt8Kernels();  // cpu/int8_i8mm.cc (smmla 2x2 tiles, sdot for one token)
#endif

}  // namespace peng::kernels
