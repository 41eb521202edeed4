#include "kernels/ref/matmul_ref.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/half.h"

namespace peng::kernels::ref {
namespace {

inline float H(uint16_t h) { return F16ToF32(h); }

// Unpacked unsigned integer weights of one 32-value block: w = scale * q + offset * ... (see
// each type), q[i] in value order.
void Unpack4(const uint8_t* qs, int* q) {
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 0xF;
    q[i + 16] = qs[i] >> 4;
  }
}
void Unpack5(const uint8_t* qs, const uint8_t* qh, int* q) {
  Unpack4(qs, q);
  const uint32_t h = Load32(qh);
  for (int i = 0; i < 32; ++i) q[i] |= ((h >> i) & 1) << 4;
}
// Q4_K/Q5_K: q[256] in value order.
void UnpackQ45K(const uint8_t* qs, const uint8_t* qh, int* q) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = qs[32 * c + l] & 0xF;
      q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
  if (qh)
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
}
// Q6_K: q[256] in value order, 0..63 (the -32 offset is applied by the caller).
void UnpackQ6K(const BlockQ6_K& b, int* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int* o = q + 128 * h;
    for (int l = 0; l < 64; ++l) {
      o[l] = ql[l] & 0xF;
      o[64 + l] = ql[l] >> 4;
    }
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) o[32 * k + l] |= ((qh[l] >> (2 * k)) & 3) << 4;
  }
}

int Dot(const int* q, const int8_t* a, int n) {
  int s = 0;
  for (int i = 0; i < n; ++i) s += q[i] * a[i];
  return s;
}

}  // namespace

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  int q[kQKK];
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16: {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = t == DType::kF16 ? F16ToF32(h) : Bf16ToF32(h);
      }
      return;
    }
    case DType::kQ4_0:
      for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(p)[b];
        Unpack4(blk.qs, q);
        for (int i = 0; i < kQK; ++i) dst[i] = H(blk.d) * static_cast<float>(q[i] - 8);
      }
      return;
    case DType::kQ4_1:
      for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
        const auto& blk = reinterpret_cast<const BlockQ4_1*>(p)[b];
        Unpack4(blk.qs, q);
        for (int i = 0; i < kQK; ++i) dst[i] = H(blk.d) * static_cast<float>(q[i]) + H(blk.m);
      }
      return;
    case DType::kQ5_0:
      for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
        const auto& blk = reinterpret_cast<const BlockQ5_0*>(p)[b];
        Unpack5(blk.qs, blk.qh, q);
        for (int i = 0; i < kQK; ++i) dst[i] = H(blk.d) * static_cast<float>(q[i] - 16);
      }
      return;
    case DType::kQ5_1:
      for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
        const auto& blk = reinterpret_cast<const BlockQ5_1*>(p)[b];
        Unpack5(blk.qs, blk.qh, q);
        for (int i = 0; i < kQK; ++i) dst[i] = H(blk.d) * static_cast<float>(q[i]) + H(blk.m);
      }
      return;
    case DType::kQ8_0:
      for (int64_t b = 0; b < n / kQK; ++b, dst += kQK) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(p)[b];
        for (int i = 0; i < kQK; ++i) dst[i] = static_cast<float>(blk.qs[i]) * H(blk.d);
      }
      return;
    case DType::kQ4_K:
    case DType::kQ5_K:
      for (int64_t b = 0; b < n / kQKK; ++b, dst += kQKK) {
        const BlockQ4_K* b4 = reinterpret_cast<const BlockQ4_K*>(p) + b;
        const BlockQ5_K* b5 = reinterpret_cast<const BlockQ5_K*>(p) + b;
        const bool is5 = t == DType::kQ5_K;
        const uint16_t d16 = is5 ? b5->d : b4->d, dmin16 = is5 ? b5->dmin : b4->dmin;
        uint8_t sc[8], m[8];
        UnpackScalesK(is5 ? b5->scales : b4->scales, sc, m);
        UnpackQ45K(is5 ? b5->qs : b4->qs, is5 ? b5->qh : nullptr, q);
        for (int j = 0; j < 8; ++j) {
          const float ds = H(d16) * static_cast<float>(sc[j]);
          const float dm = H(dmin16) * static_cast<float>(m[j]);
          for (int l = 0; l < 32; ++l) dst[32 * j + l] = ds * static_cast<float>(q[32 * j + l]) - dm;
        }
      }
      return;
    case DType::kQ6_K:
      for (int64_t b = 0; b < n / kQKK; ++b, dst += kQKK) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(p)[b];
        UnpackQ6K(blk, q);
        for (int i = 0; i < 16; ++i) {
          const float ds = H(blk.d) * static_cast<float>(blk.scales[i]);
          for (int l = 0; l < 16; ++l) dst[16 * i + l] = ds * static_cast<float>(q[16 * i + l] - 32);
        }
      }
      return;
    default:
      PENG_CHECK_MSG(false, "DequantizeRow: unsupported type");
  }
}

void QuantizeAct(const float* x, int64_t n, int ab, int8_t* qs, float* d, int16_t* sums) {
  for (int64_t b = 0; b < n / ab; ++b) {
    float amax = 0.f;
    for (int i = 0; i < ab; ++i) amax = std::fmax(amax, std::fabs(x[b * ab + i]));
    float id;
    ActBlockScale(amax, ab, &d[b], &id);
    for (int i = 0; i < ab; ++i) {
      float v = std::nearbyint(x[b * ab + i] * id);
      v = std::fmin(127.f, std::fmax(-127.f, v));
      qs[b * ab + i] = static_cast<int8_t>(v);
    }
  }
  for (int64_t g = 0; g < n / 16; ++g) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += qs[16 * g + i];
    sums[g] = static_cast<int16_t>(s);
  }
}

