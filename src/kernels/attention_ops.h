// The row primitives both attention kernels (attention.cc: paged GQA attention, mla.cc:
// attention over MLA latent rows) are built from, selected once per call for the active ISA
// (scalar reference in ref/ops_ref.h, SIMD versions in cpu/). Internal to src/kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {

struct AttnOps {
  decltype(&ref::DotRowsF32) dot_f32;
  decltype(&ref::DotRowsF16) dot_f16;
  decltype(&ref::AxpyRowsF32) axpy_f32;
  decltype(&ref::AxpyRowsF16) axpy_f16;
  decltype(&ref::ExpShiftSum) exp_shift_sum;
  decltype(&ref::ScaleInPlace) scale;
  decltype(&ref::F32ToF16Row) to_f16;
  decltype(&ref::F16ToF32Row) to_f32;
  decltype(&ref::ScoreTile16) score_tile;
  decltype(&ref::SoftmaxTile16) softmax_tile;
  decltype(&ref::AccumTile16) accum_tile;
};

// The primitives of kernels::ActiveIsa() (attention.cc).
AttnOps SelectAttnOps();

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

  // scores[0..n) are overwritten; values: n rows of `dim` values, `stride` apart, F16 or F32.
  void Add(const AttnOps& ops, float* scores, int64_t n, const void* values, DType dtype,
           int64_t stride, int dim, float* acc) {
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
    if (dtype == DType::kF16) {
      ops.axpy_f16(scores, static_cast<const uint16_t*>(values), stride, n, dim, acc);
    } else {
      ops.axpy_f32(scores, static_cast<const float*>(values), stride, n, dim, acc);
    }
  }
  void Finish(const float* acc, int dim, float* out) const {
    const float inv = 1.0f / l;
    for (int i = 0; i < dim; ++i) out[i] = acc[i] * inv;
  }
};

}  // namespace peng::kernels
