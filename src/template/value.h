// Value: the dynamic value of the chat-template language, modelled on the Python objects
// that Jinja2 templates see (undefined, None, bool, int, float, str, list, dict) plus the
// template-only kinds namespace() and callable (macros, bound methods). Strings, lists and dicts
// are immutable once built and shared by pointer, so copies are O(1); a namespace is shared and
// mutable on purpose (`{% set ns.x = 1 %}` inside a loop must be seen after it). Dicts keep
// insertion order like Python's. Not thread-safe to mutate; a rendered template owns its values.
//
// Every list and dict knows its nesting depth (a namespace counts as one level whatever it
// holds), so the interpreter can refuse values nested deeper than its limit before anything
// recurses over them. Work that grows with the size of values (building strings and lists,
// comparing, printing, serializing) is charged to the WorkBudget of the render running on the
// calling thread, so that a template cannot make one render allocate or loop without bound.
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

// The work one render may do, in bytes: a string costs its length (plus kStringBytes when it
// is made), a list or dict element kElementBytes, each time it is built, copied, scanned,
// compared, printed or serialized. A render
// installs one for its thread (RAII); Charge() adds to it and says whether it is still within
// its limit. With none installed (values used outside a render) nothing is counted. Once
// spent it stays spent, and the operations that notice stop early (returning partial results
// or an error); the interpreter turns that into a ResourceExhausted error.
class WorkBudget {
 public:
  explicit WorkBudget(int64_t limit);
  ~WorkBudget();
  WorkBudget(const WorkBudget&) = delete;
  WorkBudget& operator=(const WorkBudget&) = delete;

  bool exhausted() const { return used_ > limit_; }
  int64_t limit() const { return limit_; }

  // Charges the budget of the calling thread's render; false once it is exhausted.
  static bool Charge(int64_t bytes);
  // Whether the calling thread's render has exhausted its budget.
  static bool Exhausted();
  // Bytes one list/dict element counts for (at least sizeof(Value)), and the overhead of one
  // string value besides its characters: close to what they take in memory.
  static constexpr int64_t kElementBytes = 96;
  static constexpr int64_t kStringBytes = 48;

  // Nothing is charged while one is alive: for fixed-size bookkeeping that other limits
  // already bound (the `loop` variable of each iteration).
  class Pause {
   public:
    Pause();
    ~Pause();
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;

   private:
    WorkBudget* paused_;
  };

 private:
  int64_t limit_;
  int64_t used_ = 0;
  WorkBudget* previous_;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };

  Value() = default;  // undefined
  static Value Undefined(std::string hint);
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
  // Also the undefined hint and the callable name.
  const std::string& as_string() const { return str_ ? *str_ : EmptyString(); }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }  // dict or namespace entries
  const NativeFunction& as_function() const { return *fn_; }

  // Nesting of lists and dicts: 0 for scalars, 1 + the deepest element for lists and dicts, 1
  // for a namespace.
  int depth() const { return depth_; }

  // Dict/namespace lookup; nullptr when absent.
  const Value* Find(const std::string& key) const;
  // Namespace assignment (shared: every copy of this namespace sees it).
  void SetAttr(const std::string& key, Value v);
  // Empties a namespace; the interpreter does this to every namespace it created when a render
  // ends, which breaks the reference cycles a template can build (`{% set ns.x = ns %}`).
  void ClearNamespace();

  bool Truthy() const;
  // Python str(): what `{{ v }}` prints. Undefined prints "".
  std::string Str() const;
  // Python repr(): how values print inside lists and dicts.
  std::string Repr() const;
  // json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson filter does it;
  // indent < 0 means compact-with-spaces (", " and ": ").
  StatusOr<std::string> ToJson(int64_t indent) const;

  // Python ==.
  bool Equals(const Value& other) const;
  const char* TypeName() const;

 private:
  static const std::string& EmptyString();
  void AppendRepr(std::string* out) const;

  Kind kind_ = Kind::kUndefined;
  int depth_ = 0;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const NativeFunction> fn_;
};

// Python float repr(): shortest round-trip digits, "1.0", "1e-05", "1e+20", "inf", "nan".
std::string FormatPythonFloat(double f);

}  // namespace peng::tmpl
