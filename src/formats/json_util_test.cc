#include "formats/json_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace peng {
namespace {

TEST(JsonUtilTest, ParsesValidText) {
  auto j = ParseJson(R"({"a": [1, 2], "b": "x"})", "c.json");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)["a"][1].get<int>(), 2);
  EXPECT_EQ((*j)["b"].get<std::string>(), "x");
}

TEST(JsonUtilTest, ReportsFileAndBytePosition) {
  auto j = ParseJson(R"({"a": [1, 2}")", "config.json");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(j.status().message().rfind("config.json: invalid JSON at byte 12: ", 0), 0u)
      << j.status().message();
  EXPECT_FALSE(ParseJson("", "empty.json").ok());
  EXPECT_FALSE(ParseJson(std::string(100000, '['), "deep.json").ok());
  // A hostile token does not make a huge message.
  auto big = ParseJson("\"" + std::string(100000, 'x'), "big.json");
  ASSERT_FALSE(big.ok());
  EXPECT_LT(big.status().message().size(), 400u);
}

TEST(JsonUtilTest, ParsesFiles) {
  const std::string path =
      ::testing::TempDir() + "/json_util_test_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << R"({"hidden_size": 576})";
  auto j = ParseJsonFile(path);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["hidden_size"].get<int>(), 576);
  std::filesystem::remove(path);
  auto missing = ParseJsonFile(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message().rfind(path + ": ", 0), 0u);
}

}  // namespace
}  // namespace peng
