// Parser: template source -> statement tree (ast.h). Recursive descent over the lexer's tokens
// with Jinja2's operator precedence (lowest first): `x if c else y`, or, and, not, comparisons
// and `in`, + -, ~, * / // %, **, unary - +, then postfix `.attr` `[i]` `[a:b:c]` `(args)`,
// `| filter` and `is test`. Nesting is capped so hostile input cannot overflow the stack.
// Errors carry line:column. Stateless and thread-safe.
#pragma once

#include <string>

#include "core/status.h"
#include "template/ast.h"

namespace peng::tmpl {

StatusOr<NodeList> ParseTemplate(const std::string& source);

}  // namespace peng::tmpl
