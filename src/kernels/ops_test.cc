// Element-wise ops and RoPE: every SIMD ISA this CPU supports against the scalar reference, the
// reference against double-precision formulas, and RoPE / YaRN against independent math.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/ref/ops_ref.h"

namespace peng::kernels {
namespace {

// Restores the active ISA when a test that switches it ends.
class IsaGuard {
 public:
  IsaGuard() : saved_(ActiveIsa()) {}
  ~IsaGuard() { SetActiveIsa(saved_); }

 private:
  Isa saved_;
};

std::vector<Isa> SimdIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kNeonDot, Isa::kNeonI8mm})
    if (IsaSupported(isa)) out.push_back(isa);
  return out;
}

std::vector<float> Random(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// |got - want| <= rel * |want| for every element.
void ExpectRelNear(const std::vector<float>& got, const std::vector<double>& want, double rel,
                   const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), rel * std::abs(want[i]))
        << what << " i=" << i << " got=" << got[i] << " want=" << want[i];
  }
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Lengths that hit every vector-tail case for 4-, 8- and 16-wide code.
const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1000, 4099};

// SIMD vs reference: 2e-6 relative (exp is ~2 ulp, sums are reassociated); Add/Scale exact.
constexpr double kSimdRel = 2e-6;

TEST(ElementwiseIsa, MatchesReference) {
  IsaGuard guard;
  for (Isa isa : SimdIsas()) {
    SCOPED_TRACE(IsaName(isa));
    SetActiveIsa(isa);
    for (int64_t n : kLengths) {
      SCOPED_TRACE(n);
      const auto a = Random(n, -8.f, 8.f, 1 + n);
      const auto b = Random(n, -2.f, 2.f, 2 + n);
      std::vector<float> got(n), want(n);

      SiluMul(a.data(), b.data(), got.data(), n);
      ref::SiluMul(a.data(), b.data(), want.data(), n);
      ExpectRelNear(got, ToDouble(want), kSimdRel, "silu");

      // The compiler may fuse z + 0.044715 z^3 into an FMA in one path and not the other, so
      // u may differ by an ulp, and exp(-2u) by |2u| ulp.
      GeluTanhMul(a.data(), b.data(), got.data(), n);
      ref::GeluTanhMul(a.data(), b.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double u = 0.7978845608 * (a[i] + 0.044715 * a[i] * a[i] * a[i]);
        ASSERT_LE(std::abs(got[i] - want[i]), (kSimdRel + 1.2e-7 * std::abs(2 * u)) * std::abs(want[i]))
            << "gelu i=" << i;
      }

      got = a;
      want = a;
      AddInPlace(got.data(), b.data(), n);
      ref::AddInPlace(want.data(), b.data(), n);
      EXPECT_EQ(got, want);
      ScaleInPlace(got.data(), 0.37f, n);
      ref::ScaleInPlace(want.data(), 0.37f, n);
      EXPECT_EQ(got, want);

      const auto logits = Random(n, -30.f, 30.f, 3 + n);
      got = logits;
      want = logits;
      Softmax(got.data(), n);
      ref::Softmax(want.data(), n);
      ExpectRelNear(got, ToDouble(want), kSimdRel, "softmax");

      const auto w = Random(n, 0.5f, 1.5f, 4 + n);
      for (float offset : {0.f, 1.f}) {
        RmsNorm(a.data(), w.data(), offset, got.data(), 1, n, 1e-6f);
        ref::RmsNorm(a.data(), w.data(), offset, want.data(), 1, n, 1e-6f);
        ExpectRelNear(got, ToDouble(want), kSimdRel, "rmsnorm");
      }
    }
  }
}

