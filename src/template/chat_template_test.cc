// Golden tests against Python jinja2 (tools/gen_chat_template_golden.py) plus unit tests of the
// expression language, whitespace control and error handling.
#include "template/chat_template.h"

#include <fstream>
#include <sstream>
#include <tuple>

#include <gtest/gtest.h>

namespace peng {
namespace {

using nlohmann::ordered_json;

std::string DataDir() { return std::string(PENG_SOURCE_DIR) + "/tests/data/chat_templates/"; }

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Renders `source` with `context` (JSON text); fails the test on error.
std::string Render(const std::string& source, const std::string& context = "{}") {
  StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  StatusOr<std::string> out = t->Render(ordered_json::parse(context));
  if (!out.ok()) return "RENDER ERROR: " + out.status().message();
  return *out;
}

Status RenderError(const std::string& source, const std::string& context = "{}") {
  StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  StatusOr<std::string> out = t->Render(ordered_json::parse(context));
  return out.ok() ? OkStatus() : out.status();
}

TEST(ChatTemplateGoldenTest, MatchesJinja2ByteForByte) {
  const ordered_json cases = ordered_json::parse(ReadFile(DataDir() + "golden.json"));
  const ordered_json convs = ordered_json::parse(ReadFile(DataDir() + "conversations.json"));
  ASSERT_EQ(cases.size(), 144u);
  int outputs = 0, errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() +
                             (c["add_generation_prompt"].get<bool>() ? " +gen" : "");
    SCOPED_TRACE(name);
    StatusOr<ChatTemplate> t = ChatTemplate::Parse(ReadFile(DataDir() + c["template"].get<std::string>() + ".jinja"));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const ordered_json& conv = convs[c["conversation"].get<std::string>()];
    ordered_json context;
    context["messages"] = conv["messages"];
    context["tools"] = conv.contains("tools") ? conv["tools"] : ordered_json();
    context["documents"] = nullptr;
    context["add_generation_prompt"] = c["add_generation_prompt"];
    context["bos_token"] = c["bos_token"];
    context["eos_token"] = c["eos_token"];
    StatusOr<std::string> out = t->Render(context);
    if (c.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, c["output"].get<std::string>());
      ++outputs;
    } else {
      ASSERT_FALSE(out.ok()) << "expected error: " << c["error"].dump();
      if (c["error"]["kind"] == "raise_exception") {
        EXPECT_NE(out.status().message().find(c["error"]["message"].get<std::string>()), std::string::npos)
            << out.status().message();
      }
      ++errors;
    }
  }
  EXPECT_EQ(outputs, 122);
  EXPECT_EQ(errors, 22);
}

TEST(ChatTemplateTest, ApplyChatTemplateSmolLM2) {
  StatusOr<std::string> out = ApplyChatTemplate(ReadFile(DataDir() + "smollm2.jinja"),
                                                nlohmann::json::parse(R"([{"role":"user","content":"Hi"}])"),
                                                /*add_generation_prompt=*/true, "", "<|im_end|>");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, ApplyChatTemplatePassesToolsAsNoneByDefault) {
  const std::string src = "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ x }}";
  StatusOr<std::string> out = ApplyChatTemplate(src, nlohmann::json::array(), false, "", "");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "True True True ");
  out = ApplyChatTemplate(src, nlohmann::json::array(), false, "", "", {{"tools", {1}}, {"x", 7}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "True False True 7");
}

TEST(ExpressionTest, LiteralsAndPrinting) {
  EXPECT_EQ(Render("{{ 'a\\tb\\n' }}|{{ \"q'\" }}|{{ '\\u00e9' }}"), "a\tb\n|q'|é");
  EXPECT_EQ(Render("{{ 1 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 2.5e3 }}"),
            "1 1.0 0.30000000000000004 1e+20 1e-05 2500.0");
  EXPECT_EQ(Render("{{ true }} {{ False }} {{ none }} {{ None }} {{ [1, 'a', none] }} {{ {'k': \"it's\"} }}"),
            "True False None None [1, 'a', None] {'k': \"it's\"}");
  EXPECT_EQ(Render("{{ 'a' 'b' }}{{ (1, 2) }}"), "ab[1, 2]");
}

