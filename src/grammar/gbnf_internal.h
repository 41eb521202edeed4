// Internals shared by the GBNF builders (gbnf_builder.cc, json_schema.cc, regex.cc): sets of
// code points written as GBNF character classes, UTF-8 decoding, and the regex translator
// that both AddRegex and the JSON Schema "pattern"/"format" keywords use. Not a public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/utf8.h"

namespace peng::grammar::internal {

// JSON numbers in generated grammars: at most 16 integer digits, 15 fraction digits and a
// 3-digit exponent -- the precision and range of a double. Without a bound a small model can
// write digits until max_tokens.
inline constexpr int kMaxIntegerDigits = 16;
inline constexpr int kMaxFractionDigits = 15;
inline constexpr int kMaxExponentDigits = 3;

// A set of code points as sorted, disjoint, non-adjacent closed ranges.
class CharSet {
 public:
  CharSet() = default;
  static CharSet Range(uint32_t lo, uint32_t hi);
  static CharSet Of(uint32_t c) { return Range(c, c); }
  void Add(uint32_t lo, uint32_t hi);
  void Add(const CharSet& other);
  CharSet Complement() const;
  CharSet Intersect(const CharSet& other) const;
  CharSet Minus(const CharSet& other) const { return Intersect(other.Complement()); }
  bool Contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }
  // GBNF: a literal for one character, else a class "[...]" ("" when empty).
  std::string ToGbnf() const;

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// Appends code point `c` escaped for a GBNF literal, or with `in_class` for a class body:
// quote and backslash escaped (and \[ \] \x2D \x5E in a class), \n \r \t, other non-printable or
// non-ASCII characters as \xHH, \uHHHH or \UHHHHHHHH.
void AppendEscaped(std::string* out, uint32_t c, bool in_class = false);

// The GBNF alternatives for one character of JSON string content in `set`: unescaped where
// JSON allows it, else (and additionally for '/') its JSON escape. "" when `set` is empty.
std::string JsonCharsGbnf(const CharSet& set);

// Translates a regular expression (the dialect of gbnf_builder.h) into a GBNF expression
// (parenthesized when not atomic). With `json_string` the expression matches the JSON string
// content (without quotes) that decodes to a text the regex matches in full.
StatusOr<std::string> RegexToGbnfExpr(std::string_view regex, bool json_string);

// Integers in [lo, hi] (absent = unbounded; |bounds| <= 1e15) as decimal numerals without
// leading zeros; "" when the range is empty (number_range.cc).
std::string IntegerRangeGbnf(std::optional<long long> lo, std::optional<long long> hi);
// JSON numbers without exponent x with lo < x (lo_excl) or lo <= x, and likewise for hi,
// for integer bounds; "" when empty.
std::string NumberRangeGbnf(std::optional<long long> lo, bool lo_excl,
                            std::optional<long long> hi, bool hi_excl);

// Whether `expr` can be followed by a postfix operator or concatenated without parentheses.
bool IsAtom(std::string_view expr);
// `expr`, parenthesized unless it is an atom.
std::string Atom(const std::string& expr);

}  // namespace peng::grammar::internal
