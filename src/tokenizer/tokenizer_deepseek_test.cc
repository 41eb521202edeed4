// DeepSeek-LLM style tokenizer.json (tests/data/deepseek_tiny/tokenizer, written by
// tools/gen_deepseek_fixtures.py): a Sequence of six Split(Isolated) regexes, byte-level BPE
// without the GPT-2 regex, full-width special tokens and a BOS-prepending post-processor.
// Token ids must equal HF tokenizers' on every case of tokenizer.golden.json (ASCII, CJK,
// Japanese, digits, CR/LF, space runs, punctuation runs, full-width characters, emoji, code,
// the Kelvin sign that the letter class covers), and decoding must give the text back.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/test_paths.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

TEST(DeepseekTokenizer, MatchesHfTokenizers) {
  const std::string dir = test_util::SourceDir() + "/tests/data/deepseek_tiny";
  std::ifstream in(dir + "/tokenizer.golden.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json g = nlohmann::json::parse(in);
  auto tok = Tokenizer::FromHfFolder(dir + "/tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), g["bos_id"].get<int32_t>());
  EXPECT_EQ((*tok)->eos_id(), g["eos_id"].get<int32_t>());
  ASSERT_GE(g["cases"].size(), 20u);
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const std::vector<int32_t> ids = (*tok)->Encode(text, /*add_bos=*/true);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    ASSERT_FALSE(ids.empty());
    std::vector<int32_t> body(ids.begin() + 1, ids.end());
    EXPECT_EQ((*tok)->Decode(body), text);
  }
  EXPECT_NE((*tok)->chat_template().find("Assistant:"), std::string::npos);
}

}  // namespace
}  // namespace peng
