#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "core/mapped_file.h"
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


// A file read into huge pages holds the file's bytes, exactly as the in-place mapping does; an
// empty file and a missing one behave alike in both modes.
TEST(MappedFileTest, HugePageCopyHoldsTheFileBytes) {
  const std::string path = ::testing::TempDir() + "/mapped_file_test.bin";
  std::vector<uint8_t> bytes((size_t{3} << 20) + 12345);  // not a whole number of huge pages
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 7);
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  for (const bool huge : {false, true}) {
    StatusOr<MappedFile> m = MappedFile::Open(path, huge);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_EQ(m->size(), bytes.size());
    EXPECT_EQ(std::memcmp(m->data(), bytes.data(), bytes.size()), 0);
    EXPECT_EQ(m->in_huge_pages(), huge && TransparentHugePagesAvailable());
    if (m->in_huge_pages()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(m->data()) % (uintptr_t{2} << 20), 0u);
    }
    MappedFile moved = std::move(*m);  // the memory goes with the move
    EXPECT_EQ(moved.data()[bytes.size() - 1], bytes.back());
    EXPECT_EQ(m->data(), nullptr);
  }
  std::remove(path.c_str());
  const std::string empty = ::testing::TempDir() + "/mapped_file_empty.bin";
  std::fclose(std::fopen(empty.c_str(), "wb"));
  StatusOr<MappedFile> e = MappedFile::Open(empty, true);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 0u);
  EXPECT_FALSE(e->in_huge_pages());
  std::remove(empty.c_str());
  StatusOr<MappedFile> missing = MappedFile::Open(empty, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
}
}  // namespace
}  // namespace peng
