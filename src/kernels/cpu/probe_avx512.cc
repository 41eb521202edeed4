// AVX-512 machine-peak probe loops (cpu/probe_simd.h): 64-byte loads, 16-wide FMAs, VNNI.
#include "kernels/cpu/avx512.h"

#include "kernels/cpu/probe_simd.h"

namespace peng::kernels::avx512 {

uint64_t ReadSum(const void* p, int64_t n) {
  const auto* v = static_cast<const __m512i*>(p);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n / 64; i += 4) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(v + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(v + i + 1));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(v + i + 2));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(v + i + 3));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(a0));
}

int64_t FmaLoop(int64_t iters, float* sink) {
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  __m512 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = _mm512_fmadd_ps(a[k], m, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]);
  *sink = _mm512_reduce_add_ps(s);
  return iters * 12 * 16 * 2;
}

int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  const __m512i u = _mm512_set1_epi8(3), s8 = _mm512_set1_epi8(-2);
  __m512i a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = _mm512_dpbusd_epi32(a[k], u, s8);
  }
  __m512i s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_epi32(s, a[k]);
  *sink = _mm512_reduce_add_epi32(s);
  return iters * 12 * 64 * 2;
}

}  // namespace peng::kernels::avx512