TEST(ExpressionTest, ArithmeticAndComparison) {
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}"),
            "3 -4 2 3.5 1024 7 9");
  EXPECT_EQ(Render("{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1] == [1] }} {{ 1 != 2 }} {{ 3 >= 3 }}"),
            "True True True True True");
  EXPECT_EQ(Render("{{ (1 + 2) ~ 3 }} {{ 'x' ~ none ~ undefined_thing }} {{ 'ab' * 2 }} {{ -(3) }}"), "33 xNone abab -3");
  EXPECT_EQ(Render("{{ 1 and 'x' }} {{ 0 or 'y' }} {{ not [] }} {{ 2 in [1, 2] }} {{ 'z' not in 'abc' }}"),
            "x y True True True");
  EXPECT_EQ(Render("{{ 'yes' if 1 > 2 else 'no' }}|{{ 'only' if false }}|"), "no||");
}

TEST(ExpressionTest, AccessAndSlicing) {
  const std::string ctx = R"({"m": [{"role": "user", "content": "héllo"}, {"role": "bot"}], "d": {"b": 2, "a": 1}})";
  EXPECT_EQ(Render("{{ m[0].role }} {{ m[0]['content'] }} {{ m[-1].role }} {{ m[1].content }}|{{ m[5] }}", ctx),
            "user héllo bot |");
  EXPECT_EQ(Render("{{ m[0].content[1:3] }} {{ m[0].content[::-1] }} {{ m[1:] | length }} {{ m[0].content | length }}", ctx),
            "él olléh 1 5");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys() }} {{ d.get('z', 0) }} {{ d | tojson }}", ctx),
            "b=2;a=1; ['b', 'a'] 0 {\"b\": 2, \"a\": 1}");
}

TEST(ExpressionTest, FiltersTestsAndMethods) {
  EXPECT_EQ(Render("{{ '  Hi  ' | trim }}|{{ 'ab' | upper }}|{{ 'ÉCOLE Ω' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}"),
            "Hi|AB|école ω|Hello World|Hello");
  EXPECT_EQ(Render("{{ [1, 2, 3] | join('-') }} {{ [3, 4] | first }} {{ [3, 4] | last }} {{ '42' | int + 1 }} {{ 5 | string ~ '!' }}"),
            "1-2-3 3 4 43 5!");
  EXPECT_EQ(Render("{{ {'a': [1, {'b': none}]} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}");
  EXPECT_EQ(Render("{{ ' a b '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a b  c'.split() }}|{{ 'a=b=c'.split('=', 1) }}|{{ 'ab'.startswith('a') }}|{{ 'ab'.endswith(('x', 'b')) }}|{{ 'aaa'.replace('a', 'b', 2) }}"),
            "a b|hi|['a', 'b', 'c']|['a', 'b=c']|True|True|bba");
  EXPECT_EQ(Render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 1.5 is number }} {{ true is boolean }} {{ 4 is divisibleby 2 }} {{ 3 is not odd }}"),
            "False True True True True True True True False");
  EXPECT_EQ(Render(R"({{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }} {{ m | rejectattr('role', 'eq', 'user') | list | length }})",
                   R"({"m": [{"role": "user", "c": "1"}, {"role": "bot", "c": "2"}, {"role": "user", "c": "3"}]})"),
            "1,3 1");
  EXPECT_EQ(Render("{{ x | default('d') }} {{ '' | default('e', true) }} {{ none | default('n') }}"), "d e None");
  // A byte that is not UTF-8 stays as it is (it is not Latin-1 'ÿ' or 'Ã' to case-map).
  EXPECT_EQ(Render("{{ 'a\xFF' | upper }}|{{ 'B\xC3' | lower }}"), "A\xFF|b\xC3");
}

