// Interpreter: renders a parsed template (ast.h) against a context dict. Follows Jinja2's
// runtime rules as chat templates rely on them: undefined names print as "" but attribute or
// item access on them is an error; `set` inside a `for` body does not leak out of the loop
// (use namespace()); macros see the global scope plus their arguments. Globals provided:
// range, namespace, dict, raise_exception, strftime_now. Integers are 64-bit: a result that
// does not fit is an error (Python would switch to big integers).
//
// A template is a program, so every render runs under RenderLimits and a runaway one ends
// with a ResourceExhausted Status that names the limit: output size, loop iterations, macro
// call depth, steps (statements and expressions evaluated), nesting of the interpreter's
// recursion (statements, expressions and macro calls inside each other: bounds the stack),
// nesting of values (lists and dicts, the context included), and the work budget (bytes of
// strings and list elements built, copied, compared, printed or serialized: bounds time and
// memory; see WorkBudget in value.h). One Render call owns its state; rendering the same tree
// from several threads is safe.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "template/ast.h"
#include "template/value.h"

namespace peng::tmpl {

struct RenderLimits {
  size_t max_output_bytes = 64u << 20;
  int64_t max_loop_iterations = 1'000'000;  // summed over every loop of one render; also the
                                            // longest range()
  int max_call_depth = 100;                 // nested macro calls
  int64_t max_steps = 1'000'000;            // statements executed + expressions evaluated
  int max_nesting = 256;                    // recursion depth of statements, expressions and
                                            // macro calls (each level is a few stack frames)
  int max_value_depth = 128;                // lists and dicts inside each other
  int64_t max_work_bytes = int64_t{256} << 20;  // WorkBudget of one render
};

// `context` must be a dict; its entries become global variables.
StatusOr<std::string> RenderTemplate(const NodeList& nodes, const Value& context,
                                     const RenderLimits& limits);

}  // namespace peng::tmpl
