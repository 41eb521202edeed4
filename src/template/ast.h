// Syntax tree of a parsed chat template: expressions (Expr) and statements (Node). Built once by
// the parser, then read-only while rendering, so one tree may be rendered from many threads.
// Every node keeps its source line and column for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/value.h"

namespace peng::tmpl {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // [args...]; also tuples
    kDict,     // {args[0]: args[1], ...}
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null parts allowed)
    kCall,     // args[0](args[1..]) with kwarg_names for args[1..]
    kFilter,   // args[0] | name(args[1..]) with kwarg_names
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name in {"-", "+", "not"} applied to args[0]
    kBinary,   // args[0] name args[1]; name is an operator, "and", "or", "in", "not in", "~"
    kCond,     // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::string> kwarg_names;  // parallel to args[1..] for calls, filters, tests
  bool negated = false;                  // `is not`
  int height = 1;                        // levels of this tree (the parser bounds it)
  int line = 0;
  int column = 0;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (cond, body)...; cond null for else
    kFor,       // for targets in expr [if filter]: body [else: else_body]
    kSet,       // set targets[0] = expr, or set targets[0].targets[1] = expr (is_attr)
    kSetBlock,  // {% set targets[0] %}body{% endset %}
    kMacro,     // macro name(params): body
    kCallBlock, // {% call expr %}body{% endcall %}: expr's macro gets caller()
    kBreak,
    kContinue,
    kBlock,     // body rendered in place ({% generation %}, {% filter %} without a filter)
  };
  Kind kind = Kind::kText;
  std::string text;  // text, macro name
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  bool is_attr = false;
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
  int line = 0;
  int column = 0;
};

}  // namespace peng::tmpl
