// ARM64 NEON versions of the element-wise ops and attention inner loops (4 floats per vector;
// tails are padded into a small buffer so every element goes through the same formula).
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attn_tile.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels::neon {
namespace {

constexpr int kW = 4;

// exp(x), same scheme as the x86 versions: Cody-Waite reduction, degree-7 Taylor polynomial,
// 2^n applied as two factors.
inline float32x4_t Exp(float32x4_t x) {
  x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(89.f)), vdupq_n_f32(-105.f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.428606820309417232e-6f));
  float32x4_t p = vdupq_n_f32(1.f / 5040.f);
  p = vfmaq_f32(vdupq_n_f32(1.f / 720.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 120.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 24.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 6.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  const int32x4_t ni = vcvtq_s32_f32(n);
  const int32x4_t n1 = vshrq_n_s32(ni, 1);
  const int32x4_t n2 = vsubq_s32(ni, n1);
  const int32x4_t bias = vdupq_n_s32(127);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
  return vmulq_f32(vmulq_f32(p, s1), s2);
}

inline float32x4_t Silu(float32x4_t z) {
  const float32x4_t e = Exp(vnegq_f32(z));
  return vdivq_f32(z, vaddq_f32(vdupq_n_f32(1.f), e));
}

inline float32x4_t GeluTanh(float32x4_t z) {
  const float32x4_t z3 = vmulq_f32(vmulq_f32(z, z), z);
  const float32x4_t inner = vaddq_f32(z, vmulq_f32(vdupq_n_f32(0.044715f), z3));
  const float32x4_t u = vmulq_f32(vdupq_n_f32(0.7978845608028654f), inner);
  const float32x4_t e = Exp(vmulq_f32(vdupq_n_f32(-2.f), u));
  return vdivq_f32(z, vaddq_f32(vdupq_n_f32(1.f), e));
}

inline float32x4_t LoadF16(const uint16_t* p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

// The first `rem` (< 4) values at p, zero-padded.
inline float32x4_t LoadTail(const float* p, int64_t rem) {
  float buf[kW] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t i = 0; i < rem; ++i) buf[i] = p[i];
  return vld1q_f32(buf);
}
inline float32x4_t LoadF16Tail(const uint16_t* p, int64_t rem) {
  uint16_t buf[kW] = {0, 0, 0, 0};
  for (int64_t i = 0; i < rem; ++i) buf[i] = p[i];
  return LoadF16(buf);
}
inline void StoreTail(float* p, float32x4_t v, int64_t rem) {
  float buf[kW];
  vst1q_f32(buf, v);
  for (int64_t i = 0; i < rem; ++i) p[i] = buf[i];
}

// The 16 lanes of a query tile (cpu/attn_tile.h): four vectors.
struct Lanes {
  static constexpr int kAcc = 4;
  float32x4_t v[4];
  template <typename F>
  static Lanes Map(F f) {
    return {{f(0), f(1), f(2), f(3)}};
  }
  static Lanes Zero() { return Set(0.f); }
  static Lanes Set(float x) { return Map([&](int) { return vdupq_n_f32(x); }); }
  static Lanes Load(const float* p) { return Map([&](int i) { return vld1q_f32(p + i * kW); }); }
  static void Store(float* p, Lanes a) {
    for (int i = 0; i < 4; ++i) vst1q_f32(p + i * kW, a.v[i]);
  }
  static Lanes Max(Lanes a, Lanes b) {
    return Map([&](int i) { return vmaxq_f32(a.v[i], b.v[i]); });
  }
  static Lanes Sub(Lanes a, Lanes b) {
    return Map([&](int i) { return vsubq_f32(a.v[i], b.v[i]); });
  }
  static Lanes Mul(Lanes a, Lanes b) {
    return Map([&](int i) { return vmulq_f32(a.v[i], b.v[i]); });
  }
  static Lanes Add(Lanes a, Lanes b) {
    return Map([&](int i) { return vaddq_f32(a.v[i], b.v[i]); });
  }
  static Lanes FmaScalar(float s, Lanes a, Lanes acc) {
    return Map([&](int i) { return vfmaq_n_f32(acc.v[i], a.v[i], s); });
  }
  static Lanes Exp(Lanes a) { return Map([&](int i) { return neon::Exp(a.v[i]); }); }
  static Lanes ZeroWhereNegInf(Lanes key, Lanes x) {
    const float32x4_t ninf = vdupq_n_f32(-__builtin_inff());
    return Map([&](int i) {
      return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(x.v[i]),
                                             vceqq_f32(key.v[i], ninf)));
    });
  }
};

