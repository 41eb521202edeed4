// The CUDA backend's weight layout and its decoding, written once for the GPU and the host so
// that a CPU test (tests/device/weight_layout_test.cc) checks every function here against the
// CPU reference (kernels::ref::DequantizeRow, kernels::ref::VecDotQ).
//
// Layout. Upload repacks the 32-value block formats row by row so that a warp whose lanes take
// consecutive units (32 values) reads consecutive 16-byte pieces: the GGUF blocks (18, 20, 22,
// 24 or 34 bytes) become arrays of the same fields, one entry a unit (n units a row):
//   Q4_0  d u16 [n]              | pad to 16 | qs 16 B [n]
//   Q4_1  d, m u16 u16 [n]       | pad       | qs 16 B [n]
//   Q5_0  qh u32 [n], d u16 [n]  | pad       | qs 16 B [n]
//   Q5_1  qh u32 [n], d, m [n]   | pad       | qs 16 B [n]
//   Q8_0  d u16 [n]              | pad       | qs 32 B [n]
//   Q6_K  (210-byte super-blocks, 2-byte aligned) ql, qh, scales 208 B [ns] | d u16 [ns]
// and each row padded to a multiple of 16 bytes. Q4_K / Q5_K (144 / 176 bytes, 16-byte aligned)
// and the float and INT8 types keep the file's layout. The bytes of a unit are the file's bytes
// (the same nibble order); only where they sit changes.
//
// Arithmetic of the quantized GEMVs: activations quantized exactly as the CPU kernels quantize
// them (kernels/quant_blocks.h: int8 values, one scale per 32 values for the 32-value formats
// and per 256 for the K-quants, sums of every 16), so the integer parts of the dot products
// agree bit for bit with the CPU path; only the order of the FP32 sums differs. A unit decodes
// into eight 32-bit words of four quant bytes (values 0-15 in words 0-3, 16-31 in words 4-7,
// every byte in [-128, 127]) and the numbers that turn its two 16-value dots into its part:
//   isum = sc0 * (dot(words 0-3) + off * s0) + sc1 * (dot(words 4-7) + off * s1)
//   unit . a = ad * dw * isum + ad * mw * (s0 + s1)
// with ad the activation block's scale and s0 / s1 its sums over values 0-15 / 16-31.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/quant_blocks.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
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

namespace peng::backend::layout {

// ------------------------------------------------------------------------------------------
// Loads (little-endian; p aligned to the type's size on the device).

// Called, where set, with the address of a load that is not aligned to its size: the CUDA
// emulator's check (a GPU faults there, cudaErrorMisalignedAddress). Null elsewhere.
extern void (*misaligned_load_hook)(const void* p, int bytes);
// The host twins' side of that check (a load of `bytes` at p).
inline void CheckAligned(const uint8_t* p, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0 && misaligned_load_hook) [[unlikely]]
    misaligned_load_hook(p, bytes);
}

template <typename U>
PENG_HD U LoadAs(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const U*>(p);
#else
  CheckAligned(p, sizeof(U));
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
#endif
}
PENG_HD uint32_t Load4(const uint8_t* p) { return LoadAs<uint32_t>(p); }
PENG_HD uint16_t Load2(const uint8_t* p) { return LoadAs<uint16_t>(p); }
// 16 bytes at p (16-byte aligned) as four words.
PENG_HD void Load16(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint4 v = LoadAs<uint4>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
#else
  CheckAligned(p, 16);
  std::memcpy(w, p, 16);
#endif
}

PENG_HD float HalfBits(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return F16ToF32(h);
#endif
}
PENG_HD float Bf16Bits(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(uint32_t{h} << 16);
#else
  return Bf16ToF32(h);
#endif
}
// v rounded to the nearest BF16 (ties to even), as its bits.
PENG_HD uint16_t Bf16FromFloat(float v) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  return F32ToBf16(v);
#endif
}

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

// ------------------------------------------------------------------------------------------
// The layout.

PENG_HD constexpr int64_t Align16(int64_t b) { return (b + 15) / 16 * 16; }

