#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace peng {
namespace {

namespace fs = std::filesystem;

// A safetensors image: 8-byte header length, the header, then `data`.
std::vector<uint8_t> Image(const std::string& header, const std::vector<uint8_t>& data) {
  const uint64_t n = header.size();
  std::vector<uint8_t> b(8 + header.size() + data.size());
  std::memcpy(b.data(), &n, 8);
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + header.size());
  return b;
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(i);
  return d;
}

// "b" is first in the data, "a" second; 16 + 6 = 22 data bytes. The header is padded with
// spaces to a multiple of 8, as the reference writer does.
const char kHeader[] =
    R"({"__metadata__":{"format":"pt"},)"
    R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
    R"("b":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}    )";

std::string Error(const std::string& header, size_t data_bytes = 22) {
  const std::vector<uint8_t> b = Image(header, Iota(data_bytes));
  auto f = SafetensorsFile::FromBytes(b.data(), b.size(), "m.safetensors");
  return f.ok() ? "OK" : f.status().message();
}

std::string Entry(const std::string& body) { return R"({"w":{)" + body + "}}"; }

TEST(SafetensorsTest, ReadsTensorsAndMetadata) {
  const std::vector<uint8_t> b = Image(kHeader, Iota(22));
  auto f = SafetensorsFile::FromBytes(b.data(), b.size(), "m.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ((*f)->tensors()[0].name, "b");  // data order
  EXPECT_EQ((*f)->tensors()[1].name, "a");
  const uint8_t* data = b.data() + 8 + sizeof(kHeader) - 1;
  const TensorView* a = (*f)->FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kBF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(a->size_bytes, 6u);
  EXPECT_EQ(a->data, data + 16);
  const TensorView* t = (*f)->FindTensor("b");
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t->size_bytes, 16u);
  EXPECT_EQ(static_cast<const uint8_t*>(t->data)[15], 15);
  EXPECT_EQ((*f)->FindTensor("c"), nullptr);
}

TEST(SafetensorsTest, ScalarsAndEmptyTensors) {
  EXPECT_EQ(Error(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F16","shape":[0,5],"data_offsets":[8,8]}})",
                  8),
            "OK");
  EXPECT_EQ(Error("{}", 0), "OK");
}

TEST(SafetensorsTest, EveryTruncationFails) {
  const std::vector<uint8_t> b = Image(kHeader, Iota(22));
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> cut(b.begin(), b.begin() + n);
    auto f = SafetensorsFile::FromBytes(cut.data(), cut.size(), "cut.safetensors");
    ASSERT_FALSE(f.ok()) << n;
    EXPECT_EQ(f.status().message().rfind("cut.safetensors: ", 0), 0u);
  }
}

TEST(SafetensorsTest, RejectsBadHeaders) {
  std::vector<uint8_t> b = {1, 2, 3};
  EXPECT_EQ(SafetensorsFile::FromBytes(b.data(), b.size(), "s").status().message(),
            "s: file is 3 bytes, too short for the 8-byte header length");
  b = Image("{}", {});
  b[0] = 3;
  EXPECT_EQ(SafetensorsFile::FromBytes(b.data(), b.size(), "s").status().message(),
            "s: header length 3 extends past end of file (10 bytes)");
  b[7] = 0x80;
  EXPECT_EQ(SafetensorsFile::FromBytes(b.data(), b.size(), "s").status().message(),
            "s: header length 9223372036854775811 exceeds the limit of 104857600 bytes");
  EXPECT_EQ(Error(R"({"a":)").rfind("m.safetensors: header: invalid JSON at byte 6: ", 0), 0u);
  EXPECT_EQ(Error("[1]"), "m.safetensors: header is not a JSON object");
  EXPECT_EQ(Error(R"({"__metadata__":{"k":1}})"),
            "m.safetensors: __metadata__ value 'k' is not a string");
  EXPECT_EQ(Error(R"({"__metadata__":[]})"), "m.safetensors: __metadata__ is not a JSON object");
}

TEST(SafetensorsTest, RejectsBadTensorEntries) {
  EXPECT_EQ(Error(R"({"w":1})"), "m.safetensors: tensor 'w' is not a JSON object");
  EXPECT_EQ(Error(Entry(R"("shape":[1],"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' has no string \"dtype\"");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":1,"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' has no array \"shape\"");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1],"data_offsets":[0])")),
            "m.safetensors: tensor 'w' has no \"data_offsets\" pair of non-negative integers");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1],"data_offsets":[-4,0])")),
            "m.safetensors: tensor 'w' has no \"data_offsets\" pair of non-negative integers");
  EXPECT_EQ(Error(Entry(R"("dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1])")),
            "m.safetensors: tensor 'w' has unsupported dtype 'F8_E4M3'");
  const std::vector<uint8_t> f8 = Image(Entry(R"("dtype":"BOOL","shape":[1],"data_offsets":[0,1])"), {0});
  EXPECT_EQ(SafetensorsFile::FromBytes(f8.data(), f8.size(), "x").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' shape has an entry that is not a non-negative integer");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1.5],"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' shape has an entry that is not a non-negative integer");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' element count overflows");
  EXPECT_EQ(Error(Entry(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4])")),
            "m.safetensors: tensor 'w' byte size overflows");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1],"data_offsets":[8,4])")),
            "m.safetensors: tensor 'w' data_offsets [8, 4) ends before it begins");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1],"data_offsets":[20,24])")),
            "m.safetensors: tensor 'w' data_offsets [20, 24) extends past the end of the data "
            "(22 bytes)");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[2,3],"data_offsets":[0,20])")),
            "m.safetensors: tensor 'w' data_offsets [0, 20) holds 20 bytes but shape [2, 3] of "
            "F32 needs 24");
  EXPECT_EQ(Error(Entry(R"("dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615])")),
            "m.safetensors: tensor 'w' data_offsets [0, 18446744073709551615) extends past the "
            "end of the data (22 bytes)");
}