// ArgMax / FindNanOrPosInf: exact indices on every ISA (the scalar one too) for rows built so
// the answer is known: a tie for the maximum, NaN and +/-inf at chosen places, every length.
TEST(ElementwiseIsa, LogitScansGiveExactIndices) {
  IsaGuard guard;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Isa> isas = SimdIsas();
  isas.push_back(Isa::kScalar);
  for (Isa isa : isas) {
    SCOPED_TRACE(IsaName(isa));
    SetActiveIsa(isa);
    for (int64_t n : kLengths) {
      SCOPED_TRACE(n);
      std::vector<float> x = Random(n, -10.f, 10.f, 5 + n);
      EXPECT_EQ(FindNanOrPosInf(x.data(), n), -1);
      EXPECT_EQ(FindAbove(x.data(), n, 10.f), n);
      const int64_t at = n / 2, tie = n - 1;
      x[at] = 11.f;
      x[tie] = 11.f;
      EXPECT_EQ(ArgMax(x.data(), n), std::min(at, tie));
      EXPECT_EQ(FindAbove(x.data(), n, 10.f), std::min(at, tie));
      EXPECT_EQ(FindAbove(x.data(), n, 11.f), n);  // (strictly above)
      x[tie] = -inf;  // -inf is an ordinary (small) value
      EXPECT_EQ(FindNanOrPosInf(x.data(), n), -1);
      x[0] = nan;  // skipped by ArgMax, found by the scan
      EXPECT_EQ(ArgMax(x.data(), n), n == 1 ? 0 : at);
      EXPECT_EQ(FindAbove(x.data(), n, 10.f), n == 1 ? 1 : at);  // (NaN is above nothing)
      EXPECT_EQ(FindNanOrPosInf(x.data(), n), 0);
      x[0] = 1.f;
      x[tie] = inf;
      EXPECT_EQ(ArgMax(x.data(), n), tie);
      EXPECT_EQ(FindNanOrPosInf(x.data(), n), tie);
      std::vector<float> all_nan(n, nan);
      EXPECT_EQ(ArgMax(all_nan.data(), n), 0);
      std::vector<float> low(n, -inf);  // NaN first, -inf after: the first -inf
      low[0] = nan;
      EXPECT_EQ(ArgMax(low.data(), n), n == 1 ? 0 : 1);
    }
  }
}

// TopK against a full sort of (value, index) pairs by the order it documents: value
// descending, -0.0 equal to +0.0, ties to the lower index, NaN last; rows with many ties. Lists
// up to kTopKInsertMax and past it (the selection's path).
TEST(Elementwise, TopKIsTheHeadOfTheSortedRow) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 2, 7, 64, 65, 1000, 6000}) {
    std::vector<float> x = Random(n, -4.f, 4.f, 31 + n);
    for (float& v : x) v = std::round(v * 2.f) / 2.f;  // 17 distinct values: ties everywhere
    if (n > 3) {
      x[1] = nan;
      x[2] = -0.f;
      x[3] = -inf;
      x[n - 1] = nan;
      x[n / 2] = 0.f;
    }
    std::vector<int32_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (std::isnan(x[a]) || std::isnan(x[b])) return !std::isnan(x[a]) && std::isnan(x[b]);
      return x[a] > x[b];
    });
    for (int k : {1, 2, 5, 40, 64, kTopKInsertMax, kTopKInsertMax + 1, 4096,
                  static_cast<int>(n)}) {
      if (k > n) continue;
      SCOPED_TRACE(testing::Message() << "n " << n << " k " << k);
      std::vector<float> val(k);
      std::vector<int32_t> idx(k);
      TopK(x.data(), n, k, val.data(), idx.data());
      for (int j = 0; j < k; ++j) {
        ASSERT_EQ(idx[j], order[j]) << j;
        ASSERT_EQ(std::memcmp(&val[j], &x[order[j]], 4), 0) << j;
      }
    }
  }
}

TEST(ElementwiseIsa, RmsNormRowsInPlace) {
  IsaGuard guard;
  const int64_t rows = 3, n = 77;
  const auto x = Random(rows * n, -3.f, 3.f, 9);
  const auto w = Random(n, -1.f, 1.f, 10);
  std::vector<float> want(rows * n);
  ref::RmsNorm(x.data(), w.data(), 0.f, want.data(), rows, n, 1e-5f);
  for (Isa isa : SimdIsas()) {
    SetActiveIsa(isa);
    std::vector<float> y = x;
    RmsNorm(y.data(), w.data(), 0.f, y.data(), rows, n, 1e-5f);  // aliasing x == y
    ExpectRelNear(y, ToDouble(want), kSimdRel, IsaName(isa));
  }
}

