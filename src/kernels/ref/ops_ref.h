// Scalar reference versions of the element-wise, RoPE and attention ops in kernels/ops.h: the
// oracle that every SIMD path is tested against, and the kernel used when no SIMD ISA is
// active. Plain loops, float32 values with double accumulators where a sum is taken, libm exp.
// Stateless and re-entrant.
//
// The attention primitives (DotRows*, AxpyRows*, ExpShiftSum, the row conversions) are the inner
// loops of PagedAttention (attention.cc) and MLA (mla.cc); every ISA provides the same set
// (cpu/ops_simd.h) but F32ToQ8_0Row, and attention.cc selects whichever is active.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace peng::kernels::ref {

// Same contracts as the ops of the same name in kernels/ops.h.
void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps);
void Softmax(float* x, int64_t n);
void SiluMul(const float* gate, const float* up, float* out, int64_t n);
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n);
void AddInPlace(float* y, const float* x, int64_t n);
void ScaleInPlace(float* y, float s, int64_t n);
int64_t ArgMax(const float* x, int64_t n);
int64_t FindNanOrPosInf(const float* x, int64_t n);
int64_t FindAbove(const float* x, int64_t n, float w);
void ApplyRope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const RopeConfig& cfg,
               const float* inv_freq);
void RopeCosSin(int64_t pos, const RopeConfig& cfg, const float* inv_freq, float* cs);
void ApplyRopeCosSin(float* x, int64_t n_heads, int64_t head_dim, const RopeConfig& cfg,
                     const float* cs);

// out[r] = dot(q[0..dim), k[r * k_stride ..][0..dim)) for r < n_rows.
void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out);
void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out);
// acc[0..dim) += sum_r w[r] * v[r * v_stride ..][0..dim).
void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc);
void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc);
// The same over rows of Q8_0 blocks (GGUF's: an fp16 scale d, then 32 int8 q; value d * q): dim
// a multiple of 32, strides in bytes. A value d * q is exact in FP32, so these are DotRowsF32 /
// AxpyRowsF32 on the dequantized rows (AVX-512's and AVX2's apply d once a block: the same to
// rounding).
void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                 float* out);
void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                  float* acc);
// x[i] = exp(x[i] - m) for i < n; returns the sum of the new x[i].
float ExpShiftSum(float* x, int64_t n, float m);
// y[i] = fp16(x[i]), round to nearest even.
void F32ToF16Row(const float* x, uint16_t* y, int64_t n);
// y[i] = float(x[i]) (exact).
void F16ToF32Row(const uint16_t* x, float* y, int64_t n);
// y[0..n) = the values of the n / 32 Q8_0 blocks at x (exact).
void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n);
// x[0..n) (n a multiple of 32) as n / 32 Q8_0 blocks at y: per block d = fp16(amax / 127), q =
// round-to-nearest-even(x * 127 / amax), the activation quantizer's rounding (ActBlockScale).
// Scalar on every ISA (a KV cache row is written once), so the bits do not depend on the ISA.
void F32ToQ8_0Row(const float* x, uint8_t* y, int64_t n);
// Each run of `block` values (a power of two dividing dim) of the n_rows rows of `dim` values at
// x multiplied by the orthonormal Walsh-Hadamard matrix H (Sylvester's order: H[i][j] =
// (-1)^popcount(i & j) / sqrt(block)), in place, by the fast transform's butterflies. H is
// symmetric and its own inverse. Scalar on every ISA (the same bits everywhere).
void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block);

// The query-tile primitives of prefill attention (attention.cc): a tile is 16 query rows, one a
// lane, with the queries transposed (qt[d * 16 + lane]) and every per-key quantity stored as 16
// lanes (s[j * 16 + lane]).
// s[j][lane] = dot(qt[.][lane], k[j * k_stride ..][0..dim)) for j < n.
void ScoreTile16(const float* qt, const float* k, int64_t k_stride, int64_t n, int64_t dim,
                 float* s);
// One online-softmax step per lane over the n scores s[j][lane] (-inf = masked key): m (running
// max) and l (running sum) updated, corr = exp(m_old - m_new) (0 while m_old is -inf), and s
// overwritten with exp(s - m_new) (exactly 0 where masked).
void SoftmaxTile16(float* s, int64_t n, float* m, float* l, float* corr);
// acc[d][lane] = acc[d][lane] * corr[lane] + sum_j p[j][lane] * v[j * v_stride + d], d < dim.
void AccumTile16(const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dim,
                 const float* corr, float* acc);

}  // namespace peng::kernels::ref