template <typename Op>
inline void Binary(const float* a, const float* b, float* out, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vst1q_f32(out + i, op(vld1q_f32(a + i), vld1q_f32(b + i)));
  if (i < n) StoreTail(out + i, op(LoadTail(a + i, n - i), LoadTail(b + i, n - i)), n - i);
}

}  // namespace

void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps) {
  const float32x4_t off = vdupq_n_f32(w_offset);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float32x4_t a0 = vdupq_n_f32(0.f), a1 = vdupq_n_f32(0.f);
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      const float32x4_t v0 = vld1q_f32(xr + i), v1 = vld1q_f32(xr + i + kW);
      a0 = vfmaq_f32(a0, v0, v0);
      a1 = vfmaq_f32(a1, v1, v1);
    }
    for (; i + kW <= n; i += kW) {
      const float32x4_t v = vld1q_f32(xr + i);
      a0 = vfmaq_f32(a0, v, v);
    }
    if (i < n) {
      const float32x4_t v = LoadTail(xr + i, n - i);
      a1 = vfmaq_f32(a1, v, v);
    }
    const float mean = vaddvq_f32(vaddq_f32(a0, a1)) / static_cast<float>(n);
    const float s = 1.0f / vgetq_lane_f32(vsqrtq_f32(vdupq_n_f32(mean + eps)), 0);
    const float32x4_t vs = vdupq_n_f32(s);
    Binary(xr, w, yr, n, [&](float32x4_t xv, float32x4_t wv) {
      return vmulq_f32(vmulq_f32(xv, vs), vaddq_f32(wv, off));
    });
  }
}

float ExpShiftSum(float* x, int64_t n, float m) {
  const float32x4_t vm = vdupq_n_f32(m);
  float32x4_t sum = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const float32x4_t e = Exp(vsubq_f32(vld1q_f32(x + i), vm));
    vst1q_f32(x + i, e);
    sum = vaddq_f32(sum, e);
  }
  float total = vaddvq_f32(sum);
  if (i < n) {
    float buf[kW];
    vst1q_f32(buf, Exp(vsubq_f32(LoadTail(x + i, n - i), vm)));
    for (int64_t j = 0; j < n - i; ++j) {
      x[i + j] = buf[j];
      total += buf[j];
    }
  }
  return total;
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float32x4_t vmax = vdupq_n_f32(-__builtin_inff());
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vmax = vmaxq_f32(vmax, vld1q_f32(x + i));
  float m = vmaxvq_f32(vmax);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  ScaleInPlace(x, 1.0f / ExpShiftSum(x, n, m), n);
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n,
         [](float32x4_t g, float32x4_t u) { return vmulq_f32(Silu(g), u); });
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n,
         [](float32x4_t g, float32x4_t u) { return vmulq_f32(GeluTanh(g), u); });
}

void AddInPlace(float* y, const float* x, int64_t n) {
  Binary(y, x, y, n, [](float32x4_t a, float32x4_t b) { return vaddq_f32(a, b); });
}

void ScaleInPlace(float* y, float s, int64_t n) {
  const float32x4_t vs = vdupq_n_f32(s);
  Binary(y, y, y, n, [&](float32x4_t a, float32x4_t) { return vmulq_f32(a, vs); });
}

