// The query-tile attention primitives (ScoreTile16, SoftmaxTile16, AccumTile16 of
// cpu/ops_simd.h) written once over a 16-lane vector type V that each ISA's ops file defines
// from its own intrinsics (one __m512, two __m256, four float32x4_t) before including this
// header. A lane is one query row of the tile, so a key's score for all 16 rows is one vector
// of FMAs against the transposed queries, the online softmax is lane-wise, and no horizontal
// reduction is ever needed. Everything is in an unnamed namespace: each ISA's translation unit
// keeps its own copy, built with its own target flags (see cpu/tile_driver.h).
//
// V provides: static Zero(), Set(float), Load(const float*), Store(float*, V), Max(V, V),
// Sub(V, V), Mul(V, V), Add(V, V), FmaScalar(float s, V a, V acc) = s * a + acc (one rounding),
// Exp(V), ZeroWhereNegInf(V key, V x) = (key == -inf ? 0 : x), and kAcc, the number of V
// accumulators that fit the register file next to one operand.
#pragma once

#include <cstdint>
#include <limits>

namespace peng::kernels {
namespace {

constexpr int kTileLanes = 16;

// s[j][lane] = sum_d k[j * k_stride + d] * qt[d][lane] for J keys, d in order (one FMA chain a
// lane and key).
template <class V, int J>
inline void ScoreKeys(const float* qt, const float* k, int64_t k_stride, int64_t dim, float* s) {
  V acc[J];
  for (int j = 0; j < J; ++j) acc[j] = V::Zero();
  for (int64_t d = 0; d < dim; ++d) {
    const V q = V::Load(qt + d * kTileLanes);
    for (int j = 0; j < J; ++j) acc[j] = V::FmaScalar(k[j * k_stride + d], q, acc[j]);
  }
  for (int j = 0; j < J; ++j) V::Store(s + j * kTileLanes, acc[j]);
}

template <class V>
void ScoreTile(const float* qt, const float* k, int64_t k_stride, int64_t n, int64_t dim,
               float* s) {
  int64_t j = 0;
  for (; j + V::kAcc <= n; j += V::kAcc)
    ScoreKeys<V, V::kAcc>(qt, k + j * k_stride, k_stride, dim, s + j * kTileLanes);
  for (; j + 4 <= n; j += 4)
    ScoreKeys<V, 4>(qt, k + j * k_stride, k_stride, dim, s + j * kTileLanes);
  for (; j < n; ++j) ScoreKeys<V, 1>(qt, k + j * k_stride, k_stride, dim, s + j * kTileLanes);
}

template <class V>
void SoftmaxTile(float* s, int64_t n, float* m, float* l, float* corr) {
  const V ninf = V::Set(-std::numeric_limits<float>::infinity());
  V block_max = ninf;
  for (int64_t j = 0; j < n; ++j) block_max = V::Max(block_max, V::Load(s + j * kTileLanes));
  const V m_old = V::Load(m);
  const V m_new = V::Max(m_old, block_max);
  // A lane with no key yet (m_new = -inf) shifts by 0: its weights are 0, not exp(-inf + inf).
  const V shift = V::ZeroWhereNegInf(m_new, m_new);
  const V c = V::ZeroWhereNegInf(m_old, V::Exp(V::Sub(m_old, shift)));
  V sum = V::Zero();
  for (int64_t j = 0; j < n; ++j) {
    const V x = V::Load(s + j * kTileLanes);
    const V e = V::ZeroWhereNegInf(x, V::Exp(V::Sub(x, shift)));
    V::Store(s + j * kTileLanes, e);
    sum = V::Add(sum, e);
  }
  V::Store(m, m_new);
  V::Store(l, V::Add(V::Mul(V::Load(l), c), sum));
  V::Store(corr, c);
}

// acc[d][lane] = acc[d][lane] * corr[lane] + sum_j v[j * v_stride + d] * p[j][lane] for D dims.
template <class V, int D>
inline void AccumDims(const float* p, const float* v, int64_t v_stride, int64_t n, V corr,
                      float* acc) {
  V a[D];
  for (int d = 0; d < D; ++d) a[d] = V::Mul(V::Load(acc + d * kTileLanes), corr);
  for (int64_t j = 0; j < n; ++j) {
    const V pj = V::Load(p + j * kTileLanes);
    for (int d = 0; d < D; ++d) a[d] = V::FmaScalar(v[j * v_stride + d], pj, a[d]);
  }
  for (int d = 0; d < D; ++d) V::Store(acc + d * kTileLanes, a[d]);
}

template <class V>
void AccumTile(const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dim,
               const float* corr, float* acc) {
  const V c = V::Load(corr);
  int64_t d = 0;
  for (; d + V::kAcc <= dim; d += V::kAcc)
    AccumDims<V, V::kAcc>(p, v + d, v_stride, n, c, acc + d * kTileLanes);
  for (; d < dim; ++d) AccumDims<V, 1>(p, v + d, v_stride, n, c, acc + d * kTileLanes);
}

}  // namespace
}  // namespace peng::kernels

// The exported primitives of cpu/ops_simd.h over an ISA's lane type, written inside that ISA's
// namespace (each file: PENG_DEFINE_ATTN_TILE_OPS(Lanes)).
#define PENG_DEFINE_ATTN_TILE_OPS(LANES)                                                        \
  void ScoreTile16(const float* qt, const float* k, int64_t k_stride, int64_t n, int64_t dim,   \
                   float* s) {                                                                  \
    ScoreTile<LANES>(qt, k, k_stride, n, dim, s);                                               \
  }                                                                                             \
  void SoftmaxTile16(float* s, int64_t n, float* m, float* l, float* corr) {                    \
    SoftmaxTile<LANES>(s, n, m, l, corr);                                                       \
  }                                                                                             \
  void AccumTile16(const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dim,    \
                   const float* corr, float* acc) {                                             \
    AccumTile<LANES>(p, v, v_stride, n, dim, corr, acc);                                        \
  }
