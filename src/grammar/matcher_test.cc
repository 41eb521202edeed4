// Matcher and token masks: random walks over small random vocabularies where every mask must
// equal the brute-force mask computed with Grammar::Matches, the mask cache, copies forking
// state, the ambiguity cap, and the real Qwen2.5 vocabulary (skipped without the model).
#include <gtest/gtest.h>

#include <chrono>

#include <cmath>
#include <filesystem>
#include <random>

#include "grammar/grammar.h"
#include "grammar/grammar_internal.h"
#include "tokenizer/tokenizer.h"

namespace peng::grammar {
namespace {

const char* kJsonish = R"(
root   ::= obj
obj    ::= "{" ( pair ( "," pair )* )? "}"
pair   ::= str ":" val
val    ::= str | num | obj | "[" ( val ("," val)* )? "]"
str    ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\""
num    ::= "-"? [0-9]+
)";

const char* kGrammars[] = {
    kJsonish,
    "root ::= (\"ab\"{1,3} \"é\"?){2,} \"}\"?",
    "root ::= x | y\nx ::= \"a\" x \"b\" | \"é\"\ny ::= (\"€\" | \"😀\")+ \"a\"",
    "root ::= [a-bé€]* [^a-z{}\"]{1,2} ",
    "root ::= (\"a\" | \"ab\" | \"a\" \"b\")* \"b\"?",
    "root ::= \"a\" [^\\x00-\\x7F]{0,3} (\"b\" | [é-ë]) \",\"? | \"{\" root \"}\"",
};

// Byte strings over a small alphabet, including split multi-byte characters.
std::vector<std::string> RandomTokens(std::mt19937& rng, int n) {
  const std::vector<std::string> pieces = {
      "a", "b", "{", "}", "\"", ",", ":", "1", "-", "[", "]", "\\", "n", "é", "€", "😀", "ë",
      "\xC3", "\xA9", "\xE2\x82", "\xAC", "\xF0\x9F", "\x98\x80", "\xFF"};
  std::vector<std::string> tokens;
  for (const auto& p : pieces) tokens.push_back(p);
  while (int(tokens.size()) < n) {
    std::string t;
    for (int k = 0, len = 1 + rng() % 4; k < len; ++k) t += pieces[rng() % pieces.size()];
    tokens.push_back(t);
  }
  tokens.push_back(tokens[5]);  // a duplicate byte string
  return tokens;
}

struct TestVocab {
  std::shared_ptr<const TokenVocab> vocab;
  int32_t eos, control;
};

TestVocab MakeVocab(std::mt19937& rng, int n) {
  auto tokens = RandomTokens(rng, n);
  int32_t control = int32_t(tokens.size());
  tokens.push_back("");  // a special token: no bytes
  int32_t eos = int32_t(tokens.size());
  tokens.push_back("");
  std::shuffle(tokens.begin(), tokens.begin() + control, rng);
  return {TokenVocab::FromTokens(tokens, {eos}), eos, control};
}

bool Bit(const std::vector<uint32_t>& m, int64_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

std::vector<uint32_t> Mask(const Matcher& m, int64_t vocab) {
  std::vector<uint32_t> mask(MaskWords(vocab), 0xDEADBEEF);
  m.FillMask(mask.data(), vocab);
  return mask;
}

TEST(Matcher, RandomWalksMatchBruteForce) {
  std::mt19937 rng(1234);
  int checked_masks = 0;
  for (const char* text : kGrammars) {
    auto g = Grammar::ParseGbnf(text);
    ASSERT_TRUE(g.ok()) << g.status().ToString() << "\n" << text;
    for (int v = 0; v < 3; ++v) {
      TestVocab tv = MakeVocab(rng, 40 + 60 * v);
      auto compiled = CompiledGrammar::Create(*g, tv.vocab);
      ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
      const int32_t n = tv.vocab->size();
      for (int walk = 0; walk < 4; ++walk) {
        Matcher m(*compiled);
        std::string prefix;
        for (int step = 0; step < 32; ++step) {
          // Padded logits row: ids past the vocabulary stay disallowed.
          auto mask = Mask(m, n + 37);
          ++checked_masks;
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < n + 37; ++id) {
            bool want;
            if (id >= n || id == tv.control) {
              want = false;
            } else if (id == tv.eos) {
              want = g->Matches(prefix, true);
            } else {
              want = g->Matches(prefix + tv.vocab->bytes(id), false);
            }
            ASSERT_EQ(Bit(mask, id), want)
                << text << "\nprefix '" << prefix << "' token " << id << " '"
                << (id < n ? tv.vocab->bytes(id) : "") << "'";
            if (want) allowed.push_back(id);
          }
          ASSERT_EQ(m.IsComplete(), g->Matches(prefix, true)) << prefix;
          bool extendable = false;
          for (int b = 0; b < 256 && !extendable; ++b) {
            extendable = g->Matches(prefix + char(b), false);
          }
          ASSERT_EQ(m.IsTerminated(), m.IsComplete() && !extendable) << prefix;
          if (allowed.empty()) break;
          // Rejected tokens leave the state alone.
          for (int32_t id = 0; id < n; ++id) {
            if (!Bit(mask, id)) {
              ASSERT_FALSE(m.Accept(id));
              break;
            }
          }
          int32_t pick = allowed[rng() % allowed.size()];
          ASSERT_TRUE(m.Accept(pick));
          if (pick == tv.eos) {
            EXPECT_TRUE(m.IsTerminated());
            EXPECT_FALSE(m.Accept(0));
            auto after = Mask(m, n);  // only end-of-generation ids remain
            for (int32_t id = 0; id < n; ++id) EXPECT_EQ(Bit(after, id), id == tv.eos);
            break;
          }
          prefix += tv.vocab->bytes(pick);
        }
        // The cached mask equals one computed fresh by another CompiledGrammar (empty cache).
        if (!m.IsTerminated()) {
          auto fresh_compiled = CompiledGrammar::Create(*g, tv.vocab);
          ASSERT_TRUE(fresh_compiled.ok());
          Matcher fresh(*fresh_compiled);
          ASSERT_TRUE(fresh.AcceptBytes(prefix));
          EXPECT_EQ(Mask(fresh, n), Mask(m, n)) << prefix;
        }
      }
    }
  }
  EXPECT_GT(checked_masks, 500);
}

TEST(Matcher, CopiesForkState) {
  auto g = Grammar::ParseGbnf("root ::= \"ab\" (\"c\" | \"d\")");
  ASSERT_TRUE(g.ok());
  auto vocab = TokenVocab::FromTokens({"a", "b", "c", "d", "ab", "abc", ""}, {6});
  auto c = CompiledGrammar::Create(*g, vocab);
  ASSERT_TRUE(c.ok());
  Matcher a(*c);
  ASSERT_TRUE(a.Accept(0));  // "a"
  Matcher b = a;
  ASSERT_TRUE(b.Accept(1));  // "b"
  auto ma = Mask(a, 7), mb = Mask(b, 7);
  EXPECT_EQ(ma[0], 0b0000010u);  // a: only "b"
  EXPECT_EQ(mb[0], 0b0001100u);  // b: "c" or "d"
  ASSERT_TRUE(b.Accept(2));
  EXPECT_TRUE(b.IsComplete());
  EXPECT_TRUE(b.IsTerminated());
  EXPECT_EQ(Mask(b, 7)[0], 0b1000000u);  // only eos
  EXPECT_FALSE(a.IsComplete());
  Matcher d(*c);
  d = b;
  EXPECT_TRUE(d.Accept(6));
  EXPECT_FALSE(a.Accept(6));
  EXPECT_EQ(Mask(a, 7)[0], 0b0000010u);
  // Bytes: rejected input leaves the matcher as it was.
  Matcher e(*c);
  EXPECT_FALSE(e.AcceptBytes("abx"));
  EXPECT_TRUE(e.AcceptBytes(""));
  EXPECT_TRUE(e.AcceptBytes("ab"));
  EXPECT_EQ(Mask(e, 7)[0], 0b0001100u);
  EXPECT_FALSE(e.Accept(-1));
  EXPECT_FALSE(e.Accept(7));
}

TEST(Matcher, ApplyMaskSetsMinusInfinity) {
  auto g = Grammar::ParseGbnf("root ::= \"x\"");
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Create(*g, TokenVocab::FromTokens({"x", "y", ""}, {2}));
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  std::vector<float> logits(5, 1.0f);
  m.ApplyMask(logits.data(), 5);
  EXPECT_EQ(logits[0], 1.0f);
  for (int i = 1; i < 5; ++i) EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0) << i;
}

