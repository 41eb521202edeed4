// AVX2 + FMA + F16C versions of the element-wise ops and attention inner loops (8 floats per
// vector; tails use masked loads/stores so every element goes through the same formula).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attn_tile.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels::avx2 {
namespace {

constexpr int kW = 8;

inline __m256i TailMask(int64_t rem) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(rem)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The 8 int8 values at p as floats.
inline __m256 Int8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// The fp16 scale of the Q8_0 block at b (34 bytes: an fp16 scale d, then 32 int8 q).
inline float BlockScale(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return _cvtsh_ss(h);
}

// Values i .. i + 7 (i a multiple of 8) of a row of Q8_0 blocks, d * q (exact). Q8_0 rows are
// whole blocks, so there is never a tail.
inline __m256 LoadQ8_0(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + i / 32 * 34;
  return _mm256_mul_ps(Int8x8(b + 2 + i % 32), _mm256_set1_ps(BlockScale(b)));
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x): x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), exp(r) by its degree-7
// Taylor polynomial (truncation < 6e-9 relative), times 2^n applied as two factors so that
// results from 2^-150 (underflow to 0) to 2^128 (overflow to inf) are handled. ~1-2 ulp.
inline __m256 Exp(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(89.f)), _mm256_set1_ps(-105.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417232e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 5040.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 720.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

inline __m256 Silu(__m256 z) {
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), z));
  return _mm256_div_ps(z, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

// Same operation order as ref::GeluTanhMul (no FMA) so that u is bit-identical.
inline __m256 GeluTanh(__m256 z) {
  const __m256 z3 = _mm256_mul_ps(_mm256_mul_ps(z, z), z);
  const __m256 inner = _mm256_add_ps(z, _mm256_mul_ps(_mm256_set1_ps(0.044715f), z3));
  const __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), inner);
  const __m256 e = Exp(_mm256_mul_ps(_mm256_set1_ps(-2.f), u));
  return _mm256_div_ps(z, _mm256_add_ps(_mm256_set1_ps(1.f), e));
}

inline __m256 LoadF16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The last `rem` (< 8) halves at p, zero-padded.
inline __m256 LoadF16Tail(const uint16_t* p, int64_t rem) {
  alignas(16) uint16_t buf[kW] = {};
  for (int64_t i = 0; i < rem; ++i) buf[i] = p[i];
  return LoadF16(buf);
}

// The 16 lanes of a query tile (cpu/attn_tile.h): two vectors.
struct Lanes {
  static constexpr int kAcc = 4;
  __m256 lo, hi;
  static Lanes Zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Lanes Set(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static Lanes Load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + kW)}; }
  static void Store(float* p, Lanes a) {
    _mm256_storeu_ps(p, a.lo);
    _mm256_storeu_ps(p + kW, a.hi);
  }
  static Lanes Max(Lanes a, Lanes b) {
    return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)};
  }
  static Lanes Sub(Lanes a, Lanes b) {
    return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)};
  }
  static Lanes Mul(Lanes a, Lanes b) {
    return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
  }
  static Lanes Add(Lanes a, Lanes b) {
    return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
  }
  static Lanes FmaScalar(float s, Lanes a, Lanes acc) {
    const __m256 vs = _mm256_set1_ps(s);
    return {_mm256_fmadd_ps(vs, a.lo, acc.lo), _mm256_fmadd_ps(vs, a.hi, acc.hi)};
  }
  static Lanes Exp(Lanes a) { return {avx2::Exp(a.lo), avx2::Exp(a.hi)}; }
  static Lanes ZeroWhereNegInf(Lanes key, Lanes x) {
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    return {_mm256_and_ps(_mm256_cmp_ps(key.lo, ninf, _CMP_NEQ_UQ), x.lo),
            _mm256_and_ps(_mm256_cmp_ps(key.hi, ninf, _CMP_NEQ_UQ), x.hi)};
  }
};

