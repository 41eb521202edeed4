// Small helpers shared by the AVX-512 matmul translation units (matmul_avx512.cc,
// matmul_kquant_avx512.cc; included only by files compiled with AVX-512 flags). An anonymous
// namespace keeps one copy per unit, so no AVX-512 code can be merged into code run on older
// CPUs.
#pragma once

#include "kernels/cpu/avx512.h"

namespace peng::kernels {
namespace {

// Stores the first n (<= 16) lanes of v at y.
inline void StoreRows(float* y, __m512 v, int n) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1), v);
}

}  // namespace
}  // namespace peng::kernels