TEST(Matcher, AmbiguityIsCapped) {
  // After n a's there are ~3 * 2^n distinct stacks (each pending b/c combination): past the
  // cap the byte counts as rejected instead of growing without bound.
  auto g = Grammar::ParseGbnf("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | ");
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Create(*g, TokenVocab::FromTokens({"a", "b", "c", ""}, {3}));
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  EXPECT_TRUE(m.AcceptBytes("aaaaaaaa"));
  EXPECT_EQ(Mask(m, 4)[0], 0b0111u);
  EXPECT_FALSE(m.AcceptBytes(std::string(20, 'a')));
  EXPECT_TRUE(m.AcceptBytes("bcbc"));
  EXPECT_TRUE(g->Matches("aaaaaaaabcbc", false));
}

// A recursion that deepens over a wide character class makes every trie node a new stack set:
// a mask over Qwen2.5's vocabulary would take about a second. It fails fast instead (and the
// engine ends that request), while an ordinary JSON grammar's masks stay far below the budget.
TEST(Matcher, WorkBudgetStopsRunawayMasks) {
  std::string path = std::string(PENG_SOURCE_DIR) + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = Tokenizer::ForModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto vocab = TokenVocab::Build(**tok);
  auto g = Grammar::ParseGbnf("root ::= a\na ::= [a-z ] a [a-z ] | [a-z ] a | \"\"");
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Create(*g, vocab);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  std::vector<uint32_t> mask(MaskWords(vocab->size()));
  bool failed = false;
  for (int i = 0; i < 16 && !failed; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    failed = !m.FillMask(mask.data(), vocab->size());
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    ASSERT_TRUE(m.AcceptBytes("vectorimport"));
  }
  EXPECT_TRUE(failed);
  for (uint32_t w : mask) EXPECT_EQ(w, 0u);  // a failed mask allows nothing
}

