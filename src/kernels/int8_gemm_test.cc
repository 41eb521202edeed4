// Tests of the INT8 GEMM (int8_gemm.h): every SIMD ISA against the scalar reference (W8A8 with
// unit scales compared bit for bit -- the int32 group dots are exact and every partial sum is an
// integer below 2^24 -- and with real scales within FP32 rounding), the reference against an
// int64 brute force, quantization round trips and rounding, W8A16 against a double-precision
// reference, odd shapes, thread pools, all-zero rows, outliers, and GEMV/prefill speed prints
// (not asserted).
#include "kernels/int8_gemm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "kernels/isa.h"
#include "kernels/ops.h"
#include "kernels/ref/int8_ref.h"

namespace peng::kernels {
namespace {

struct OwnedWeights {
  std::vector<int8_t> q;
  std::vector<float> scales;
  int64_t rows = 0, cols = 0;
  Int8Weights View() const { return {q.data(), scales.data(), rows, cols}; }
};

// Activations quantized for W8A8: q [n, cols], scales [n, cols / 32].
struct QuantActs {
  std::vector<int8_t> q;
  std::vector<float> s;
};
QuantActs Quantize(const std::vector<float>& x, int64_t n, int64_t cols) {
  QuantActs a{std::vector<int8_t>(n * cols), std::vector<float>(n * cols / kInt8ActGroup)};
  QuantizeActivations(x.data(), n, cols, a.q.data(), a.s.data());
  return a;
}

// y = sum_g xs[t, g] * dot_g * ws[r] in double, and mag = the same sum over |products| (which
// bounds the FP32 accumulation error in any order).
void DoubleW8A8(const Int8Weights& w, const QuantActs& a, int64_t t, int64_t r, double* y,
                double* mag) {
  const int64_t groups = w.cols / kInt8ActGroup;
  *y = *mag = 0;
  for (int64_t g = 0; g < groups; ++g) {
    int64_t d = 0, m = 0;
    for (int64_t c = g * kInt8ActGroup; c < (g + 1) * kInt8ActGroup; ++c) {
      d += int64_t{w.q[r * w.cols + c]} * a.q[t * w.cols + c];
      m += std::abs(int64_t{w.q[r * w.cols + c]} * a.q[t * w.cols + c]);
    }
    *y += double(d) * a.s[t * groups + g] * w.scales[r];
    *mag += double(m) * a.s[t * groups + g] * w.scales[r];
  }
}

std::vector<float> RandomFloats(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

OwnedWeights QuantizedWeights(int64_t rows, int64_t cols, std::mt19937& rng) {
  OwnedWeights w;
  w.rows = rows;
  w.cols = cols;
  std::vector<float> f = RandomFloats(rows * cols, rng);
  for (int64_t r = 0; r < rows; ++r)  // per-row magnitudes spanning 1e-3 .. 1e2
    for (int64_t c = 0; c < cols; ++c) f[r * cols + c] *= std::pow(10.f, float(r % 6) - 3.f);
  w.q.resize(rows * cols);
  w.scales.resize(rows);
  QuantizeWeightsPerRow(f.data(), rows, cols, w.q.data(), w.scales.data());
  return w;
}

std::vector<Isa> SimdIsas() {
  std::vector<Isa> v;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kNeon, Isa::kNeonDot, Isa::kNeonI8mm})
    if (IsaSupported(isa)) v.push_back(isa);
  return v;
}

// Restores the active ISA on scope exit.
class IsaGuard {
 public:
  IsaGuard() : saved_(ActiveIsa()) {}
  ~IsaGuard() { SetActiveIsa(saved_); }

 private:
  Isa saved_;
};

std::vector<float> RefW8A8(const Int8Weights& w, const int8_t* xq, const float* xs, int64_t n) {
  std::vector<float> y(n * w.rows);
  Int8Args a;
  a.w = w;
  a.xq = xq;
  a.x_scales = xs;
  a.y = y.data();
  ref::Int8MatMulW8A8(a, 0, w.rows, 0, n);
  return y;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Int8GemmTest, ReferenceMatchesInt64BruteForce) {
  std::mt19937 rng(1);
  const int64_t rows = 7, cols = 96, n = 3;
  OwnedWeights w = QuantizedWeights(rows, cols, rng);
  std::vector<float> x = RandomFloats(n * cols, rng);
  const QuantActs a = Quantize(x, n, cols);
  const std::vector<float> y = RefW8A8(w.View(), a.q.data(), a.s.data(), n);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double want, mag;
      DoubleW8A8(w.View(), a, t, r, &want, &mag);
      EXPECT_NEAR(y[t * rows + r], want, 1e-6 * mag + 1e-30) << t << "," << r;
    }
}

