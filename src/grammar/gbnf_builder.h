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
// or a list of them; without a type, the one the other keywords imply, else any value),
// properties, required (others optional, emitted in declaration order -- the schema's key
// order, so pass an ordered_json), additionalProperties (false, true or a schema; default
// false when properties are given, any value when not; extra keys come after the declared
// ones and never repeat one), enum, const (objects/arrays in them with the optional spaces),
// anyOf / oneOf (as anyOf; sibling constraints are merged into each branch), allOf (merged:
// properties and required united, other keywords must agree), $ref to any local JSON pointer
// (#/$defs/..., #/definitions/..., #; recursive refs allowed, a ref cycle that consumes no
// text is an error), items, prefixItems (without items: no further items), minItems /
// maxItems, minLength / maxLength, pattern (a regex matching the whole string), format
// (date-time, date, time, uuid, email, ipv4, hostname as regexes; other formats are
// annotations), minimum / maximum / exclusiveMinimum / exclusiveMaximum (also draft-4
// booleans) for integers (digit-range rules) and numbers (integer part ranges, no exponent;
// fractional bounds rounded inwards), nullable (OpenAPI). Keywords that carry no constraint
// (title, description, default, examples, example, $schema, $id, $comment, strict, readOnly,
// writeOnly, deprecated, $defs, definitions) are ignored. Any other keyword is an
// InvalidArgument naming it: "unsupported JSON Schema keyword 'patternProperties' at
// #/properties/x"; so are pattern/format together with minLength/maxLength, and schemas
// deeper than 64, needing over 10,000 rules or over 1 MB of grammar text.
//
// The grammar accepts a subset of the valid instances: compact separators, declared
// properties in order, integers without fraction/exponent, strings without \u escapes of
// surrogates, enum values in their compact spelling.
//
// Regex (vLLM guided_regex / schema pattern): literals, escapes (\d \w \s \D \W \S \. \\ \n
// \t \xHH \uHHHH ...; ASCII meanings), classes [...] / [^...], `.` (not newline), groups ( ),
// (?: ), (?P<name> ), alternation |, quantifiers * + ? {m} {m,} {m,n} {,n} (lazy variants
// accepted as greedy), ^ and $ at the ends only. Backreferences, lookaround, other anchors,
// inline flags, possessive quantifiers and repetitions expanding past 1,000,000 characters
// are InvalidArgument naming the construct.
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
  // One of these texts (an empty list gives a rule matching only "": callers refuse it first).
  std::string AddChoice(const std::vector<std::string>& choices);
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
