// Lexer for the chat-template language (a Jinja2 subset). Splits a template source into text
// runs and the tokens inside `{{ }}` / `{% %}` tags, dropping `{# #}` comments, and applies
// Jinja's whitespace rules as Hugging Face configures them: trim_blocks (the first newline after
// a block or comment tag is removed), lstrip_blocks (spaces and tabs from the start of a line up
// to a block or comment tag are removed), and the explicit `-` (strip all whitespace on that side)
// and `+` (disable trim/lstrip on that side) modifiers. One trailing newline of the source is
// dropped (Jinja's keep_trailing_newline=False). Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace peng::tmpl {

enum class TokenKind {
  kText,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifiers and keywords
  kString,      // unescaped string literal
  kInt,
  kFloat,
  kOp,          // operators and punctuation: + - * / // % ** ~ == != < <= > >= ( ) [ ] { } , . : | =
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  std::string text;  // name, operator, string value or text run
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

// Errors: "syntax error at 3:14: unterminated string".
StatusOr<std::vector<Token>> Tokenize(const std::string& source);

}  // namespace peng::tmpl
