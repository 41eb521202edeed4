// Golden tests against llama.cpp: every string of tests/data/tokenizer/corpus.json must give
// exactly the ids recorded by tools/gen_tokenizer_golden.py, and decode back to itself. Needs
// the GGUF files in models/ (or $PENG_MODELS_DIR); skipped when they are missing.
#include <gtest/gtest.h>

#include "core/test_paths.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

using ::peng::test_util::SourceDir;

std::string ModelPath(const std::string& file) { return test_util::ModelsDir() + "/" + file; }

struct LoadedModel {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tok;
  nlohmann::json golden;
};

// Loads golden `name` and its GGUF; sets *skip when the model file is absent.
LoadedModel Load(const std::string& name, bool* skip) {
  LoadedModel m;
  std::ifstream in(SourceDir() + "/tests/data/tokenizer/" + name + ".golden.json");
  EXPECT_TRUE(in.good()) << name;
  m.golden = nlohmann::json::parse(in);
  const std::string path = ModelPath(m.golden.at("file").get<std::string>());
  *skip = !std::filesystem::exists(path);
  if (*skip) return m;
  auto gguf = GgufFile::Open(path);
  EXPECT_TRUE(gguf.ok()) << gguf.status().ToString();
  if (!gguf.ok()) return m;
  m.gguf = std::move(gguf).value();
  auto tok = Tokenizer::FromGguf(*m.gguf);
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  if (tok.ok()) m.tok = std::move(tok).value();
  return m;
}

void CheckCorpus(const LoadedModel& m) {
  ASSERT_NE(m.tok, nullptr);
  const Tokenizer& t = *m.tok;
  const auto& cases = m.golden.at("cases");
  ASSERT_EQ(cases.size(), 41u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string text = cases[i].at("text").get<std::string>();
    const Ids want = cases[i].at("ids").get<Ids>();
    const Ids got = t.Encode(text, /*add_bos=*/false);
    EXPECT_EQ(got, want) << "case " << i << ": " << text;
    EXPECT_EQ(t.Decode(got), text) << "case " << i;
    StreamingDecoder dec(t);
    std::string streamed;
    for (int32_t id : got) streamed += dec.Push(id);
    EXPECT_EQ(streamed + dec.Flush(), text) << "case " << i;
  }
  const std::string first = cases[0].at("text").get<std::string>();
  EXPECT_EQ(t.Encode(first, t.add_bos_default()), m.golden.at("first_with_bos").get<Ids>());
}

// Encodes ~4 KB of mixed text (the corpus repeated) and decodes it back; prints the best time
// of a few runs. The time is printed, not asserted: a timed unit test fails on a loaded machine
// or under qemu (scripts/test_arm64.sh), whatever the code does.
void EncodeLongText(const Tokenizer& t, const nlohmann::json& cases) {
  std::string text;
  while (text.size() < 4096) {
    for (const auto& c : cases) text += c.at("text").get<std::string>() + "\n";
  }
  double best = 1e9;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const Ids ids = t.Encode(text, false);
    const std::chrono::duration<double, std::milli> ms = std::chrono::steady_clock::now() - start;
    best = std::min(best, ms.count());
    EXPECT_EQ(t.Decode(ids), text);
  }
  std::printf("encode %zu bytes: %.3f ms\n", text.size(), best);
}

TEST(TokenizerGoldenTest, SmolLm2) {
  bool skip = false;
  LoadedModel m = Load("smollm2", &skip);
  if (skip) GTEST_SKIP() << "SmolLM2 GGUF not found";
  CheckCorpus(m);
  const Tokenizer& t = *m.tok;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_FALSE(t.add_bos_default());
  EXPECT_TRUE(t.IsEndOfGeneration(2));  // <|im_end|>
  EXPECT_TRUE(t.IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(t.IsEndOfGeneration(1));  // <|im_start|>
  EXPECT_TRUE(t.chat_template().starts_with("{% for message in messages %}"));
  EncodeLongText(t, m.golden.at("cases"));
}

TEST(TokenizerGoldenTest, Qwen2) {
  bool skip = false;
  LoadedModel m = Load("qwen2", &skip);
  if (skip) GTEST_SKIP() << "Qwen2.5 GGUF not found";
  CheckCorpus(m);
  const Tokenizer& t = *m.tok;
  EXPECT_EQ(t.vocab_size(), 151936);
  EXPECT_EQ(t.eos_id(), 151645);
  EXPECT_TRUE(t.IsEndOfGeneration(151645));  // <|im_end|>
  EXPECT_TRUE(t.IsEndOfGeneration(151643));  // <|endoftext|>
  EXPECT_FALSE(t.IsEndOfGeneration(151644));  // <|im_start|>
  EXPECT_FALSE(t.chat_template().empty());
  EncodeLongText(t, m.golden.at("cases"));
}

TEST(TokenizerGoldenTest, Gemma3) {
  bool skip = false;
  LoadedModel m = Load("gemma3", &skip);
  if (skip) GTEST_SKIP() << "Gemma 3 GGUF not found";
  CheckCorpus(m);
  const Tokenizer& t = *m.tok;
  EXPECT_EQ(t.model(), TokenizerModel::kSentencePieceBpe);
  EXPECT_EQ(t.vocab_size(), 262144);
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.add_bos_default());
  EXPECT_TRUE(t.IsEndOfGeneration(1));    // <eos>
  EXPECT_TRUE(t.IsEndOfGeneration(106));  // <end_of_turn>
  EXPECT_FALSE(t.IsEndOfGeneration(105));  // <start_of_turn>
  EXPECT_EQ(t.Decode({2, 9259}, /*skip_special=*/true), "Hello");
  EncodeLongText(t, m.golden.at("cases"));
}

}  // namespace
}  // namespace peng
