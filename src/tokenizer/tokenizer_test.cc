// Unit tests that need no model file: hand-made byte-level BPE and SentencePiece vocabularies,
// the tokenizer.json fixture under tests/data/tokenizer/tiny_bpe, pre-tokenizer regexes and
// streaming detokenization.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/unicode_util.h"

namespace peng {
namespace {

using Ids = std::vector<int32_t>;

std::string DataDir() {
  const char* env = std::getenv("PENG_SOURCE_DIR");
  return std::string(env ? env : PENG_SOURCE_DIR) + "/tests/data/tokenizer";
}

std::vector<std::string> Split(const std::vector<std::string>& regexes, std::string_view text) {
  auto pre = PreTokenizer::Create(regexes);
  EXPECT_TRUE(pre.ok()) << pre.status().ToString();
  std::vector<std::string_view> views;
  (*pre)->Split(text, &views);
  return {views.begin(), views.end()};
}

std::vector<std::string> ForPre(std::string_view name, std::string_view text) {
  std::vector<std::string> regexes;
  EXPECT_TRUE(RegexesForPreName(name, &regexes)) << name;
  return Split(regexes, text);
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizerTest, Gpt2) {
  EXPECT_EQ(ForPre("gpt2", "Hello world's  123 ok!!\n\n"),
            (Pieces{"Hello", " world", "'s", " ", " 123", " ok", "!!", "\n\n"}));
}

TEST(PreTokenizerTest, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(ForPre("llama-bpe", "I'M 1234567 x\n\n y"),
            (Pieces{"I", "'M", " ", "123", "456", "7", " x", "\n\n", " y"}));
}

TEST(PreTokenizerTest, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(ForPre("qwen2", "v12 ab"), (Pieces{"v", "1", "2", " ab"}));
}

TEST(PreTokenizerTest, SmollmDigitsThenGpt2) {
  EXPECT_EQ(ForPre("smollm", "a 12b"), (Pieces{"a", " ", "1", "2", "b"}));
}

TEST(PreTokenizerTest, DeepseekRegexesCompile) {
  EXPECT_EQ(ForPre("deepseek-llm", "Hi 你好 12"), (Pieces{"Hi", " ", "你好", " ", "12"}));
  EXPECT_EQ(ForPre("deepseek3-llm", "Hi 你好 1234"),
            (Pieces{"Hi", " ", "你好", " ", "123", "4"}));
}

TEST(PreTokenizerTest, InvalidUtf8IsKept) {
  EXPECT_EQ(Split({kGpt2Regex}, "ab\xFF" "cd"), (Pieces{"ab", "\xFF", "cd"}));
}

// The byte-level alphabet both ways: every byte round-trips; text outside the alphabet and a
// stray byte that is not UTF-8 are copied as they are.
TEST(ByteLevelTest, DecodeMapsLettersAndKeepsTheRest) {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  EXPECT_EQ(ByteLevelDecode(ByteLevelEncode(bytes)), bytes);
  EXPECT_EQ(ByteLevelDecode("\xC4\xA0" "a"), " a");  // Ġ is the space's letter
  EXPECT_EQ(ByteLevelDecode("\xE4\xBD\xA0"), "\xE4\xBD\xA0");  // 你: no letter, kept
  EXPECT_EQ(ByteLevelDecode("\xC4" "A"), "\xC4" "A");  // not U+0101 (byte 1's letter)
}

// Byte-level BPE over the alphabet {a, b, c, space(Ġ)}.
VocabSpec TinyBpeSpec() {
  VocabSpec spec;
  spec.model = TokenizerModel::kByteLevelBpe;
  const std::string g = "\xC4\xA0";  // Ġ, the byte-level letter for a space
  spec.tokens = {"<unk>", "<|end|>", "a", "b", "c", g, "ab", "abc", g + "a", g + "ab"};
  spec.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kNormal, TokenType::kNormal,
                TokenType::kNormal,  TokenType::kNormal,  TokenType::kNormal, TokenType::kNormal,
                TokenType::kNormal,  TokenType::kNormal};
  spec.merges = {{"a", "b"}, {"ab", "c"}, {g, "a"}, {g + "a", "b"}};
  spec.pre_regexes = {kGpt2Regex};
  spec.unk_id = 0;
  spec.eos_id = 1;
  return spec;
}

TEST(BpeTest, MergesLowestRankFirst) {
  auto tok = Tokenizer::FromSpec(TinyBpeSpec());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  // "abc" -> a b c -> ab c -> abc. " ab": (a,b) has rank 0 so it wins over (Ġ,a) rank 2,
  // and (Ġ,ab) is no merge. "aab" -> a ab. "d" is unknown.
  EXPECT_EQ(t.Encode("abc", false), (Ids{7}));
  EXPECT_EQ(t.Encode(" ab", false), (Ids{5, 6}));
  EXPECT_EQ(t.Encode(" a", false), (Ids{8}));
  EXPECT_EQ(t.Encode("aab", false), (Ids{2, 6}));
  EXPECT_EQ(t.Encode("abc ab d", false), (Ids{7, 5, 6, 5, 0}));
  EXPECT_EQ(t.Decode({7, 5, 6}), "abc ab");
  EXPECT_TRUE(t.IsEndOfGeneration(1));
  EXPECT_FALSE(t.IsEndOfGeneration(7));
}

TEST(BpeTest, SpecialTokensInText) {
  auto tok = Tokenizer::FromSpec(TinyBpeSpec());
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.Encode("ab<|end|>c", false), (Ids{6, 1, 4}));
  EXPECT_EQ(t.Encode("ab<|end|>c", false, /*parse_special=*/false),
            (Ids{6, 0, 0, 0, 0, 0, 0, 0, 4}));  // '<', '|', 'e', ... are not in the vocabulary
  EXPECT_EQ(t.Decode({6, 1, 4}), "ab<|end|>c");
  EXPECT_EQ(t.Decode({6, 1, 4}, /*skip_special=*/true), "abc");
}

