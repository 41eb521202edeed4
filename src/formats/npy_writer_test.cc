#include "formats/npy_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace peng {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The expected header: prelude with header_len = 118 (0x76), dict, padding, '\n' = 128 bytes.
std::string Expected128(const std::string& dict) {
  std::string h("\x93NUMPY\x01\x00\x76\x00", 10);
  h += dict;
  h.append(127 - h.size(), ' ');
  h += '\n';
  return h;
}

TEST(NpyWriterTest, WritesHeaderAndDataExactly) {
  const std::string path = testing::TempDir() + "npy_writer_test_2x3.npy";
  const std::vector<float> data = {0.0f, 1.5f, -2.0f, 3.25f, 1e-3f, -0.0f};
  ASSERT_TRUE(WriteNpy(path, data.data(), {2, 3}).ok());
  const std::string bytes = ReadAll(path);
  ASSERT_EQ(bytes.size(), 128u + 24u);
  EXPECT_EQ(bytes.substr(0, 128),
            Expected128("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
  std::vector<float> back(6);
  std::memcpy(back.data(), bytes.data() + 128, 24);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(std::memcmp(&back[i], &data[i], 4), 0) << i;
  // Little-endian bytes of 1.5f = 0x3fc00000.
  EXPECT_EQ(bytes.substr(132, 4), std::string("\x00\x00\xc0\x3f", 4));
}

TEST(NpyWriterTest, OneDimAndScalarUsePythonTupleRepr) {
  auto one = NpyHeader({3});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, Expected128("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"));
  auto scalar = NpyHeader({});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(*scalar, Expected128("{'descr': '<f4', 'fortran_order': False, 'shape': (), }"));

  const std::string path = testing::TempDir() + "npy_writer_test_scalar.npy";
  const float x = 7.0f;
  ASSERT_TRUE(WriteNpy(path, &x, {}).ok());
  EXPECT_EQ(ReadAll(path).size(), 132u);
}

TEST(NpyWriterTest, LongHeaderStaysAlignedTo64) {
  std::vector<int64_t> shape(12, 1234567);
  auto h = NpyHeader(shape);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->size(), 192u);
  EXPECT_EQ(h->back(), '\n');
  const size_t header_len = static_cast<uint8_t>((*h)[8]) | static_cast<uint8_t>((*h)[9]) << 8;
  EXPECT_EQ(header_len, 182u);
  EXPECT_EQ(h->find("'shape': (1234567, 1234567, "), 51u);
}

TEST(NpyWriterTest, ZeroSizedArrayWritesOnlyTheHeader) {
  const std::string path = testing::TempDir() + "npy_writer_test_empty.npy";
  ASSERT_TRUE(WriteNpy(path, nullptr, {0, 4}).ok());
  EXPECT_EQ(ReadAll(path),
            Expected128("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }"));
}

TEST(NpyWriterTest, Errors) {
  Status neg = WriteNpy(testing::TempDir() + "neg.npy", nullptr, {2, -1});
  EXPECT_EQ(neg.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(neg.message(), "npy shape: dimension 1 is negative (-1)");
  const float x = 1.0f;
  Status io = WriteNpy("/nonexistent-dir/x.npy", &x, {1});
  EXPECT_EQ(io.code(), StatusCode::kIoError);
  EXPECT_EQ(io.message().rfind("/nonexistent-dir/x.npy: cannot open for writing", 0), 0u);
}

}  // namespace
}  // namespace peng
