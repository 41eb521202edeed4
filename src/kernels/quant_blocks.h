// GGUF/GGML block layouts of the quantized weight types MatMul supports, the quantized
// activation rows their dot products run against, and the kernel table each ISA provides.
//
// Weight blocks are byte-exact views of GGUF tensor data (facts of the format; fp16 fields are
// stored as raw uint16). Activations are quantized once per MatMul call into an ActRows
// buffer (structure of arrays, one row per token):
//   qs   int8  [cols]        round-to-nearest-even(x / d), |q| <= 127
//   d    float [cols / ab]   per activation block: ab = 32 for the 32-value weight types
//                            (Q8_0 companion; with `sums` it is the Q8_1 companion) and
//                            ab = 256 for the K-quants (the Q8_K companion)
//   sums int16 [cols / 16]   sum of qs over each run of 16 values
// The activation quantizer is deterministic and identical on every ISA, so integer parts of
// every dot product are exact; only the FP32 accumulation order differs between ISAs.
// Everything here is plain data; the kernels are pure functions (thread-safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"

namespace peng::kernels {

inline constexpr int kQK = 32;    // values per block of the 32-value types
inline constexpr int kQKK = 256;  // values per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;                // fp16 scale
  uint8_t qs[kQK / 2];       // value i: low nibble of qs[i], value i + 16: high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;             // fp16 scale and minimum: w = d * q + m
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];             // bit i (little-endian uint32) = 5th bit of value i
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// Q4_K: 8 sub-blocks of 32; w = d * sc[j] * q - dmin * m[j] with 6-bit sc/m packed in scales.
// qs chunk c (32 bytes): low nibbles = sub-block 2c, high nibbles = sub-block 2c + 1.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
// Q5_K: as Q4_K plus qh: bit j of qh[l] is the 5th bit of value 32 * j + l.
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
// Q6_K: 16 sub-blocks of 16; w = d * scales[i] * (q - 32), q 6-bit. Per half h (128 values):
// ql[64h + l] low nibble -> value l (l < 64), high nibble -> value 64 + l; qh[32h + l] bits
// 2k..2k+1 -> upper two bits of value 32k + l.
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Unpacks the 12-byte K-quant scale field into 8 scales and 8 mins (6-bit each).
inline void UnpackScalesK(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0xF) | ((s[j] >> 6) << 4);
    m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// 4 bytes from any address as a little-endian word (no int32 aliasing of int8 data).
inline uint32_t Load32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Same as UnpackScalesK, as two little-endian 8-byte words (byte j = sc[j] / m[j]); no byte
// stores, so SIMD code can move the result straight into a vector register.
inline void UnpackScalesK64(const uint8_t* s, uint64_t* sc, uint64_t* m) {
  const uint32_t lo = Load32(s), hi = Load32(s + 4), b = Load32(s + 8);
  const uint32_t sc_hi = (b & 0x0F0F0F0Fu) | ((lo >> 2) & 0x30303030u);
  const uint32_t m_hi = ((b >> 4) & 0x0F0F0F0Fu) | ((hi >> 2) & 0x30303030u);
  *sc = (lo & 0x3F3F3F3Fu) | uint64_t{sc_hi} << 32;
  *m = (hi & 0x3F3F3F3Fu) | uint64_t{m_hi} << 32;
}

// Activation block size of the companion format of weight type t (32 or 256).
inline int ActBlockSize(DType t) {
  return (t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K) ? kQKK : kQK;
}

// Activation block scales, computed as llama.cpp does so that results agree with it: values
// are quantized with iscale = 127 / amax (round to nearest even); 32-value blocks (Q8_0/Q8_1)
// keep the scale amax / 127 rounded to fp16, 256-value blocks (Q8_K) keep 1 / iscale.
inline void ActBlockScale(float amax, int ab, float* d, float* iscale) {
  *iscale = amax != 0.f ? 127.f / amax : 0.f;
  if (ab == kQKK) {
    *d = amax != 0.f ? 1.f / *iscale : 0.f;
  } else {
    *d = F16ToF32(F32ToF16(amax / 127.f));
  }
}

// Quantized activation rows (see the header comment). Row t starts at qs + t * qs_stride,
// d + t * d_stride, sums + t * sums_stride.
// For 32-value blocks also, per block bb, neg_sum[bb] = -(sums[2bb] + sums[2bb + 1]) and
// dsum[bb] = d[bb] * float(sums[2bb] + sums[2bb + 1]) (row t at t * d_stride): the offset term
// of a block's dot as an integer a GEMM kernel starts its accumulator from (shifted by the
// weight offset's power of two) and the min term as a float it broadcasts from memory.
struct ActRows {
  const int8_t* qs = nullptr;
  const float* d = nullptr;
  const int16_t* sums = nullptr;
  const int32_t* neg_sum = nullptr;
  const float* dsum = nullptr;
  int64_t qs_stride = 0, d_stride = 0, sums_stride = 0;
};

// One MatMul work description: rows of W (each row_bytes apart) times n_tokens activation
// rows, y[t * ldy + r]. Float weight types read x (row-major [n_tokens, cols]); quantized
// types read a.
struct MatMulArgs {
  DType type = DType::kF32;
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int64_t cols = 0;
  int64_t n_tokens = 0;
  const float* x = nullptr;
  ActRows a;
  float* y = nullptr;
  int64_t ldy = 0;
  // The rows packed into 16-row panels (TensorView::panels, from the args' first row, which is
  // then a multiple of 16), panel_bytes apart; null: only the row-major `w`.
  const uint8_t* panels = nullptr;
  size_t panel_bytes = 0;
};

// Computes rows [r0, r1) of args for all tokens.
using MatMulKernel = void (*)(const MatMulArgs& args, int64_t r0, int64_t r1);
// Quantizes n values of x into qs/d/sums with activation block size ab (32 or 256).
using QuantizeActFn = void (*)(const float* x, int64_t n, int ab, int8_t* qs, float* d,
                               int16_t* sums);

// Per-ISA kernel lookup; nullptr where that ISA has no kernel for the type (the caller then
// falls back to the scalar reference).
MatMulKernel RefMatMulKernel(DType t);
MatMulKernel Avx2MatMulKernel(DType t);
MatMulKernel Avx512MatMulKernel(DType t);
MatMulKernel NeonMatMulKernel(DType t);      // cpu/matmul_neon.cc (ARMv8.0)
MatMulKernel NeonDotMatMulKernel(DType t);   // cpu/matmul_dotprod.cc (sdot)
MatMulKernel NeonI8mmMatMulKernel(DType t);  // cpu/matmul_i8mm.cc (smmla + sdot)
// AVX-512's load-time panel layout (kernels::PackPanels): bytes per 16-row panel of a matrix of
// `cols` columns, 0 for a type it does not pack; and the packing of `rows` rows (`row_bytes`
// apart) into ceil(rows / 16) panels.
size_t Avx512PanelBytes(DType t, int64_t cols);
void Avx512PackPanels(DType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                      uint8_t* out);
// The K-quants' part of the three above (cpu/matmul_kquant_avx512.cc).
MatMulKernel Avx512KQuantKernel(DType t);
size_t Avx512KQuantPanelBytes(DType t, int64_t cols);
void Avx512PackKQuantPanels(DType t, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                            uint8_t* out);
QuantizeActFn Avx2QuantizeAct();
QuantizeActFn Avx512QuantizeAct();
QuantizeActFn NeonQuantizeAct();  // every ARM64 level (needs no extension)

}  // namespace peng::kernels