TEST(ElementwiseIsa, ExtremeInputs) {
  IsaGuard guard;
  const std::vector<float> g = {-200.f, -90.f, -30.f, -1e-3f, 0.f, 1e-3f, 30.f, 90.f, 200.f};
  const std::vector<float> up(g.size(), 1.f);
  for (Isa isa : SimdIsas()) {
    SCOPED_TRACE(IsaName(isa));
    SetActiveIsa(isa);
    std::vector<float> out(g.size());
    SiluMul(g.data(), up.data(), out.data(), g.size());
    EXPECT_EQ(out[0], 0.f);  // -200 / (1 + inf)
    EXPECT_EQ(out[4], 0.f);
    EXPECT_EQ(out[8], 200.f);
    EXPECT_NEAR(out[5], g[5] / (1 + std::exp(-double{g[5]})), 1e-6 * out[5]);
    GeluTanhMul(g.data(), up.data(), out.data(), g.size());
    EXPECT_EQ(out[0], 0.f);
    EXPECT_EQ(out[8], 200.f);
    for (float v : out) EXPECT_TRUE(std::isfinite(v));
    // Softmax with a huge spread: exp underflows to exactly 0 for the far-away entries.
    std::vector<float> s = {0.f, -1000.f, 1.f, -200.f};
    Softmax(s.data(), s.size());
    EXPECT_EQ(s[1], 0.f);
    EXPECT_EQ(s[3], 0.f);
    EXPECT_NEAR(s[2], 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
  }
}

// The reference against double-precision formulas.
TEST(ElementwiseRef, MatchesDoubleFormulas) {
  const int64_t n = 1000;
  const auto a = Random(n, -6.f, 6.f, 11);
  const auto b = Random(n, -2.f, 2.f, 12);
  const auto w = Random(n, -1.f, 1.f, 13);
  std::vector<float> got(n);
  std::vector<double> want(n);

  ref::SiluMul(a.data(), b.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] / (1.0 + std::exp(-double{a[i]})) * b[i];
  ExpectRelNear(got, want, 1e-6, "silu");  // exp, div, mul: <= ~3 ulp

  // gelu: u is computed in float32, so the exp(-2u) term carries |2u| * 1 ulp of relative error.
  ref::GeluTanhMul(a.data(), b.data(), got.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double z = a[i];
    const double u = std::sqrt(2.0 / std::numbers::pi) * (z + 0.044715 * z * z * z);
    want[i] = 0.5 * z * (1.0 + std::tanh(u)) * b[i];
    const double tol = 1.2e-7 * (6.0 + 2.0 * std::abs(u));
    ASSERT_LE(std::abs(got[i] - want[i]), tol * std::abs(want[i])) << "gelu i=" << i;
  }

  ref::RmsNorm(a.data(), w.data(), 1.f, got.data(), 1, n, 1e-6f);
  double ss = 0;
  for (float v : a) ss += double{v} * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
  for (int64_t i = 0; i < n; ++i) want[i] = a[i] * inv * (w[i] + 1.0);
  ExpectRelNear(got, want, 1e-6, "rmsnorm");

  got = Random(n, -20.f, 20.f, 14);
  const std::vector<float> logits = got;
  ref::Softmax(got.data(), n);
  double mx = -1e300, sum = 0;
  for (float v : logits) mx = std::max(mx, double{v});
  for (float v : logits) sum += std::exp(v - mx);
  // x - max is rounded to float32 first (as every float32 softmax does): |x - max| * 2^-24 of
  // absolute error in the exponent.
  for (int64_t i = 0; i < n; ++i) {
    want[i] = std::exp(logits[i] - mx) / sum;
    ASSERT_LE(std::abs(got[i] - want[i]), (1e-6 + 6e-8 * (mx - logits[i])) * want[i]) << i;
  }
}

TEST(ElementwiseRef, SmallExactValues) {
  std::vector<float> x = {1.f, 2.f, 3.f, 4.f};
  ref::Softmax(x.data(), 4);
  const double e = std::exp(1.0), z = 1 + e + e * e + e * e * e;
  EXPECT_NEAR(x[0], 1 / z, 1e-8);
  EXPECT_NEAR(x[3], e * e * e / z, 1e-7);
  const float v[2] = {3.f, 4.f}, w[2] = {1.f, 2.f};
  float y[2];
  ref::RmsNorm(v, w, 0.f, y, 1, 2, 0.f);  // rms = sqrt(12.5)
  EXPECT_FLOAT_EQ(y[0], 3.f / std::sqrt(12.5f));
  EXPECT_FLOAT_EQ(y[1], 8.f / std::sqrt(12.5f));
}

// ---------------------------------------------------------------------------------------------
// RoPE

TEST(Rope, DefaultAndLinearInvFreq) {
  RopeConfig cfg;
  cfg.rot_dim = 128;
  cfg.theta = 500000.f;
  std::vector<float> inv(64);
  ComputeRopeInvFreq(cfg, inv.data());
  EXPECT_EQ(inv[0], 1.f);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(inv[i], std::pow(500000.0, -2.0 * i / 128), 1e-6 * inv[i]) << i;
  cfg.scaling = RopeConfig::Scaling::kLinear;
  cfg.factor = 4.f;
  std::vector<float> lin(64);
  ComputeRopeInvFreq(cfg, lin.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(lin[i], inv[i] / 4.f) << i;
}

TEST(Rope, YarnDeepSeekV2) {
  RopeConfig cfg;
  cfg.rot_dim = 64;
  cfg.theta = 10000.f;
  cfg.style = RopeStyle::kInterleaved;
  cfg.scaling = RopeConfig::Scaling::kYarn;
  cfg.factor = 40.f;
  cfg.original_max_position = 4096;
  cfg.beta_fast = 32.f;
  cfg.beta_slow = 1.f;
  std::vector<float> inv(32);
  ComputeRopeInvFreq(cfg, inv.data());

  // Independent double-precision YaRN.
  const double dim = 64, base = 1e4, lo_max = 4096, factor = 40;
  auto corr_dim = [&](double rot) {
    return dim * std::log(lo_max / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(corr_dim(32)), 0.0);
  const double high = std::min(std::ceil(corr_dim(1)), dim - 1);
  EXPECT_EQ(low, 10);
  EXPECT_EQ(high, 23);
  for (int i = 0; i < 32; ++i) {
    const double extrap = std::pow(base, -2.0 * i / dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = extrap / factor * ramp + extrap * (1 - ramp);
    EXPECT_NEAR(inv[i], want, 1e-6 * want) << i;
    if (i <= 10) {
      EXPECT_NEAR(inv[i], extrap, 1e-6 * extrap) << i;
    }
    if (i >= 23) {
      EXPECT_NEAR(inv[i], extrap / 40, 1e-6 * extrap / 40) << i;
    }
  }
  EXPECT_EQ(inv[0], 1.f);
  EXPECT_NEAR(inv[1], 0.7498942093324559, 1e-7);             // 1e4^(-1/32)
  EXPECT_NEAR(inv[31], std::pow(1e4, -62.0 / 64) / 40, 1e-13);  // 3.1e-6 / ... interpolated
}

// x' = rotation of x at `pos`, in double from the same float32 inv_freq and angle rounding.
std::vector<double> RotateDouble(const std::vector<float>& x, int64_t n_heads, int64_t head_dim,
                                 int64_t pos, const RopeConfig& cfg, const float* inv,
                                 bool float_angle) {
  std::vector<double> out(x.begin(), x.end());
  const int half = cfg.rot_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const double theta = float_angle ? double{static_cast<float>(pos) * inv[i]}
                                       : pos * std::pow(double{cfg.theta}, -2.0 * i / cfg.rot_dim);
      const int64_t ia = h * head_dim + (cfg.style == RopeStyle::kNeox ? i : 2 * i);
      const int64_t ib = h * head_dim + (cfg.style == RopeStyle::kNeox ? i + half : 2 * i + 1);
      const double a = x[ia], b = x[ib], c = std::cos(theta), s = std::sin(theta);
      out[ia] = cfg.attention_factor * (a * c - b * s);
      out[ib] = cfg.attention_factor * (a * s + b * c);
    }
  }
  return out;
}

TEST(Rope, ApplyMatchesDirectRotation) {
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kInterleaved}) {
    for (float attention_factor : {1.f, 1.25f}) {
      RopeConfig cfg;
      cfg.rot_dim = 32;  // < head_dim: dims 32..63 pass through
      cfg.style = style;
      cfg.attention_factor = attention_factor;
      const int64_t n_heads = 3, head_dim = 64;
      std::vector<float> inv(16);
      ComputeRopeInvFreq(cfg, inv.data());
      for (int64_t pos : {0, 1, 37, 5000}) {
        SCOPED_TRACE(pos);
        const auto x = Random(n_heads * head_dim, -2.f, 2.f, 20 + pos);
        std::vector<float> y = x;
        ApplyRope(y.data(), n_heads, head_dim, pos, cfg, inv.data());
        const auto same_angle = RotateDouble(x, n_heads, head_dim, pos, cfg, inv.data(), true);
        const auto exact = RotateDouble(x, n_heads, head_dim, pos, cfg, inv.data(), false);
        // float32 angle rounding: |d theta| <= pos * 2^-23 (|theta| <= pos, inv <= 1).
        const double angle_tol = 4e-6 + pos * 1.2e-7 * 2 * 2;
        for (int64_t j = 0; j < n_heads * head_dim; ++j) {
          if (j % head_dim >= cfg.rot_dim) {
            EXPECT_EQ(y[j], x[j]) << j;
            continue;
          }
          ASSERT_NEAR(y[j], same_angle[j], 1e-6) << j;
          ASSERT_NEAR(y[j], exact[j], angle_tol) << j;
        }
        if (pos == 0 && attention_factor == 1.f) {
          EXPECT_EQ(y, x);
        }
      }
    }
  }
}