namespace {

template <int R, typename Load, typename LoadT>
inline void DotRowsN(const float* q, int64_t dim, float* out, Load load, LoadT load_tail) {
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.f);
  int64_t i = 0;
  for (; i + kW <= dim; i += kW) {
    const float32x4_t qv = vld1q_f32(q + i);
    for (int r = 0; r < R; ++r) acc[r] = vfmaq_f32(acc[r], qv, load(r, i));
  }
  if (i < dim) {
    const float32x4_t qv = LoadTail(q + i, dim - i);
    for (int r = 0; r < R; ++r) acc[r] = vfmaq_f32(acc[r], qv, load_tail(r, i));
  }
  for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]);
}

template <typename Load, typename LoadT>
inline void AxpyRows(const float* w, int64_t n_rows, int64_t dim, float* acc, Load load,
                     LoadT load_tail) {
  int64_t i = 0;
  for (; i + 4 * kW <= dim; i += 4 * kW) {
    float32x4_t a0 = vld1q_f32(acc + i), a1 = vld1q_f32(acc + i + kW);
    float32x4_t a2 = vld1q_f32(acc + i + 2 * kW), a3 = vld1q_f32(acc + i + 3 * kW);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float32x4_t wr = vdupq_n_f32(w[r]);
      a0 = vfmaq_f32(a0, wr, load(r, i));
      a1 = vfmaq_f32(a1, wr, load(r, i + kW));
      a2 = vfmaq_f32(a2, wr, load(r, i + 2 * kW));
      a3 = vfmaq_f32(a3, wr, load(r, i + 3 * kW));
    }
    vst1q_f32(acc + i, a0);
    vst1q_f32(acc + i + kW, a1);
    vst1q_f32(acc + i + 2 * kW, a2);
    vst1q_f32(acc + i + 3 * kW, a3);
  }
  for (; i + kW <= dim; i += kW) {
    float32x4_t a = vld1q_f32(acc + i);
    for (int64_t r = 0; r < n_rows; ++r) a = vfmaq_f32(a, vdupq_n_f32(w[r]), load(r, i));
    vst1q_f32(acc + i, a);
  }
  if (i < dim) {
    float32x4_t a = LoadTail(acc + i, dim - i);
    for (int64_t r = 0; r < n_rows; ++r) a = vfmaq_f32(a, vdupq_n_f32(w[r]), load_tail(r, i));
    StoreTail(acc + i, a, dim - i);
  }
}

}  // namespace

void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  const int64_t rem = dim % kW;
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    const float* kr = k + r * k_stride;
    DotRowsN<4>(
        q, dim, out + r, [&](int j, int64_t i) { return vld1q_f32(kr + j * k_stride + i); },
        [&](int j, int64_t i) { return LoadTail(kr + j * k_stride + i, rem); });
  }
  for (; r < n_rows; ++r) {
    const float* kr = k + r * k_stride;
    DotRowsN<1>(
        q, dim, out + r, [&](int, int64_t i) { return vld1q_f32(kr + i); },
        [&](int, int64_t i) { return LoadTail(kr + i, rem); });
  }
}

void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  const int64_t rem = dim % kW;
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    const uint16_t* kr = k + r * k_stride;
    DotRowsN<4>(
        q, dim, out + r, [&](int j, int64_t i) { return LoadF16(kr + j * k_stride + i); },
        [&](int j, int64_t i) { return LoadF16Tail(kr + j * k_stride + i, rem); });
  }
  for (; r < n_rows; ++r) {
    const uint16_t* kr = k + r * k_stride;
    DotRowsN<1>(
        q, dim, out + r, [&](int, int64_t i) { return LoadF16(kr + i); },
        [&](int, int64_t i) { return LoadF16Tail(kr + i, rem); });
  }
}

