// Structured output through the engine on SmolLM2 (skipped when the model file is absent):
// grammars from JSON Schema / regex / choices constrain what is sampled, with n > 1, seeds and
// logprobs, without changing what the other requests of a batch produce; logit_bias and
// skip_special_tokens.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/test_paths.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "grammar/gbnf_builder.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

using test_util::Greedy;
using test_util::Result;
using test_util::RunBatch;
using test_util::RunOne;

class StructuredOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test_util::ModelFile("smollm2-135m-instruct-q4_1.gguf");
    if (path.empty()) return;
    EngineOptions o;
    o.model_path = path;
    o.threads = 2;
    o.max_model_len = 512;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(*e).release();
    vocab_ = new std::shared_ptr<const grammar::TokenVocab>(
        grammar::TokenVocab::Build(*engine_->tokenizer()));
  }
  static void TearDownTestSuite() {
    if (engine_) test_util::ExpectIdleAndFreed(engine_);
    delete engine_;
    delete vocab_;
    engine_ = nullptr;
    vocab_ = nullptr;
  }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "smollm2-135m-instruct-q4_1.gguf not found";
  }

  static std::shared_ptr<const grammar::CompiledGrammar> Compile(const std::string& gbnf) {
    auto g = grammar::Grammar::ParseGbnf(gbnf);
    EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << gbnf;
    if (!g.ok()) return nullptr;
    auto c = grammar::CompiledGrammar::Create(*g, *vocab_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : nullptr;
  }

  // A chat prompt for `question`.
  static test_util::Ids Chat(const std::string& question) {
    return engine_->tokenizer()->Encode(
        "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n", false);
  }

  static GenerateRequest Sampled(const std::string& id, const std::string& question,
                                 int max_tokens, int n, int64_t seed) {
    GenerateRequest r;
    r.id = id;
    r.prompt = Chat(question);
    r.params.temperature = 1.0f;
    r.params.seed = seed;
    r.params.max_tokens = max_tokens;
    r.n = n;
    return r;
  }

  static Engine* engine_;
  static std::shared_ptr<const grammar::TokenVocab>* vocab_;
};

Engine* StructuredOutput::engine_ = nullptr;
std::shared_ptr<const grammar::TokenVocab>* StructuredOutput::vocab_ = nullptr;

TEST_F(StructuredOutput, ChoiceWithNAndSeeds) {
  const std::vector<std::string> choices = {"red", "green", "blue", "dark purple"};
  GenerateRequest r = Sampled("choice", "Name a colour.", 32, 6, 42);
  r.grammar = Compile(grammar::ChoiceToGbnf(choices));
  ASSERT_TRUE(r.grammar);
  r.params.want_logprobs = true;
  r.params.logprobs = 2;
  Result got = RunOne(engine_, r);
  for (int i = 0; i < r.n; ++i) {
    EXPECT_NE(std::find(choices.begin(), choices.end(), got.text[i]), choices.end())
        << "completion " << i << ": '" << got.text[i] << "'";
    EXPECT_EQ(got.finish[i], "stop");  // nothing can follow a whole choice
    EXPECT_EQ(got.logprobs[i].size(), got.tokens[i].size());
  }
  // The same seed gives the same completions.
  r.id = "choice-again";
  EXPECT_EQ(RunOne(engine_, r).tokens, got.tokens);
}

TEST_F(StructuredOutput, RegexIsFollowedByEverySample) {
  auto gbnf = grammar::RegexToGbnf("\\(\\d{3}\\) \\d{3}-\\d{4}");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  GenerateRequest r = Sampled("phone", "Give me a phone number.", 40, 4, 7);
  r.grammar = Compile(*gbnf);
  ASSERT_TRUE(r.grammar);
  Result got = RunOne(engine_, r);
  const std::regex re("\\(\\d{3}\\) \\d{3}-\\d{4}");
  for (int i = 0; i < r.n; ++i) {
    EXPECT_TRUE(std::regex_match(got.text[i], re)) << "'" << got.text[i] << "'";
    EXPECT_EQ(got.finish[i], "stop");
  }
}