TEST(BpeTest, IgnoreMergesEmitsWholeWord) {
  VocabSpec spec = TinyBpeSpec();
  spec.tokens.push_back("ca");  // reachable only as a whole word: there is no (c, a) merge
  spec.types.push_back(TokenType::kNormal);
  auto plain = Tokenizer::FromSpec(spec);
  spec.ignore_merges = true;
  auto whole = Tokenizer::FromSpec(spec);
  ASSERT_TRUE(plain.ok() && whole.ok());
  EXPECT_EQ((*plain)->Encode("ca", false), (Ids{4, 2}));
  EXPECT_EQ((*whole)->Encode("ca", false), (Ids{10}));
}

// SentencePiece BPE: merges by score, U+2581 for spaces, byte fallback.
VocabSpec TinySpmSpec() {
  VocabSpec spec;
  spec.model = TokenizerModel::kSentencePieceBpe;
  const std::string s = "\xE2\x96\x81";  // ▁
  spec.tokens = {"<unk>", "<s>", "</s>", "<0x69>", "<0xC3>", "<0xA9>", s, "h", "e", "l", "o",
                 s + "h", "he", "ll", s + "he", "llo", s + "hello", "<eot>"};
  spec.scores = {0, 0, 0, 0, 0, 0, -1, -2, -2, -2, -2, -5, -1, -3, -4, -6, -7, 0};
  spec.types.assign(spec.tokens.size(), TokenType::kNormal);
  spec.types[0] = TokenType::kUnknown;
  spec.types[1] = spec.types[2] = spec.types[17] = TokenType::kControl;
  for (int i = 3; i <= 5; ++i) spec.types[i] = TokenType::kByte;
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  spec.add_space_prefix = true;
  return spec;
}

TEST(SpmTest, MergesHighestScoreFirst) {
  auto tok = Tokenizer::FromSpec(TinySpmSpec());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  // "▁hello": he(-1) first, then ll(-3) beats ▁he(-4), then ▁he(-4), then llo(-6) beats
  // nothing else, then ▁hello(-7).
  EXPECT_EQ(t.Encode("hello", true), (Ids{1, 16}));
  // "▁hel": he, then ▁he; 'l' stays.
  EXPECT_EQ(t.Encode("hel", false), (Ids{14, 9}));
  // 'i' and 'é' are not pieces: byte fallback.
  EXPECT_EQ(t.Encode("hi", false), (Ids{11, 3}));
  EXPECT_EQ(t.Encode("\xC3\xA9", false), (Ids{6, 4, 5}));
  // 'z' has no byte token: unk.
  EXPECT_EQ(t.Encode("z", false), (Ids{6, 0}));
  // A space prefix is added at the start and after each special token.
  EXPECT_EQ(t.Encode("he<eot>he", false), (Ids{14, 17, 14}));
}

TEST(SpmTest, DecodeRestoresSpacesAndBytes) {
  auto tok = Tokenizer::FromSpec(TinySpmSpec());
  ASSERT_TRUE(tok.ok());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.Decode({1, 16, 11, 3}), "<s>hello hi");
  EXPECT_EQ(t.Decode({1, 16, 11, 3}, /*skip_special=*/true), "hello hi");
  EXPECT_EQ(t.Decode(t.Encode("hello h\xC3\xA9", true), true), "hello h\xC3\xA9");
  EXPECT_EQ(t.TokenText(5), "\xA9");
  EXPECT_EQ(t.TokenText(16), " hello");
}

