// GbnfBuilder: exact GBNF for small schemas, errors naming the keyword and its path, integer and
// number ranges checked exhaustively against arithmetic, regexes, choices, tool-call
// composition, size limits, and the schema corpus (tests/data/json_schemas): every valid
// instance (compact and with ", " / ": " separators) is accepted by the parsed grammar and
// every invalid one rejected.
#include "grammar/gbnf_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/test_paths.h"
#include "grammar/grammar.h"

namespace peng::grammar {
namespace {

using nlohmann::ordered_json;

Grammar Parse(const std::string& text) {
  auto g = Grammar::ParseGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << text.substr(0, 4000);
  return g.ok() ? *g : Grammar();
}

Grammar SchemaGrammar(const std::string& schema_json) {
  auto text = JsonSchemaToGbnf(ordered_json::parse(schema_json));
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? Parse(*text) : Grammar();
}

std::string SchemaError(const std::string& schema_json) {
  auto text = JsonSchemaToGbnf(ordered_json::parse(schema_json));
  if (text.ok()) return "(converted)";
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  return text.status().message();
}

std::string RegexError(const std::string& regex) {
  auto text = RegexToGbnf(regex);
  if (text.ok()) return "(converted)";
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  return text.status().message();
}

std::shared_ptr<const TokenVocab> ByteVocab() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  tokens.push_back("");  // end of generation
  return TokenVocab::FromTokens(tokens, {256});
}

// JSON with ", " and ": " separators (Python's json.dumps default).
std::string Spaced(const ordered_json& j) {
  if (j.is_object()) {
    std::string s = "{";
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      s += (first ? "" : ", ") + ordered_json(k).dump() + ": " + Spaced(v);
      first = false;
    }
    return s + "}";
  }
  if (j.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < j.size(); ++i) s += (i ? ", " : "") + Spaced(j[i]);
    return s + "]";
  }
  return j.dump();
}

// ---------------------------------------------------------------------------------------------
// Exact text

TEST(GbnfBuilderText, StringSchema) {
  EXPECT_EQ(*JsonSchemaToGbnf(ordered_json::parse(R"({"type": "string"})")),
            "root ::= string\n"
            "string ::= \"\\\"\" char* \"\\\"\"\n"
            "char ::= [^\\\"\\\\\\x00-\\x1F] | \"\\\\\" ([\\\"\\\\/bfnrt] | \"u\" ([0-9a-cA-Ce-fE-F] "
            "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}))\n");
}

TEST(GbnfBuilderText, ObjectWithOptionalFirstProperty) {
  const std::string text = *JsonSchemaToGbnf(ordered_json::parse(R"({
    "type": "object",
    "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"enum": [1, "x"]}},
    "required": ["b"]})"));
  EXPECT_EQ(text,
            "root ::= schema\n"
            "boolean ::= \"true\" | \"false\"\n"
            "null ::= \"null\"\n"
            "schema-c ::= (\"1\" | \"\\\"x\\\"\")\n"
            "schema ::= \"{\" (\"\\\"a\\\":\" \" \"? boolean \",\" \" \"? \"\\\"b\\\":\" \" \"? null "
            "(\",\" \" \"? \"\\\"c\\\":\" \" \"? schema-c)? | \"\\\"b\\\":\" \" \"? null (\",\" \" \"? "
            "\"\\\"c\\\":\" \" \"? schema-c)?) \"}\"\n");
}

TEST(GbnfBuilderText, IntegerRangeAndArray) {
  EXPECT_EQ(*JsonSchemaToGbnf(ordered_json::parse(
                R"({"type": "array", "items": {"type": "integer", "minimum": 7, "maximum": 123},
                    "minItems": 1, "maxItems": 3})")),
            "root ::= schema\n"
            "schema-item ::= ([7-9] | [1-9] [0-9] | \"1\" ([0-1] [0-9] | \"2\" [0-3]))\n"
            "schema ::= \"[\" schema-item (\",\" \" \"? schema-item){0,2} \"]\"\n");
}

