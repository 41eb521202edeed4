// GbnfBuilder: writes GBNF text (see grammar.h for the dialect) for the constraints of the
// OpenAI API and vLLM's guided decoding -- a JSON Schema (the subset OpenAI's structured
// outputs accept), any JSON value/object (response_format json_object), a regular expression,
// a list of choices, literal text -- as named rules that can be combined into one grammar (a
// tool call is a literal prefix, a JSON object of a given schema, a literal suffix).
//
// JSON output is compact: no whitespace except one optional space after ':' and ',' (a small
// model let loose on free whitespace can loop on newlines until max_tokens).
//
// JSON Schema supported: type (string / number / integer / boolean / null / object / array,
// or a list of them), properties, required (others optional, emitted in declaration order),
// additionalProperties (false, true or a schema; default false when properties are given,
// any value when not), enum, const, anyOf / oneOf (as anyOf), allOf of one schema, $ref to
// #/$defs/... and #/definitions/... (recursive refs allowed), items, prefixItems, minItems /
// maxItems, minLength / maxLength, pattern (a regex, anchored), format (date-time, date, time,
// uuid, email as patterns), minimum / maximum / exclusiveMinimum / exclusiveMaximum for
// integers (digit-range rules when bounded), nullable. Keywords that carry no constraint
// (title, description, default, examples, $schema, $id, $comment, strict) are ignored. Any
// other keyword is an InvalidArgument naming it: "unsupported JSON Schema keyword
// 'patternProperties' at #/properties/x".
//
// Regex (vLLM guided_regex / schema pattern): literals, escapes (\d \w \s \D \W \S \. \\ \n
// \t \uHHHH ...), classes [...] / [^...], `.`, groups ( ), (?: ), alternation |, quantifiers
// * + ? {m} {m,} {m,n} (lazy variants accepted as greedy), ^ and $ at the ends only.
// Backreferences, lookaround and other anchors are InvalidArgument naming the construct.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace peng::grammar {

class GbnfBuilder {
 public:
  // Each Add* returns the name of the rule that matches the construct; names are unique in
  // this builder (helper rules get derived names).
  // Properties are emitted in the schema's key order: pass an ordered_json parsed from the
  // request to keep declaration order (a plain json's keys are sorted).
  StatusOr<std::string> AddJsonSchema(const nlohmann::ordered_json& schema);
  StatusOr<std::string> AddJsonSchema(const nlohmann::json& schema);
  std::string AddJsonValue();   // any JSON value
  std::string AddJsonObject();  // any JSON object (response_format json_object)
  StatusOr<std::string> AddRegex(std::string_view regex);
  std::string AddChoice(const std::vector<std::string>& choices);  // one of these texts
  std::string AddLiteral(std::string_view text);
  // A rule with a raw GBNF body, e.g. AddRule("call", "\"<a>\" " + obj + " \"</a>\"").
  std::string AddRule(std::string_view name_hint, std::string_view body);
  // The whole grammar text: "root ::= <root_rule>" and every rule added.
  std::string Build(std::string_view root_rule) const;

  // GBNF string literal for `text` (quoted, escaped).
  static std::string Quote(std::string_view text);

 private:
  friend class SchemaConverter;  // json_schema.cc
  std::string UniqueName(std::string_view hint);
  // Adds rule `name` (from UniqueName) with `body`, or replaces the body of a reserved name.
  void SetRule(const std::string& name, std::string body);
  // The shared rule for a JSON primitive ("value", "object", "array", "string", "char",
  // "number", "integer", "boolean", "null"), added with its dependencies on first use.
  std::string Primitive(std::string_view kind);

  std::map<std::string, std::string> rules_;  // name -> body ("" while reserved)
  std::vector<std::string> order_;            // rule names in the order they were created
  std::map<std::string, std::string, std::less<>> primitives_;  // kind -> rule name
  size_t text_size_ = 0;                      // bytes of rule bodies so far
};

// Convenience wrappers: a whole grammar text for one construct.
StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);
StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::json& schema);
StatusOr<std::string> RegexToGbnf(std::string_view regex);
std::string ChoiceToGbnf(const std::vector<std::string>& choices);
std::string JsonObjectGbnf();

}  // namespace peng::grammar
