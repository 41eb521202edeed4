// The CUDA backend's weight layout and decoding (backend/cuda/weight_layout.h) on the host,
// where CI runs it: random rows of every type the backend takes, repacked as Upload repacks
// them, then every value (DecodeValue) against the CPU reference's dequantization and every
// unit's integer dot product (DecodeUnit, UnitDot) against kernels::ref::VecDotQ over the same
// quantized activations, read in the device's order (ActIndex, ActWords); and the device
// quantizer's arithmetic against kernels::ref::QuantizeAct.
#include "backend/cuda/weight_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/int8_gemm.h"
#include "kernels/ref/matmul_ref.h"
#include "quant/random_weights.h"

namespace peng {
namespace {

namespace layout = backend::layout;

constexpr int64_t kRows = 5, kCols = 1280;  // five K-quant super-blocks, 40 units

// kRows random rows of type t in the file's layout, and the same rows repacked.
struct Rows {
  std::vector<uint8_t> file, device;
  size_t file_row = 0, device_row = 0;
};
Rows RandomRows(DType t) {
  Rows r;
  std::mt19937_64 rng(7 + static_cast<int>(t));
  r.file_row = RowBytes(t, kCols);
  r.device_row = layout::DeviceRowBytes(t, kCols);
  r.file.resize(r.file_row * kRows);
  EXPECT_TRUE(FillRandomWeights(t, kRows * kCols, r.file.data(), &rng).ok());
  r.device.assign(r.device_row * kRows, 0xAB);
  for (int64_t i = 0; i < kRows; ++i)
    layout::RepackRow(t, r.file.data() + i * r.file_row, kCols, r.device.data() + i * r.device_row);
  return r;
}

template <DType T>
void CheckValues() {
  const Rows r = RandomRows(T);
  EXPECT_EQ(r.device_row % 16, 0u) << DTypeName(T) << ": rows start 16-byte aligned";
  EXPECT_LE(r.device_row, r.file_row + 15) << DTypeName(T);
  // Upload copies rows as stored exactly where Repacked says so -- not where the sizes match:
  // at kCols = 1280 every field-array type's rows keep the file's size, in another order.
  const bool as_stored = r.device_row == r.file_row && r.device == r.file;
  EXPECT_EQ(layout::Repacked(T), !as_stored) << DTypeName(T);
  std::vector<float> want(kCols);
  for (int64_t i = 0; i < kRows; ++i) {
    kernels::ref::DequantizeRow(T, r.file.data() + i * r.file_row, want.data(), kCols);
    const uint8_t* row = r.device.data() + i * r.device_row;
    for (int64_t c = 0; c < kCols; ++c) {
      const float got = layout::DecodeValue<T>(row, kCols / 32, c / 32, static_cast<int>(c % 32));
      ASSERT_EQ(got, want[c])
          << DTypeName(T) << " row " << i << " value " << c;
    }
  }
}

template <DType T>
void CheckDots() {
  constexpr int ab = layout::kActBlock<T>;
  const Rows r = RandomRows(T);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> x(kCols);
  for (float& v : x) v = u(rng);
  x[5] = 0.f;  // a zero, and a block of zeros (scale 0)
  for (int i = 64; i < 96; ++i) x[i] = 0.f;
  std::vector<int8_t> qs(kCols);
  std::vector<float> d(kCols / ab);
  std::vector<int16_t> sums(kCols / 16);
  kernels::ref::QuantizeAct(x.data(), kCols, ab, qs.data(), d.data(), sums.data());
  std::vector<int8_t> act(kCols);  // the same values in the device row's order
  for (int64_t c = 0; c < kCols; ++c) act[layout::ActIndex(c, kCols)] = qs[c];
  for (int64_t i = 0; i < kRows; ++i) {
    const float want = kernels::ref::VecDotQ(T, kCols, r.file.data() + i * r.file_row, qs.data(),
                                             d.data(), sums.data());
    const uint8_t* row = r.device.data() + i * r.device_row;
    float got = 0.f, scale = 0.f;
    for (int64_t unit = 0; unit < kCols / 32; ++unit) {
      uint32_t a[8];
      layout::ActWords(act.data(), kCols, unit, a);
      const float p = layout::UnitDot<T>(layout::DecodeUnit<T>(row, kCols / 32, unit), a,
                                      d[unit * 32 / ab], sums[2 * unit], sums[2 * unit + 1]);
      got += p;
      scale += std::fabs(p);
    }
    // The integer parts are exact; the FP32 sums run in another order.
    EXPECT_NEAR(got, want, 1e-5f * scale + 1e-6f) << DTypeName(T) << " row " << i;
  }
}

TEST(WeightLayoutTest, EveryValueOfEveryTypeDecodesAsTheCpuReference) {
  CheckValues<DType::kF32>();
  CheckValues<DType::kF16>();
  CheckValues<DType::kBF16>();
  CheckValues<DType::kQ4_0>();
  CheckValues<DType::kQ4_1>();
  CheckValues<DType::kQ5_0>();
  CheckValues<DType::kQ5_1>();
  CheckValues<DType::kQ8_0>();
  CheckValues<DType::kQ4_K>();
  CheckValues<DType::kQ5_K>();
  CheckValues<DType::kQ6_K>();
}

TEST(WeightLayoutTest, EveryUnitsDotProductMatchesTheCpuReference) {
  CheckDots<DType::kQ4_0>();
  CheckDots<DType::kQ4_1>();
  CheckDots<DType::kQ5_0>();
  CheckDots<DType::kQ5_1>();
  CheckDots<DType::kQ8_0>();
  CheckDots<DType::kQ4_K>();
  CheckDots<DType::kQ5_K>();
  CheckDots<DType::kQ6_K>();
}

// kCols activation values for the quantizer checks: magnitudes from 2^-8 to 2^11 (64 values
// each), zeros at 256-511 (whole blocks of them: scale 0), half-integers +-0.5 ... +-16 at
// 512-543 (values on rounding steps).
std::vector<float> QuantizerInputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(kCols);
  for (int64_t c = 0; c < kCols; ++c) x[c] = u(rng) * std::ldexp(1.f, static_cast<int>(c / 64) - 8);
  for (int c = 256; c < 512; ++c) x[c] = 0.f;
  for (int c = 512; c < 544; ++c) x[c] = (c % 2 ? -0.5f : 0.5f) * static_cast<float>(c - 511);
  return x;
}

// The device quantizer's arithmetic (ActBlockScale, QuantizeActValue) against the CPU's, bit
// for bit (QuantizerInputs).
template <int AB>
void CheckQuantizer() {
  const std::vector<float> x = QuantizerInputs(5 + AB);
  std::vector<int8_t> qs(kCols);
  std::vector<float> d(kCols / AB);
  std::vector<int16_t> sums(kCols / 16);
  kernels::ref::QuantizeAct(x.data(), kCols, AB, qs.data(), d.data(), sums.data());
  for (int64_t b = 0; b < kCols / AB; ++b) {
    float amax = 0.f;
    for (int i = 0; i < AB; ++i) amax = std::fmax(amax, std::fabs(x[b * AB + i]));
    const layout::ActScale s = layout::ActBlockScale<AB>(amax);
    ASSERT_EQ(s.d, d[b]) << "block " << b;
    for (int i = 0; i < AB; ++i)
      ASSERT_EQ(layout::QuantizeActValue(x[b * AB + i], s.iscale), qs[b * AB + i])
          << "value " << b * AB + i;
  }
}

TEST(WeightLayoutTest, TheDeviceQuantizerMatchesTheCpuReference) {
  CheckQuantizer<32>();
  CheckQuantizer<256>();
  // The block scales over many magnitudes against kernels::ActBlockScale.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(0.5f, 1.f);
  for (int i = 0; i < 4000; ++i) {
    const float amax = i == 0 ? 0.f : u(rng) * std::ldexp(1.f, i % 40 - 20);
    float d32, d256, is32, is256;
    kernels::ActBlockScale(amax, kernels::kQK, &d32, &is32);
    kernels::ActBlockScale(amax, kernels::kQKK, &d256, &is256);
    const layout::ActScale a32 = layout::ActBlockScale<32>(amax);
    const layout::ActScale a256 = layout::ActBlockScale<256>(amax);
    ASSERT_EQ(a32.d, d32) << amax;
    ASSERT_EQ(a32.iscale, is32) << amax;
    ASSERT_EQ(a256.d, d256) << amax;
    ASSERT_EQ(a256.iscale, is256) << amax;
  }
}

// INT8 W8A8: the device quantizer against kernels::QuantizeActivations bit for bit (scales and
// values of QuantizerInputs), and a row's units (DecodeUnit<kI8>, UnitDot) against the CPU
// kernel's sum of group dot products (kernels::Int8MatMul: scale[r] * sum_g x_scale[g] *
// float(int dot), done by the GEMV's store).
TEST(WeightLayoutTest, Int8W8A8QuantizerAndUnitsMatchTheCpu) {
  const std::vector<float> x = QuantizerInputs(17);
  std::mt19937_64 rng(18);
  std::vector<int8_t> qs(kCols);
  std::vector<float> scales(kCols / 32);
  kernels::QuantizeActivations(x.data(), 1, kCols, qs.data(), scales.data());
  std::vector<int8_t> act(kCols);  // the device row's order
  for (int64_t g = 0; g < kCols / 32; ++g) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[g * 32 + i]));
    const layout::ActScale s = layout::W8A8ActScale(amax);
    ASSERT_EQ(s.d, scales[g]) << "group " << g;
    for (int i = 0; i < 32; ++i) {
      const int64_t c = g * 32 + i;
      ASSERT_EQ(layout::QuantizeW8A8Value(x[c], s.d), qs[c]) << "value " << c;
      act[layout::ActIndex(c, kCols)] = qs[c];
    }
  }
  std::vector<int8_t> w(kCols);
  for (int8_t& v : w) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  const uint8_t* row = reinterpret_cast<const uint8_t*>(w.data());
  ASSERT_EQ(layout::DeviceRowBytes(DType::kI8, kCols), static_cast<size_t>(kCols));
  for (int64_t unit = 0; unit < kCols / 32; ++unit) {
    int want = 0;
    for (int i = 0; i < 32; ++i) want += int{w[unit * 32 + i]} * qs[unit * 32 + i];
    uint32_t a[8];
    layout::ActWords(act.data(), kCols, unit, a);
    const float got = layout::UnitDot<DType::kI8>(layout::DecodeUnit<DType::kI8>(row, kCols / 32,
                                                                               unit),
                                                  a, scales[unit], 0, 0);
    ASSERT_EQ(got, scales[unit] * static_cast<float>(want)) << "unit " << unit;
  }
}

TEST(WeightLayoutTest, Dp4aTakesSignedBytes) {
  // (-1, 2, -128, 127) . (3, -4, 1, 127) = -3 - 8 - 128 + 16129
  const uint32_t a = 0xFFu | 0x02u << 8 | 0x80u << 16 | 0x7Fu << 24;
  const uint32_t b = 0x03u | 0xFCu << 8 | 0x01u << 16 | 0x7Fu << 24;
  EXPECT_EQ(layout::Dp4a(a, b, 10), 10 - 3 - 8 - 128 + 16129);
}

}  // namespace
}  // namespace peng