template <typename Op>
inline void Binary(const float* a, const float* b, float* out, int64_t n, Op op) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW)
    _mm256_storeu_ps(out + i, op(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(out + i, m, op(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
  }
}

}  // namespace

void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps) {
  const __m256 off = _mm256_set1_ps(w_offset);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      const __m256 v0 = _mm256_loadu_ps(xr + i), v1 = _mm256_loadu_ps(xr + i + kW);
      a0 = _mm256_fmadd_ps(v0, v0, a0);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    for (; i + kW <= n; i += kW) {
      const __m256 v = _mm256_loadu_ps(xr + i);
      a0 = _mm256_fmadd_ps(v, v, a0);
    }
    if (i < n) {
      const __m256 v = _mm256_maskload_ps(xr + i, TailMask(n - i));
      a1 = _mm256_fmadd_ps(v, v, a1);
    }
    const float mean = HSum(_mm256_add_ps(a0, a1)) / static_cast<float>(n);
    const float s = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean + eps)));
    const __m256 vs = _mm256_set1_ps(s);
    Binary(xr, w, yr, n, [&](__m256 xv, __m256 wv) {
      return _mm256_mul_ps(_mm256_mul_ps(xv, vs), _mm256_add_ps(wv, off));
    });
  }
}

float ExpShiftSum(float* x, int64_t n, float m) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i mask = TailMask(n - i);
    const __m256 e = _mm256_and_ps(Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), vm)),
                                   _mm256_castsi256_ps(mask));
    _mm256_maskstore_ps(x + i, mask, e);
    sum = _mm256_add_ps(sum, e);
  }
  return HSum(sum);
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 vmax = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  float m = HMax(vmax);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  ScaleInPlace(x, 1.0f / ExpShiftSum(x, n, m), n);
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n, [](__m256 g, __m256 u) { return _mm256_mul_ps(Silu(g), u); });
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n, [](__m256 g, __m256 u) { return _mm256_mul_ps(GeluTanh(g), u); });
}

void AddInPlace(float* y, const float* x, int64_t n) {
  Binary(y, x, y, n, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); });
}

void ScaleInPlace(float* y, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  Binary(y, y, y, n, [&](__m256 a, __m256) { return _mm256_mul_ps(a, vs); });
}

namespace {

// Dot products of q with 4 rows at once (independent FMA chains), or 1 row.
template <int R, typename Load, typename LoadTail>
inline void DotRowsN(const float* q, int64_t dim, float* out, Load load, LoadTail load_tail) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kW <= dim; i += kW) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(qv, load(r, i), acc[r]);
  }
  if (i < dim) {
    const __m256 qv = _mm256_maskload_ps(q + i, TailMask(dim - i));
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(qv, load_tail(r, i), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = HSum(acc[r]);
}

}  // namespace

void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  int64_t r = 0;
  const __m256i tail = TailMask(dim % kW);
  for (; r + 4 <= n_rows; r += 4) {
    const float* kr = k + r * k_stride;
    DotRowsN<4>(
        q, dim, out + r, [&](int j, int64_t i) { return _mm256_loadu_ps(kr + j * k_stride + i); },
        [&](int j, int64_t i) { return _mm256_maskload_ps(kr + j * k_stride + i, tail); });
  }
  for (; r < n_rows; ++r) {
    const float* kr = k + r * k_stride;
    DotRowsN<1>(
        q, dim, out + r, [&](int, int64_t i) { return _mm256_loadu_ps(kr + i); },
        [&](int, int64_t i) { return _mm256_maskload_ps(kr + i, tail); });
  }
}

void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  int64_t r = 0;
  const int64_t rem = dim % kW;
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

// Dot products of q with R Q8_0 rows at once: each 32-value block's four products with the
// query summed, then scaled by the block's d once (not each value).
template <int R>
inline void DotRowsQ8_0N(const float* q, const uint8_t* k, int64_t k_stride, int64_t dim,
                         float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < dim / 32; ++g) {
    const __m256 q0 = _mm256_loadu_ps(q + g * 32), q1 = _mm256_loadu_ps(q + g * 32 + kW);
    const __m256 q2 = _mm256_loadu_ps(q + g * 32 + 2 * kW);
    const __m256 q3 = _mm256_loadu_ps(q + g * 32 + 3 * kW);
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = k + r * k_stride + g * 34;
      __m256 t = _mm256_mul_ps(q0, Int8x8(b + 2));
      t = _mm256_fmadd_ps(q1, Int8x8(b + 2 + kW), t);
      t = _mm256_fmadd_ps(q2, Int8x8(b + 2 + 2 * kW), t);
      t = _mm256_fmadd_ps(q3, Int8x8(b + 2 + 3 * kW), t);
      acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(BlockScale(b)), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HSum(acc[r]);
}

}  // namespace

