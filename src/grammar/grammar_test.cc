// GBNF parsing (accepted syntax, error messages with line:column), UTF-8 character classes
// compiled to byte ranges, and the brute-force recognizer Grammar::Matches.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <random>

#include "core/utf8.h"

namespace peng::grammar {
namespace {

Grammar Parse(std::string_view text) {
  auto g = Grammar::ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << text;
  return g.ok() ? *g : Grammar();
}

std::string ParseError(std::string_view text) {
  auto g = Grammar::ParseGbnf(text);
  if (g.ok()) return "(parsed)";
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  return g.status().message();
}

std::string Utf8(uint32_t cp) {  // (core_test checks the encoder against the compiler's)
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

TEST(GbnfParse, LiteralsAlternativesAndGroups) {
  Grammar g = Parse("root ::= \"ab\" | \"c\" (\"d\" | \"e\")  # comment\n");
  EXPECT_TRUE(g.Matches("ab", true));
  EXPECT_TRUE(g.Matches("cd", true));
  EXPECT_TRUE(g.Matches("ce", true));
  EXPECT_FALSE(g.Matches("c", true));
  EXPECT_TRUE(g.Matches("c", false));
  EXPECT_TRUE(g.Matches("", false));
  EXPECT_FALSE(g.Matches("", true));
  EXPECT_FALSE(g.Matches("abc", false));
  EXPECT_FALSE(g.Matches("x", false));
}

TEST(GbnfParse, RulesNewlinesAndComments) {
  Grammar g = Parse(
      "# leading comment\n"
      "root ::= greeting \" \" name\r\n"
      "greeting ::= \"hi\" |\n"
      "    \"hello\"\n"
      "name ::= (\n"
      "  \"bob\"   # inside a group newlines are fine\n"
      "  | \"al\"\n"
      ")\n");
  EXPECT_TRUE(g.Matches("hi bob", true));
  EXPECT_TRUE(g.Matches("hello al", true));
  EXPECT_FALSE(g.Matches("hello", true));
  EXPECT_FALSE(g.Matches("hey al", false));
}

TEST(GbnfParse, Repetitions) {
  Grammar g = Parse("root ::= \"a\"{2} \"b\"{1,3} \"c\"{2,} \"d\"* \"e\"+ \"f\"?");
  EXPECT_TRUE(g.Matches("aabcce", true));
  EXPECT_TRUE(g.Matches("aabbbcccccdddeef", true));
  EXPECT_FALSE(g.Matches("abcce", true));
  EXPECT_FALSE(g.Matches("aabbbbcce", false));
  EXPECT_FALSE(g.Matches("aabce", false));
  EXPECT_FALSE(g.Matches("aabcc", true));
  EXPECT_TRUE(g.Matches("aabcc", false));
  Grammar h = Parse("root ::= (\"ab\" | \"c\"){0,2} \"x\"{ 0 }");
  EXPECT_TRUE(h.Matches("", true));
  EXPECT_TRUE(h.Matches("abc", true));
  EXPECT_TRUE(h.Matches("cab", true));
  EXPECT_FALSE(h.Matches("ccc", false));
  EXPECT_FALSE(h.Matches("x", false));
  // A postfix on a multi-byte literal repeats the whole literal.
  Grammar k = Parse("root ::= \"ab\"+");
  EXPECT_TRUE(k.Matches("abab", true));
  EXPECT_FALSE(k.Matches("abb", false));
}

TEST(GbnfParse, NestedAndRecursiveRules) {
  Grammar g = Parse(
      "root ::= list\n"
      "list ::= \"[\" (item (\",\" item)*)? \"]\"\n"
      "item ::= [0-9]+ | list\n");
  EXPECT_TRUE(g.Matches("[]", true));
  EXPECT_TRUE(g.Matches("[1,[2,[]],34]", true));
  EXPECT_TRUE(g.Matches("[1,[2,[", false));
  EXPECT_FALSE(g.Matches("[1,]", false));
  EXPECT_FALSE(g.Matches("[[]", true));
}

TEST(GbnfParse, Escapes) {
  Grammar g = Parse(R"(root ::= "\n\r\t\\\"\[\]\x41\u00e9\U0001F600" [\x30-\x39\]])");
  std::string text = "\n\r\t\\\"[]A\xC3\xA9\xF0\x9F\x98\x80";
  EXPECT_TRUE(g.Matches(text + "7", true));
  EXPECT_TRUE(g.Matches(text + "]", true));
  EXPECT_FALSE(g.Matches(text + "a", false));
  // \xHH is a code point: \xE9 is U+00E9, two bytes.
  EXPECT_TRUE(Parse(R"(root ::= "\xE9")").Matches("\xC3\xA9", true));
}

TEST(GbnfParse, Utf8Classes) {
  Grammar g = Parse("root ::= [a-cé-ë€😀-😂]");
  for (const char* ok : {"a", "c", "é", "ê", "ë", "€", "😀", "😁", "😂"}) {
    EXPECT_TRUE(g.Matches(ok, true)) << ok;
  }
  for (const char* no : {"d", "è", "ì", "😃", "\xC3", "\xE2\x82"}) {
    EXPECT_FALSE(g.Matches(no, true)) << no;
  }
  EXPECT_TRUE(g.Matches("\xE2\x82", false));  // prefix of €
  EXPECT_FALSE(g.Matches("\xE2\x83", false));
}

TEST(GbnfParse, NegatedClassesAndDot) {
  Grammar g = Parse("root ::= [^a\"]");
  for (uint32_t cp : {0x0u, 0x62u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu,
                      0x10000u, 0x10FFFFu}) {
    EXPECT_TRUE(g.Matches(Utf8(cp), true)) << cp;
  }
  EXPECT_FALSE(g.Matches("a", false));
  EXPECT_FALSE(g.Matches("\"", false));
  EXPECT_FALSE(g.Matches("\xED\xA0\x80", false));  // U+D800 (surrogate): not UTF-8
  EXPECT_FALSE(g.Matches("\xC0\x80", false));      // overlong
  EXPECT_FALSE(g.Matches("\xF4\x90\x80\x80", false));  // above U+10FFFF
  EXPECT_FALSE(g.Matches("\x80", false));
  Grammar dot = Parse("root ::= . .");
  EXPECT_TRUE(dot.Matches("a\xF0\x9F\x98\x80", true));
  EXPECT_FALSE(dot.Matches("a", true));
  EXPECT_FALSE(dot.Matches("\xFF", false));
}

// Random code-point ranges: the byte-range split accepts exactly the encodings inside them.
TEST(GbnfParse, RandomClassesAgainstCodePoints) {
  std::mt19937 rng(7);
  const uint32_t kEdges[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xD7FF, 0xE000,
                             0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0x10FFFF};
  auto pick = [&]() -> uint32_t {
    uint32_t v = rng() % 3 == 0 ? kEdges[rng() % std::size(kEdges)] : rng() % 0x110000;
    if (v >= 0xD800 && v <= 0xDFFF) v = 0xE000;
    return v;
  };
  auto hex = [](uint32_t v) {
    char buf[16];
    snprintf(buf, sizeof(buf), "\\U%08X", v);
    return std::string(buf);
  };
  for (int iter = 0; iter < 40; ++iter) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    std::string cls;
    bool negate = rng() % 2;
    for (int r = 0, n = 1 + rng() % 3; r < n; ++r) {
      uint32_t a = pick(), b = pick();
      if (a > b) std::swap(a, b);
      ranges.push_back({a, b});
      cls += hex(a) + "-" + hex(b);
    }
    auto g = Grammar::ParseGbnf("root ::= [" + std::string(negate ? "^" : "") + cls + "]");
    if (!g.ok()) {  // a negated class can cover everything
      EXPECT_NE(g.status().message().find("matches no character"), std::string::npos);
      continue;
    }
    std::vector<uint32_t> probes;
    for (auto [a, b] : ranges) {
      for (uint32_t v : {a, b, a - 1, b + 1, a + (b - a) / 2}) probes.push_back(v);
    }
    for (int i = 0; i < 30; ++i) probes.push_back(pick());
    for (uint32_t cp : probes) {
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
      bool in = false;
      for (auto [a, b] : ranges) in |= cp >= a && cp <= b;
      EXPECT_EQ(g->Matches(Utf8(cp), true), in != negate) << cls << " cp " << cp;
    }
  }
}

TEST(GbnfParse, Errors) {
  auto has = [](const std::string& msg, const std::string& piece) {
    return msg.find(piece) != std::string::npos;
  };
  EXPECT_EQ(ParseError(""), "line 1, column 1: empty grammar (no rules)");
  EXPECT_EQ(ParseError("  # only a comment\n\n"), "line 3, column 1: empty grammar (no rules)");
  EXPECT_EQ(ParseError("foo ::= \"x\""), "line 1, column 1: no rule named 'root'");
  EXPECT_EQ(ParseError("root ::= a\n\nb ::= c \"x\""), "line 1, column 10: undefined rule 'a'");
  EXPECT_EQ(ParseError("root ::= \"x\"\nroot ::= \"y\""),
            "line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(ParseError("root ::= root \"x\" | \"y\""),
            "line 1, column 1: left recursion in rule 'root'");
  EXPECT_EQ(ParseError("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\""),
            "line 2, column 1: left recursion in rule 'a'");
  EXPECT_EQ(ParseError("root ::= \"a\" root"),
            "line 1, column 1: rule 'root' can never finish (matches no text)");
  EXPECT_EQ(ParseError("root ::= \"abc"), "line 1, column 10: unterminated string literal");
  EXPECT_EQ(ParseError("root ::= [abc"), "line 1, column 10: unterminated character class");
  EXPECT_EQ(ParseError("root ::= []"), "line 1, column 10: empty character class");
  EXPECT_EQ(ParseError("root ::= [z-a]"), "line 1, column 12: character range is out of order");
  EXPECT_EQ(ParseError("root ::= [^\\x00-\\U0010FFFF]"),
            "line 1, column 10: character class matches no character");
  EXPECT_EQ(ParseError("root ::= \"\\q\""), "line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(ParseError("root ::= \"\\x4\""), "line 1, column 11: escape needs 2 hex digits");
  EXPECT_EQ(ParseError("root ::= \"\\uD800\""),
            "line 1, column 11: escape is not a Unicode scalar value");
  EXPECT_EQ(ParseError("root ::= \"\xC3\""), "line 1, column 11: invalid UTF-8");
  // U+FFFD itself is a character (what an invalid byte decodes to, but three bytes long).
  EXPECT_TRUE(Parse("root ::= \"\xEF\xBF\xBD\"").Matches("\xEF\xBF\xBD", true));
  EXPECT_EQ(ParseError("root ::= (\"a\""), "line 1, column 10: unmatched '('");
  EXPECT_EQ(ParseError("root ::= * \"a\""), "line 1, column 10: '*' needs an element before it");
  EXPECT_EQ(ParseError("root ::= \"a\"{2,1}"), "line 1, column 13: repetition {m,n} with n < m");
  EXPECT_EQ(ParseError("root ::= \"a\"{x}"), "line 1, column 14: expected a number in '{}'");
  EXPECT_EQ(ParseError("root ::= \"a\"{1"), "line 1, column 13: expected '}'");
  EXPECT_EQ(ParseError("root ::= \"a\" )"), "line 1, column 14: unexpected ')'");
  EXPECT_EQ(ParseError("root \"a\""), "line 1, column 6: expected '::=' after rule name");
  EXPECT_EQ(ParseError("::= \"a\""), "line 1, column 1: expected a rule name");
  EXPECT_TRUE(has(ParseError("root ::= \"a\"{100001}"), "repetition count above 100000"));
  std::string big = "root ::= ";
  for (int i = 0; i < 12; ++i) big += "\"ab\"{100000} ";
  EXPECT_TRUE(has(ParseError(big), "grammar too large"));
  // Nested repetitions stay small: each level repeats one reference.
  EXPECT_EQ(ParseError("root ::= ((\"a\"{1000}){1000}){1000}"), "(parsed)");
  EXPECT_TRUE(has(ParseError(std::string(300, '(') + std::string(300, ')')), "expected a rule name"));
  EXPECT_TRUE(has(ParseError("root ::= " + std::string(300, '(')), "groups nested too deeply"));
  // A different start rule.
  auto g = Grammar::ParseGbnf("start ::= \"s\"", "start");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->Matches("s", true));
}