TEST(GbnfBuilderText, ChoiceLiteralRegex) {
  EXPECT_EQ(ChoiceToGbnf({"yes", "no \"way\"", "caf\xC3\xA9"}),
            "root ::= choice\nchoice ::= \"yes\" | \"no \\\"way\\\"\" | \"caf\\u00E9\"\n");
  EXPECT_EQ(*RegexToGbnf("^(ab|c)+\\d{2,3}[^a-z\\n]?$"),
            "root ::= regex\n"
            "regex ::= (\"ab\" | \"c\")+ [0-9]{2,3} [^\\na-z]?\n");
  GbnfBuilder b;
  EXPECT_EQ(b.AddLiteral("<tool_call>\n"), "literal");
  EXPECT_EQ(b.AddLiteral("x"), "literal-2");
  EXPECT_EQ(b.AddRule("root", "literal literal-2"), "root-2");
  EXPECT_EQ(b.Build("root-2"),
            "root ::= root-2\nliteral ::= \"<tool_call>\\n\"\nliteral-2 ::= \"x\"\n"
            "root-2 ::= literal literal-2\n");
  EXPECT_EQ(GbnfBuilder::Quote("a\"\\\t\x01"), "\"a\\\"\\\\\\t\\x01\"");
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(GbnfBuilderErrors, NameKeywordAndPath) {
  EXPECT_EQ(SchemaError(R"({"type": "object", "properties": {"x": {"patternProperties": {}}}})"),
            "unsupported JSON Schema keyword 'patternProperties' at #/properties/x");
  EXPECT_EQ(SchemaError(R"({"type": "array", "items": {"type": "string", "uniqueItems": true}})"),
            "unsupported JSON Schema keyword 'uniqueItems' at #/items");
  EXPECT_EQ(SchemaError(R"({"properties": {"a/b": {"multipleOf": 2}}})"),
            "unsupported JSON Schema keyword 'multipleOf' at #/properties/a~1b");
  EXPECT_EQ(SchemaError(R"({"anyOf": [{"type": "string"}, {"not": {}}]})"),
            "unsupported JSON Schema keyword 'not' at #/anyOf/1");
  EXPECT_EQ(SchemaError(R"({"type": "strin"})"), "unknown type 'strin' at #");
  EXPECT_EQ(SchemaError(R"({"$ref": "#/$defs/missing"})"),
            "$ref '#/$defs/missing' at # does not resolve");
  EXPECT_EQ(SchemaError(R"({"$ref": "http://x/y.json"})"),
            "unsupported $ref 'http://x/y.json' at # (only #/... refs)");
  EXPECT_EQ(SchemaError(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [
                {"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})"),
            "$ref '#/$defs/a' at #/$defs/b/anyOf/0 refers to itself without any text in between");
  EXPECT_EQ(SchemaError(R"({"type": "string", "pattern": "^(a)\\1$"})"),
            "'pattern' at #: regex '^(a)\\1$': backreference is not supported at offset 6");
  EXPECT_EQ(SchemaError(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "no integer satisfies the bounds at #");
  EXPECT_EQ(SchemaError(R"({"type": "string", "minLength": 3, "maxLength": 2})"),
            "'maxLength' at # is below minLength");
  EXPECT_EQ(SchemaError(R"({"type": "object", "properties": {}, "required": ["a"],
                             "additionalProperties": false})"),
            "required property 'a' at # is not allowed by additionalProperties");
  EXPECT_EQ(SchemaError(R"({"enum": ["a"], "type": "integer"})"),
            "'enum' at # has no value of the schema's type");
  EXPECT_EQ(SchemaError("false"), "schema false (matches nothing) at #");
  EXPECT_EQ(SchemaError(R"({"type": "string", "pattern": "[a-z]+", "maxLength": 3})"),
            "'minLength'/'maxLength' together with 'pattern' at # is not supported");
}

TEST(GbnfBuilderErrors, AbsurdSchemasAreRefused) {
  // Nesting.
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_EQ(SchemaError(deep).substr(0, 33), "JSON Schema nested deeper than 64");
  // Rules.
  ordered_json many = {{"type", "object"}, {"properties", ordered_json::object()}};
  for (int i = 0; i < 10001; ++i) {
    many["properties"]["p" + std::to_string(i)] = {{"type", "string"}, {"maxLength", 3}};
  }
  auto r = JsonSchemaToGbnf(many);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 10,000 grammar rules"), std::string::npos)
      << r.status().message();
  // Text.
  ordered_json big = {{"enum", ordered_json::array()}};
  for (int i = 0; i < 3000; ++i) big["enum"].push_back(std::string(500, 'a') + std::to_string(i));
  r = JsonSchemaToGbnf(big);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 1 MB of grammar"), std::string::npos)
      << r.status().message();
  // Regex repetitions.
  EXPECT_EQ(RegexError("(a{1000}){1001}"),
            "regex '(a{1000}){1001}': more than 1,000,000 characters after expanding repetitions");
}

TEST(GbnfBuilderErrors, RegexConstructs) {
  EXPECT_EQ(RegexError("(a)\\1"), "regex '(a)\\1': backreference is not supported at offset 5");
  EXPECT_EQ(RegexError("(?P<x>a)(?P=x)"),
            "regex '(?P<x>a)(?P=x)': backreference is not supported at offset 9");
  EXPECT_EQ(RegexError("a(?=b)"), "regex 'a(?=b)': lookaround is not supported at offset 2");
  EXPECT_EQ(RegexError("a(?<!b)"), "regex 'a(?<!b)': lookaround is not supported at offset 2");
  EXPECT_EQ(RegexError("\\bword"), "regex '\\bword': anchor '\\b' is not supported at offset 2");
  EXPECT_EQ(RegexError("a^b"), "regex 'a^b': '^' not at the start at offset 1");
  EXPECT_EQ(RegexError("a$b"), "regex 'a$b': '$' not at the end at offset 2");
  EXPECT_EQ(RegexError("(?i)abc"),
            "regex '(?i)abc': group construct '(?i' (flags, conditionals) is not supported at "
            "offset 1");
  EXPECT_EQ(RegexError("a**"), "regex 'a**': multiple repeat at offset 3");
  EXPECT_EQ(RegexError("*a"), "regex '*a': nothing to repeat at offset 0");
  EXPECT_EQ(RegexError("(ab"), "regex '(ab': missing ')' at offset 3");
  EXPECT_EQ(RegexError("ab)"), "regex 'ab)': unbalanced ')' at offset 2");
  EXPECT_EQ(RegexError("[z-a]"), "regex '[z-a]': bad character range at offset 4");
  EXPECT_EQ(RegexError("\\p{L}"),
            "regex '\\p{L}': unicode property escapes are not supported at offset 2");
}

// ---------------------------------------------------------------------------------------------
// Ranges, checked against arithmetic

TEST(GbnfBuilderRanges, IntegersExhaustive) {
  const std::vector<std::pair<std::optional<int>, std::optional<int>>> cases = {
      {0, 100},  {1, 12},     {7, 123},  {-50, 50},   {-1000, -3}, {-7, std::nullopt},
      {15, std::nullopt}, {std::nullopt, 99}, {std::nullopt, -12}, {100, 999}, {999, 1000},
      {0, 0},    {-1, -1},    {98, 1203}};
  for (const auto& [lo, hi] : cases) {
    ordered_json schema = {{"type", "integer"}};
    if (lo) schema["minimum"] = *lo;
    if (hi) schema["maximum"] = *hi;
    auto text = JsonSchemaToGbnf(schema);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    Grammar g = Parse(*text);
    for (int x = -1300; x <= 1300; ++x) {
      const bool in = (!lo || x >= *lo) && (!hi || x <= *hi);
      ASSERT_EQ(g.Matches(std::to_string(x), true), in) << schema.dump() << " x=" << x;
    }
    EXPECT_FALSE(g.Matches("-0", true)) << schema.dump();
    EXPECT_FALSE(g.Matches("007", true)) << schema.dump();
    EXPECT_FALSE(g.Matches("1.0", true)) << schema.dump();
  }
  // Exclusive and fractional bounds.
  Grammar g = SchemaGrammar(R"({"type": "integer", "exclusiveMinimum": 2, "maximum": 9.5})");
  for (int x = -5; x < 20; ++x) EXPECT_EQ(g.Matches(std::to_string(x), true), x > 2 && x <= 9);
  g = SchemaGrammar(R"({"type": "integer", "minimum": -2.5, "exclusiveMaximum": 3})");
  for (int x = -5; x < 20; ++x) EXPECT_EQ(g.Matches(std::to_string(x), true), x >= -2 && x < 3);
}

TEST(GbnfBuilderRanges, NumbersAgainstArithmetic) {
  std::vector<std::string> samples;
  for (const char* s : {"0", "-0", "0.0", "-0.0", "0.5", "-0.5", "1", "1.0", "1.5", "2", "2.00",
                        "2.01", "-1", "-1.0", "-1.01", "-2", "9.999", "10", "10.0", "10.5",
                        "99", "100", "100.0", "100.25", "-100", "-100.5", "1e2", "00.5", "1.",
                        ".5", "-"}) {
    samples.push_back(s);
  }
  struct Case {
    const char* schema;
    double lo, hi;
    bool lo_excl, hi_excl;
  };
  const double inf = INFINITY;
  const Case cases[] = {
      {R"({"type": "number", "minimum": 0, "maximum": 1})", 0, 1, false, false},
      {R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", 0, 10, true, true},
      {R"({"type": "number", "minimum": -1, "maximum": 2})", -1, 2, false, false},
      {R"({"type": "number", "exclusiveMinimum": -1})", -1, inf, true, false},
      {R"({"type": "number", "maximum": -1})", -inf, -1, false, false},
      {R"({"type": "number", "exclusiveMaximum": 0})", -inf, 0, false, true},
      {R"({"type": "number", "minimum": 2, "maximum": 100})", 2, 100, false, false},
      {R"({"type": "number", "exclusiveMinimum": 1, "maximum": 10})", 1, 10, true, false},
  };
  for (const Case& c : cases) {
    Grammar g = SchemaGrammar(c.schema);
    for (const std::string& s : samples) {
      const bool syntax = s != "1e2" && s != "00.5" && s != "1." && s != ".5" && s != "-";
      if (s == "-0" || s == "-0.0") continue;  // negative zero: either way is fine
      bool in = false;
      if (syntax) {
        const double x = std::stod(s);
        in = (c.lo_excl ? x > c.lo : x >= c.lo) && (c.hi_excl ? x < c.hi : x <= c.hi);
      }
      EXPECT_EQ(g.Matches(s, true), in) << c.schema << " x=" << s;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Strings, objects, values

TEST(GbnfBuilderJson, StringEscapesAndLengths) {
  Grammar g = SchemaGrammar(R"({"type": "string"})");
  for (const char* ok : {R"("")", R"("a b")", R"("\"\\\/\b\f\n\r\t")", R"("\u00e9\uFFFF")",
                         "\"caf\xC3\xA9 \xF0\x9F\x98\x80\""}) {
    EXPECT_TRUE(g.Matches(ok, true)) << ok;
  }
  for (const char* bad : {R"(")", R"("\x")", R"("\u12")", R"("\ud800")", "\"a\nb\"", "\"\t\"",
                          R"("a" )", R"('a')"}) {
    EXPECT_FALSE(g.Matches(bad, true)) << bad;
  }
  g = SchemaGrammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(g.Matches(R"("a")", true));
  EXPECT_TRUE(g.Matches(R"("\nb")", true));
  EXPECT_TRUE(g.Matches("\"\xC3\xA9\xC3\xA9\xC3\xA9\"", true));
  EXPECT_FALSE(g.Matches(R"("abcd")", true));
  // Large bounds stay small as text and parse.
  auto text = JsonSchemaToGbnf(ordered_json::parse(R"({"type": "string", "maxLength": 10000})"));
  ASSERT_TRUE(text.ok());
  EXPECT_LT(text->size(), 400u);
  g = Parse(*text);
  EXPECT_TRUE(g.Matches("\"" + std::string(300, 'x') + "\"", true));
  g = SchemaGrammar(R"({"type": "string", "minLength": 250, "maxLength": 300})");
  EXPECT_TRUE(g.Matches("\"" + std::string(300, 'x') + "\"", true));
  EXPECT_FALSE(g.Matches("\"" + std::string(301, 'x') + "\"", false));
  EXPECT_FALSE(g.Matches("\"" + std::string(249, 'x') + "\"", true));
}

TEST(GbnfBuilderJson, PatternInsideJsonString) {
  Grammar g = SchemaGrammar(R"({"type": "string", "pattern": "^a\"b\\\\[/\"x]\\n.$"})");
  EXPECT_TRUE(g.Matches(R"("a\"b\\/\nz")", true));
  EXPECT_TRUE(g.Matches(R"("a\"b\\\/\nz")", true));
  EXPECT_TRUE(g.Matches(R"("a\"b\\\"\n\"")", true));
  EXPECT_FALSE(g.Matches(R"("a"b\\/\nz")", false));
  EXPECT_FALSE(g.Matches(R"("a\"b\\/\n\n")", true));  // '.' is not a newline
  EXPECT_FALSE(g.Matches("\"a\\\"b\\\\/\n\"", false));  // raw newline
}

TEST(GbnfBuilderJson, AnyValueAndObject) {
  Grammar v = Parse(JsonSchemaToGbnf(ordered_json::parse("{}")).value());
  Grammar o = Parse(JsonObjectGbnf());
  for (const char* ok : {R"({})", R"({"a": [1, -2.5e+3, true, null, "x"], "b":{}})",
                         R"({"a":{"b":{"c":[[]]}}})"}) {
    EXPECT_TRUE(v.Matches(ok, true)) << ok;
    EXPECT_TRUE(o.Matches(ok, true)) << ok;
  }
  for (const char* ok : {"1", "-0.5", "\"s\"", "[1, 2]", "true", "null", "1E-7"}) {
    EXPECT_TRUE(v.Matches(ok, true)) << ok;
    EXPECT_FALSE(o.Matches(ok, true)) << ok;
  }
  for (const char* bad : {"{ }", "{\"a\" :1}", "{\"a\":1,}", "[1,,2]", "01", "1.", "+1", "nul",
                          "{\"a\":1}\n", "{\n\"a\":1}", "[1,  2]", "{'a':1}"}) {
    EXPECT_FALSE(v.Matches(bad, true)) << bad;
  }
}

TEST(GbnfBuilderJson, AdditionalPropertiesNeverRepeatDeclaredKeys) {
  Grammar g = SchemaGrammar(R"({"type": "object", "properties": {"name": {"type": "string"},
      "n": {"type": "integer"}}, "required": ["name"], "additionalProperties": {"type": "boolean"}})");
  EXPECT_TRUE(g.Matches(R"({"name":"x"})", true));
  EXPECT_TRUE(g.Matches(R"({"name":"x","n":1,"name2":true,"na":false,"":true,"\n":true})", true));
  EXPECT_TRUE(g.Matches(R"({"name":"x","\"":true,"nam\\":true})", true));
  EXPECT_FALSE(g.Matches(R"({"name":"x","name":true})", true));
  EXPECT_FALSE(g.Matches(R"({"name":"x","n":true})", true));
  EXPECT_FALSE(g.Matches(R"({"name":"x","na\/":1})", true));
  EXPECT_FALSE(g.Matches(R"({"n":1})", true));
  // Keys spelled with escapes of a declared key's characters still count as that key.
  Grammar h = SchemaGrammar(R"({"type": "object", "properties": {"a/b": {"type": "null"}},
      "additionalProperties": true})");
  EXPECT_TRUE(h.Matches(R"({"a/b":null,"a/c":1})", true));
  EXPECT_FALSE(h.Matches(R"({"a\/b":1})", true));
  EXPECT_FALSE(h.Matches(R"({"a\/b":null})", false));  // a declared key is written plainly
}

TEST(GbnfBuilderJson, ManyOptionalPropertiesStayLinear) {
  ordered_json s = {{"type", "object"}, {"properties", ordered_json::object()}};
  for (int i = 0; i < 300; ++i) s["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
  auto text = JsonSchemaToGbnf(s);
  ASSERT_TRUE(text.ok());
  EXPECT_LT(text->size(), 100000u);
  Grammar g = Parse(*text);
  EXPECT_TRUE(g.Matches("{}", true));
  EXPECT_TRUE(g.Matches(R"({"p7":1,"p200":2, "p299":3})", true));
  EXPECT_FALSE(g.Matches(R"({"p200":2,"p7":1})", true));
  EXPECT_FALSE(g.Matches(R"({,"p7":1})", false));
}

// ---------------------------------------------------------------------------------------------
// Regex, choices, composition

TEST(GbnfBuilderRegex, AcceptsAndRejects) {
  struct Case {
    const char* regex;
    std::vector<const char*> ok, bad;
  };
  const Case cases[] = {
      {R"(\d{3}-\d{4})", {"555-1234"}, {"5551234", "55-1234", "555-12345"}},
      {R"(^[A-Z][a-z]*( [A-Z][a-z]*)*$)", {"Ada", "Ada Lovelace"}, {"ada", "Ada ", ""}},
      {R"((?:yes|no)!?)", {"yes", "no!"}, {"yes!!", "maybe"}},
      {R"(a.c)", {"abc", "a.c", "a\xC3\xA9" "c"}, {"a\nc", "ac"}},
      {R"([^\d\s]+)", {"abc", "-_"}, {"a1", "a b", ""}},
      {R"(\w+@\w+\.com)", {"me@x.com"}, {"me@x.org"}},
      {R"(x{2,}y{,2}z{0})", {"xx", "xxxyy"}, {"x", "xyyy"}},
      {R"((?P<year>\d{4})-(?<m>\d\d))", {"2024-05"}, {"2024-5"}},
      {R"(\u00e9\x41\t[\]\-^]+)", {"\xC3\xA9" "A\t]-^"}, {"\xC3\xA9" "A\t"}},
      {R"(a+?b*?c??)", {"a", "aab", "abbc"}, {"b"}},
      {R"([]a]|\.)", {"]", "a", "."}, {"b"}},
      {R"(\[\{\}\(\)\|\*\+\?\$\^)", {"[{}()|*+?$^"}, {"x"}},
      {"a|", {"a", ""}, {"b"}},
  };
  for (const Case& c : cases) {
    auto text = RegexToGbnf(c.regex);
    ASSERT_TRUE(text.ok()) << c.regex << ": " << text.status().ToString();
    Grammar g = Parse(*text);
    for (const char* s : c.ok) EXPECT_TRUE(g.Matches(s, true)) << c.regex << " / " << s;
    for (const char* s : c.bad) EXPECT_FALSE(g.Matches(s, true)) << c.regex << " / " << s;
  }
}

TEST(GbnfBuilderChoice, ExactTexts) {
  Grammar g = Parse(ChoiceToGbnf({"red", "green", "light green", "\"quoted\"", "\xE2\x9C\x93"}));
  for (const char* ok : {"red", "green", "light green", "\"quoted\"", "\xE2\x9C\x93"}) {
    EXPECT_TRUE(g.Matches(ok, true)) << ok;
  }
  for (const char* bad : {"re", "redd", "Red", "light", "\"quoted"}) {
    EXPECT_FALSE(g.Matches(bad, true)) << bad;
  }
  EXPECT_TRUE(g.Matches("light", false));
}

TEST(GbnfBuilderCompose, ToolCallAroundSchema) {
  GbnfBuilder b;
  auto args = b.AddJsonSchema(ordered_json::parse(R"({"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
      "required": ["city"], "additionalProperties": false})"));
  ASSERT_TRUE(args.ok()) << args.status().ToString();
  const std::string call =
      b.AddRule("call", b.AddLiteral("<tool_call>{\"name\": \"get_weather\", \"arguments\": ") +
                            " " + *args + " " + b.AddLiteral("}</tool_call>"));
  // A second schema in the same builder gets its own names.
  auto other = b.AddJsonSchema(ordered_json::parse(R"({"type": "object",
      "properties": {"q": {"type": "string", "maxLength": 5}}, "required": ["q"]})"));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *args);
  Grammar g = Parse(b.Build(call + " | " + *other));
  EXPECT_TRUE(g.Matches(
      R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>)",
      true));
  EXPECT_TRUE(g.Matches(R"({"q":"abc"})", true));
  EXPECT_FALSE(g.Matches(
      R"(<tool_call>{"name": "get_weather", "arguments": {"unit": "c"}}</tool_call>)", false));
}

TEST(GbnfBuilderJson, RecursiveRefsAndJsonSchemaOverload) {
  Grammar g = SchemaGrammar(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array",
      "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}})");
  EXPECT_TRUE(g.Matches(R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})", true));
  EXPECT_FALSE(g.Matches(R"({"v":1,"kids":[{"kids":[]}]})", true));
  // A plain nlohmann::json has sorted keys: properties come alphabetically.
  auto text = JsonSchemaToGbnf(nlohmann::json::parse(
      R"({"type": "object", "properties": {"b": {"type": "null"}, "a": {"type": "null"}}})"));
  ASSERT_TRUE(text.ok());
  Grammar h = Parse(*text);
  EXPECT_TRUE(h.Matches(R"({"a":null,"b":null})", true));
  EXPECT_FALSE(h.Matches(R"({"b":null,"a":null})", true));
}

// ---------------------------------------------------------------------------------------------
// The corpus

TEST(GbnfBuilderCorpus, EveryInstance) {
  const std::filesystem::path dir =
      std::filesystem::path(test_util::SourceDir()) / "tests/data/json_schemas";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 35u);
  int checked = 0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.filename().string());
    std::ifstream f(path);
    const ordered_json doc = ordered_json::parse(f);
    auto text = JsonSchemaToGbnf(doc.at("schema"));
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    Grammar g = Parse(*text);
    // The Matcher too (the path generation takes), over a vocabulary of single bytes.
    auto compiled = CompiledGrammar::Create(g, ByteVocab());
    ASSERT_TRUE(compiled.ok()) << compiled.status().ToString();
    auto matcher_accepts = [&](const std::string& s) {
      Matcher m(*compiled);
      return m.AcceptBytes(s) && m.IsComplete();
    };
    for (const auto& v : doc.at("valid")) {
      EXPECT_TRUE(g.Matches(v.dump(), true)) << "valid: " << v.dump();
      EXPECT_TRUE(g.Matches(Spaced(v), true)) << "valid: " << Spaced(v);
      EXPECT_TRUE(matcher_accepts(v.dump())) << "valid: " << v.dump();
      ++checked;
    }
    for (const auto& v : doc.at("invalid")) {
      EXPECT_FALSE(g.Matches(v.dump(), true)) << "invalid: " << v.dump();
      EXPECT_FALSE(g.Matches(Spaced(v), true)) << "invalid: " << Spaced(v);
      EXPECT_FALSE(matcher_accepts(v.dump())) << "invalid: " << v.dump();
      ++checked;
    }
    // Valid instances outside the grammar's subset (documented in the file's "notes").
    if (doc.contains("valid_not_generated")) {
      for (const auto& v : doc["valid_not_generated"]) {
        EXPECT_FALSE(g.Matches(v.dump(), true)) << "valid_not_generated: " << v.dump();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 300);
}

}  // namespace
}  // namespace peng::grammar
