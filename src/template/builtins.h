// Built-in filters (`x | name(args)`), tests (`x is name(args)`), methods of str and dict
// (`s.strip()`, `d.get(k)`), and Python-like helpers for the template interpreter. Behaviour
// follows Jinja2 3.1 and Python 3 as Hugging Face chat templates see them (for example `tojson`
// is transformers' json.dumps(ensure_ascii=False) override). Strings are UTF-8 and are indexed,
// sliced and measured in code points. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "template/value.h"

namespace peng::tmpl {

// "not found" is a distinct outcome so the caller can report "no filter named 'x'".
StatusOr<Value> ApplyFilter(const std::string& name, const Value& subject, const CallArgs& args);
StatusOr<bool> ApplyTest(const std::string& name, const Value& subject, const CallArgs& args);
// Methods bound to str and dict values. Undefined result = no such method.
StatusOr<Value> CallMethod(const Value& object, const std::string& name, const CallArgs& args);
bool HasMethod(const Value& object, const std::string& name);

// Items that `for` iterates: list elements, dict keys, string characters; undefined -> empty.
StatusOr<std::vector<Value>> Iterate(const Value& v);
// Code points of a UTF-8 string, each as its own string.
std::vector<std::string> Utf8Chars(const std::string& s);
// Number of code points (as Utf8Chars counts them), without building them.
int64_t CountChars(const std::string& s);
// First occurrence of `needle` in `haystack` at or after byte `from`, or npos, in
// O(|haystack| + |needle|) whatever the text (a naive search is quadratic on inputs like
// "aaaa...a" / "aa...ab", which a template can build). Charged to the WorkBudget.
size_t FindSubstring(std::string_view haystack, std::string_view needle, size_t from = 0);
// str.upper()/str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other code
// points pass through unchanged. `title` upper-cases the first letter of each word and lowers
// the rest; `capitalize` does that for the first letter of the string only.
enum class CaseMode { kUpper, kLower, kTitle, kCapitalize };
std::string MapCase(const std::string& s, CaseMode mode);
// Python len().
StatusOr<int64_t> Length(const Value& v);
// Python x[start:stop:step] on lists and strings (null Values mean "omitted").
StatusOr<Value> Slice(const Value& v, const Value& start, const Value& stop, const Value& step);
// Python x[key] for lists, strings and dicts; a missing key or index gives undefined.
StatusOr<Value> GetItem(const Value& v, const Value& key);
// Python ordering for < <= > >= (numbers, strings, lists).
StatusOr<int> Compare(const Value& a, const Value& b);

}  // namespace peng::tmpl