namespace {

// The fp16 scale of the Q8_0 block at b (34 bytes: an fp16 scale d, then 32 int8 q).
inline float BlockScale(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

// The 32 int8 values of the Q8_0 block at b as 8 vectors of 4 floats.
inline void Int8x32(const uint8_t* b, float32x4_t* f) {
  const int8x16_t lo = vld1q_s8(reinterpret_cast<const int8_t*>(b + 2));
  const int8x16_t hi = vld1q_s8(reinterpret_cast<const int8_t*>(b + 18));
  const int16x8_t w[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_s8(vget_high_s8(lo)),
                          vmovl_s8(vget_low_s8(hi)), vmovl_s8(vget_high_s8(hi))};
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[j])));
    f[2 * j + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[j])));
  }
}

// Dot products of q with R Q8_0 rows at once: each 32-value block's eight products with the
// query summed, then scaled by the block's d once (not each value).
template <int R>
inline void DotRowsQ8_0N(const float* q, const uint8_t* k, int64_t k_stride, int64_t dim,
                         float* out) {
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.f);
  for (int64_t g = 0; g < dim / 32; ++g) {
    float32x4_t qv[8];
    for (int j = 0; j < 8; ++j) qv[j] = vld1q_f32(q + g * 32 + j * kW);
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = k + r * k_stride + g * 34;
      float32x4_t f[8];
      Int8x32(b, f);
      float32x4_t t = vmulq_f32(qv[0], f[0]);
      for (int j = 1; j < 8; ++j) t = vfmaq_f32(t, qv[j], f[j]);
      acc[r] = vfmaq_n_f32(acc[r], t, BlockScale(b));
    }
  }
  for (int r = 0; r < R; ++r) out[r] = vaddvq_f32(acc[r]);
}

}  // namespace

// Q8_0 rows are whole blocks (dim a multiple of 32): there is never a tail.
void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                 float* out) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) DotRowsQ8_0N<4>(q, k + r * k_stride, k_stride, dim, out + r);
  for (; r < n_rows; ++r) DotRowsQ8_0N<1>(q, k + r * k_stride, k_stride, dim, out + r);
}

// acc += sum_r w[r] * row_r over Q8_0 rows, a block (32 accumulator floats in registers) at a
// time: w[r] times the block's d once, then 8 FMAs.
void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                  float* acc) {
  for (int64_t i = 0; i < dim; i += 32) {
    float32x4_t a[8];
    for (int j = 0; j < 8; ++j) a[j] = vld1q_f32(acc + i + j * kW);
    const uint8_t* b = v + i / 32 * 34;
    for (int64_t r = 0; r < n_rows; ++r, b += v_stride) {
      const float c = w[r] * BlockScale(b);
      float32x4_t f[8];
      Int8x32(b, f);
      for (int j = 0; j < 8; ++j) a[j] = vfmaq_n_f32(a[j], f[j], c);
    }
    for (int j = 0; j < 8; ++j) vst1q_f32(acc + i + j * kW, a[j]);
  }
}

void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  const int64_t rem = dim % kW;
  AxpyRows(
      w, n_rows, dim, acc, [&](int64_t r, int64_t i) { return vld1q_f32(v + r * v_stride + i); },
      [&](int64_t r, int64_t i) { return LoadTail(v + r * v_stride + i, rem); });
}

void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  const int64_t rem = dim % kW;
  AxpyRows(
      w, n_rows, dim, acc, [&](int64_t r, int64_t i) { return LoadF16(v + r * v_stride + i); },
      [&](int64_t r, int64_t i) { return LoadF16Tail(v + r * v_stride + i, rem); });
}

// The largest value (vmaxnm skips NaN), then its first position. The tail is scalar.
int64_t ArgMax(const float* x, int64_t n) {
  float32x4_t m = vdupq_n_f32(-__builtin_inff());
  int64_t i = 0;
  for (; i + kW <= n; i += kW) m = vmaxnmq_f32(m, vld1q_f32(x + i));
  float best = vmaxnmvq_f32(m);
  for (int64_t j = i; j < n; ++j) best = x[j] > best ? x[j] : best;
  const float32x4_t b = vdupq_n_f32(best);
  for (i = 0; i + kW <= n; i += kW) {
    if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), b)) != 0) break;
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every value NaN
}

