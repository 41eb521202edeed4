// Rotary position embedding: inverse frequencies (default, linear, YaRN) computed in float32
// the way HF transformers does, and the rotation itself (scalar; see ref::ApplyRope for how the
// angles are rounded).
#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {
namespace {

// The (fractional) dimension index whose wavelength makes n_rotations full turns over
// max_position tokens; in double like HF (Python math).
double YarnCorrectionDim(double n_rotations, int dim, double base, int max_position) {
  return dim * std::log(max_position / (n_rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

}  // namespace

void ComputeRopeInvFreq(const RopeConfig& cfg, float* inv_freq) {
  const int dim = cfg.rot_dim;
  const int half = dim / 2;
  PENG_CHECK(dim > 0 && dim % 2 == 0);
  const bool scaled = cfg.factor > 1.f;
  const bool yarn = scaled && cfg.scaling == RopeConfig::Scaling::kYarn;
  double low = 0.0;
  double high = 0.0;
  if (yarn) {
    PENG_CHECK_MSG(cfg.original_max_position > 0, "YaRN needs original_max_position");
    low = std::max(std::floor(YarnCorrectionDim(cfg.beta_fast, dim, cfg.theta,
                                                cfg.original_max_position)),
                   0.0);
    high = std::min(std::ceil(YarnCorrectionDim(cfg.beta_slow, dim, cfg.theta,
                                                cfg.original_max_position)),
                    static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
  }
  const float low_f = static_cast<float>(low);
  const float range_f = static_cast<float>(high - low);
  for (int i = 0; i < half; ++i) {
    // HF: base ** (arange(0, dim, 2).float() / dim), all float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float pos_freq = std::pow(cfg.theta, exponent);
    const float extrap = 1.0f / pos_freq;
    if (!scaled || cfg.scaling == RopeConfig::Scaling::kNone) {
      inv_freq[i] = extrap;
    } else if (!yarn) {
      inv_freq[i] = extrap / cfg.factor;
    } else {
      const float interp = 1.0f / (cfg.factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - low_f) / range_f, 0.f, 1.f);
      const float extrap_weight = 1.0f - ramp;
      inv_freq[i] = interp * (1.0f - extrap_weight) + extrap * extrap_weight;
    }
  }
}

void ApplyRope(float* x, int64_t n_heads, int64_t head_dim, int64_t pos, const RopeConfig& cfg,
               const float* inv_freq) {
  ref::ApplyRope(x, n_heads, head_dim, pos, cfg, inv_freq);
}

void RopeCosSin(int64_t pos, const RopeConfig& cfg, const float* inv_freq, float* cs) {
  ref::RopeCosSin(pos, cfg, inv_freq, cs);
}

void ApplyRopeCosSin(float* x, int64_t n_heads, int64_t head_dim, const RopeConfig& cfg,
                     const float* cs) {
  ref::ApplyRopeCosSin(x, n_heads, head_dim, cfg, cs);
}

}  // namespace peng::kernels