TEST_F(StructuredOutput, JsonSchemaOutputParsesAndHasTheRequiredFields) {
  const auto schema = nlohmann::json::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 24},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]}
    },
    "required": ["name", "age", "city"],
    "additionalProperties": false})");
  auto gbnf = grammar::JsonSchemaToGbnf(schema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().ToString();
  GenerateRequest r = Sampled("json", "Describe a person as JSON.", 120, 3, 1);
  r.grammar = Compile(*gbnf);
  ASSERT_TRUE(r.grammar);
  Result got = RunOne(engine_, r);
  for (int i = 0; i < r.n; ++i) {
    ASSERT_EQ(got.finish[i], "stop") << got.text[i];
    auto j = nlohmann::json::parse(got.text[i], nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << got.text[i];
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j.size(), 3u) << got.text[i];
    EXPECT_TRUE(j["name"].is_string());
    EXPECT_LE(j["name"].get<std::string>().size(), 24u);
    ASSERT_TRUE(j["age"].is_number_integer());
    EXPECT_GE(j["age"].get<int64_t>(), 0);
    EXPECT_LE(j["age"].get<int64_t>(), 150);
    EXPECT_TRUE(j["city"] == "Paris" || j["city"] == "Berlin" || j["city"] == "Tokyo");
  }
}

// Free requests batched with constrained ones produce exactly what they produce alone.
TEST_F(StructuredOutput, OtherRequestsOfTheBatchAreUnaffected) {
  std::vector<GenerateRequest> free_reqs;
  for (int i = 0; i < 3; ++i) {
    free_reqs.push_back(Greedy("free" + std::to_string(i),
                               Chat("Tell me about the number " + std::to_string(i)), 16));
  }
  std::vector<Result> alone;
  for (const GenerateRequest& r : free_reqs) alone.push_back(RunOne(engine_, r));
  std::vector<GenerateRequest> mixed = free_reqs;
  for (GenerateRequest& r : mixed) r.id += "-mixed";
  GenerateRequest c = Sampled("constrained", "Pick one.", 16, 2, 3);
  c.grammar = Compile(grammar::ChoiceToGbnf({"alpha", "beta"}));
  mixed.insert(mixed.begin() + 1, c);
  std::vector<Result> got = RunBatch(engine_, mixed);
  EXPECT_EQ(got[0].tokens, alone[0].tokens);
  EXPECT_EQ(got[2].tokens, alone[1].tokens);
  EXPECT_EQ(got[3].tokens, alone[2].tokens);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(got[1].text[i] == "alpha" || got[1].text[i] == "beta");
}

TEST_F(StructuredOutput, LogitBiasBansAndForces) {
  GenerateRequest r = Greedy("bias", Chat("Say something."), 4);
  const Result plain = RunOne(engine_, r);
  ASSERT_EQ(plain.tokens[0].size(), 4u);
  const int32_t first = plain.tokens[0][0];
  r.id = "ban";
  r.params.logit_bias = {{first, -100.0f}};
  EXPECT_NE(RunOne(engine_, r).tokens[0][0], first);
  const int32_t forced = engine_->tokenizer()->Encode(" banana", false)[0];
  r.id = "force";
  r.params.logit_bias = {{forced, 100.0f}};
  const Result f = RunOne(engine_, r);
  EXPECT_EQ(f.tokens[0], test_util::Ids(4, forced));
  // Out of the vocabulary: refused at submission.
  r.id = "oov";
  r.params.logit_bias = {{1 << 30, 1.0f}};
  auto s = engine_->Submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("logit_bias: token id 1073741824"), std::string::npos);
}

TEST_F(StructuredOutput, SkipSpecialTokensApplies) {
  const Tokenizer& tok = *engine_->tokenizer();
  const int32_t marker = tok.FindPiece("<|im_start|>");
  ASSERT_GE(marker, 0);
  ASSERT_TRUE(tok.IsControl(marker));
  GenerateRequest r = Greedy("special", Chat("Hi."), 2);
  r.params.logit_bias = {{marker, 100.0f}};
  EXPECT_EQ(RunOne(engine_, r).text[0], "");  // skip_special_tokens defaults to true
  r.id = "special-kept";
  r.params.skip_special_tokens = false;
  EXPECT_EQ(RunOne(engine_, r).text[0], "<|im_start|><|im_start|>");
}

}  // namespace
}  // namespace peng