template <DType T>
constexpr bool kQuantized = T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                            T == DType::kQ5_1 || T == DType::kQ8_0 || T == DType::kQ4_K ||
                            T == DType::kQ5_K || T == DType::kQ6_K;
// The types of the integer GEMV (DecodeUnit, UnitDot): the block formats and INT8 (W8A8; its
// row scale is the GEMV's, applied to the finished dot product).
template <DType T>
constexpr bool kIntDot = kQuantized<T> || T == DType::kI8;
// The 32-value block formats Upload rearranges into per-field arrays.
template <DType T>
constexpr bool kFieldArrays = T == DType::kQ4_0 || T == DType::kQ4_1 || T == DType::kQ5_0 ||
                              T == DType::kQ5_1 || T == DType::kQ8_0;
// Per unit: bytes of the fields before qs (qh first where there is one), and of qs.
template <DType T>
constexpr int kHeadBytes = T == DType::kQ4_0 || T == DType::kQ8_0 ? 2
                           : T == DType::kQ4_1 ? 4
                           : T == DType::kQ5_0 ? 6
                                               : 8;
template <DType T>
constexpr int kQsBytes = T == DType::kQ8_0 ? 32 : 16;
template <DType T>
constexpr int kActBlock = T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K
                              ? kernels::kQKK
                              : kernels::kQK;
constexpr int kQ6Body = 208;  // a Q6_K super-block without its d

// Where the qs array of a row of n units starts.
template <DType T>
PENG_HD int64_t QsOffset(int64_t n) {
  return Align16(kHeadBytes<T> * n);
}

// Whether rows of type t are rearranged for the device (RepackRow) rather than copied as
// stored. (Not the same as a change of size: a Q4_0 row of a multiple of 256 values keeps its
// byte count.)
bool Repacked(DType t);
// Bytes of one row of `cols` values in device memory (the row stride).
size_t DeviceRowBytes(DType t, int64_t cols);
// Writes one row of `cols` values from the file's layout (src) into the device's (dst,
// DeviceRowBytes(t, cols) bytes, the padding zeroed).
void RepackRow(DType t, const uint8_t* src, int64_t cols, uint8_t* dst);

// ------------------------------------------------------------------------------------------
// Decoding. `row` is a row in the device layout, n its units (cols / 32).