TEST(Rope, NeoxAndInterleavedPairs) {
  // One head, rot_dim 4, pos 1, theta chosen so that inv_freq = {1, 0.01}.
  RopeConfig cfg;
  cfg.rot_dim = 4;
  cfg.theta = 10000.f;
  float inv[2];
  ComputeRopeInvFreq(cfg, inv);
  EXPECT_EQ(inv[0], 1.f);
  EXPECT_FLOAT_EQ(inv[1], 0.01f);
  float neox[6] = {1, 2, 3, 4, 5, 6};
  ApplyRope(neox, 1, 6, 1, cfg, inv);  // pairs (0,2), (1,3)
  EXPECT_FLOAT_EQ(neox[0], std::cos(1.f) * 1 - std::sin(1.f) * 3);
  EXPECT_FLOAT_EQ(neox[2], std::sin(1.f) * 1 + std::cos(1.f) * 3);
  EXPECT_FLOAT_EQ(neox[1], std::cos(0.01f) * 2 - std::sin(0.01f) * 4);
  EXPECT_EQ(neox[4], 5.f);
  EXPECT_EQ(neox[5], 6.f);
  cfg.style = RopeStyle::kInterleaved;
  float inter[4] = {1, 2, 3, 4};
  ApplyRope(inter, 1, 4, 1, cfg, inv);  // pairs (0,1), (2,3)
  EXPECT_FLOAT_EQ(inter[0], std::cos(1.f) * 1 - std::sin(1.f) * 2);
  EXPECT_FLOAT_EQ(inter[1], std::sin(1.f) * 1 + std::cos(1.f) * 2);
  EXPECT_FLOAT_EQ(inter[3], std::sin(0.01f) * 3 + std::cos(0.01f) * 4);
}

}  // namespace
}  // namespace peng::kernels
