// The CUDA backend's quantized-GEMV arithmetic (backend/cuda/qdot.h) on the host, where CI runs
// it: every unit of random rows of every block-quantized type, against the CPU reference
// (kernels::ref::VecDotQ over the same quantized activations).
#include "backend/cuda/qdot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/ref/matmul_ref.h"
#include "quant/random_weights.h"

namespace peng {
namespace {

template <DType T>
void CheckType() {
  using backend::qdot::DecodeUnit;
  using backend::qdot::UnitDot;
  constexpr int ab = backend::qdot::kActBlock<T>;
  const int64_t rows = 7, cols = 1024;  // four K-quant super-blocks, 32 units
  std::mt19937_64 rng(99 + static_cast<int>(T));
  std::vector<uint8_t> w(RowBytes(T, cols) * rows);
  ASSERT_TRUE(FillRandomWeights(T, rows * cols, w.data(), &rng).ok());
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> x(cols);
  for (float& v : x) v = u(rng);
  x[5] = 0.f;  // a zero, and a block of zeros (scale 0)
  for (int i = 64; i < 96; ++i) x[i] = 0.f;
  std::vector<int8_t> qs(cols);
  std::vector<float> d(cols / ab);
  std::vector<int16_t> sums(cols / 16);
  kernels::ref::QuantizeAct(x.data(), cols, ab, qs.data(), d.data(), sums.data());
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = w.data() + r * RowBytes(T, cols);
    const float want = kernels::ref::VecDotQ(T, cols, row, qs.data(), d.data(), sums.data());
    float got = 0.f, scale = 0.f;
    for (int64_t unit = 0; unit < cols / 32; ++unit) {
      uint32_t a[8];
      std::memcpy(a, qs.data() + unit * 32, 32);
      const float p = UnitDot(DecodeUnit<T>(row, unit), a, d[unit * 32 / ab], sums[2 * unit],
                              sums[2 * unit + 1]);
      got += p;
      scale += std::fabs(p);
    }
    // The integer parts are exact; the FP32 sums run in another order.
    EXPECT_NEAR(got, want, 1e-5f * scale + 1e-6f) << DTypeName(T) << " row " << r;
  }
}

TEST(QdotTest, EveryUnitOfEveryQuantizedTypeMatchesTheCpuReference) {
  CheckType<DType::kQ4_0>();
  CheckType<DType::kQ4_1>();
  CheckType<DType::kQ5_0>();
  CheckType<DType::kQ5_1>();
  CheckType<DType::kQ8_0>();
  CheckType<DType::kQ4_K>();
  CheckType<DType::kQ5_K>();
  CheckType<DType::kQ6_K>();
}

TEST(QdotTest, Dp4aTakesSignedBytes) {
  // (-1, 2, -128, 127) . (3, -4, 1, 127) = -3 - 8 - 128 + 16129
  const uint32_t a = 0xFFu | 0x02u << 8 | 0x80u << 16 | 0x7Fu << 24;
  const uint32_t b = 0x03u | 0xFCu << 8 | 0x01u << 16 | 0x7Fu << 24;
  EXPECT_EQ(backend::qdot::Dp4a(a, b, 10), 10 - 3 - 8 - 128 + 16129);
}

}  // namespace
}  // namespace peng