TEST(StatementTest, LoopsScopesAndNamespaces) {
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}"),
            "10TrueFalse3 21FalseFalse3 32FalseTrue3 ");
  EXPECT_EQ(Render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{{ x }}{% endfor %}"), "135");
  EXPECT_EQ(Render("{% set y = 0 %}{% for a in [1, 2] %}{% set y = a %}{% endfor %}{{ y }}"), "0");
  EXPECT_EQ(Render("{% set ns = namespace(y=0) %}{% for a in [1, 2] %}{% set ns.y = ns.y + a %}{% endfor %}{{ ns.y }}"), "3");
  EXPECT_EQ(Render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}x{{ a }}{% endset %}{{ c }}"), "12x1");
  EXPECT_EQ(Render("{% macro f(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"), "<1B><23>");
  EXPECT_EQ(Render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}"), "[in]");
}

TEST(WhitespaceTest, TrimBlocksAndLstripBlocks) {
  EXPECT_EQ(Render("<ul>\n  {% for i in [1, 2] %}\n  <li>{{ i }}</li>\n  {% endfor %}\n</ul>"), "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(Render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(Render("{{ 'a' }}\n{{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(Render("x {% if true %}y{% endif %}\nz"), "x yz");
}

TEST(ErrorTest, SyntaxErrorsCarryLineAndColumn) {
  Status s = RenderError("line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "syntax error at 3:10: unexpected '}}'");
  EXPECT_EQ(RenderError("{% for x in y %}no end").message(),
            "syntax error at 1:23: unexpected end of template, expected '{% else %}'");
  EXPECT_EQ(RenderError("ok\n  {{ 'open").message(), "syntax error at 2:6: unterminated string");
  EXPECT_EQ(RenderError("{{ '\\U00110000' }}").message(),
            "syntax error at 1:5: escape beyond U+10FFFF");
  EXPECT_EQ(RenderError("{% frobnicate %}").message(), "syntax error at 1:4: unknown statement 'frobnicate'");
  EXPECT_EQ(RenderError("{{ ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1 }}").code(),
            StatusCode::kInvalidArgument);
}

TEST(ErrorTest, RuntimeErrors) {
  EXPECT_EQ(RenderError("{{ raise_exception('Roles must alternate') }}").message(),
            "render error at 1:19: raise_exception: Roles must alternate");
  EXPECT_EQ(RenderError("\n{{ nope() }}").message(), "render error at 2:8: 'nope' is undefined");
  EXPECT_EQ(RenderError("{{ foo.bar }}").message(), "render error at 1:7: 'foo' is undefined");
  EXPECT_EQ(RenderError("{{ 'a' + 1 }}").message(),
            "render error at 1:8: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(RenderError("{{ x | frob }}").message(), "render error at 1:6: no filter named 'frob'");
  EXPECT_EQ(RenderError("{{ 1 / 0 }}").message(), "render error at 1:6: division by zero");
  EXPECT_TRUE(RenderError("{{ undefined_thing }}{% for x in undefined_thing %}{% endfor %}").ok());
}

TEST(ErrorTest, RunawayTemplatesAreStopped) {
  Status s = RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("call depth limit (100)"), std::string::npos) << s.message();

  s = RenderError("{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("loop iteration limit"), std::string::npos) << s.message();

  StatusOr<ChatTemplate> t = ChatTemplate::Parse("{% for i in range(100) %}{{ 'x' * 1000 }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  tmpl::RenderLimits limits;
  limits.max_output_bytes = 50000;
  t->set_limits(limits);
  StatusOr<std::string> out = t->Render(nlohmann::json::object());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

// Renders `source` under `limits`; the Status.
Status RenderWithLimits(const std::string& source, const tmpl::RenderLimits& limits,
                        const std::string& context = "{}") {
  StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return t.status();
  t->set_limits(limits);
  StatusOr<std::string> out = t->Render(ordered_json::parse(context));
  return out.ok() ? OkStatus() : out.status();
}

bool Mentions(const Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

// Found by fuzz/jinja_fuzz.cc: integer results past 64 bits were undefined behaviour (signed
// overflow, INT64_MIN / -1 trapping, float-to-int casts of huge powers); now an error, and
// ** is exact.
TEST(LimitsTest, IntegerOverflowIsAnError) {
  EXPECT_EQ(Render("{{ 3 ** 39 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 2 ** -1 }} {{ 7 // -1 }} {{ 7 % -1 }}"),
            "4052555153018976267 4611686018427387904 -9223372036854775808 0.5 -7 0");
  for (const char* src : {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
                          "{{ 4294967296 * 4294967296 }}", "{{ 2 ** 63 }}", "{{ 10 ** 30 }}",
                          "{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}",
                          "{{ (-9223372036854775807 - 1) | abs }}"}) {
    const Status s = RenderError(src);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << src;
    EXPECT_TRUE(Mentions(s, "integer overflow")) << src << ": " << s.message();
  }
  EXPECT_TRUE(Mentions(RenderError("{{ 99999999999999999999 }}"), "does not fit in 64 bits"));
  EXPECT_TRUE(Mentions(RenderError("{{ 1e300 | int }}"), "out of the 64-bit integer range"));
  EXPECT_TRUE(Mentions(RenderError("{{ '99999999999999999999' | int }}"), "out of the 64-bit integer range"));
  EXPECT_EQ(Render("{{ 'nan' | float | int }} {{ -2.7 | int }} {{ '12' | int(5) }} {{ 'x' | int(5) }}"), "0 -2 12 5");
  EXPECT_EQ(Render("{{ (-9223372036854775807 - 1) is divisibleby(-1) }}"), "True");
}

TEST(LimitsTest, RangesAndSlicesNearTheIntegerLimits) {
  EXPECT_EQ(Render("{{ range(9223372036854775806, 9223372036854775807, 100) }}"), "[9223372036854775806]");
  EXPECT_EQ(Render("{{ range(-9223372036854775807, -9223372036854775807 - 1, -5) }}"), "[-9223372036854775807]");
  EXPECT_EQ(Render("{{ [1, 2, 3][1::9223372036854775807] }} {{ 'héllo'[::-9223372036854775807] }}"), "[2] o");
  EXPECT_EQ(Render("{{ 'héllo'[-9223372036854775807:2] }} {{ 'héllo'[1] }} {{ 'héllo'[-1] }} {{ 'héllo'[-6] }}|"),
            "hé é o |");
  EXPECT_EQ(Render("{{ 'x\ny' | indent(-3) }}|{{ 'x\ny' | indent(2, true) }}"), "x\ny|  x\n  y");
}

// Values that contain themselves (through a namespace) used to leak and print forever.
TEST(LimitsTest, NamespaceCyclesAreBrokenAfterTheRender) {
  EXPECT_EQ(Render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{% set ns.b = [ns, {'n': ns}] %}{{ ns.a }} {{ ns.b }}"),
            "<Namespace> [<Namespace>, {'n': <Namespace>}]");
  EXPECT_TRUE(Mentions(RenderError("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns | tojson }}"),
                       "nested too deeply"));
}

// A list nested a million levels deep overflowed the stack when it was freed or printed.
TEST(LimitsTest, DeeplyNestedValuesAreRefused) {
  Status s = RenderError("{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "value nested deeper than 128 levels")) << s.message();
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  StatusOr<std::string> out = ApplyChatTemplate("{{ messages }}", nlohmann::json::parse(deep), false, "", "");
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Mentions(out.status(), "messages nested deeper")) << out.status().message();
  nlohmann::json extra = nlohmann::json::object();
  extra["x"] = nlohmann::json::parse(deep);  // moved, not copied: a copy would recurse
  out = ApplyChatTemplate("{{ x }}", nlohmann::json::array(), false, "", "", extra);
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(Render("{{ x }}", R"({"x": [[[[[1]]]]]})"), "[[[[[1]]]]]");
}

// Recursion of statements, expressions and macro calls is bounded, so that no template can
// overflow the stack: blocks nested in a recursive macro used to.
TEST(LimitsTest, NestingIsBounded) {
  std::string src = "{% macro f(n) %}";
  for (int i = 0; i < 150; ++i) src += "{% if true %}";
  src += "{% if n > 0 %}{{ f(n - 1) }}{% endif %}";
  for (int i = 0; i < 150; ++i) src += "{% endif %}";
  src += "{% endmacro %}{{ f(99) }}";
  Status s = RenderError(src);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "template nesting limit (256)")) << s.message();
  // Chains the grammar builds in a loop are as tall as they are long: refused when parsed.
  for (const auto& [head, link, tail] : {std::tuple{"", "1 + ", "1"}, std::tuple{"x", ".a", ""},
                                         std::tuple{"x", " | f", ""}, std::tuple{"f", "()", ""},
                                         std::tuple{"x", "[0]", ""}, std::tuple{"x", " is defined", ""}}) {
    std::string chain = std::string("{{ ") + head;
    for (int i = 0; i < 5000; ++i) chain += link;
    chain += std::string(tail) + " }}";
    s = RenderError(chain);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << link;
    EXPECT_TRUE(Mentions(s, "expression nested too deeply")) << link << ": " << s.message();
  }
  EXPECT_EQ(Render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) | length }}"),
            "71");
}

TEST(LimitsTest, StepsAreBounded) {
  tmpl::RenderLimits limits;
  limits.max_steps = 10000;
  const Status s = RenderWithLimits("{% for i in range(100000) %}{{ i }}{% endfor %}", limits);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Mentions(s, "template step limit (10000 statements and expressions)")) << s.message();
  EXPECT_TRUE(RenderWithLimits("{% for i in range(1000) %}{{ i }}{% endfor %}", limits).ok());
}

// Work that the loop and output limits did not see: values built and thrown away in a loop,
// strings doubled by concatenation, lists holding one big value many times over (printed,
// compared or serialized), replace() and join() multiplying their input.
TEST(LimitsTest, WorkIsBounded) {
  tmpl::RenderLimits small;  // the same with less work allowed, to keep the test quick
  small.max_work_bytes = 16 << 20;
  for (const char* src : {
           "{% for i in range(1000000) %}{% set x = range(1000000) %}{% endfor %}",
           "{% for i in range(1000000) %}{% set x = 'a' * 16000000 %}{% endfor %}",
           "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
           "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
           "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a == ns.a }}",
           "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | tojson }}",
           "{% set s = 'a' * 10000000 %}{{ s.replace('a', s) | length }}",
           "{% set s = 'a' * 10000000 %}{{ ([1] * 10000) | join(s) | length }}",
           "{{ {'a': 1} | tojson(indent=2000000000) }}",
           "{{ ('x\n' * 1000000) | indent(100000) | length }}",
           "{{ range(100000) | unique | list | length }}",  // quadratic: kept spinning once spent
       }) {
    const Status s = RenderWithLimits(src, small);
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << src << ": " << s.ToString();
    EXPECT_TRUE(Mentions(s, "template work limit (16777216 bytes")) << src << ": " << s.message();
  }
  const Status s = RenderError("{{ {'a': 1} | tojson(indent=2000000000) }}");
  EXPECT_TRUE(Mentions(s, "template work limit (268435456 bytes")) << s.message();
  // Big but bounded work is fine, and fast: repetition by doubling, linear substring search.
  EXPECT_EQ(Render("{{ ('a' * 10000000) | length }}"), "10000000");
  EXPECT_EQ(Render("{{ ('\xce\xa9\xc3\xa9' * 1000000) | upper | length }} {{ ('\xce\xa9\xc3\xa9' * 2) | upper }}"),
            "2000000 \xce\xa9\xc3\x89\xce\xa9\xc3\x89");  // ΩÉΩÉ, no allocation per character
  EXPECT_EQ(Render("{% set s = 'a' * 2000000 %}{% set t = 'a' * 1000000 ~ 'b' %}{{ t in s }} {{ s.count(t) }} "
                   "{{ (s ~ t).find(t) }} {{ (s ~ t).replace(t, 'c') | length }}"),
            "False 0 2000000 2000001");
}

TEST(ChatTemplateTest, StrftimeNow) {
  const std::string year = Render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_EQ(year.substr(0, 2), "20");
}

}  // namespace
}  // namespace peng
