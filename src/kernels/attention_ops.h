// The row primitives both attention kernels (attention.cc: paged GQA attention, mla.cc:
// attention over MLA latent rows) are built from, selected once per call for the active ISA
// (scalar reference in ref/ops_ref.h, SIMD versions in cpu/). Internal to src/kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {

struct AttnOps {
  decltype(&ref::DotRowsF32) dot_f32;
  decltype(&ref::DotRowsF16) dot_f16;
  decltype(&ref::AxpyRowsF32) axpy_f32;
  decltype(&ref::AxpyRowsF16) axpy_f16;
  decltype(&ref::DotRowsQ8_0) dot_q8_0;
  decltype(&ref::AxpyRowsQ8_0) axpy_q8_0;
  decltype(&ref::ExpShiftSum) exp_shift_sum;
  decltype(&ref::ScaleInPlace) scale;
  decltype(&ref::F32ToF16Row) to_f16;
  decltype(&ref::F16ToF32Row) to_f32;
  decltype(&ref::Q8_0ToF32Row) q8_0_to_f32;
  decltype(&ref::HadamardRows) hadamard;
  decltype(&ref::ScoreTile16) score_tile;
  decltype(&ref::SoftmaxTile16) softmax_tile;
  decltype(&ref::AccumTile16) accum_tile;
};

// The primitives of kernels::ActiveIsa() (attention.cc).
AttnOps SelectAttnOps();

// The rows of a KV cache of type F32, F16 or Q8_0 are addressed in values, as if every value
// had its own slot: value `off` of the cache starts at byte CacheBytes(t, off). A Q8_0 cache's
// rows are whole 32-value blocks (its head dimensions are multiples of 32), so every row's
// offset is a block boundary. These are the only places that tell the cache types apart.
inline int64_t CacheBytes(DType t, int64_t off) {
  switch (t) {
    case DType::kF16: return off * 2;
    case DType::kQ8_0: return off / 32 * 34;
    default: return off * 4;
  }
}

// out[j] = dot(q[0..dim), row j) for the n rows at values off + j * stride of `cache`.
inline void DotCacheRows(const AttnOps& ops, DType t, const float* q, const void* cache,
                         int64_t off, int64_t stride, int64_t n, int64_t dim, float* out) {
  const auto* base = static_cast<const uint8_t*>(cache) + CacheBytes(t, off);
  switch (t) {
    case DType::kF16:
      ops.dot_f16(q, reinterpret_cast<const uint16_t*>(base), stride, n, dim, out);
      break;
    case DType::kQ8_0: ops.dot_q8_0(q, base, CacheBytes(t, stride), n, dim, out); break;
    default: ops.dot_f32(q, reinterpret_cast<const float*>(base), stride, n, dim, out);
  }
}

// acc[0..dim) += sum_j w[j] * row j, the rows as in DotCacheRows.
inline void AxpyCacheRows(const AttnOps& ops, DType t, const float* w, const void* cache,
                          int64_t off, int64_t stride, int64_t n, int64_t dim, float* acc) {
  const auto* base = static_cast<const uint8_t*>(cache) + CacheBytes(t, off);
  switch (t) {
    case DType::kF16:
      ops.axpy_f16(w, reinterpret_cast<const uint16_t*>(base), stride, n, dim, acc);
      break;
    case DType::kQ8_0: ops.axpy_q8_0(w, base, CacheBytes(t, stride), n, dim, acc); break;
    default: ops.axpy_f32(w, reinterpret_cast<const float*>(base), stride, n, dim, acc);
  }
}

// y[j * dim + i] = value i of row j (exact), the rows as in DotCacheRows.
inline void CacheRowsToF32(const AttnOps& ops, DType t, const void* cache, int64_t off,
                           int64_t stride, int64_t n, int64_t dim, float* y) {
  const auto* base = static_cast<const uint8_t*>(cache) + CacheBytes(t, off);
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = base + CacheBytes(t, j * stride);
    switch (t) {
      case DType::kF16: ops.to_f32(reinterpret_cast<const uint16_t*>(row), y + j * dim, dim); break;
      case DType::kQ8_0: ops.q8_0_to_f32(row, y + j * dim, dim); break;
      default: std::copy_n(reinterpret_cast<const float*>(row), dim, y + j * dim);
    }
  }
}

