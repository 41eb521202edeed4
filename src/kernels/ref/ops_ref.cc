#include "kernels/ref/ops_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/half.h"
#include "kernels/quant_blocks.h"

namespace peng::kernels::ref {

void RmsNorm(const float* x, const float* w, float w_offset, float* y, int64_t n_rows, int64_t n,
             float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * s) * (w[i] + w_offset);
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  const float inv = 1.0f / ExpShiftSum(x, n, m);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float z = gate[i];
    out[i] = z / (1.0f + std::exp(-z)) * up[i];
  }
}

// gelu_tanh(z) = 0.5 z (1 + tanh(u)) with u = sqrt(2/pi) (z + 0.044715 z^3), evaluated as the
// equal z / (1 + exp(-2u)), which keeps full relative accuracy where tanh(u) is near -1.
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float z = gate[i];
    const float z3 = (z * z) * z;
    const float u = kSqrt2OverPi * (z + kCubic * z3);
    out[i] = z / (1.0f + std::exp(-2.0f * u)) * up[i];
  }
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void ScaleInPlace(float* y, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

int64_t ArgMax(const float* x, int64_t n) {
  int64_t best = -1;
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    // strict: ties keep the lowest index; NaN compares neither greater nor equal
    if (x[i] > m || (best < 0 && x[i] == m)) {
      m = x[i];
      best = i;
    }
  }
  return best < 0 ? 0 : best;
}

int64_t FindNanOrPosInf(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!(x[i] < std::numeric_limits<float>::infinity())) return i;
  return -1;
}

int64_t FindAbove(const float* x, int64_t n, float w) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > w) return i;
  return n;
}

// Angles follow HF: theta_i = float32(float32(pos) * inv_freq[i]); cos and sin of that float32
// angle are evaluated in double and rounded to float32 (a correctly rounded float32 cos/sin),
// then multiplied by attention_factor in float32. The rotation itself is in float32.
void RopeCosSin(int64_t pos, const RopeConfig& cfg, const float* inv_freq, float* cs) {
  const int half = cfg.rot_dim / 2;
  const float fpos = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float theta = fpos * inv_freq[i];
    cs[i] = static_cast<float>(std::cos(static_cast<double>(theta))) * cfg.attention_factor;
    cs[half + i] = static_cast<float>(std::sin(static_cast<double>(theta))) * cfg.attention_factor;
  }
}

void ApplyRope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const RopeConfig& cfg,
               const float* inv_freq) {
  constexpr int kMaxRot = 1024;
  PENG_CHECK(cfg.rot_dim <= kMaxRot);
  float cs[kMaxRot];
  ref::RopeCosSin(pos, cfg, inv_freq, cs);
  ref::ApplyRopeCosSin(x, n_heads, head_dim, cfg, cs);
}

void ApplyRopeCosSin(float* x, int64_t n_heads, int64_t head_dim, const RopeConfig& cfg,
                     const float* cs) {
  const int half = cfg.rot_dim / 2;
  PENG_CHECK(cfg.rot_dim % 2 == 0 && cfg.rot_dim <= head_dim);
  const float* cos_t = cs;
  const float* sin_t = cs + half;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * head_dim;
    for (int i = 0; i < half; ++i) {
      // (a, b) is the pair rotated by theta_i.
      float* a = cfg.style == RopeStyle::kInterleaved ? &xh[2 * i] : &xh[i];
      float* b = cfg.style == RopeStyle::kInterleaved ? &xh[2 * i + 1] : &xh[i + half];
      const float x0 = *a;
      const float x1 = *b;
      *a = x0 * cos_t[i] - x1 * sin_t[i];
      *b = x1 * cos_t[i] + x0 * sin_t[i];
    }
  }
}

void DotRowsF32(const float* q, const float* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* kr = k + r * k_stride;
    float s = 0.f;
    for (int64_t i = 0; i < dim; ++i) s += q[i] * kr[i];
    out[r] = s;
  }
}

void DotRowsF16(const float* q, const uint16_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint16_t* kr = k + r * k_stride;
    float s = 0.f;
    for (int64_t i = 0; i < dim; ++i) s += q[i] * F16ToF32(kr[i]);
    out[r] = s;
  }
}

void AxpyRowsF32(const float* w, const float* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* vr = v + r * v_stride;
    for (int64_t i = 0; i < dim; ++i) acc[i] += w[r] * vr[i];
  }
}