// Every ISA against the reference. Unit scales: every partial sum is an integer below 2^24, so
// all accumulation orders give the exact same (integer) result. Real scales: FP32 rounding.
TEST(Int8GemmTest, EveryIsaMatchesReference) {
  IsaGuard guard;
  ThreadPool pool1(1), pool2(2);
  std::mt19937 rng(2);
  for (int64_t cols : {32, 96, 256}) {
    for (int64_t rows : {1, 3, 37, 64}) {
      OwnedWeights w = QuantizedWeights(rows, cols, rng);
      OwnedWeights w1 = w;
      w1.scales.assign(rows, 1.f);
      for (int64_t n : {1, 2, 5, 17, 70}) {
        std::vector<float> x = RandomFloats(n * cols, rng);
        const QuantActs a = Quantize(x, n, cols);
        const std::vector<float> ones(a.s.size(), 1.f);
        const std::vector<float> want = RefW8A8(w.View(), a.q.data(), a.s.data(), n);
        const std::vector<float> want1 = RefW8A8(w1.View(), a.q.data(), ones.data(), n);
        for (Isa isa : SimdIsas()) {
          SetActiveIsa(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool2}) {
            const std::string what = std::string(IsaName(isa)) + " rows=" + std::to_string(rows) +
                                     " cols=" + std::to_string(cols) + " n=" + std::to_string(n) +
                                     " threads=" +
                                     std::to_string(pool ? pool->num_threads() : 0);
            std::vector<float> y1(n * rows, -1.f), y(n * rows, -1.f);
            Int8MatMul(w1.View(), a.q.data(), ones.data(), n, y1.data(), pool);
            EXPECT_TRUE(BitEqual(y1, want1)) << what;
            Int8MatMul(w.View(), a.q.data(), a.s.data(), n, y.data(), pool);
            for (int64_t t = 0; t < n; ++t)
              for (int64_t r = 0; r < rows; ++r) {
                double ref, mag;
                DoubleW8A8(w.View(), a, t, r, &ref, &mag);
                ASSERT_NEAR(y[t * rows + r], ref, 1e-6 * mag + 1e-30) << what;
              }
          }
        }
      }
    }
  }
}

// Weights packed at load time (PackPanels of the kI8 tensor, Int8Weights::panels) give the
// row-major results bit for bit, W8A8 and W8A16: a partial last panel and group (37 rows), a
// 32-column tail (96 columns: a half-filled last chunk), decode and batches of every tile
// width, one thread and two (thread ranges of whole panels).
TEST(Int8GemmTest, PackedWeightsGiveTheRowMajorResults) {
  IsaGuard guard;
  ThreadPool pool2(2);
  std::mt19937 rng(5);
  bool packed_any = false;
  for (Isa isa : SimdIsas()) {
    SetActiveIsa(isa);
    for (int64_t rows : {37, 64}) {
      const int64_t cols = 96;
      OwnedWeights w = QuantizedWeights(rows, cols, rng);
      TensorView t;
      t.dtype = DType::kI8;
      t.shape = {rows, cols};
      t.data = w.q.data();
      t.size_bytes = w.q.size();
      const std::shared_ptr<const uint8_t> panels = PackPanels(t);
      ASSERT_EQ(panels != nullptr, isa == Isa::kAvx512) << IsaName(isa);
      if (!panels) continue;
      packed_any = true;
      Int8Weights packed = w.View();
      packed.panels = panels.get();
      for (int64_t n : {1, 2, 3, 4, 9}) {
        std::vector<float> x = RandomFloats(n * cols, rng);
        const QuantActs a = Quantize(x, n, cols);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
          std::vector<float> want(n * rows), got(n * rows, -1.f);
          Int8MatMul(w.View(), a.q.data(), a.s.data(), n, want.data(), pool);
          Int8MatMul(packed, a.q.data(), a.s.data(), n, got.data(), pool);
          EXPECT_TRUE(BitEqual(want, got)) << "W8A8 rows " << rows << " tokens " << n;
          Int8MatMulW8A16(w.View(), x.data(), n, want.data(), pool);
          std::fill(got.begin(), got.end(), -1.f);
          Int8MatMulW8A16(packed, x.data(), n, got.data(), pool);
          EXPECT_TRUE(BitEqual(want, got)) << "W8A16 rows " << rows << " tokens " << n;
        }
      }
    }
  }
  if (IsaSupported(Isa::kAvx512)) {
    EXPECT_TRUE(packed_any);
  }
}

