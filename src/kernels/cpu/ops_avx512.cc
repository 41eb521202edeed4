// AVX-512 (F/BW/VL/DQ) versions of the element-wise ops and attention inner loops (16 floats
// per vector; tails use mask registers so every element goes through the same formula).
#include "kernels/cpu/avx512.h"

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attn_tile.h"
#include "kernels/cpu/fold_avx512.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels::avx512 {
namespace {

constexpr int kW = 16;

inline __mmask16 TailMask(int64_t rem) {
  return static_cast<__mmask16>(rem >= kW ? 0xffff : (1u << rem) - 1);
}

// exp(x), same scheme as the AVX2 version: Cody-Waite reduction, degree-7 Taylor polynomial,
// 2^n applied as two factors. ~1-2 ulp for results in the normal range.
inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.f)), _mm512_set1_ps(-105.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606820309417232e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

inline __m512 Silu(__m512 z) {
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_div_ps(z, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

// Same operation order as ref::GeluTanhMul (no FMA) so that u is bit-identical.
inline __m512 GeluTanh(__m512 z) {
  const __m512 z3 = _mm512_mul_ps(_mm512_mul_ps(z, z), z);
  const __m512 inner = _mm512_add_ps(z, _mm512_mul_ps(_mm512_set1_ps(0.044715f), z3));
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), inner);
  const __m512 e = Exp(_mm512_mul_ps(_mm512_set1_ps(-2.f), u));
  return _mm512_div_ps(z, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

inline __m512 LoadF32(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 LoadF16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
// The 16 int8 values at p as floats.
inline __m512 Int8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// The fp16 scale of the Q8_0 block at b (34 bytes: an fp16 scale d, then 32 int8 q).
inline float BlockScale(const uint8_t* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
  return _cvtsh_ss(h);
}

// Values i .. i + 15 (i a multiple of 16) of a row of Q8_0 blocks, d * q (exact). Q8_0 rows are
// whole blocks, so there is never a tail.
inline __m512 LoadQ8_0(const uint8_t* row, int64_t i) {
  const uint8_t* b = row + i / 32 * 34;
  return _mm512_mul_ps(Int8x16(b + 2 + i % 32), _mm512_set1_ps(BlockScale(b)));
}

template <typename Op>
inline void Binary(const float* a, const float* b, float* out, int64_t n, Op op) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(out + i, m, op(LoadF32(a + i, m), LoadF32(b + i, m)));
  }
}

// The 16 lanes of a query tile (cpu/attn_tile.h): one vector.
struct Lanes {
  static constexpr int kAcc = 16;
  __m512 v;
  static Lanes Zero() { return {_mm512_setzero_ps()}; }
  static Lanes Set(float x) { return {_mm512_set1_ps(x)}; }
  static Lanes Load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static void Store(float* p, Lanes a) { _mm512_storeu_ps(p, a.v); }
  static Lanes Max(Lanes a, Lanes b) { return {_mm512_max_ps(a.v, b.v)}; }
  static Lanes Sub(Lanes a, Lanes b) { return {_mm512_sub_ps(a.v, b.v)}; }
  static Lanes Mul(Lanes a, Lanes b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static Lanes Add(Lanes a, Lanes b) { return {_mm512_add_ps(a.v, b.v)}; }
  static Lanes FmaScalar(float s, Lanes a, Lanes acc) {
    return {_mm512_fmadd_ps(_mm512_set1_ps(s), a.v, acc.v)};
  }
  static Lanes Exp(Lanes a) { return {avx512::Exp(a.v)}; }
  static Lanes ZeroWhereNegInf(Lanes key, Lanes x) {
    return {_mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask(key.v, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ), x.v)};
  }
};

}  // namespace

void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps) {
  const __m512 off = _mm512_set1_ps(w_offset);
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 * kW <= n; i += 2 * kW) {
      const __m512 v0 = _mm512_loadu_ps(xr + i), v1 = _mm512_loadu_ps(xr + i + kW);
      a0 = _mm512_fmadd_ps(v0, v0, a0);
      a1 = _mm512_fmadd_ps(v1, v1, a1);
    }
    for (; i < n; i += kW) {
      const __m512 v = LoadF32(xr + i, TailMask(n - i));
      a0 = _mm512_fmadd_ps(v, v, a0);
    }
    const float mean = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) / static_cast<float>(n);
    const float s = 1.0f / _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(mean + eps)));
    const __m512 vs = _mm512_set1_ps(s);
    Binary(xr, w, yr, n, [&](__m512 xv, __m512 wv) {
      return _mm512_mul_ps(_mm512_mul_ps(xv, vs), _mm512_add_ps(wv, off));
    });
  }
}

