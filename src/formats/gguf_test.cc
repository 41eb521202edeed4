#include "formats/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/test_paths.h"
#include "formats/gguf_writer.h"

namespace peng {
namespace {

using Type = GgufValue::Type;

// Builds GGUF bytes by hand, so that tests can write files the writer refuses to produce.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& Put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  Bytes& U32(uint32_t v) { return Put(v); }
  Bytes& U64(uint64_t v) { return Put(v); }
  Bytes& Str(const std::string& s) {
    U64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return U32(0x46554747).U32(version).U64(n_tensors).U64(n_kv);
  }
  // name, dims innermost first, ggml type, offset.
  Bytes& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) U64(d);
    return U32(type).U64(offset);
  }
  Bytes& PadTo(size_t n) {
    b.resize(n, 0);
    return *this;
  }
};

std::string Error(const std::vector<uint8_t>& b) {
  auto f = GgufFile::FromBytes(b.data(), b.size(), "t.gguf");
  return f.ok() ? "OK" : f.status().message();
}

::testing::AssertionResult HasError(const std::vector<uint8_t>& b, const std::string& want) {
  const std::string got = Error(b);
  if (got.find(want) != std::string::npos && got.rfind("t.gguf: ", 0) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "error '" << got << "' lacks '" << want << "'";
}

GgufWriter MakeRichFile(std::vector<float>* f32_data, std::vector<uint8_t>* q8_data) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU8("u8", 200);
  w.AddI8("i8", -100);
  w.AddU16("u16", 60000);
  w.AddI16("i16", -30000);
  w.AddU32("u32", 4000000000u);
  w.AddI32("i32", -2000000000);
  w.AddU64("u64", 1ull << 40);
  w.AddI64("i64", -(1ll << 40));
  w.AddF32("f32", 0.5f);
  w.AddF64("f64", 0.1);
  w.AddBool("bool", true);
  w.AddStringArray("tokens", {"<s>", "", "hello"});
  w.AddIntArray("i32s", Type::kI32, {-1, 0, 7});
  w.AddIntArray("bools", Type::kBool, {1, 0});
  w.AddFloatArray("f32s", Type::kF32, {1.5, -2.25});
  *f32_data = {1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(w.AddTensor("a", DType::kF32, {2, 3}, f32_data->data(), 24).ok());
  q8_data->resize(2 * 34);
  for (size_t i = 0; i < q8_data->size(); ++i) (*q8_data)[i] = static_cast<uint8_t>(i * 7);
  EXPECT_TRUE(w.AddTensor("blk.0.q", DType::kQ8_0, {2, 32}, q8_data->data(), 68).ok());
  return w;
}

TEST(GgufTest, WriterRoundTripsEveryValueType) {
  std::vector<float> fa;
  std::vector<uint8_t> qa;
  const std::vector<uint8_t> bytes = MakeRichFile(&fa, &qa).Serialize();
  auto f = GgufFile::FromBytes(bytes.data(), bytes.size(), "rich.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.metadata().size(), 16u);
  EXPECT_EQ(g.GetString("general.architecture"), "llama");
  EXPECT_EQ(g.GetInt("u8"), 200);
  EXPECT_EQ(g.GetInt("i8"), -100);
  EXPECT_EQ(g.GetInt("u16"), 60000);
  EXPECT_EQ(g.GetInt("i16"), -30000);
  EXPECT_EQ(g.GetInt("u32"), 4000000000ll);
  EXPECT_EQ(g.GetInt("i32"), -2000000000);
  EXPECT_EQ(g.GetInt("u64"), 1ll << 40);
  EXPECT_EQ(g.GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(g.GetFloat("f32"), 0.5);
  EXPECT_EQ(g.GetFloat("f64"), 0.1);
  EXPECT_EQ(g.GetFloat("u8"), 200.0);
  EXPECT_EQ(g.GetBool("bool"), true);
  EXPECT_EQ(g.GetInt("bool"), 1);
  EXPECT_EQ(g.metadata().at("u16").type, Type::kU16);
  EXPECT_EQ(g.GetString("u8"), std::nullopt);
  EXPECT_EQ(g.GetInt("f32"), std::nullopt);
  EXPECT_EQ(g.GetBool("u8"), std::nullopt);
  EXPECT_EQ(g.GetInt("missing"), std::nullopt);
  ASSERT_NE(g.GetStringArray("tokens"), nullptr);
  EXPECT_EQ(*g.GetStringArray("tokens"), (std::vector<std::string>{"<s>", "", "hello"}));
  EXPECT_EQ(g.metadata().at("tokens").elem_type, Type::kString);
  EXPECT_EQ(*g.GetIntArray("i32s"), (std::vector<int64_t>{-1, 0, 7}));
  EXPECT_EQ(*g.GetIntArray("bools"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(*g.GetFloatArray("f32s"), (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(g.GetFloatArray("tokens"), nullptr);

  ASSERT_EQ(g.tensors().size(), 2u);
  const TensorView* a = g.FindTensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->size_bytes, 24u);
  EXPECT_EQ(std::memcmp(a->data, fa.data(), 24), 0);
  const TensorView* q = g.FindTensor("blk.0.q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, DType::kQ8_0);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{2, 32}));
  EXPECT_EQ(q->size_bytes, 68u);
  EXPECT_EQ(std::memcmp(q->data, qa.data(), 68), 0);
  EXPECT_EQ(q->row(1), static_cast<const uint8_t*>(q->data) + 34);
  // Both tensors start on 32-byte boundaries relative to the image, the second right after
  // the first one's padded 24 bytes.
  const size_t a_off = static_cast<const uint8_t*>(a->data) - bytes.data();
  const size_t q_off = static_cast<const uint8_t*>(q->data) - bytes.data();
  EXPECT_EQ(a_off % 32, 0u);
  EXPECT_EQ(q_off, a_off + 32);
  EXPECT_EQ(bytes.size(), q_off + 96);
  EXPECT_EQ(g.FindTensor("nope"), nullptr);
}

TEST(GgufTest, HandBuiltFileHasExactLayout) {
  // 24-byte header + kv "a"=u32 7 (17 bytes) + tensor info "t" [4] f32 (33 bytes) = 74 bytes,
  // so the data section starts at 96.
  Bytes b;
  b.Header(1, 1).Str("a").U32(4).U32(7).Tensor("t", {4}, 0, 0);
  ASSERT_EQ(b.b.size(), 74u);
  b.PadTo(96);
  for (float v : {1.f, 2.f, 3.f, 4.f}) b.Put(v);
  auto f = GgufFile::FromBytes(b.b.data(), b.b.size(), "hand.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->GetInt("a"), 7);
  const TensorView& t = (*f)->tensors()[0];
  EXPECT_EQ(t.name, "t");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(static_cast<const uint8_t*>(t.data), b.b.data() + 96);
  EXPECT_EQ(static_cast<const float*>(t.data)[3], 4.f);
}

TEST(GgufTest, VersionTwoAndCustomAlignment) {
  GgufWriter w(2);
  w.SetAlignment(64);
  const float x[2] = {7, 8};
  ASSERT_TRUE(w.AddTensor("x", DType::kF32, {2}, x, 8).ok());
  ASSERT_TRUE(w.AddTensor("y", DType::kF32, {1, 2}, x, 8).ok());
  const std::vector<uint8_t> bytes = w.Serialize();
  auto f = GgufFile::FromBytes(bytes.data(), bytes.size(), "v2.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->alignment(), 64u);
  const auto* y = static_cast<const uint8_t*>((*f)->FindTensor("y")->data);
  const auto* xp = static_cast<const uint8_t*>((*f)->FindTensor("x")->data);
  EXPECT_EQ((xp - bytes.data()) % 64, 0);
  EXPECT_EQ(y - xp, 64);
}

TEST(GgufTest, OpenReadsFileWrittenByWriter) {
  std::vector<float> fa;
  std::vector<uint8_t> qa;
  const std::string path = ::testing::TempDir() + "/gguf_test_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(MakeRichFile(&fa, &qa).WriteFile(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ(static_cast<const float*>((*f)->FindTensor("a")->data)[5], 6.f);
  std::filesystem::remove(path);

  auto missing = GgufFile::Open(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_EQ(missing.status().message().rfind(path + ": ", 0), 0u);
}

TEST(GgufTest, EveryTruncationFails) {
  std::vector<float> fa;
  std::vector<uint8_t> qa;
  const std::vector<uint8_t> bytes = MakeRichFile(&fa, &qa).Serialize();
  const size_t data_end = bytes.size() - (96 - 68);  // the last tensor ends before padding
  for (size_t n = 0; n < data_end; ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);  // exact-size heap block
    auto f = GgufFile::FromBytes(cut.data(), cut.size(), "cut.gguf");
    ASSERT_FALSE(f.ok()) << "truncated at " << n;
    EXPECT_EQ(f.status().message().rfind("cut.gguf: ", 0), 0u);
  }
  for (size_t n = data_end; n <= bytes.size(); ++n) {
    EXPECT_TRUE(GgufFile::FromBytes(bytes.data(), n, "cut.gguf").ok()) << n;
  }
  EXPECT_TRUE(HasError(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 10),
                       "unexpected end of file at offset 8 reading tensor count (need 8 bytes, "
                       "2 left)"));
  EXPECT_TRUE(HasError(std::vector<uint8_t>(bytes.begin(), bytes.begin() + data_end - 1),
                       "tensor 'blk.0.q' data ["));
}

TEST(GgufTest, ByteFlipsNeverCrash) {
  std::vector<float> fa;
  std::vector<uint8_t> qa;
  const std::vector<uint8_t> bytes = MakeRichFile(&fa, &qa).Serialize();
  const size_t header_end = static_cast<size_t>(
      static_cast<const uint8_t*>(GgufFile::FromBytes(bytes.data(), bytes.size(), "x")
                                      .value()->tensors()[0].data) - bytes.data());
  int failures = 0;
  for (size_t i = 0; i < header_end; ++i) {
    for (uint8_t v : {0x00, 0x01, 0x7f, 0x80, 0xff}) {
      std::vector<uint8_t> b = bytes;
      if (b[i] == v) continue;
      b[i] = v;
      failures += !GgufFile::FromBytes(b.data(), b.size(), "flip.gguf").ok();
    }
  }
  EXPECT_GT(failures, 0);
}

TEST(GgufTest, RejectsBadHeaders) {
  EXPECT_TRUE(HasError(Bytes().U32(0x46554746).U32(3).U64(0).U64(0).b, "not a GGUF file"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 0, 1).b, "unsupported GGUF version 1 (supported: 2, 3)"));
  EXPECT_TRUE(HasError(Bytes().Header(0, ~0ull).b,
                       "metadata count 18446744073709551615 is impossible in the 0 bytes left"));
  EXPECT_TRUE(HasError(Bytes().Header(1ull << 60, 0).b,
                       "tensor count 1152921504606846976 is impossible in the 0 bytes left"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).U64(~0ull).U32(4).U32(1).b,
                       "metadata entry 0: metadata key at offset 24 has length "
                       "18446744073709551615 but only 8 bytes remain"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("s").U32(8).U64(1000).Str("x").b,
                       "metadata key 's': string value at offset 37 has length 1000"));
  EXPECT_EQ(GgufFile::FromBytes(nullptr, 0, "e.gguf").status().message(),
            "e.gguf: unexpected end of file at offset 0 reading magic (need 4 bytes, 0 left)");
}

TEST(GgufTest, RejectsBadMetadata) {
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(13).U32(0).b,
                       "metadata key 'k': unknown metadata value type 13"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(9).U32(9).U64(0).b,
                       "metadata key 'k': nested arrays (arrays of arrays) are not supported"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(9).U32(4).U64(1ull << 62).U32(0).b,
                       "metadata key 'k': array of 4611686018427387904 elements needs at least "
                       "2^64 bytes but only 4 remain"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(9).U32(8).U64(3).U64(0).b,
                       "array of 3 elements needs at least 24 bytes but only 8 remain"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 2).Str("k").U32(4).U32(1).Str("k").U32(4).U32(2).b,
                       "metadata key 'k' appears twice"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(10).U64(~0ull).b,
                       "u64 value 18446744073709551615 does not fit in int64"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("k").U32(7).Put<uint8_t>(2).b,
                       "bool value 2 is neither 0 nor 1"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("general.alignment").U32(4).U32(48).b,
                       "general.alignment 48 is not a power of two"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("general.alignment").U32(4).U32(0).b,
                       "general.alignment 0 is not a power of two"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("general.alignment").U32(8).Str("32").b,
                       "general.alignment is not an integer"));
  EXPECT_TRUE(HasError(Bytes().Header(0, 1).Str("a\nb").U32(13).b, "metadata key 'a\\x0ab'"));
}

TEST(GgufTest, RejectsBadTensorInfos) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    Bytes b;
    b.Header(1, 0).Tensor("blk.0.attn_q.weight", dims, type, offset).PadTo(128);
    return b.b;
  };
  EXPECT_EQ(Error(one({4}, 0, 0)), "OK");
  EXPECT_TRUE(HasError(one({32}, 16, 0),
                       "tensor 'blk.0.attn_q.weight': unsupported ggml type 16 (IQ2_XXS)"));
  EXPECT_TRUE(HasError(one({32}, 1000, 0), "unsupported ggml type 1000"));
  EXPECT_EQ(GgufFile::FromBytes(one({32}, 16, 0).data(), 128, "t").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_TRUE(HasError(one({1, 1, 1, 1, 1}, 0, 0), "n_dims 5 exceeds the maximum of 4"));
  EXPECT_TRUE(HasError(one({1ull << 32, 1ull << 32}, 0, 0),
                       "element count overflows (dimension 1 is 4294967296)"));
  EXPECT_TRUE(HasError(one({~0ull}, 0, 0), "element count overflows (dimension 0 is"));
  EXPECT_TRUE(HasError(one({1ull << 62}, 0, 0), "byte size overflows"));
  EXPECT_TRUE(HasError(one({33, 2}, 8, 0),
                       "row length 33 is not a multiple of the Q8_0 block size 32"));
  EXPECT_TRUE(HasError(one({4}, 0, 4), "offset 4 is not a multiple of the alignment 32"));
  // Header ends at 24 + 27 + 24 = 75 bytes, so data starts at 96; 8 f32 end at 128.
  EXPECT_EQ(Error(one({8}, 0, 0)), "OK");
  EXPECT_EQ(Error(one({9}, 0, 0)),
            "t.gguf: tensor 'blk.0.attn_q.weight' data [96, 132) extends past end of file "
            "(128 bytes)");
  EXPECT_TRUE(HasError(one({4}, 0, 64), "data [160, 176) extends past end of file (128 bytes)"));
  EXPECT_TRUE(HasError(one({4}, 0, ~0ull - 31), "offset 18446744073709551584 overflows"));

  Bytes dup;
  dup.Header(2, 0).Tensor("w", {4}, 0, 0).Tensor("w", {4}, 0, 32).PadTo(256);
  EXPECT_TRUE(HasError(dup.b, "tensor 'w' appears twice"));
  Bytes big_name;
  big_name.Header(1, 0).U64(1ull << 40).PadTo(64);
  EXPECT_TRUE(HasError(big_name.b, "tensor info 0: tensor name at offset 24 has length "
                                   "1099511627776 but only 32 bytes remain"));
}

TEST(GgufTest, WriterRejectsBadTensors) {
  GgufWriter w;
  const float x[4] = {};
  EXPECT_TRUE(w.AddTensor("x", DType::kF32, {4}, x, 16).ok());
  EXPECT_EQ(w.AddTensor("x", DType::kF32, {4}, x, 16).message(), "tensor 'x' added twice");
  EXPECT_EQ(w.AddTensor("y", DType::kF32, {4}, x, 12).message(), "tensor 'y' needs 16 bytes, got 12");
  EXPECT_EQ(w.AddTensor("z", DType::kQ4_0, {2, 16}, x, 9).message(),
            "tensor 'z' row length 16 is not a multiple of the block size 32");
  EXPECT_FALSE(w.AddTensor("v", DType::kF32, {1, 1, 1, 1, 1}, x, 4).ok());
  w.AddU32("k", 1);
  w.AddString("k", "replaced");
  const std::vector<uint8_t> bytes = w.Serialize();
  auto f = GgufFile::FromBytes(bytes.data(), bytes.size(), "w.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ((*f)->GetString("k"), "replaced");
}

TEST(GgufTest, AddValueCopiesMetadata) {
  std::vector<float> fa;
  std::vector<uint8_t> qa;
  const std::vector<uint8_t> bytes = MakeRichFile(&fa, &qa).Serialize();
  auto src = GgufFile::FromBytes(bytes.data(), bytes.size(), "src.gguf");
  ASSERT_TRUE(src.ok());
  GgufWriter w;
  for (const auto& [k, v] : (*src)->metadata()) w.AddValue(k, v);
  const std::vector<uint8_t> copy = w.Serialize();
  auto dst = GgufFile::FromBytes(copy.data(), copy.size(), "dst.gguf");
  ASSERT_TRUE(dst.ok());
  ASSERT_EQ((*dst)->metadata().size(), (*src)->metadata().size());
  for (const auto& [k, v] : (*src)->metadata()) {
    const GgufValue& d = (*dst)->metadata().at(k);
    EXPECT_EQ(d.type, v.type) << k;
    EXPECT_EQ(d.elem_type, v.elem_type) << k;
    EXPECT_TRUE(d.value == v.value) << k;
  }
}

TEST(GgufTest, RealSmolLm2File) {
  const std::string path = test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "model not downloaded (scripts/fetch_models.sh)";
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->tensors().size(), 272u);
  EXPECT_EQ((*f)->GetString("general.architecture"), "llama");
  const TensorView* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dtype, DType::kQ8_0);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(emb->size_bytes, 49152u * 18 * 34);
  ASSERT_NE((*f)->GetStringArray("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ((*f)->GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
}

TEST(GgufTest, RealGemma3File) {
  const std::string path = test_util::ModelFile("gemma-3-270m-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "model not downloaded (scripts/fetch_models.sh)";
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->tensors().size(), 236u);
  EXPECT_EQ((*f)->GetString("general.architecture"), "gemma3");
}

}  // namespace
}  // namespace peng