// Value l (0..31) of unit u, in FP32 (the float kernels: exact mode, the FP16 copies of
// prefill, embeddings).
template <DType T>
PENG_HD float DecodeValue(const uint8_t* row, int64_t n, int64_t u, int l) {
  using namespace kernels;
  if constexpr (T == DType::kF32) {
    return reinterpret_cast<const float*>(row)[u * 32 + l];
  } else if constexpr (T == DType::kF16 || T == DType::kBF16) {
    const uint16_t v = Load2(row + 2 * (u * 32 + l));
    return T == DType::kF16 ? HalfBits(v) : Bf16Bits(v);
  } else if constexpr (T == DType::kI8) {
    return static_cast<float>(reinterpret_cast<const int8_t*>(row)[u * 32 + l]);
  } else if constexpr (T == DType::kQ8_0) {
    const int8_t q = static_cast<int8_t>(row[QsOffset<T>(n) + 32 * u + l]);
    return static_cast<float>(q) * HalfBits(Load2(row + 2 * u));
  } else if constexpr (kFieldArrays<T>) {
    constexpr bool kFive = T == DType::kQ5_0 || T == DType::kQ5_1;
    constexpr bool kMin = T == DType::kQ4_1 || T == DType::kQ5_1;
    constexpr int kOff = kMin ? 0 : kFive ? 16 : 8;
    const uint8_t* head = row + (kFive ? 4 * n : 0) + (kMin ? 4 : 2) * u;  // d (, m)
    const uint8_t byte = row[QsOffset<T>(n) + 16 * u + (l & 15)];
    int q = l < 16 ? (byte & 0xF) : (byte >> 4);
    if constexpr (kFive) q |= ((Load4(row + 4 * u) >> l) & 1) << 4;
    float m = 0.f;
    if constexpr (kMin) m = HalfBits(Load2(head + 2));
    return HalfBits(Load2(head)) * static_cast<float>(q - kOff) + m;
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    using B = std::conditional_t<T == DType::kQ4_K, BlockQ4_K, BlockQ5_K>;
    const uint8_t* b = row + (u / 8) * sizeof(B);
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
    const float ds = HalfBits(Load2(b)) * static_cast<float>(sc);
    const float dm = HalfBits(Load2(b + 2)) * static_cast<float>(m);
    const uint8_t byte = b[(T == DType::kQ5_K ? 48 : 16) + 32 * (j / 2) + l];
    int q = (j % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    if constexpr (T == DType::kQ5_K) q |= ((b[16 + l] >> j) & 1) << 4;
    return ds * static_cast<float>(q) - dm;
  } else {
    static_assert(T == DType::kQ6_K);
    const uint8_t* b = row + (u / 8) * kQ6Body;
    const int k = static_cast<int>(u % 8), h = k / 4, kk = k % 4;
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    const int v = 32 * kk + l;
    int q = v < 64 ? (ql[v] & 0xF) : (ql[v - 64] >> 4);
    q |= ((qh[l] >> (2 * kk)) & 3) << 4;
    const int8_t sc = static_cast<int8_t>(b[192 + (128 * h + v) / 16]);
    const float d = HalfBits(Load2(row + (n / 8) * kQ6Body + 2 * (u / 8)));
    return d * static_cast<float>(sc) * static_cast<float>(q - 32);
  }
}

// Bits 0-3 of b moved to bit 4 of bytes 0-3 (the fifth bit of four Q5 values).
PENG_HD uint32_t FifthBits(uint32_t b) {
  return ((b & 1u) | (b & 2u) << 7 | (b & 4u) << 14 | (b & 8u) << 21) << 4;
}

// A unit's numbers (the formula above): its sub-blocks' scales, the weight scale and the
// minimum term's; off is its type's (kUnitOff).
struct UnitScale {
  int sc0 = 1, sc1 = 1;
  float dw = 0.f, mw = 0.f;
};
struct Unit {
  uint32_t q[8];
  UnitScale s;
};
template <DType T>
constexpr int kUnitOff = T == DType::kQ4_0   ? -8
                         : T == DType::kQ5_0 ? -16
                         : T == DType::kQ6_K ? -32
                                             : 0;

// Unit u for the integer dot products.
template <DType T>
PENG_HD Unit DecodeUnit(const uint8_t* row, int64_t n, int64_t u) {
  using namespace kernels;
  Unit w;
  if constexpr (T == DType::kI8) {  // 32 bytes a unit, the scale the row's (dw 1)
    w.s.dw = 1.f;
    Load16(row + 32 * u, w.q);
    Load16(row + 32 * u + 16, w.q + 4);
  } else if constexpr (T == DType::kQ8_0) {
    w.s.dw = HalfBits(Load2(row + 2 * u));
    Load16(row + QsOffset<T>(n) + 32 * u, w.q);
    Load16(row + QsOffset<T>(n) + 32 * u + 16, w.q + 4);
  } else if constexpr (kFieldArrays<T>) {
    constexpr bool kMin = T == DType::kQ4_1 || T == DType::kQ5_1;
    constexpr bool kFive = T == DType::kQ5_0 || T == DType::kQ5_1;
    const uint8_t* head = row + (kFive ? 4 * n : 0) + (kMin ? 4 : 2) * u;
    w.s.dw = HalfBits(Load2(head));
    if constexpr (kMin) w.s.mw = HalfBits(Load2(head + 2));
    uint32_t v[4];
    Load16(row + QsOffset<T>(n) + 16 * u, v);
    const uint32_t qh = kFive ? Load4(row + 4 * u) : 0;
    PENG_UNROLL
    for (int i = 0; i < 4; ++i) {
      w.q[i] = v[i] & 0x0F0F0F0Fu;
      w.q[i + 4] = (v[i] >> 4) & 0x0F0F0F0Fu;
      if constexpr (kFive) {
        w.q[i] |= FifthBits(qh >> (4 * i));
        w.q[i + 4] |= FifthBits(qh >> (16 + 4 * i));
      }
    }
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    constexpr bool kFive = T == DType::kQ5_K;
    constexpr int kSize = kFive ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
    const uint8_t* b = row + (u / 8) * kSize;
    const int j = static_cast<int>(u % 8);
    uint32_t head[4];  // d, dmin, then the 12-byte scales as three words
    Load16(b, head);
    // The 8 scales and mins a byte each (kernels::UnpackScalesK64), then sub-block j's.
    const uint32_t sc_hi = (head[3] & 0x0F0F0F0Fu) | ((head[1] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((head[3] >> 4) & 0x0F0F0F0Fu) | ((head[2] >> 2) & 0x30303030u);
    const uint64_t sc8 = (head[1] & 0x3F3F3F3Fu) | uint64_t{sc_hi} << 32;
    const uint64_t m8 = (head[2] & 0x3F3F3F3Fu) | uint64_t{m_hi} << 32;
    const int sc = static_cast<int>((sc8 >> (8 * j)) & 0xFF);
    const int m = static_cast<int>((m8 >> (8 * j)) & 0xFF);
    w.s.sc0 = w.s.sc1 = sc;
    w.s.dw = HalfBits(static_cast<uint16_t>(head[0]));
    w.s.mw = -HalfBits(static_cast<uint16_t>(head[0] >> 16)) * static_cast<float>(m);
    const uint8_t* qs = b + (kFive ? 48 : 16) + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    uint32_t v[8];
    Load16(qs, v);
    Load16(qs + 16, v + 4);
    uint32_t hv[8] = {};
    if constexpr (kFive) {
      Load16(b + 16, hv);
      Load16(b + 32, hv + 4);
    }
    PENG_UNROLL
    for (int i = 0; i < 8; ++i) {
      w.q[i] = (v[i] >> shift) & 0x0F0F0F0Fu;
      if constexpr (kFive) w.q[i] |= ((hv[i] >> j) & 0x01010101u) << 4;
    }
  } else {
    static_assert(T == DType::kQ6_K);
    const uint8_t* b = row + (u / 8) * kQ6Body;
    const int k = static_cast<int>(u % 8), h = k / 4, kk = k % 4;
    uint32_t lo[8], hi[8];
    Load16(b + 64 * h + 32 * (kk & 1), lo);
    Load16(b + 64 * h + 32 * (kk & 1) + 16, lo + 4);
    Load16(b + 128 + 32 * h, hi);
    Load16(b + 128 + 32 * h + 16, hi + 4);
    const int lo_shift = 4 * (kk >> 1), hi_shift = 2 * kk;
    PENG_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] = ((lo[i] >> lo_shift) & 0x0F0F0F0Fu) | (((hi[i] >> hi_shift) & 0x03030303u) << 4);
    const uint16_t sc = Load2(b + 192 + 8 * h + 2 * kk);
    w.s.sc0 = static_cast<int8_t>(sc & 0xFF);
    w.s.sc1 = static_cast<int8_t>(sc >> 8);
    w.s.dw = HalfBits(Load2(row + (n / 8) * kQ6Body + 2 * (u / 8)));
  }
  return w;
}

// Formats with a minimum term (mw); the others skip it (x * 0 is not foldable in IEEE).
template <DType T>
constexpr bool kHasMin = T == DType::kQ4_1 || T == DType::kQ5_1 || T == DType::kQ4_K ||
                         T == DType::kQ5_K;
// Formats whose units carry sub-block scales (sc0 for values 0-15, sc1 for 16-31: the
// K-quants); the others' are 1.
template <DType T>
constexpr bool kSubScales = T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K;

// The dot of a unit of type T whose numbers are w with 32 activation values, from the integer
// dots of its two halves with them, lo (values 0-15) and hi (16-31), wherever those were
// summed (UnitDot's dp4a, the tensor cores' tiles); ad is the activations' block scale, s0 / s1
// their sums over values 0-15 / 16-31. Only the numbers T has are read (the others are
// constants to the compiler).
template <DType T>
PENG_HD float HalvesDot(const UnitScale& w, int lo, int hi, float ad, int s0, int s1) {
  constexpr int off = kUnitOff<T>;
  const int sc0 = kSubScales<T> ? w.sc0 : 1, sc1 = kSubScales<T> ? w.sc1 : 1;
  const int isum = sc0 * (lo + off * s0) + sc1 * (hi + off * s1);
  const float dot = ad * w.dw * static_cast<float>(isum);
  if constexpr (kHasMin<T>) return dot + ad * w.mw * static_cast<float>(s0 + s1);
  return dot;
}
// The same with 32 activation values a (eight words), the halves' dots by dp4a.
template <DType T>
PENG_HD float UnitDot(const Unit& w, const uint32_t* a, float ad, int s0, int s1) {
  int lo = 0, hi = 0;
  PENG_UNROLL
  for (int i = 0; i < 4; ++i) {
    lo = Dp4a(w.q[i], a[i], lo);
    hi = Dp4a(w.q[i + 4], a[i + 4], hi);
  }
  return HalvesDot<T>(w.s, lo, hi, ad, s0, s1);
}

// ------------------------------------------------------------------------------------------
// The activations (the CUDA quantizer, kernels.cuh QuantizeValue, and the GEMVs' reads).

// A block of AB (32 or 256) activation values whose largest magnitude is amax: the factor its
// values are quantized with and the scale kept (kernels::ActBlockScale's arithmetic: amax / 127
// rounded to fp16 for 32-value blocks, 1 / iscale for 256).
struct ActScale {
  float iscale, d;
};
template <int AB>
PENG_HD ActScale ActBlockScale(float amax) {
  static_assert(AB == kernels::kQK || AB == kernels::kQKK);
  ActScale a;
  a.iscale = amax != 0.f ? 127.f / amax : 0.f;
  if constexpr (AB == kernels::kQKK) {
    a.d = amax != 0.f ? 1.f / a.iscale : 0.f;
  } else {
#if defined(__CUDA_ARCH__)
    a.d = __half2float(__float2half_rn(amax / 127.f));
#else
    a.d = F16ToF32(F32ToF16(amax / 127.f));
#endif
  }
  return a;
}
// Value v of the block: round-half-even(v * iscale) within [-127, 127].
PENG_HD int8_t QuantizeActValue(float v, float iscale) {
#if defined(__CUDA_ARCH__)
  const float r = rintf(v * iscale);
#else
  const float r = std::nearbyint(v * iscale);
#endif
  return static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, r)));
}