TEST(GbnfParse, TailRecursiveCyclesAreAllowed) {
  // `("a"?)*` reaches itself through a nullable item, but only in tail position.
  Grammar g = Parse("root ::= (\"a\"?)* \"b\"");
  EXPECT_TRUE(g.Matches("b", true));
  EXPECT_TRUE(g.Matches("aaab", true));
  EXPECT_FALSE(g.Matches("aaba", false));
  Grammar h = Parse("root ::= x\nx ::= y | \"q\"\ny ::= x | \"r\"");
  EXPECT_TRUE(h.Matches("q", true));
  EXPECT_TRUE(h.Matches("r", true));
  EXPECT_FALSE(h.Matches("qr", false));
}

TEST(GbnfParse, UnproductiveAlternativesAreDropped) {
  Grammar g = Parse("root ::= \"a\" | \"b\" loop\nloop ::= \"c\" loop");
  EXPECT_TRUE(g.Matches("a", true));
  // "b" can start nothing that finishes, so it is not even a prefix.
  EXPECT_FALSE(g.Matches("b", false));
}

TEST(GrammarMatches, JsonLike) {
  Grammar g = Parse(R"(
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ("," ws member)* )? "}"
member ::= string ":" ws value ws
array  ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrtu] )* "\""
number ::= "-"? [0-9]+ ("." [0-9]+)?
ws     ::= [ \t\n]*
)");
  EXPECT_TRUE(g.Matches(R"({"a": [1, 2.5, "x\"y"], "b": {"c": null}})", true));
  EXPECT_TRUE(g.Matches(R"({"é😀": true})", true));
  EXPECT_TRUE(g.Matches(R"({"a": [1, 2.5, "x)", false));
  EXPECT_FALSE(g.Matches(R"({"a" [)", false));
  EXPECT_FALSE(g.Matches(R"({"a": 01x)", false));
  EXPECT_FALSE(g.Matches(R"([1, 2,])", false));
  EXPECT_TRUE(g.Matches("-12.5", true));
  EXPECT_FALSE(g.Matches("-", true));
  EXPECT_TRUE(g.Matches("-", false));
}

}  // namespace
}  // namespace peng::grammar