float ExpShiftSum(float* x, int64_t n, float m) {
  const __m512 vm = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 mask = TailMask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(mask, Exp(_mm512_sub_ps(LoadF32(x + i, mask), vm)));
    _mm512_mask_storeu_ps(x + i, mask, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m512 vmax = _mm512_set1_ps(-__builtin_inff());
  for (int64_t i = 0; i < n; i += kW) {
    vmax = _mm512_mask_max_ps(vmax, TailMask(n - i), vmax, _mm512_maskz_loadu_ps(TailMask(n - i), x + i));
  }
  ScaleInPlace(x, 1.0f / ExpShiftSum(x, n, _mm512_reduce_max_ps(vmax)), n);
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n, [](__m512 g, __m512 u) { return _mm512_mul_ps(Silu(g), u); });
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  Binary(gate, up, out, n, [](__m512 g, __m512 u) { return _mm512_mul_ps(GeluTanh(g), u); });
}

void AddInPlace(float* y, const float* x, int64_t n) {
  Binary(y, x, y, n, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

void ScaleInPlace(float* y, float s, int64_t n) {
  const __m512 vs = _mm512_set1_ps(s);
  Binary(y, y, y, n, [&](__m512 a, __m512) { return _mm512_mul_ps(a, vs); });
}

namespace {

// out[r] = dot(q, row r) for r < n <= 16: each row's 16-lane partial sums, folded across the
// rows (Fold16) and stored at once.
template <typename Load>
inline void DotRows16(const float* q, int64_t dim, int n, float* out, Load load) {
  const auto z = [&](int r) {
    __m512 acc = _mm512_setzero_ps();
    if (r >= n) return acc;
    for (int64_t i = 0; i < dim; i += kW) {
      const __mmask16 m = TailMask(dim - i);
      acc = _mm512_fmadd_ps(LoadF32(q + i, m), load(r, i, m), acc);
    }
    return acc;
  };
  _mm512_mask_storeu_ps(out, TailMask(n),
                        Fold16(z, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
}

// acc[0..dim) += sum_r w[r] * row_r; 64 accumulator floats stay in registers across rows.
template <typename Load>
inline void AxpyRows(const float* w, int64_t n_rows, int64_t dim, float* acc, Load load) {
  int64_t i = 0;
  for (; i + 4 * kW <= dim; i += 4 * kW) {
    const __mmask16 all = 0xffff;
    __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + kW);
    __m512 a2 = _mm512_loadu_ps(acc + i + 2 * kW), a3 = _mm512_loadu_ps(acc + i + 3 * kW);
    for (int64_t r = 0; r < n_rows; ++r) {
      const __m512 wr = _mm512_set1_ps(w[r]);
      a0 = _mm512_fmadd_ps(wr, load(r, i, all), a0);
      a1 = _mm512_fmadd_ps(wr, load(r, i + kW, all), a1);
      a2 = _mm512_fmadd_ps(wr, load(r, i + 2 * kW, all), a2);
      a3 = _mm512_fmadd_ps(wr, load(r, i + 3 * kW, all), a3);
    }
    _mm512_storeu_ps(acc + i, a0);
    _mm512_storeu_ps(acc + i + kW, a1);
    _mm512_storeu_ps(acc + i + 2 * kW, a2);
    _mm512_storeu_ps(acc + i + 3 * kW, a3);
  }
  for (; i < dim; i += kW) {
    const __mmask16 m = TailMask(dim - i);
    __m512 a = LoadF32(acc + i, m);
    for (int64_t r = 0; r < n_rows; ++r) a = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), load(r, i, m), a);
    _mm512_mask_storeu_ps(acc + i, m, a);
  }
}

// DotRows16 for dim = 16 * V: the query's V vectors stay in registers and each row's products
// are fully unrolled (no tail masks or loop tests), in the order of the generic loop (so the
// sums are bit-identical to it).
template <int V, typename Load>
inline void DotRows16Fixed(const float* q, int n, float* out, Load load) {
  __m512 qv[V];
#pragma GCC unroll 16
  for (int i = 0; i < V; ++i) qv[i] = _mm512_loadu_ps(q + i * kW);
  const auto z = [&](int r) {
    __m512 acc = _mm512_setzero_ps();
    if (r >= n) return acc;
#pragma GCC unroll 16
    for (int i = 0; i < V; ++i) acc = _mm512_fmadd_ps(qv[i], load(r, i * kW), acc);
    return acc;
  };
  _mm512_mask_storeu_ps(out, TailMask(n),
                        Fold16(z, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
}

// out[r] for all rows, 16 at a time: fixed-size forms for head_dim 64 / 128 / 256.
template <typename Load, typename LoadFull>
inline void DotRowsAll(const float* q, int64_t n_rows, int64_t dim, float* out, Load load,
                       LoadFull load_full) {
  for (int64_t r = 0; r < n_rows; r += 16) {
    const int n = static_cast<int>(n_rows - r < 16 ? n_rows - r : 16);
    const auto full = [&](int j, int64_t i) { return load_full(r + j, i); };
    switch (dim) {
      case 64: DotRows16Fixed<4>(q, n, out + r, full); break;
      case 128: DotRows16Fixed<8>(q, n, out + r, full); break;
      case 256: DotRows16Fixed<16>(q, n, out + r, full); break;
      default:
        DotRows16(q, dim, n, out + r,
                  [&](int j, int64_t i, __mmask16 m) { return load(r + j, i, m); });
    }
  }
}

}  // namespace

void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  DotRowsAll(
      q, n_rows, dim, out,
      [&](int64_t j, int64_t i, __mmask16 m) { return LoadF32(k + j * k_stride + i, m); },
      [&](int64_t j, int64_t i) { return _mm512_loadu_ps(k + j * k_stride + i); });
}

void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  DotRowsAll(
      q, n_rows, dim, out,
      [&](int64_t j, int64_t i, __mmask16 m) { return LoadF16(k + j * k_stride + i, m); },
      [&](int64_t j, int64_t i) {
        return _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + j * k_stride + i)));
      });
}