// INT8 W8A8's activation groups of 32 (kernels::QuantizeActivations): the scale amax / 127 in
// FP32, each value divided by it and rounded to nearest even, clamped to +-127; a group of zeros
// (scale 0) quantizes to zeros.
PENG_HD ActScale W8A8ActScale(float amax) { return {0.f, amax / 127.f}; }
PENG_HD int8_t QuantizeW8A8Value(float v, float d) {
  if (d == 0.f) return 0;
#if defined(__CUDA_ARCH__)
  const float r = rintf(v / d);
#else
  const float r = std::nearbyint(v / d);
#endif
  return static_cast<int8_t>(fminf(127.f, fmaxf(-127.f, r)));
}

// Where value i of a quantized activation row of cols values sits: the first 16 values of
// every unit in the row's first half, unit after unit, the last 16 in its second half, so
// that lanes taking consecutive units read consecutive 16-byte pieces (ActWords).
PENG_HD int64_t ActIndex(int64_t i, int64_t cols) {
  return (i % 32 < 16 ? 0 : cols / 2) + i / 32 * 16 + i % 16;
}
// The 32 values of unit u of such a row (16-byte aligned) as eight words, values 0-15 first.
PENG_HD void ActWords(const int8_t* row, int64_t cols, int64_t u, uint32_t* words) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(row) + u * 16;
  Load16(p, words);
  Load16(p + cols / 2, words + 4);
}

}  // namespace peng::backend::layout