float VecDotQ(DType t, int64_t n, const void* w, const int8_t* qs, const float* d,
              const int16_t* sums) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  int q[kQKK];
  float acc = 0.f;
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
      for (int64_t b = 0; b < n / kQK; ++b) {
        const int8_t* a = qs + b * kQK;
        float dw;
        if (t == DType::kQ4_0) {
          const auto& blk = reinterpret_cast<const BlockQ4_0*>(p)[b];
          Unpack4(blk.qs, q);
          for (int i = 0; i < kQK; ++i) q[i] -= 8;
          dw = H(blk.d);
        } else if (t == DType::kQ5_0) {
          const auto& blk = reinterpret_cast<const BlockQ5_0*>(p)[b];
          Unpack5(blk.qs, blk.qh, q);
          for (int i = 0; i < kQK; ++i) q[i] -= 16;
          dw = H(blk.d);
        } else {
          const auto& blk = reinterpret_cast<const BlockQ8_0*>(p)[b];
          for (int i = 0; i < kQK; ++i) q[i] = blk.qs[i];
          dw = H(blk.d);
        }
        acc += dw * d[b] * static_cast<float>(Dot(q, a, kQK));
      }
      return acc;
    case DType::kQ4_1:
    case DType::kQ5_1:
      for (int64_t b = 0; b < n / kQK; ++b) {
        float dw, mw;
        if (t == DType::kQ4_1) {
          const auto& blk = reinterpret_cast<const BlockQ4_1*>(p)[b];
          Unpack4(blk.qs, q);
          dw = H(blk.d);
          mw = H(blk.m);
        } else {
          const auto& blk = reinterpret_cast<const BlockQ5_1*>(p)[b];
          Unpack5(blk.qs, blk.qh, q);
          dw = H(blk.d);
          mw = H(blk.m);
        }
        const int asum = sums[2 * b] + sums[2 * b + 1];
        acc += dw * d[b] * static_cast<float>(Dot(q, qs + b * kQK, kQK)) +
               mw * d[b] * static_cast<float>(asum);
      }
      return acc;
    case DType::kQ4_K:
    case DType::kQ5_K:
      for (int64_t b = 0; b < n / kQKK; ++b) {
        const BlockQ4_K* b4 = reinterpret_cast<const BlockQ4_K*>(p) + b;
        const BlockQ5_K* b5 = reinterpret_cast<const BlockQ5_K*>(p) + b;
        const bool is5 = t == DType::kQ5_K;
        uint8_t sc[8], m[8];
        UnpackScalesK(is5 ? b5->scales : b4->scales, sc, m);
        UnpackQ45K(is5 ? b5->qs : b4->qs, is5 ? b5->qh : nullptr, q);
        const int8_t* a = qs + b * kQKK;
        const int16_t* s = sums + b * 16;
        int isc = 0, imin = 0;
        for (int j = 0; j < 8; ++j) {
          isc += sc[j] * Dot(q + 32 * j, a + 32 * j, 32);
          imin += m[j] * (s[2 * j] + s[2 * j + 1]);
        }
        const float dw = H(is5 ? b5->d : b4->d), dmin = H(is5 ? b5->dmin : b4->dmin);
        acc += d[b] * (dw * static_cast<float>(isc) - dmin * static_cast<float>(imin));
      }
      return acc;
    case DType::kQ6_K:
      for (int64_t b = 0; b < n / kQKK; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(p)[b];
        UnpackQ6K(blk, q);
        const int8_t* a = qs + b * kQKK;
        int isum = 0;
        for (int i = 0; i < 16; ++i) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += (q[16 * i + l] - 32) * a[16 * i + l];
          isum += blk.scales[i] * s;
        }
        acc += d[b] * H(blk.d) * static_cast<float>(isum);
      }
      return acc;
    default:
      PENG_CHECK_MSG(false, "VecDotQ: unsupported type");
  }
  return 0.f;
}

float VecDotF(DType t, int64_t n, const void* w, const float* x) {
  float acc = 0.f;
  if (t == DType::kF32) {
    const float* wf = static_cast<const float*>(w);
    for (int64_t i = 0; i < n; ++i) acc += wf[i] * x[i];
    return acc;
  }
  const uint16_t* wh = static_cast<const uint16_t*>(w);
  for (int64_t i = 0; i < n; ++i)
    acc += (t == DType::kF16 ? F16ToF32(wh[i]) : Bf16ToF32(wh[i])) * x[i];
  return acc;
}

}  // namespace peng::kernels::ref

namespace peng::kernels {
namespace {

template <bool kQuant>
void RefKernel(const MatMulArgs& g, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = g.w + r * g.row_bytes;
    for (int64_t t = 0; t < g.n_tokens; ++t) {
      g.y[t * g.ldy + r] =
          kQuant ? ref::VecDotQ(g.type, g.cols, w, g.a.qs + t * g.a.qs_stride,
                                g.a.d + t * g.a.d_stride, g.a.sums + t * g.a.sums_stride)
                 : ref::VecDotF(g.type, g.cols, w, g.x + t * g.cols);
    }
  }
}

}  // namespace

MatMulKernel RefMatMulKernel(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return &RefKernel<false>;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ8_0:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return &RefKernel<true>;
    default:
      return nullptr;
  }
}

}  // namespace peng::kernels