TEST(Matcher, QwenJsonStart) {
  std::string path = std::string(PENG_SOURCE_DIR) + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = Tokenizer::ForModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto vocab = TokenVocab::Build(**tok);
  ASSERT_EQ(vocab->size(), (*tok)->vocab_size());
  auto g = Grammar::ParseGbnf(kJsonish);
  ASSERT_TRUE(g.ok());
  auto c = CompiledGrammar::Create(*g, vocab);
  ASSERT_TRUE(c.ok());
  Matcher m(*c);
  auto mask = Mask(m, vocab->size());
  auto id_of = [&](std::string_view s) {
    auto ids = (*tok)->Encode(s, false);
    EXPECT_EQ(ids.size(), 1u) << s;
    return ids.empty() ? -1 : ids[0];
  };
  EXPECT_TRUE(Bit(mask, id_of("{")));
  EXPECT_TRUE(Bit(mask, id_of("{\"")));
  EXPECT_FALSE(Bit(mask, id_of("a")));
  EXPECT_FALSE(Bit(mask, id_of("}")));
  for (int32_t eos : vocab->eos_ids()) EXPECT_FALSE(Bit(mask, eos));
  EXPECT_FALSE(vocab->eos_ids().empty());
  // Every allowed token starts with '{'.
  for (int32_t id = 0; id < vocab->size(); ++id) {
    if (Bit(mask, id)) {
      ASSERT_EQ(vocab->bytes(id)[0], '{') << id;
    }
  }
  for (int32_t id : (*tok)->Encode("{\"key\":[1,-2,{\"é\":\"x\\n\"}]}", false)) {
    ASSERT_TRUE(Bit(Mask(m, vocab->size()), id)) << id;
    ASSERT_TRUE(m.Accept(id));
  }
  EXPECT_TRUE(m.IsComplete());
  EXPECT_TRUE(m.Accept((*tok)->eos_id()));

  // Masks from context masks (the fast path) equal plain whole-trie walks, state by state,
  // through nesting deeper than the kept frames.
  const CompiledGrammar::Impl& ci = (*c)->impl();
  Stepper st(*g->impl());
  st.frames() = ci.initial_frames;
  std::vector<Top> tops = ci.initial, next;
  std::string text = R"({"a":[{"b":{"c":[[-1,{"d":"x\\\"y\n"}]]},"e":"é€😀"}],"f":{}})";
  for (size_t i = 0; i <= text.size(); ++i) {
    std::vector<uint32_t> fast(MaskWords(vocab->size())), slow(fast.size());
    ComputeTokenMask(ci, tops, st.frames(), fast.data());
    ComputeTokenMaskByWalk(*g->impl(), vocab->impl(), tops, st.frames(), slow.data());
    ASSERT_EQ(fast, slow) << text.substr(0, i);
    if (i == text.size()) break;
    ASSERT_TRUE(st.Step(tops, uint8_t(text[i]), &next) && !next.empty()) << text.substr(0, i + 1);
    tops.swap(next);
  }
}

}  // namespace
}  // namespace peng::grammar