TEST(SafetensorsTest, ByteFlipsNeverCrash) {
  const std::vector<uint8_t> good = Image(kHeader, Iota(22));
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t v : {0x00, 0x22, 0x5b, 0x7d, 0xff}) {
      std::vector<uint8_t> b = good;
      b[i] = v;
      auto f = SafetensorsFile::FromBytes(b.data(), b.size(), "flip");
      if (f.ok()) {
        for (const TensorView& t : (*f)->tensors()) {
          ASSERT_GE(static_cast<const uint8_t*>(t.data), b.data());
          ASSERT_LE(static_cast<const uint8_t*>(t.data) + t.size_bytes, b.data() + b.size());
        }
      }
    }
  }
}

// A temporary checkpoint directory, removed at the end of the test.
class SafetensorsModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("safetensors_model_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream(dir_ / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  void WriteText(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  // A shard holding F32 tensors of 4 values each.
  void WriteShard(const std::string& name, const std::vector<std::string>& tensors) {
    std::string h = "{";
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i) h += ",";
      h += "\"" + tensors[i] + R"(":{"dtype":"F32","shape":[4],"data_offsets":[)" +
           std::to_string(16 * i) + "," + std::to_string(16 * i + 16) + "]}";
    }
    Write(name, Image(h + "}", Iota(16 * tensors.size())));
  }

  fs::path dir_;
};

TEST_F(SafetensorsModelTest, OpensSingleFile) {
  Write("model.safetensors", Image(kHeader, Iota(22)));
  auto m = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->shards().size(), 1u);
  EXPECT_EQ((*m)->tensors().size(), 2u);
  EXPECT_EQ((*m)->FindTensor("a")->shape, (std::vector<int64_t>{3}));
  auto direct = SafetensorsModel::Open((dir_ / "model.safetensors").string());
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ((*direct)->tensors().size(), 2u);
}

TEST_F(SafetensorsModelTest, OpensShardedCheckpoint) {
  WriteShard("model-00001-of-00002.safetensors", {"x", "y"});
  WriteShard("model-00002-of-00002.safetensors", {"z"});
  WriteText("model.safetensors.index.json",
            R"({"metadata":{"total_size":48},"weight_map":{)"
            R"("x":"model-00001-of-00002.safetensors","y":"model-00001-of-00002.safetensors",)"
            R"("z":"model-00002-of-00002.safetensors"}})");
  auto m = SafetensorsModel::Open(dir_.string());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->shards().size(), 2u);
  ASSERT_EQ((*m)->tensors().size(), 3u);
  EXPECT_EQ((*m)->tensors()[2].name, "z");
  const TensorView* y = (*m)->FindTensor("y");
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>(y->data)[0], 16);
  EXPECT_EQ((*m)->FindTensor("w"), nullptr);
}

TEST_F(SafetensorsModelTest, ShardErrorsNameTheShard) {
  const std::string s1 = (dir_ / "s1.safetensors").string();
  const std::string s2 = (dir_ / "s2.safetensors").string();
  WriteShard("s1.safetensors", {"x"});
  WriteShard("s2.safetensors", {"y"});
  WriteText("model.safetensors.index.json",
            R"({"weight_map":{"x":"s1.safetensors","y":"s1.safetensors"}})");
  auto m = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            s1 + ": tensor 'y' listed in model.safetensors.index.json is not in this shard");

  WriteShard("s2.safetensors", {"x"});
  WriteText("model.safetensors.index.json",
            R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})");
  m = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), s2 + ": tensor 'x' is also in " + s1);

  Write("s2.safetensors", {1, 2, 3});
  m = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), s2 + ": file is 3 bytes, too short for the 8-byte header length");

  WriteText("model.safetensors.index.json", R"({"weight_map":{"x":"s3.safetensors"}})");
  m = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind((dir_ / "s3.safetensors").string() + ": cannot open", 0),
            0u);

  const std::string index = (dir_ / "model.safetensors.index.json").string();
  WriteText("model.safetensors.index.json", R"({"weight_map":{"x":"../s1.safetensors"}})");
  m = SafetensorsModel::Open(dir_.string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            index + ": weight_map entry 'x' names an invalid shard file '../s1.safetensors'");

  WriteText("model.safetensors.index.json", R"({"weight_map":[]})");
  EXPECT_EQ(SafetensorsModel::Open(dir_.string()).status().message(),
            index + ": no \"weight_map\" object");
  WriteText("model.safetensors.index.json", R"({"weight_map":)");
  EXPECT_EQ(SafetensorsModel::Open(dir_.string()).status().message().rfind(index + ": invalid JSON", 0),
            0u);
}

TEST_F(SafetensorsModelTest, MissingCheckpoint) {
  EXPECT_EQ(SafetensorsModel::Open(dir_.string()).status().message(),
            dir_.string() + ": neither model.safetensors nor model.safetensors.index.json found");
  EXPECT_EQ(SafetensorsModel::Open((dir_ / "nope").string()).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace peng