// Extremes: pair sums at the int16 saturation edge of vpmaddubsw (+-127 * +-127 twice) and
// |x| = 127 with either sign in the VNNI sign trick; unit scales, so results are exact integers
// (|sum| <= 127^2 * 512 < 2^24).
TEST(Int8GemmTest, ExtremeValuesExact) {
  IsaGuard guard;
  const int64_t rows = 4, cols = 512, n = 3;
  OwnedWeights w;
  w.rows = rows;
  w.cols = cols;
  w.q.resize(rows * cols);
  w.scales.assign(rows, 1.f);
  for (int64_t c = 0; c < cols; ++c) {
    w.q[0 * cols + c] = -127;
    w.q[1 * cols + c] = 127;
    w.q[2 * cols + c] = (c & 1) ? 127 : -127;
    w.q[3 * cols + c] = static_cast<int8_t>((c % 255) - 127);
  }
  std::vector<int8_t> xq(n * cols);
  for (int64_t c = 0; c < cols; ++c) {
    xq[c] = -127;
    xq[cols + c] = 127;
    xq[2 * cols + c] = (c & 2) ? -127 : 127;
  }
  const std::vector<float> xs(n * cols / kInt8ActGroup, 1.f);
  const std::vector<float> want = RefW8A8(w.View(), xq.data(), xs.data(), n);
  EXPECT_EQ(want[0], 127.f * 127.f * cols);
  EXPECT_EQ(want[1], -127.f * 127.f * cols);
  for (Isa isa : SimdIsas()) {
    SetActiveIsa(isa);
    std::vector<float> y(n * rows);
    Int8MatMul(w.View(), xq.data(), xs.data(), n, y.data(), nullptr);
    EXPECT_TRUE(BitEqual(y, want)) << IsaName(isa);
  }
}

TEST(Int8GemmTest, ActivationGroupsQuantizedSeparately) {
  std::vector<float> x(64, 0.01f);
  x[3] = 100.f;  // an outlier only coarsens its own group
  std::vector<int8_t> q(64);
  std::vector<float> s(2);
  QuantizeActivations(x.data(), 1, 64, q.data(), s.data());
  EXPECT_EQ(s[0], 100.f / 127.f);
  EXPECT_EQ(s[1], 0.01f / 127.f);
  EXPECT_EQ(q[3], 127);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[40], 127);
}

TEST(Int8GemmTest, QuantizeRoundTripWithinHalfStep) {
  std::mt19937 rng(3);
  const int64_t n = 9, cols = 160;
  std::vector<float> x = RandomFloats(n * cols, rng);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < cols; ++c) x[t * cols + c] *= std::pow(10.f, float(t) - 4.f);
  std::vector<int8_t> q(n * cols);
  std::vector<float> s(n);
  QuantizeRowsPerToken(x.data(), n, cols, q.data(), s.data());
  for (int64_t t = 0; t < n; ++t) {
    float amax = 0.f;
    int32_t qmax = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[t * cols + c], dq = q[t * cols + c] * s[t];
      amax = std::max(amax, std::fabs(v));
      EXPECT_LE(std::fabs(v - dq), s[t] * 0.5f * (1.f + 1e-5f)) << t << "," << c;
      EXPECT_GE(q[t * cols + c], -127);
      qmax = std::max(qmax, std::abs(int32_t{q[t * cols + c]}));
    }
    EXPECT_EQ(s[t], amax / 127.f);
    EXPECT_EQ(qmax, 127);
  }
}

TEST(Int8GemmTest, RmsNormQuantizeEqualsNormThenQuantize) {
  std::mt19937 rng(11);
  const int64_t n = 5, cols = 96, g = cols / kInt8ActGroup;
  std::vector<float> x = RandomFloats(n * cols, rng), w = RandomFloats(cols, rng);
  std::vector<float> y_ref(n * cols), s_ref(n * g), s(n * g);
  std::vector<int8_t> q_ref(n * cols), q(n * cols);
  RmsNorm(x.data(), w.data(), 1.f, y_ref.data(), n, cols, 1e-6f);
  QuantizeActivations(y_ref.data(), n, cols, q_ref.data(), s_ref.data());
  // In place (y aliases x), as the decoder uses it.
  RmsNormQuantize(x.data(), w.data(), 1.f, x.data(), q.data(), s.data(), n, cols, 1e-6f);
  EXPECT_TRUE(BitEqual(x, y_ref));
  EXPECT_EQ(q, q_ref);
  EXPECT_TRUE(BitEqual(s, s_ref));
}

