// Value: the dynamic value of the chat-template language, modelled on the Python objects
// that Jinja2 templates see (undefined, None, bool, int, float, str, list, dict) plus the
// template-only kinds namespace() and callable (macros, bound methods). Lists and dicts are
// immutable once built and shared by pointer, so copies are cheap; a namespace is shared and
// mutable on purpose (`{% set ns.x = 1 %}` inside a loop must be seen after it). Dicts keep
// insertion order like Python's. Not thread-safe to mutate; a rendered template owns its values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace peng::tmpl {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered

// Keyword and positional arguments of a call: f(a, b, key=c).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* Get(size_t index, const std::string& name) const;
};
using NativeFunction = std::function<StatusOr<Value>(const CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };

  Value() = default;  // undefined
  static Value Undefined(std::string hint) { Value v; v.str_ = std::move(hint); return v; }
  static Value None() { Value v; v.kind_ = Kind::kNone; return v; }
  static Value Bool(bool b) { Value v; v.kind_ = Kind::kBool; v.int_ = b; return v; }
  static Value Int(int64_t i) { Value v; v.kind_ = Kind::kInt; v.int_ = i; return v; }
  static Value Float(double f) { Value v; v.kind_ = Kind::kFloat; v.float_ = f; return v; }
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Dict(ValueDict items);
  static Value Namespace(ValueDict items);
  static Value Callable(std::string name, NativeFunction fn);
  static Value FromJson(const nlohmann::json& j);
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python: bool ⊂ int
  bool is_number() const { return is_int() || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }  // also: undefined hint, callable name
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }  // dict or namespace entries
  const NativeFunction& as_function() const { return *fn_; }

  // Dict/namespace lookup; nullptr when absent.
  const Value* Find(const std::string& key) const;
  // Namespace assignment (shared: every copy of this namespace sees it).
  void SetAttr(const std::string& key, Value v);

  bool Truthy() const;
  // Python str(): what `{{ v }}` prints. Undefined prints "".
  std::string Str() const;
  // Python repr(): how values print inside lists and dicts.
  std::string Repr() const;
  // json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson filter does it;
  // indent < 0 means compact-with-spaces (", " and ": ").
  StatusOr<std::string> ToJson(int indent) const;

  // Python ==.
  bool Equals(const Value& other) const;
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const NativeFunction> fn_;
};

// Python float repr(): shortest round-trip digits, "1.0", "1e-05", "1e+20", "inf", "nan".
std::string FormatPythonFloat(double f);

}  // namespace peng::tmpl
