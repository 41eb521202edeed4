// GbnfBuilder: rule bookkeeping, the shared JSON rules, literals, choices, regexes and the
// whole-grammar wrappers. JSON Schema conversion is in json_schema.cc, regex parsing in
// regex.cc.
#include "grammar/gbnf_builder.h"

#include "grammar/gbnf_internal.h"

namespace peng::grammar {

using internal::Atom;

std::string GbnfBuilder::UniqueName(std::string_view hint) {
  std::string base;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    base.push_back(ok ? c : '-');
  }
  if (base.empty()) base = "rule";
  if (base.size() > 64) base.resize(64);
  std::string name = base;
  for (int i = 2; name == "root" || rules_.count(name); ++i) name = base + "-" + std::to_string(i);
  rules_[name] = "";
  order_.push_back(name);
  text_size_ += name.size() + 6;
  return name;
}

void GbnfBuilder::SetRule(const std::string& name, std::string body) {
  text_size_ += body.size();
  rules_[name] = std::move(body);
}

std::string GbnfBuilder::Primitive(std::string_view kind) {
  if (auto it = primitives_.find(kind); it != primitives_.end()) return it->second;
  const std::string name = UniqueName(kind);
  primitives_.emplace(std::string(kind), name);  // before the body: "value" is recursive
  std::string body;
  if (kind == "char") {
    body = R"([^\"\\\x00-\x1F] | "\\" ([\"\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | )"
           R"([dD] [0-7] [0-9a-fA-F]{2})))";
  } else if (kind == "string") {
    body = "\"\\\"\" " + Primitive("char") + "* \"\\\"\"";
  } else if (kind == "integer") {
    // Digit counts bounded (internal::kMax*Digits).
    body = R"("-"? ("0" | [1-9] [0-9]{0,)" + std::to_string(internal::kMaxIntegerDigits - 1) +
           "})";
  } else if (kind == "number") {
    body = Primitive("integer") + R"( ("." [0-9]{1,)" +
           std::to_string(internal::kMaxFractionDigits) + R"(})? ([eE] ("-" | "+")? [0-9]{1,)" +
           std::to_string(internal::kMaxExponentDigits) + "})?";
  } else if (kind == "boolean") {
    body = R"("true" | "false")";
  } else if (kind == "null") {
    body = R"("null")";
  } else if (kind == "value") {
    body = Primitive("object") + " | " + Primitive("array") + " | " + Primitive("string") +
           " | " + Primitive("number") + " | " + Primitive("boolean") + " | " +
           Primitive("null");
  } else if (kind == "object") {
    const std::string s = Primitive("string"), v = Primitive("value");
    body = "\"{\" (" + s + " \":\" \" \"? " + v + " (\",\" \" \"? " + s + " \":\" \" \"? " + v +
           ")*)? \"}\"";
  } else if (kind == "array") {
    const std::string v = Primitive("value");
    body = "\"[\" (" + v + " (\",\" \" \"? " + v + ")*)? \"]\"";
  }
  SetRule(name, std::move(body));
  return name;
}

std::string GbnfBuilder::AddJsonValue() { return Primitive("value"); }
std::string GbnfBuilder::AddJsonObject() { return Primitive("object"); }

StatusOr<std::string> GbnfBuilder::AddRegex(std::string_view regex) {
  PENG_ASSIGN_OR_RETURN(std::string expr, internal::RegexToGbnfExpr(regex, false));
  const std::string name = UniqueName("regex");
  SetRule(name, std::move(expr));
  return name;
}

std::string GbnfBuilder::AddChoice(const std::vector<std::string>& choices) {
  std::string body;
  for (size_t i = 0; i < choices.size(); ++i) body += (i ? " | " : "") + Quote(choices[i]);
  if (body.empty()) body = "\"\"";
  const std::string name = UniqueName("choice");
  SetRule(name, std::move(body));
  return name;
}

std::string GbnfBuilder::AddLiteral(std::string_view text) {
  const std::string name = UniqueName("literal");
  SetRule(name, Quote(text));
  return name;
}

std::string GbnfBuilder::AddRule(std::string_view name_hint, std::string_view body) {
  const std::string name = UniqueName(name_hint);
  SetRule(name, std::string(body));
  return name;
}

std::string GbnfBuilder::Build(std::string_view root_rule) const {
  std::string out = "root ::= " + std::string(root_rule) + "\n";
  for (const std::string& name : order_) out += name + " ::= " + rules_.at(name) + "\n";
  return out;
}

std::string GbnfBuilder::Quote(std::string_view text) {
  std::string out = "\"";
  for (uint32_t c : DecodeUtf8(text)) internal::AppendEscaped(&out, c);
  return out + "\"";
}

StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) {
  GbnfBuilder b;
  PENG_ASSIGN_OR_RETURN(std::string root, b.AddJsonSchema(schema));
  return b.Build(root);
}

StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::json& schema) {
  GbnfBuilder b;
  PENG_ASSIGN_OR_RETURN(std::string root, b.AddJsonSchema(schema));
  return b.Build(root);
}

StatusOr<std::string> RegexToGbnf(std::string_view regex) {
  GbnfBuilder b;
  PENG_ASSIGN_OR_RETURN(std::string root, b.AddRegex(regex));
  return b.Build(root);
}

std::string ChoiceToGbnf(const std::vector<std::string>& choices) {
  GbnfBuilder b;
  return b.Build(b.AddChoice(choices));
}

std::string JsonObjectGbnf() {
  GbnfBuilder b;
  return b.Build(b.AddJsonObject());
}

}  // namespace peng::grammar