TEST(Int8GemmTest, QuantizeRoundsHalfToEven) {
  std::vector<float> x(32, 0.f);
  x[0] = 127.f;  // scale 1
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -0.5f;
  x[5] = 1.49f;
  std::vector<int8_t> q(32);
  float s = 0.f;
  QuantizeRowsPerToken(x.data(), 1, 32, q.data(), &s);
  EXPECT_EQ(s, 1.f);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], -2);
  EXPECT_EQ(q[4], 0);
  EXPECT_EQ(q[5], 1);
}

TEST(Int8GemmTest, ZeroRowsGiveZeroNotNan) {
  IsaGuard guard;
  const int64_t rows = 3, cols = 64, n = 2;
  std::mt19937 rng(4);
  std::vector<float> wf = RandomFloats(rows * cols, rng), x = RandomFloats(n * cols, rng);
  std::fill(wf.begin() + cols, wf.begin() + 2 * cols, 0.f);  // weight row 1
  std::fill(x.begin(), x.begin() + cols, 0.f);                 // token 0
  OwnedWeights w;
  w.rows = rows;
  w.cols = cols;
  w.q.resize(rows * cols);
  w.scales.resize(rows);
  QuantizeWeightsPerRow(wf.data(), rows, cols, w.q.data(), w.scales.data());
  EXPECT_EQ(w.scales[1], 0.f);
  const QuantActs a = Quantize(x, n, cols);
  const std::vector<int8_t>& xq = a.q;
  const std::vector<float>& xs = a.s;
  EXPECT_EQ(xs[0], 0.f);
  std::vector<Isa> isas = SimdIsas();
  isas.push_back(Isa::kScalar);
  for (Isa isa : isas) {
    SetActiveIsa(isa);
    std::vector<float> y(n * rows), y16(n * rows);
    Int8MatMul(w.View(), xq.data(), xs.data(), n, y.data(), nullptr);
    Int8MatMulW8A16(w.View(), x.data(), n, y16.data(), nullptr);
    for (int64_t i = 0; i < n * rows; ++i) {
      EXPECT_FALSE(std::isnan(y[i])) << IsaName(isa);
      EXPECT_FALSE(std::isnan(y16[i])) << IsaName(isa);
    }
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(y[r], 0.f) << IsaName(isa);  // token 0
    for (int64_t t = 0; t < n; ++t) EXPECT_EQ(y16[t * rows + 1], 0.f) << IsaName(isa);
  }
}

TEST(Int8GemmTest, W8A16MatchesDoubleReference) {
  IsaGuard guard;
  ThreadPool pool2(2);
  std::mt19937 rng(5);
  std::vector<Isa> isas = SimdIsas();
  isas.push_back(Isa::kScalar);
  for (int64_t cols : {32, 160, 512}) {
    for (int64_t rows : {1, 3, 37}) {
      OwnedWeights w = QuantizedWeights(rows, cols, rng);
      for (int64_t n : {1, 2, 5, 17}) {
        std::vector<float> x = RandomFloats(n * cols, rng);
        for (Isa isa : isas) {
          SetActiveIsa(isa);
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
            std::vector<float> y(n * rows);
            Int8MatMulW8A16(w.View(), x.data(), n, y.data(), pool);
            for (int64_t t = 0; t < n; ++t)
              for (int64_t r = 0; r < rows; ++r) {
                double s = 0, mag = 0;
                for (int64_t c = 0; c < cols; ++c) {
                  const double p = double(w.q[r * cols + c]) * w.scales[r] * x[t * cols + c];
                  s += p;
                  mag += std::fabs(p);
                }
                // Relative to the magnitude sum |w||x|, which bounds the FP32 summation error.
                EXPECT_NEAR(y[t * rows + r], s, 1e-5 * mag + 1e-30)
                    << IsaName(isa) << " rows=" << rows << " cols=" << cols << " n=" << n;
              }
          }
        }
      }
    }
  }
}

