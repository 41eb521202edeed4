// quant_config.json parsing and the consistency check between a quant config and the tensors of
// its folder: every error names the field or tensor at fault.
#include "model/quant_config.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

namespace peng {
namespace {

nlohmann::json ValidJson() {
  return {{"format", "peng-int8"}, {"format_version", 1}, {"scheme", "w8a8"},
          {"group_size", -1},      {"quantized", {"a.weight"}}};
}

void ExpectError(const Status& s, const std::string& substr) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(substr), std::string::npos) << s.message();
}

TEST(QuantConfigTest, ParsesAndRoundTrips) {
  auto c = QuantConfig::FromJson(ValidJson(), "q.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->scheme, QuantScheme::kW8A8);
  EXPECT_EQ(c->quantized, std::vector<std::string>{"a.weight"});
  c->skipped.emplace_back("lm_head.weight", "matches --skip pattern 'lm_head.weight'");
  const nlohmann::json j = c->ToJson();
  EXPECT_EQ(j["scheme"], "w8a8");
  EXPECT_EQ(j["granularity"], "per_channel");
  EXPECT_EQ(j["activation_group_size"], 32);
  EXPECT_EQ(j["skipped"][0]["name"], "lm_head.weight");
  auto back = QuantConfig::FromJson(j, "q.json");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->skipped, c->skipped);
}

TEST(QuantConfigTest, RejectsBadConfigs) {
  nlohmann::json j = ValidJson();
  j["scheme"] = "w4a4";
  ExpectError(QuantConfig::FromJson(j, "q.json").status(), "unknown quantization scheme 'w4a4'");
  j = ValidJson();
  j["format_version"] = 7;
  ExpectError(QuantConfig::FromJson(j, "q.json").status(), "format_version 7");
  j = ValidJson();
  j["group_size"] = 128;
  ExpectError(QuantConfig::FromJson(j, "q.json").status(), "group_size 128");
  j = ValidJson();
  j.erase("quantized");
  ExpectError(QuantConfig::FromJson(j, "q.json").status(), "'quantized'");
  j = ValidJson();
  j["format"] = "gptq";
  ExpectError(QuantConfig::FromJson(j, "q.json").status(), "unknown format 'gptq'");
  ExpectError(QuantConfig::FromJson(nlohmann::json::array(), "q.json").status(), "q.json");
}

// In-memory tensors: a.weight I8 [4, 32] with a.weight_scale F32 [4], plus a float norm.
struct Fixture {
  std::vector<int8_t> q = std::vector<int8_t>(4 * 32, 1);
  std::vector<float> s = {0.1f, 0.2f, 0.3f, 0.4f};
  std::vector<float> norm = std::vector<float>(32, 1.f);
  TensorView w{"a.weight", DType::kI8, {4, 32}, nullptr, 128};
  TensorView ws{"a.weight_scale", DType::kF32, {4}, nullptr, 16};
  TensorView n{"norm.weight", DType::kF32, {32}, nullptr, 128};
  Fixture() {
    w.data = q.data();
    ws.data = s.data();
    n.data = norm.data();
  }
  std::vector<const TensorView*> All() { return {&w, &ws, &n}; }
};

TEST(QuantConfigTest, ValidTensorsPass) {
  Fixture f;
  auto c = QuantConfig::FromJson(ValidJson(), "q.json");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(ValidateQuantizedTensors(&*c, f.All(), "m").ok());
  f.ws.shape = {4, 1};  // [rows, 1] is accepted too
  EXPECT_TRUE(ValidateQuantizedTensors(&*c, f.All(), "m").ok());
}

TEST(QuantConfigTest, MismatchedTensorsAreErrors) {
  auto c = QuantConfig::FromJson(ValidJson(), "q.json");
  ASSERT_TRUE(c.ok());
  {
    Fixture f;
    ExpectError(ValidateQuantizedTensors(nullptr, f.All(), "m"), "no quant_config.json");
  }
  {
    Fixture f;  // missing scale
    ExpectError(ValidateQuantizedTensors(&*c, {&f.w, &f.n}, "m"),
                "has no scale tensor 'a.weight_scale'");
  }
  {
    Fixture f;  // wrong scale shape
    f.ws.shape = {3};
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "expected F32 [4]");
  }
  {
    Fixture f;  // wrong scale dtype
    f.ws.dtype = DType::kF16;
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "is F16");
  }
  {
    Fixture f;  // NaN scale
    f.s[2] = std::numeric_limits<float>::quiet_NaN();
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "invalid value");
  }
  {
    Fixture f;  // an INT8 tensor the config does not list
    f.w.name = "b.weight";
    f.ws.name = "b.weight_scale";
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "'b.weight' is not listed");
  }
  {
    Fixture f;  // listed but stored as float
    f.w.dtype = DType::kF32;
    f.w.size_bytes = 4 * 32 * 4;
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "scale tensor 'a.weight_scale'");
  }
  {
    Fixture f;  // 3-D INT8 stack of 2 matrices of 2 rows: scales must be [2, 2]
    f.w.shape = {2, 2, 32};
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "expected F32 [2, 2]");
    f.ws.shape = {2, 2};
    EXPECT_TRUE(ValidateQuantizedTensors(&*c, f.All(), "m").ok());
    f.w.shape = {2, 2, 2, 16};
    ExpectError(ValidateQuantizedTensors(&*c, f.All(), "m"), "expected a 2-D matrix");
  }
}

}  // namespace
}  // namespace peng