void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  AxpyRows(w, n_rows, dim, acc,
           [&](int64_t r, int64_t i, __mmask16 m) { return LoadF32(v + r * v_stride + i, m); });
}

void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  AxpyRows(w, n_rows, dim, acc,
           [&](int64_t r, int64_t i, __mmask16 m) { return LoadF16(v + r * v_stride + i, m); });
}

namespace {

// Q8_0 rows' dot products, 16 rows at a time: each 32-value block's two products with the
// query summed, then scaled by the block's d once (not each value), folded as DotRows16Fixed.
// G blocks a row (0: dim / 32 from the loop).
template <int G>
inline void DotRows16Q8_0(const float* q, const uint8_t* k, int64_t k_stride, int n,
                          int64_t dim, float* out) {
  const int64_t groups = G > 0 ? G : dim / 32;
  const auto z = [&](int r) {
    __m512 acc = _mm512_setzero_ps();
    if (r >= n) return acc;
    const uint8_t* row = k + r * k_stride;
#pragma GCC unroll 8
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* b = row + g * 34;
      __m512 t = _mm512_mul_ps(_mm512_loadu_ps(q + g * 32), Int8x16(b + 2));
      t = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * 32 + kW), Int8x16(b + 2 + kW), t);
      acc = _mm512_fmadd_ps(t, _mm512_set1_ps(BlockScale(b)), acc);
    }
    return acc;
  };
  _mm512_mask_storeu_ps(out, TailMask(n),
                        Fold16(z, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); }));
}

}  // namespace

void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                 float* out) {
  for (int64_t r = 0; r < n_rows; r += 16) {
    const int n = static_cast<int>(n_rows - r < 16 ? n_rows - r : 16);
    const uint8_t* kr = k + r * k_stride;
    switch (dim) {
      case 64: DotRows16Q8_0<2>(q, kr, k_stride, n, dim, out + r); break;
      case 128: DotRows16Q8_0<4>(q, kr, k_stride, n, dim, out + r); break;
      case 256: DotRows16Q8_0<8>(q, kr, k_stride, n, dim, out + r); break;
      default: DotRows16Q8_0<0>(q, kr, k_stride, n, dim, out + r);
    }
  }
}

// acc += sum_r w[r] * row_r over Q8_0 rows: w[r] times a block's d once, then 16 FMAs a block's
// 32 values; 64 accumulator floats stay in registers across rows.
void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                  float* acc) {
  int64_t i = 0;
  for (; i + 64 <= dim; i += 64) {
    __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + kW);
    __m512 a2 = _mm512_loadu_ps(acc + i + 2 * kW), a3 = _mm512_loadu_ps(acc + i + 3 * kW);
    const uint8_t* b = v + i / 32 * 34;
    for (int64_t r = 0; r < n_rows; ++r, b += v_stride) {
      const __m512 c0 = _mm512_set1_ps(w[r] * BlockScale(b));
      const __m512 c1 = _mm512_set1_ps(w[r] * BlockScale(b + 34));
      a0 = _mm512_fmadd_ps(c0, Int8x16(b + 2), a0);
      a1 = _mm512_fmadd_ps(c0, Int8x16(b + 2 + kW), a1);
      a2 = _mm512_fmadd_ps(c1, Int8x16(b + 36), a2);
      a3 = _mm512_fmadd_ps(c1, Int8x16(b + 36 + kW), a3);
    }
    _mm512_storeu_ps(acc + i, a0);
    _mm512_storeu_ps(acc + i + kW, a1);
    _mm512_storeu_ps(acc + i + 2 * kW, a2);
    _mm512_storeu_ps(acc + i + 3 * kW, a3);
  }
  for (; i < dim; i += 32) {
    __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + kW);
    const uint8_t* b = v + i / 32 * 34;
    for (int64_t r = 0; r < n_rows; ++r, b += v_stride) {
      const __m512 c = _mm512_set1_ps(w[r] * BlockScale(b));
      a0 = _mm512_fmadd_ps(c, Int8x16(b + 2), a0);
      a1 = _mm512_fmadd_ps(c, Int8x16(b + 2 + kW), a1);
    }
    _mm512_storeu_ps(acc + i, a0);
    _mm512_storeu_ps(acc + i + kW, a1);
  }
}