void AxpyRowsF16(const float* w, const uint16_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                 float* acc) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint16_t* vr = v + r * v_stride;
    for (int64_t i = 0; i < dim; ++i) acc[i] += w[r] * F16ToF32(vr[i]);
  }
}

namespace {

// Value i of a row of Q8_0 blocks.
inline float Q8_0Value(const uint8_t* row, int64_t i) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + i / kQK;
  return F16ToF32(b->d) * static_cast<float>(b->qs[i % kQK]);
}

}  // namespace

void DotRowsQ8_0(const float* q, const uint8_t* k, int64_t k_stride, int64_t n_rows, int64_t dim,
                 float* out) {
  PENG_DCHECK(dim % kQK == 0);
  for (int64_t r = 0; r < n_rows; ++r) {
    float s = 0.f;
    for (int64_t i = 0; i < dim; ++i) s += q[i] * Q8_0Value(k + r * k_stride, i);
    out[r] = s;
  }
}

void AxpyRowsQ8_0(const float* w, const uint8_t* v, int64_t v_stride, int64_t n_rows, int64_t dim,
                  float* acc) {
  PENG_DCHECK(dim % kQK == 0);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) acc[i] += w[r] * Q8_0Value(v + r * v_stride, i);
  }
}

void Q8_0ToF32Row(const uint8_t* x, float* y, int64_t n) {
  PENG_DCHECK(n % kQK == 0);
  for (int64_t i = 0; i < n; ++i) y[i] = Q8_0Value(x, i);
}

void F32ToQ8_0Row(const float* x, uint8_t* y, int64_t n) {
  PENG_CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.f;  // (plain comparisons: std::fmax is a library call)
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    float d, id;
    ActBlockScale(amax, kQK, &d, &id);
    BlockQ8_0 blk;
    blk.d = F32ToF16(d);
    for (int i = 0; i < kQK; ++i) {
      const float v = std::nearbyint(xb[i] * id);  // |v| <= 127 but for rounding: clamped
      blk.qs[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
    std::memcpy(y + b * sizeof(BlockQ8_0), &blk, sizeof(BlockQ8_0));
  }
}

void HadamardRows(float* x, int64_t n_rows, int64_t dim, int block) {
  PENG_CHECK(block > 0 && (block & (block - 1)) == 0 && dim % block == 0);
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
  for (int64_t b = 0; b < n_rows * dim; b += block) {
    float* v = x + b;
    for (int h = 1; h < block; h *= 2) {
      for (int i = 0; i < block; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = v[j], c = v[j + h];
          v[j] = a + c;
          v[j + h] = a - c;
        }
      }
    }
    for (int i = 0; i < block; ++i) v[i] *= norm;
  }
}

float ExpShiftSum(float* x, int64_t n, float m) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return static_cast<float>(sum);
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = F32ToF16(x[i]);
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = F16ToF32(x[i]);
}

void ScoreTile16(const float* qt, const float* k, int64_t k_stride, int64_t n, int64_t dim,
                 float* s) {
  for (int64_t j = 0; j < n; ++j) {
    for (int lane = 0; lane < 16; ++lane) {
      float sum = 0.f;
      for (int64_t d = 0; d < dim; ++d) sum += k[j * k_stride + d] * qt[d * 16 + lane];
      s[j * 16 + lane] = sum;
    }
  }
}

void SoftmaxTile16(float* s, int64_t n, float* m, float* l, float* corr) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int lane = 0; lane < 16; ++lane) {
    float m_new = m[lane];
    for (int64_t j = 0; j < n; ++j) m_new = std::max(m_new, s[j * 16 + lane]);
    const float shift = m_new == ninf ? 0.f : m_new;
    const float c = m[lane] == ninf ? 0.f : std::exp(m[lane] - shift);
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      float& x = s[j * 16 + lane];
      x = x == ninf ? 0.f : std::exp(x - shift);
      sum += x;
    }
    m[lane] = m_new;
    l[lane] = l[lane] * c + static_cast<float>(sum);
    corr[lane] = c;
  }
}

void AccumTile16(const float* p, const float* v, int64_t v_stride, int64_t n, int64_t dim,
                 const float* corr, float* acc) {
  for (int64_t d = 0; d < dim; ++d) {
    for (int lane = 0; lane < 16; ++lane) {
      float a = acc[d * 16 + lane] * corr[lane];
      for (int64_t j = 0; j < n; ++j) a += v[j * v_stride + d] * p[j * 16 + lane];
      acc[d * 16 + lane] = a;
    }
  }
}

}  // namespace peng::kernels::ref
