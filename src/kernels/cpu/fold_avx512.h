// Fold16: 16 vectors reduced lane-wise at once, for the AVX-512 translation units (included
// only by files compiled with AVX-512 flags; an anonymous namespace keeps one copy per unit,
// so no AVX-512 code can be merged into code run on older CPUs).
#pragma once

#include "kernels/cpu/avx512.h"

namespace peng::kernels {
namespace {

// Lane r of the result = op over the 16 lanes of z(r), r < 16: a transpose-and-combine tree
// (op commutative and associative -- max, integer adds; float adds come out reassociated)
// instead of 16 horizontal reductions (about 45 shuffles and ops for 16 vectors, where a
// horizontal reduction of one takes 8). z(r) is called in order 0..15 as the tree consumes it,
// so few vectors are live.
template <class Z, class Op>
__attribute__((always_inline)) inline __m512 Fold16(Z&& z, Op&& op) {
  __m512 t[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    __m512 s[2];
#pragma GCC unroll 2
    for (int p = 0; p < 2; ++p) {
      const __m512 za = z(4 * g + 2 * p), zb = z(4 * g + 2 * p + 1);
      s[p] = op(_mm512_unpacklo_ps(za, zb), _mm512_unpackhi_ps(za, zb));
    }
    const __m512d s0 = _mm512_castps_pd(s[0]), s1 = _mm512_castps_pd(s[1]);
    t[g] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(s0, s1)),
              _mm512_castpd_ps(_mm512_unpackhi_pd(s0, s1)));
  }
  const __m512 u0 =
      op(_mm512_shuffle_f32x4(t[0], t[1], 0x88), _mm512_shuffle_f32x4(t[0], t[1], 0xDD));
  const __m512 u1 =
      op(_mm512_shuffle_f32x4(t[2], t[3], 0x88), _mm512_shuffle_f32x4(t[2], t[3], 0xDD));
  return op(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xDD));
}

}  // namespace
}  // namespace peng::kernels
