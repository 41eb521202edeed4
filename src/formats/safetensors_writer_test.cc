// SafetensorsWriter round trips through our reader (dtype, shape, bytes, metadata, 8-byte
// header padding) and reports misuse (undeclared / missing bytes, unsupported dtypes).
#include "formats/safetensors_writer.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "formats/safetensors.h"

namespace peng {
namespace {

std::string TmpPath(const char* name) {
  return ::testing::TempDir() + "/" + name + std::to_string(::getpid()) + ".safetensors";
}

TEST(SafetensorsWriterTest, RoundTrip) {
  const std::string path = TmpPath("rt");
  const std::vector<int8_t> q = {1, -2, 3, -127, 127, 0};
  const std::vector<float> s = {0.5f, 0.25f};
  SafetensorsWriter w(path);
  ASSERT_TRUE(w.Add("w", DType::kI8, {2, 3}).ok());
  ASSERT_TRUE(w.Add("w_scale", DType::kF32, {2}).ok());
  ASSERT_TRUE(w.Add("empty", DType::kF32, {0, 4}).ok());
  ASSERT_TRUE(w.Begin({{"format", "pt"}}).ok());
  ASSERT_TRUE(w.Write(q.data(), 4).ok());  // in pieces, across a tensor boundary
  std::vector<uint8_t> rest(2 + 8);
  std::memcpy(rest.data(), q.data() + 4, 2);
  std::memcpy(rest.data() + 2, s.data(), 8);
  ASSERT_TRUE(w.Write(rest.data(), rest.size()).ok());
  ASSERT_TRUE(w.Finish().ok());

  std::ifstream f(path, std::ios::binary);
  uint64_t hlen = 0;
  f.read(reinterpret_cast<char*>(&hlen), 8);
  EXPECT_EQ(hlen % 8, 0u);

  auto r = SafetensorsFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  const TensorView* tw = (*r)->FindTensor("w");
  ASSERT_NE(tw, nullptr);
  EXPECT_EQ(tw->dtype, DType::kI8);
  EXPECT_EQ(tw->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(tw->data, q.data(), 6), 0);
  const TensorView* ts = (*r)->FindTensor("w_scale");
  ASSERT_NE(ts, nullptr);
  EXPECT_EQ(std::memcmp(ts->data, s.data(), 8), 0);
  EXPECT_EQ((*r)->FindTensor("empty")->numel(), 0);
  std::remove(path.c_str());
}

TEST(SafetensorsWriterTest, Misuse) {
  const std::string path = TmpPath("bad");
  SafetensorsWriter w(path);
  EXPECT_FALSE(w.Add("q", DType::kQ4_0, {1, 32}).ok());  // GGML block types do not fit
  ASSERT_TRUE(w.Add("a", DType::kF32, {2}).ok());
  EXPECT_FALSE(w.Add("a", DType::kF32, {2}).ok());  // duplicate
  ASSERT_TRUE(w.Begin().ok());
  const float v[3] = {1, 2, 3};
  EXPECT_FALSE(w.Write(v, sizeof v).ok());  // more than declared
  SafetensorsWriter w2(path);
  ASSERT_TRUE(w2.Add("a", DType::kF32, {2}).ok());
  ASSERT_TRUE(w2.Begin().ok());
  ASSERT_TRUE(w2.Write(v, 4).ok());
  Status st = w2.Finish();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'a'"), std::string::npos) << st.message();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace peng