void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                 float* out) {
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) DotRowsQ8_0N<4>(q, k + r * k_stride, k_stride, dim, out + r);
  for (; r < n_rows; ++r) DotRowsQ8_0N<1>(q, k + r * k_stride, k_stride, dim, out + r);
}

namespace {

// acc[0..dim) += sum_r w[r] * row_r; 32 accumulator floats stay in registers across rows.
template <typename Load, typename LoadTail>
inline void AxpyRows(const float* w, int64_t n_rows, int64_t dim, float* acc, Load load,
                     LoadTail load_tail) {
  int64_t i = 0;
  for (; i + 4 * kW <= dim; i += 4 * kW) {
    __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + kW);
    __m256 a2 = _mm256_loadu_ps(acc + i + 2 * kW), a3 = _mm256_loadu_ps(acc + i + 3 * kW);
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m256 wr = _mm256_set1_ps(w[r]);
      a0 = _mm256_fmadd_ps(wr, load(r, i), a0);
      a1 = _mm256_fmadd_ps(wr, load(r, i + kW), a1);
      a2 = _mm256_fmadd_ps(wr, load(r, i + 2 * kW), a2);
      a3 = _mm256_fmadd_ps(wr, load(r, i + 3 * kW), a3);
    }
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + kW, a1);
    _mm256_storeu_ps(acc + i + 2 * kW, a2);
    _mm256_storeu_ps(acc + i + 3 * kW, a3);
  }
  for (; i + kW <= dim; i += kW) {
    __m256 a = _mm256_loadu_ps(acc + i);
    for (int64_t r = 0; r < n_rows; ++r) a = _mm256_fmadd_ps(_mm256_set1_ps(w[r]), load(r, i), a);
    _mm256_storeu_ps(acc + i, a);
  }
  if (i < dim) {
    const __m256i m = TailMask(dim - i);
    __m256 a = _mm256_maskload_ps(acc + i, m);
    for (int64_t r = 0; r < n_rows; ++r)
      a = _mm256_fmadd_ps(_mm256_set1_ps(w[r]), load_tail(r, i), a);
    _mm256_maskstore_ps(acc + i, m, a);
  }
}

}  // namespace

void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  const __m256i tail = TailMask(dim % kW);
  AxpyRows(
      w, n_rows, dim, acc, [&](int64_t r, int64_t i) { return _mm256_loadu_ps(v + r * v_stride + i); },
      [&](int64_t r, int64_t i) { return _mm256_maskload_ps(v + r * v_stride + i, tail); });
}

void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  const int64_t rem = dim % kW;
  AxpyRows(
      w, n_rows, dim, acc, [&](int64_t r, int64_t i) { return LoadF16(v + r * v_stride + i); },
      [&](int64_t r, int64_t i) { return LoadF16Tail(v + r * v_stride + i, rem); });
}

// acc += sum_r w[r] * row_r over Q8_0 rows, a block (32 accumulator floats in registers) at a
// time: w[r] times the block's d once, then 4 FMAs.
void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                  float* acc) {
  for (int64_t i = 0; i < dim; i += 32) {
    __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + kW);
    __m256 a2 = _mm256_loadu_ps(acc + i + 2 * kW), a3 = _mm256_loadu_ps(acc + i + 3 * kW);
    const uint8_t* b = v + i / 32 * 34;
    for (int64_t r = 0; r < n_rows; ++r, b += v_stride) {
      const __m256 c = _mm256_set1_ps(w[r] * BlockScale(b));
      a0 = _mm256_fmadd_ps(c, Int8x8(b + 2), a0);
      a1 = _mm256_fmadd_ps(c, Int8x8(b + 2 + kW), a1);
      a2 = _mm256_fmadd_ps(c, Int8x8(b + 2 + 2 * kW), a2);
      a3 = _mm256_fmadd_ps(c, Int8x8(b + 2 + 3 * kW), a3);
    }
    _mm256_storeu_ps(acc + i, a0);
    _mm256_storeu_ps(acc + i + kW, a1);
    _mm256_storeu_ps(acc + i + 2 * kW, a2);
    _mm256_storeu_ps(acc + i + 3 * kW, a3);
  }
}

