// Interpreter: renders a parsed template (ast.h) against a context dict. Follows Jinja2's
// runtime rules as chat templates rely on them: undefined names print as "" but attribute or
// item access on them is an error; `set` inside a `for` body does not leak out of the loop
// (use namespace()); macros see the global scope plus their arguments. Globals provided:
// range, namespace, dict, raise_exception, strftime_now. Runaway templates are stopped by
// RenderLimits (output size, total loop iterations, macro call depth). One Render call owns
// its state; rendering the same tree from several threads is safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "template/ast.h"
#include "template/value.h"

namespace peng::tmpl {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;
  int64_t max_loop_iterations = 1'000'000;  // summed over every loop of one render
  int max_call_depth = 100;                 // nested macro calls
};

// `context` must be a dict; its entries become global variables.
StatusOr<std::string> RenderTemplate(const NodeList& nodes, const Value& context,
                                     const RenderLimits& limits);

}  // namespace peng::tmpl
