#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace peng {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  PENG_ASSIGN_OR_RETURN(*out, Half(x));
  return OkStatus();
}

TEST(StatusTest, OkAndErrors) {
  int v = 0;
  EXPECT_TRUE(UseHalf(4, &v).ok());
  EXPECT_EQ(v, 2);
  Status s = UseHalf(3, &v);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "InvalidArgument: odd: 3");
}

TEST(DTypeTest, GgmlIdsAndSizes) {
  EXPECT_EQ(DTypeFromGgml(12), DType::kQ4_K);
  EXPECT_EQ(DTypeFromGgml(30), DType::kBF16);
  EXPECT_FALSE(DTypeFromGgml(16).has_value());  // IQ2_XXS: unsupported
  EXPECT_EQ(RowBytes(DType::kQ4_0, 64), 36u);
  EXPECT_EQ(RowBytes(DType::kQ6_K, 512), 420u);
  EXPECT_EQ(RowBytes(DType::kF16, 10), 20u);
  EXPECT_EQ(DTypeFromSafetensors("BF16"), DType::kBF16);
}

TEST(HalfTest, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), h) << h;
  }
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(HalfTest, Bf16) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBf16(1.00390625f), 0x3f80);  // tie to even
}

TEST(ThreadPoolTest, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 50; ++rep) {
      pool.ParallelFor(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 50);
  }
}

}  // namespace
}  // namespace peng