// As the AVX-512 version: the largest value (vmaxps skips a NaN first operand), then its first
// position. The tail is scalar.
int64_t ArgMax(const float* x, int64_t n) {
  const float ninf = -__builtin_inff();
  __m256 m = _mm256_set1_ps(ninf);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  float best = HMax(m);
  for (int64_t j = i; j < n; ++j) best = x[j] > best ? x[j] : best;
  const __m256 b = _mm256_set1_ps(best);
  for (i = 0; i + kW <= n; i += kW) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
    if (eq) return i + __builtin_ctz(eq);
  }
  for (; i < n; ++i)
    if (x[i] == best) return i;
  return 0;  // every value NaN
}

int64_t FindNanOrPosInf(const float* x, int64_t n) {
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {  // not below +inf: NaN or +inf
    const int bad = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), inf, _CMP_NLT_UQ));
    if (bad) return i + __builtin_ctz(bad);
  }
  for (; i < n; ++i)
    if (!(x[i] < __builtin_inff())) return i;
  return -1;
}

int64_t FindAbove(const float* x, int64_t n, float w) {
  const __m256 b = _mm256_set1_ps(w);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    const int gt = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_GT_OQ));
    if (gt) return i + __builtin_ctz(gt);
  }
  for (; i < n; ++i)
    if (x[i] > w) return i;
  return n;
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) _mm256_storeu_ps(y + i, LoadF16(x + i));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kW) _mm256_storeu_ps(y + i, LoadQ8_0(x, i));
}

namespace {

// One butterfly stage inside a vector: the partner of lane i is lane i ^ h (p), a lower lane
// (bit h clear) becomes self + partner and an upper one partner - self, as the reference's
// a + c and a - c.
template <int kUpper>
inline __m256 Butterfly(__m256 v, __m256 p) {
  return _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), kUpper);
}

// ref::HadamardRows on one run of 8 * V values: the stages in the reference's order (within
// each vector for h = 1, 2, 4, then across vectors), so every value is the same sums.
template <int V>
inline void HadamardRun(float* x, __m256 norm) {
  __m256 v[V];
  for (int i = 0; i < V; ++i) {
    __m256 a = _mm256_loadu_ps(x + i * kW);
    a = Butterfly<0xAA>(a, _mm256_permute_ps(a, 0xB1));
    a = Butterfly<0xCC>(a, _mm256_permute_ps(a, 0x4E));
    v[i] = Butterfly<0xF0>(a, _mm256_permute2f128_ps(a, a, 0x01));
  }
  for (int h = 1; h < V; h *= 2) {
    for (int i = 0; i < V; ++i) {
      if (i & h) continue;
      const __m256 a = v[i], c = v[i + h];
      v[i] = _mm256_add_ps(a, c);
      v[i + h] = _mm256_sub_ps(a, c);
    }
  }
  for (int i = 0; i < V; ++i) _mm256_storeu_ps(x + i * kW, _mm256_mul_ps(v[i], norm));
}

}  // namespace

void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block) {
  if (block != 32 && block != 64) {
    ref::HadamardRows(x, n_rows, dim, block);
    return;
  }
  const __m256 norm = _mm256_set1_ps(1.0f / __builtin_sqrtf(static_cast<float>(block)));
  for (int64_t b = 0; b < n_rows * dim; b += block) {
    if (block == 64) {
      HadamardRun<8>(x + b, norm);
    } else {
      HadamardRun<4>(x + b, norm);
    }
  }
}

PENG_DEFINE_ATTN_TILE_OPS(Lanes)

}  // namespace peng::kernels::avx2