// W8A8 end to end against FP32 math: the quantization error stays small (sanity, loose bound),
// also for the token with an outlier.
TEST(Int8GemmTest, W8A8CloseToFloatMatmul) {
  std::mt19937 rng(6);
  const int64_t rows = 16, cols = 512, n = 4;
  std::vector<float> wf = RandomFloats(rows * cols, rng), x = RandomFloats(n * cols, rng);
  x[7] = 200.f;  // an outlier channel in token 0 (coarsens only its group)
  OwnedWeights w;
  w.rows = rows;
  w.cols = cols;
  w.q.resize(rows * cols);
  w.scales.resize(rows);
  QuantizeWeightsPerRow(wf.data(), rows, cols, w.q.data(), w.scales.data());
  const QuantActs a = Quantize(x, n, cols);
  std::vector<float> y(n * rows);
  Int8MatMul(w.View(), a.q.data(), a.s.data(), n, y.data(), nullptr);
  // Hard bound from the quantization steps: |w - w~| <= sw / 2, |x - x~| <= sx_g / 2.
  const int64_t groups = cols / kInt8ActGroup;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, bound = 1e-3;
      for (int64_t c = 0; c < cols; ++c) {
        const double wv = wf[r * cols + c], xv = x[t * cols + c];
        const double sx = a.s[t * groups + c / kInt8ActGroup], sw = w.scales[r];
        s += wv * xv;
        bound += std::fabs(wv) * sx / 2 + std::fabs(xv) * sw / 2 + sx * sw / 4;
      }
      EXPECT_NEAR(y[t * rows + r], s, bound) << t << "," << r;
      if (t > 0) {
        EXPECT_NEAR(y[t * rows + r], s, 0.03 * std::sqrt(double(cols)));
      }
    }
}

// Timing print only (never asserted; the machine may be shared): GEMV weight bandwidth of each
// ISA for a 4096 x 4096 INT8 matrix, single thread.
TEST(Int8GemmSpeedPrintOnly, GemvBandwidth) {
  IsaGuard guard;
  const int64_t rows = 4096, cols = 4096;
  std::mt19937 rng(7);
  OwnedWeights w;
  w.rows = rows;
  w.cols = cols;
  w.q.resize(rows * cols);
  for (auto& v : w.q) v = static_cast<int8_t>(int(rng() % 255) - 127);
  w.scales.assign(rows, 0.01f);
  std::vector<float> x = RandomFloats(cols, rng), y(rows);
  const QuantActs a = Quantize(x, 1, cols);
  const std::vector<int8_t>& xq = a.q;
  const std::vector<float>& xs = a.s;
  std::vector<Isa> isas = SimdIsas();
  isas.insert(isas.begin(), Isa::kScalar);
  for (Isa isa : isas) {
    SetActiveIsa(isa);
    const int reps = isa == Isa::kScalar ? 1 : 8;
    for (int mode = 0; mode < 2; ++mode) {
      auto run = [&] {
        if (mode == 0) Int8MatMul(w.View(), xq.data(), xs.data(), 1, y.data(), nullptr);
        else Int8MatMulW8A16(w.View(), x.data(), 1, y.data(), nullptr);
      };
      run();  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) run();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[int8 gemv, print only] %-6s %-5s %4ldx%ld: %.2f ms, %.1f GB/s\n",
                  IsaName(isa), mode == 0 ? "W8A8" : "W8A16", long(rows), long(cols),
                  1e3 * s / reps, double(rows * cols) * reps / s / 1e9);
    }
  }
}

// Timing print only: W8A8 prefill (64 tokens x 1024 x 4096, single thread) in int8 GOPS.
TEST(Int8GemmSpeedPrintOnly, PrefillGops) {
  IsaGuard guard;
  const int64_t rows = 1024, cols = 4096, n = 64;
  std::mt19937 rng(8);
  OwnedWeights w = QuantizedWeights(rows, cols, rng);
  std::vector<float> x = RandomFloats(n * cols, rng), y(n * rows);
  const QuantActs a = Quantize(x, n, cols);
  const std::vector<int8_t>& xq = a.q;
  const std::vector<float>& xs = a.s;
  for (Isa isa : SimdIsas()) {
    SetActiveIsa(isa);
    Int8MatMul(w.View(), xq.data(), xs.data(), n, y.data(), nullptr);  // warm-up
    const int reps = 3;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) Int8MatMul(w.View(), xq.data(), xs.data(), n, y.data(), nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[int8 prefill, print only] %-6s W8A8 %ld tok x %ldx%ld: %.2f ms, %.1f GOPS\n",
                IsaName(isa), long(n), long(rows), long(cols), 1e3 * s / reps,
                2.0 * rows * cols * n * reps / s / 1e9);
  }
}

}  // namespace
}  // namespace peng::kernels
