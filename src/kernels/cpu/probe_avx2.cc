// AVX2 machine-peak probe loops (cpu/probe_simd.h): 32-byte loads, 8-wide FMAs, and the
// maddubs + madd pair the AVX2 quantized matmuls use for int8 dot products.
#include <immintrin.h>

#include "kernels/cpu/probe_simd.h"

namespace peng::kernels::avx2 {

uint64_t ReadSum(const void* p, int64_t n) {
  const auto* v = static_cast<const __m256i*>(p);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n / 32; i += 4) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(v + i));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(v + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(v + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(v + i + 3));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t w[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), a0);
  return w[0] + w[1] + w[2] + w[3];
}

int64_t FmaLoop(int64_t iters, float* sink) {
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  __m256 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm256_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) a[k] = _mm256_fmadd_ps(a[k], m, c);
  }
  __m256 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm256_add_ps(s, a[k]);
  alignas(32) float w[8];
  _mm256_store_ps(w, s);
  *sink = w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6] + w[7];
  return iters * 12 * 8 * 2;
}

int64_t Int8DotLoop(int64_t iters, int32_t* sink) {
  const __m256i u = _mm256_set1_epi8(3), s8 = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  __m256i a[8];
  for (int k = 0; k < 8; ++k) a[k] = _mm256_set1_epi32(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 8; ++k)
      a[k] = _mm256_add_epi32(a[k], _mm256_madd_epi16(_mm256_maddubs_epi16(u, s8), ones));
  }
  __m256i s = a[0];
  for (int k = 1; k < 8; ++k) s = _mm256_add_epi32(s, a[k]);
  alignas(32) int32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), s);
  *sink = w[0] + w[1] + w[2] + w[3] + w[4] + w[5] + w[6] + w[7];
  return iters * 8 * 32 * 2;
}

}  // namespace peng::kernels::avx2