int64_t FindNanOrPosInf(const float* x, int64_t n) {
  const float32x4_t inf = vdupq_n_f32(__builtin_inff());
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {  // every lane below +inf: no NaN, no +inf
    if (vminvq_u32(vcltq_f32(vld1q_f32(x + i), inf)) == 0) break;
  }
  for (; i < n; ++i)
    if (!(x[i] < __builtin_inff())) return i;
  return -1;
}

int64_t FindAbove(const float* x, int64_t n, float w) {
  const float32x4_t b = vdupq_n_f32(w);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {  // (no lane above: skip the four)
    if (vmaxvq_u32(vcgtq_f32(vld1q_f32(x + i), b)) != 0) break;
  }
  for (; i < n; ++i)
    if (x[i] > w) return i;
  return n;
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
  if (i < n) {
    uint16_t buf[kW];
    vst1_u16(buf, vreinterpret_u16_f16(vcvt_f16_f32(LoadTail(x + i, n - i))));
    for (int64_t j = 0; j < n - i; ++j) y[i + j] = buf[j];
  }
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vst1q_f32(y + i, LoadF16(x + i));
  if (i < n) StoreTail(y + i, LoadF16Tail(x + i, n - i), n - i);
}

void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 32) {  // d * q (exact)
    const uint8_t* b = x + i / 32 * 34;
    const float d = BlockScale(b);
    float32x4_t f[8];
    Int8x32(b, f);
    for (int j = 0; j < 8; ++j) vst1q_f32(y + i + j * kW, vmulq_n_f32(f[j], d));
  }
}

namespace {

// One butterfly stage inside a vector: the partner of lane i is lane i ^ h (p), a lower lane
// (bit h clear) becomes self + partner and an upper one partner - self, as the reference's
// a + c and a - c.
inline float32x4_t Butterfly(float32x4_t v, float32x4_t p, uint32x4_t upper) {
  return vbslq_f32(upper, vsubq_f32(p, v), vaddq_f32(v, p));
}

// ref::HadamardRows on one run of 4 * V values: the stages in the reference's order (within
// each vector for h = 1, 2, then across vectors), so every value is the same sums.
template <int V>
inline void HadamardRun(float* x, float32x4_t norm) {
  const uint32_t odd[4] = {0, ~0u, 0, ~0u}, high[4] = {0, 0, ~0u, ~0u};
  const uint32x4_t upper1 = vld1q_u32(odd), upper2 = vld1q_u32(high);
  float32x4_t v[V];
  for (int i = 0; i < V; ++i) {
    float32x4_t a = vld1q_f32(x + i * kW);
    a = Butterfly(a, vrev64q_f32(a), upper1);
    v[i] = Butterfly(a, vextq_f32(a, a, 2), upper2);
  }
  for (int h = 1; h < V; h *= 2) {
    for (int i = 0; i < V; ++i) {
      if (i & h) continue;
      const float32x4_t a = v[i], c = v[i + h];
      v[i] = vaddq_f32(a, c);
      v[i + h] = vsubq_f32(a, c);
    }
  }
  for (int i = 0; i < V; ++i) vst1q_f32(x + i * kW, vmulq_f32(v[i], norm));
}

}  // namespace

void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block) {
  if (block != 32 && block != 64) {
    ref::HadamardRows(x, n_rows, dim, block);
    return;
  }
  const float32x4_t norm = vdupq_n_f32(1.0f / __builtin_sqrtf(static_cast<float>(block)));
  for (int64_t b = 0; b < n_rows * dim; b += block) {
    if (block == 64) {
      HadamardRun<16>(x + b, norm);
    } else {
      HadamardRun<8>(x + b, norm);
    }
  }
}

PENG_DEFINE_ATTN_TILE_OPS(Lanes)

}  // namespace peng::kernels::neon

#endif  // defined(__aarch64__)