// Two passes: the largest value (vmaxps returns its second operand when the first is NaN, so
// NaN is skipped), then its first position.
int64_t ArgMax(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 m = ninf;
  for (int64_t i = 0; i < n; i += kW)
    m = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, TailMask(n - i), x + i), m);
  const __m512 best = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 t = TailMask(n - i);
    const __mmask16 eq =
        _mm512_mask_cmp_ps_mask(t, _mm512_maskz_loadu_ps(t, x + i), best, _CMP_EQ_OQ);
    if (eq) return i + __builtin_ctz(eq);
  }
  return 0;  // every value NaN
}

int64_t FindNanOrPosInf(const float* x, int64_t n) {
  const __m512 inf = _mm512_set1_ps(__builtin_inff());
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = TailMask(n - i);
    const __mmask16 bad =  // not below +inf: NaN or +inf
        _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), inf, _CMP_NLT_UQ);
    if (bad) return i + __builtin_ctz(bad);
  }
  return -1;
}

int64_t FindAbove(const float* x, int64_t n, float w) {
  const __m512 b = _mm512_set1_ps(w);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = TailMask(n - i);
    const __mmask16 gt = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), b, _CMP_GT_OQ);
    if (gt) return i + __builtin_ctz(gt);
  }
  return n;
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = TailMask(n - i);
    _mm256_mask_storeu_epi16(y + i, m,
                             _mm512_cvtps_ph(LoadF32(x + i, m), _MM_FROUND_TO_NEAREST_INT));
  }
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, LoadF16(x + i, m));
  }
}

void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kW) _mm512_storeu_ps(y + i, LoadQ8_0(x, i));
}

namespace {

// One butterfly stage inside a vector: the partner of lane i is lane i ^ h (p), a lower lane
// (bit h clear) becomes self + partner and an upper one partner - self, as the reference's
// a + c and a - c.
inline __m512 Butterfly(__m512 v, __m512 p, __mmask16 upper) {
  return _mm512_mask_sub_ps(_mm512_add_ps(v, p), upper, p, v);
}

// ref::HadamardRows on one run of 16 * V values: the stages in the reference's order (within
// each vector for h = 1, 2, 4, 8, then across vectors), so every value is the same sums.
template <int V>
inline void HadamardRun(float* x, __m512 norm) {
  __m512 v[V];
  for (int i = 0; i < V; ++i) {
    __m512 a = _mm512_loadu_ps(x + i * kW);
    a = Butterfly(a, _mm512_permute_ps(a, 0xB1), 0xAAAA);
    a = Butterfly(a, _mm512_permute_ps(a, 0x4E), 0xCCCC);
    a = Butterfly(a, _mm512_shuffle_f32x4(a, a, 0xB1), 0xF0F0);
    v[i] = Butterfly(a, _mm512_shuffle_f32x4(a, a, 0x4E), 0xFF00);
  }
  for (int h = 1; h < V; h *= 2) {
    for (int i = 0; i < V; ++i) {
      if (i & h) continue;
      const __m512 a = v[i], c = v[i + h];
      v[i] = _mm512_add_ps(a, c);
      v[i + h] = _mm512_sub_ps(a, c);
    }
  }
  for (int i = 0; i < V; ++i) _mm512_storeu_ps(x + i * kW, _mm512_mul_ps(v[i], norm));
}

}  // namespace

void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block) {
  if (block != 32 && block != 64) {
    ref::HadamardRows(x, n_rows, dim, block);
    return;
  }
  const __m512 norm = _mm512_set1_ps(1.0f / __builtin_sqrtf(static_cast<float>(block)));
  for (int64_t b = 0; b < n_rows * dim; b += block) {
    if (block == 64) {
      HadamardRun<4>(x + b, norm);
    } else {
      HadamardRun<2>(x + b, norm);
    }
  }
}

PENG_DEFINE_ATTN_TILE_OPS(Lanes)

}  // namespace peng::kernels::avx512
