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
#include "core/utf8.h"

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

// The encoder against the compiler's own UTF-8 (u8 literals), at every length's bounds.
TEST(Utf8Test, EncodesAndDecodesAsTheCompilerDoes) {
  const std::u32string cps = U"a\u007F\u0080\u00E9\u07FF\u0800\u4E2D\uD7FF\uE000\uFFFF"
                             U"\U00010000\U0001F600\U0010FFFF";
  const std::u8string want = u8"a\u007F\u0080\u00E9\u07FF\u0800\u4E2D\uD7FF\uE000\uFFFF"
                             u8"\U00010000\U0001F600\U0010FFFF";
  std::string got;
  for (char32_t c : cps) AppendUtf8(c, &got);
  EXPECT_EQ(got, std::string(want.begin(), want.end()));
  EXPECT_EQ(DecodeUtf8(got), std::vector<uint32_t>(cps.begin(), cps.end()));
  size_t len = 0;
  EXPECT_EQ(DecodeUtf8At(std::string_view(got).substr(got.size() - 4), &len), 0x10FFFFu);
  EXPECT_EQ(len, 4u);
  for (size_t i = got.size() - 4; i < got.size(); ++i) {  // the lead byte, then continuations
    EXPECT_EQ(Utf8SeqLen(static_cast<unsigned char>(got[i])), i == got.size() - 4 ? 4 : 1);
  }
}

// Each byte that does not start a complete, shortest-form sequence of a scalar value is U+FFFD,
// and decoding resumes at the next byte.
TEST(Utf8Test, InvalidBytesAreReplacementCharacters) {
  const uint32_t r = 0xFFFD;
  const std::vector<std::pair<std::string, std::vector<uint32_t>>> cases = {
      {"a\x80" "b", {'a', r, 'b'}},               // a stray continuation byte
      {"\xC0\x80", {r, r}},                       // an overlong NUL
      {"\xE0\x9F\xBF", {r, r, r}},                // an overlong U+07FF
      {"\xED\xA0\x80", {r, r, r}},                // a surrogate (U+D800)
      {"\xF4\x90\x80\x80", {r, r, r, r}},         // above U+10FFFF
      {"\xF8\x88\x80\x80\x80", {r, r, r, r, r}},  // no five-byte forms
      {"\xE4\xB8", {r, r}},                       // cut short
      {"\xE4\xB8\xAD\xE4", {0x4E2D, r}},          // cut short at the end
  };
  for (const auto& [bytes, want] : cases) EXPECT_EQ(DecodeUtf8(bytes), want) << bytes;
  bool incomplete = false;
  EXPECT_EQ(ValidUtf8Prefix("\xE4\xB8", &incomplete), 0);
  EXPECT_TRUE(incomplete);
  EXPECT_EQ(ValidUtf8Prefix("\xE4\xB8\xAD", &incomplete), 3);
  EXPECT_FALSE(incomplete);
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