// A Q8_0 cache holds its rows rotated: each run of `block` values (RotationBlock) multiplied by
// the orthonormal Walsh-Hadamard matrix H (ref::HadamardRows) before it is quantized. That
// spreads a row's few large values (Qwen2's keys have some in every layer) over the run, so a
// 32-value block's scale no longer leaves its other values a handful of steps. Scores are
// unchanged when the queries are rotated alike (q . k = Hq . Hk), and a weighted sum of rotated
// values is the rotated sum, so the attention's output is rotated back (H is its own inverse).
// llama.cpp rotates its quantized caches too. The runs are 64 values where the dimensions allow
// (every head dimension of the models peng runs), else 32: RotationBlock in ops.h.

// Stores x[0..n) at value `off` of `cache`: F16 rounded to nearest even; Q8_0 rotated in runs of
// `block` values, then ref::F32ToQ8_0Row (the same bits on every ISA: every ISA's HadamardRows
// computes the reference's sums).
inline void WriteCacheRow(const AttnOps& ops, DType t, const float* x, void* cache, int64_t off,
                          int64_t n, int block) {
  auto* base = static_cast<uint8_t*>(cache) + CacheBytes(t, off);
  switch (t) {
    case DType::kF16: ops.to_f16(x, reinterpret_cast<uint16_t*>(base), n); break;
    case DType::kQ8_0: {
      thread_local std::vector<float> rotated;
      rotated.assign(x, x + n);
      ops.hadamard(rotated.data(), 1, n, block);
      ref::F32ToQ8_0Row(rotated.data(), base, n);
      break;
    }
    default: std::copy_n(x, n, reinterpret_cast<float*>(base));
  }
}

// A softmax-weighted sum computed in parts of its keys (each part k with its own maximum m_k,
// sum l_k = sum_j exp(s_j - m_k) and unnormalized acc_k), merged in part order:
// out[d] = sum_k e_k acc_k[d] / sum_k e_k l_k, e_k = exp(m_k - M), M the largest m_k.
// Part k's m and l are m[k * ml_stride] and l[k * ml_stride], its value d acc[k * acc_stride +
// d * d_stride]. The decode attentions of attention.cc and mla.cc merge their parts with it.
inline void MergeParts(int n_parts, const float* m, const float* l, int64_t ml_stride,
                       const float* acc, int64_t acc_stride, int64_t d_stride, int dim,
                       float* out) {
  float mx = m[0];
  for (int k = 1; k < n_parts; ++k) mx = std::max(mx, m[k * ml_stride]);
  std::fill_n(out, dim, 0.f);
  float sum = 0.f;
  for (int k = 0; k < n_parts; ++k) {
    const float e = std::exp(m[k * ml_stride] - mx);
    sum += e * l[k * ml_stride];
    const float* a = acc + k * acc_stride;
    for (int d = 0; d < dim; ++d) out[d] += e * a[d * d_stride];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < dim; ++d) out[d] *= inv;
}

// Streaming (flash-attention style) softmax-weighted sum over blocks of keys: Add() takes one
// block's final scores (scaled, soft-capped) and its value rows, rescaling the running sum when
// the maximum grows; Finish() writes acc / l. acc holds `dim` floats, zeroed by the caller.
struct OnlineSoftmax {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.f;

  // scores[0..n) are overwritten; values: the n cache rows at values off + j * stride of
  // `cache` (DotCacheRows), of which the first `dim` values are summed.
  void Add(const AttnOps& ops, float* scores, int64_t n, const void* cache, DType dtype,
           int64_t off, int64_t stride, int dim, float* acc) {
    float block_max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) block_max = std::max(block_max, scores[j]);
    if (block_max > m) {
      if (l > 0.f) {
        const float corr = std::exp(m - block_max);
        ops.scale(acc, corr, dim);
        l *= corr;
      }
      m = block_max;
    }
    l += ops.exp_shift_sum(scores, n, m);
    AxpyCacheRows(ops, dtype, scores, cache, off, stride, n, dim, acc);
  }
  void Finish(const float* acc, int dim, float* out) const {
    const float inv = 1.0f / l;
    for (int i = 0; i < dim; ++i) out[i] = acc[i] * inv;
  }
};

}  // namespace peng::kernels
