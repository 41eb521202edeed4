// Integer dot products of one 32-value unit of a block-quantized weight row with the same 32
// values of a quantized activation row: the arithmetic of the CUDA backend's quantized GEMVs
// (kernels.cuh, QGemvKernel), written once for the GPU (dp4a) and the host, so that a CPU test
// (tests/device/qdot_test.cc) checks it against the CPU reference (kernels::ref::VecDotQ).
//
// The activations are quantized exactly as the CPU kernels quantize them (kernels/quant_blocks.h:
// int8 values, one scale per 32 values for the 32-value weight types and per 256 for the
// K-quants, sums of every 16 values), so the integer parts agree bit for bit with the CPU path;
// only the order of the FP32 sums differs.
//
// A unit decodes into eight 32-bit words of four quant bytes each (values 0-15 in words 0-3,
// values 16-31 in words 4-7, every byte in [-128, 127]) and the integers and floats that turn
// the two 16-value dots into the unit's contribution:
//   isum = sc0 * (dot(words 0-3) + off * s0) + sc1 * (dot(words 4-7) + off * s1)
//   unit . a = ad * dw * isum + ad * mw * (s0 + s1)
// where ad is the activation block's scale and s0 / s1 its sums of values 0-15 / 16-31.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/quant_blocks.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define PENG_HD __host__ __device__ __forceinline__
#else
#define PENG_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define PENG_UNROLL _Pragma("unroll")
#else
#define PENG_UNROLL
#endif

namespace peng::backend::qdot {

// c + the dot product of the four signed bytes of a and b.
PENG_HD int Dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i));
  return c;
#endif
}

PENG_HD float HalfBits(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return F16ToF32(h);
#endif
}

// Little-endian loads from an address aligned to A bytes (2 or 4; the GGUF block layouts only
// promise 2 for Q4_0, Q5_0, Q8_0 and Q6_K).
template <int A>
PENG_HD uint32_t Load4(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (A >= 4) {
    return *reinterpret_cast<const uint32_t*>(p);
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t{h[0]} | uint32_t{h[1]} << 16;
  }
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
PENG_HD uint16_t Load2(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

// Bits 0-3 of b moved to bit 4 of bytes 0-3 (the fifth bit of four Q5 values).
PENG_HD uint32_t FifthBits(uint32_t b) {
  return ((b & 1u) | (b & 2u) << 7 | (b & 4u) << 14 | (b & 8u) << 21) << 4;
}

struct Unit {
  uint32_t q[8];
  int sc0 = 1, sc1 = 1, off = 0;
  float dw = 0.f, mw = 0.f;
};

// Weight types the quantized GEMV covers (every block-quantized type MatMul supports).
template <DType T>
constexpr bool kQuantized = T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                            T == DType::kQ5_1 || T == DType::kQ8_0 || T == DType::kQ4_K ||
                            T == DType::kQ5_K || T == DType::kQ6_K;
template <DType T>
constexpr int kActBlock = T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K
                              ? kernels::kQKK
                              : kernels::kQK;

// Unit u (values 32u .. 32u + 31) of a weight row.
template <DType T>
PENG_HD Unit DecodeUnit(const uint8_t* row, int64_t u) {
  using namespace kernels;
  Unit w;
  if constexpr (T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                T == DType::kQ5_1) {
    constexpr bool kMin = T == DType::kQ4_1 || T == DType::kQ5_1;
    constexpr bool kFive = T == DType::kQ5_0 || T == DType::kQ5_1;
    constexpr int kSize = T == DType::kQ4_0   ? sizeof(BlockQ4_0)
                          : T == DType::kQ4_1 ? sizeof(BlockQ4_1)
                          : T == DType::kQ5_0 ? sizeof(BlockQ5_0)
                                              : sizeof(BlockQ5_1);
    constexpr int kAlign = kSize % 4 == 0 ? 4 : 2;
    constexpr int kQs = (kMin ? 4 : 2) + (kFive ? 4 : 0);  // offset of qs in the block
    const uint8_t* b = row + u * kSize;
    w.dw = HalfBits(Load2(b));
    if constexpr (kMin) w.mw = HalfBits(Load2(b + 2));
    uint32_t qh = 0;
    if constexpr (kFive) qh = Load4<kAlign>(b + (kMin ? 4 : 2));
PENG_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = Load4<kAlign>(b + kQs + 4 * i);
      w.q[i] = v & 0x0F0F0F0Fu;
      w.q[i + 4] = (v >> 4) & 0x0F0F0F0Fu;
      if constexpr (kFive) {
        w.q[i] |= FifthBits(qh >> (4 * i));
        w.q[i + 4] |= FifthBits(qh >> (16 + 4 * i));
      }
    }
    w.off = kMin ? 0 : kFive ? -16 : -8;
  } else if constexpr (T == DType::kQ8_0) {
    const uint8_t* b = row + u * sizeof(BlockQ8_0);
    w.dw = HalfBits(Load2(b));
PENG_UNROLL
    for (int i = 0; i < 8; ++i) w.q[i] = Load4<2>(b + 2 + 4 * i);
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    constexpr bool kFive = T == DType::kQ5_K;
    constexpr int kSize = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    const uint8_t* b = row + (u / 8) * kSize;
    const int j = static_cast<int>(u % 8);
    const uint8_t* s = b + 4;  // the 12-byte scales
    int sc, m;
    if (j < 4) {
      sc = s[j] & 63;
      m = s[j + 4] & 63;
    } else {
      sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
      m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    w.sc0 = w.sc1 = sc;
    w.dw = HalfBits(Load2(b));
    w.mw = -HalfBits(Load2(b + 2)) * static_cast<float>(m);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (j / 2);
    const int shift = 4 * (j % 2);
PENG_UNROLL
    for (int i = 0; i < 8; ++i) {
      w.q[i] = (Load4<4>(qs + 4 * i) >> shift) & 0x0F0F0F0Fu;
      if constexpr (kFive) w.q[i] |= ((Load4<4>(qh + 4 * i) >> j) & 0x01010101u) << 4;
    }
  } else {
    static_assert(T == DType::kQ6_K);
    const uint8_t* b = row + (u / 8) * sizeof(BlockQ6_K);
    const int k = static_cast<int>(u % 8), h = k / 4, kk = k % 4;
    const uint8_t* ql = b + 64 * h + 32 * (kk & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const int lo_shift = 4 * (kk >> 1), hi_shift = 2 * kk;
PENG_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] = ((Load4<2>(ql + 4 * i) >> lo_shift) & 0x0F0F0F0Fu) |
               (((Load4<2>(qh + 4 * i) >> hi_shift) & 0x03030303u) << 4);
    w.sc0 = scales[8 * h + 2 * kk];
    w.sc1 = scales[8 * h + 2 * kk + 1];
    w.off = -32;
    w.dw = HalfBits(Load2(b + 208));
  }
  return w;
}

// The unit's dot with 32 activation values a (eight words), their block scale ad and their
// sums s0 (values 0-15) and s1 (16-31).
PENG_HD float UnitDot(const Unit& w, const uint32_t* a, float ad, int s0, int s1) {
  int lo = 0, hi = 0;
PENG_UNROLL
  for (int i = 0; i < 4; ++i) {
    lo = Dp4a(w.q[i], a[i], lo);
    hi = Dp4a(w.q[i + 4], a[i + 4], hi);
  }
  const int isum = w.sc0 * (lo + w.off * s0) + w.sc1 * (hi + w.off * s1);
  return ad * w.dw * static_cast<float>(isum) + ad * w.mw * static_cast<float>(s0 + s1);
}

}  // namespace peng::backend::qdot