struct Golden {
  std::vector<std::string> texts;
  std::vector<Ids> ids;
};

Golden LoadGolden(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  for (const auto& c : j.at("cases")) {
    g.texts.push_back(c.at("text").get<std::string>());
    g.ids.push_back(c.at("ids").get<Ids>());
  }
  return g;
}

TEST(HfTokenizerTest, TinyBpeFixtureMatchesHfTokenizers) {
  auto tok = Tokenizer::FromHfFolder(DataDir() + "/tiny_bpe");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), 400);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_FALSE(t.add_bos_default());
  EXPECT_EQ(t.chat_template(), "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  EXPECT_TRUE(t.IsEndOfGeneration(2));
  const Golden g = LoadGolden(DataDir() + "/tiny_bpe.golden.json");
  ASSERT_EQ(g.texts.size(), 41u);
  for (size_t i = 0; i < g.texts.size(); ++i) {
    EXPECT_EQ(t.Encode(g.texts[i], false), g.ids[i]) << "case " << i << ": " << g.texts[i];
    EXPECT_EQ(t.Decode(g.ids[i]), g.texts[i]) << "case " << i;
  }
}

TEST(HfTokenizerTest, MissingFolderIsAnError) {
  auto tok = Tokenizer::FromHfFolder("/nonexistent/tokenizer");
  EXPECT_FALSE(tok.ok());
}

TEST(StreamingDecoderTest, DrainHoldsIncompleteSequences) {
  std::string bytes = "a\xE4\xBB", out;  // 今 is E4 BB 8A
  DrainUtf8(&bytes, false, &out);
  EXPECT_EQ(out, "a");
  EXPECT_EQ(bytes, "\xE4\xBB");
  bytes += "\x8A\xF0\x9F";
  DrainUtf8(&bytes, false, &out);
  EXPECT_EQ(out, "a\xE4\xBB\x8A");
  EXPECT_EQ(bytes, "\xF0\x9F");
  DrainUtf8(&bytes, true, &out);  // incomplete tail at the end: one U+FFFD
  EXPECT_EQ(out, "a\xE4\xBB\x8A\xEF\xBF\xBD");
  EXPECT_EQ(bytes, "");
}

TEST(StreamingDecoderTest, InvalidBytesBecomeReplacementAtOnce) {
  std::string bytes = "\xFF" "x\xE4" "y", out;  // E4 followed by 'y' can never complete
  DrainUtf8(&bytes, false, &out);
  EXPECT_EQ(out, "\xEF\xBF\xBD" "x\xEF\xBF\xBD" "y");
  EXPECT_EQ(bytes, "");
}

TEST(StreamingDecoderTest, SplitCharactersAcrossTokens) {
  auto tok = Tokenizer::FromSpec(TinySpmSpec());
  ASSERT_TRUE(tok.ok());
  StreamingDecoder dec(**tok);
  EXPECT_EQ(dec.Push(16), " hello");
  EXPECT_EQ(dec.Push(4), "");  // first byte of é
  EXPECT_EQ(dec.Push(5), "\xC3\xA9");
  EXPECT_EQ(dec.Push(4), "");
  EXPECT_EQ(dec.Flush(), "\xEF\xBF\xBD");
}

TEST(StreamingDecoderTest, ChineseAndEmojiWithTinyBpe) {
  auto tok = Tokenizer::FromHfFolder(DataDir() + "/tiny_bpe");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::string text =
      "\xE4\xBB\x8A\xE5\xA4\xA9 \xF0\x9F\x98\x80 "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7";
  // = "今天 😀 👨‍👩‍👧" (ZWJ family)
  const Ids ids = (*tok)->Encode(text, false);
  StreamingDecoder dec(**tok);
  std::string streamed;
  int held = 0;
  for (int32_t id : ids) {
    const std::string piece = dec.Push(id);
    bool incomplete = false;
    for (size_t i = 0; i < piece.size();) {  // every chunk is whole characters
      const int n = ValidUtf8Prefix(std::string_view(piece).substr(i), &incomplete);
      ASSERT_GT(n, 0) << "chunk " << streamed.size();
      i += n;
    }
    held += piece.empty();
    streamed += piece;
  }
  streamed += dec.Flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0);  // the byte-level tokens really did split characters
}

}  // namespace
}  // namespace peng
