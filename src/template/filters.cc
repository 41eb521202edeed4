// Built-in filters (see builtins.h).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "template/builtins.h"

namespace peng::tmpl {
namespace {

bool IsPySpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Attribute lookup for selectattr/map/join(attribute=): "a.b" walks nested dicts.
StatusOr<Value> Attribute(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_undefined()) return cur;
    PENG_ASSIGN_OR_RETURN(cur, GetItem(cur, Value::String(part)));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Arguments after the first `skip` positional ones, for forwarding to a test or filter.
CallArgs Rest(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

StatusOr<Value> SelectOrReject(const std::string& name, const Value& v, const CallArgs& args) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool select = name == "select" || name == "selectattr";
  PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return InvalidArgument(name + " needs an attribute name");
    }
    attr = args.positional[next++].as_string();
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return InvalidArgument(name + ": test name must be a string");
    test = args.positional[next++].as_string();
  }
  const CallArgs test_args = Rest(args, next);
  ValueList out;
  for (const Value& item : items) {
    if (WorkBudget::Exhausted()) return ResourceExhausted(name + ": the template's work limit is exhausted");
    Value subject = item;
    if (by_attr) {
      PENG_ASSIGN_OR_RETURN(subject, Attribute(item, attr));
    }
    bool pass = subject.Truthy();
    if (!test.empty()) {
      PENG_ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, test_args));
    }
    if (pass == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

StatusOr<Value> Map(const Value& v, const CallArgs& args) {
  PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const Value* attr = args.Get(SIZE_MAX, "attribute");
  const Value* def = args.Get(SIZE_MAX, "default");
  ValueList out;
  for (const Value& item : items) {
    if (WorkBudget::Exhausted()) return ResourceExhausted("map: the template's work limit is exhausted");
    if (attr) {
      PENG_ASSIGN_OR_RETURN(Value x, Attribute(item, attr->Str()));
      out.push_back(x.is_undefined() && def ? *def : x);
    } else {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return InvalidArgument("map needs a filter name or attribute=");
      }
      PENG_ASSIGN_OR_RETURN(Value x, ApplyFilter(args.positional[0].as_string(), item, Rest(args, 1)));
      out.push_back(std::move(x));
    }
  }
  return Value::List(std::move(out));
}

StatusOr<Value> Join(const Value& v, const CallArgs& args) {
  const Value* sep = args.Get(0, "d");
  const Value* attr = args.Get(1, "attribute");
  PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const std::string separator = sep ? sep->Str() : std::string();
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value x = items[i];
    if (attr) {
      PENG_ASSIGN_OR_RETURN(x, Attribute(x, attr->Str()));
    }
    const std::string text = x.Str();
    // The separator repeats once per item: charged as the output grows.
    if (!WorkBudget::Charge(static_cast<int64_t>((i ? separator.size() : 0) + text.size()))) {
      return ResourceExhausted("join: the template's work limit is exhausted");
    }
    if (i) out += separator;
    out += text;
  }
  return Value::String(std::move(out));
}

}  // namespace

StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const CallArgs& args) {
  const Value* a0 = args.Get(0, "");
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    return InvalidArgument("filter '" + name + "' is not supported");
  }
  if (name == "string") return Value::String(v.Str());
  if (name == "trim") {
    const std::string s = v.Str();
    const Value* chars = args.Get(0, "chars");
    auto strip_char = [&](char c) {
      return chars && chars->is_string() ? chars->as_string().find(c) != std::string::npos : IsPySpace(c);
    };
    size_t b = 0, e = s.size();
    while (b < e && strip_char(s[b])) ++b;
    while (e > b && strip_char(s[e - 1])) --e;
    return Value::String(s.substr(b, e - b));
  }
  if (name == "upper") return Value::String(MapCase(v.Str(), CaseMode::kUpper));
  if (name == "lower") return Value::String(MapCase(v.Str(), CaseMode::kLower));
  if (name == "capitalize") return Value::String(MapCase(v.Str(), CaseMode::kCapitalize));
  if (name == "title") return Value::String(MapCase(v.Str(), CaseMode::kTitle));
  if (name == "length" || name == "count") {
    PENG_ASSIGN_OR_RETURN(int64_t n, Length(v));
    return Value::Int(n);
  }
  if (name == "tojson") {
    const Value* indent = args.Get(0, "indent");
    PENG_ASSIGN_OR_RETURN(std::string s, v.ToJson(indent && indent->is_int() ? indent->as_int() : -1));
    return Value::String(s);
  }
  if (name == "join") return Join(v, args);
  if (name == "first" || name == "last") {
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    if (items.empty()) return Value::Undefined("no " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    const Value* boolean = args.Get(1, "boolean");
    const bool use_default = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
    if (!use_default) return v;
    return a0 ? *a0 : Value::String("");
  }
  if (name == "int") {
    // Python int(): NaN and text that is no number give the default (jinja catches the
    // ValueError); values beyond 64 bits, which Python would keep as big ints, are an error.
    auto from_double = [&](double f) -> StatusOr<Value> {
      if (std::isnan(f)) return a0 ? *a0 : Value::Int(0);
      if (!(f >= -0x1p63 && f < 0x1p63)) {
        return InvalidArgument("int: " + FormatPythonFloat(f) + " is out of the 64-bit integer range");
      }
      return Value::Int(static_cast<int64_t>(f));
    };
    if (v.is_int()) return Value::Int(v.as_int());
    if (v.kind() == Value::Kind::kFloat) return from_double(v.as_double());
    if (v.is_string()) {
      char* end = nullptr;
      const std::string& s = v.as_string();
      errno = 0;
      const long long x = std::strtoll(s.c_str(), &end, 10);
      if (end != s.c_str() && *end == '\0') {
        if (errno == ERANGE) return InvalidArgument("int: '" + s + "' is out of the 64-bit integer range");
        return Value::Int(x);
      }
      const double f = std::strtod(s.c_str(), &end);
      if (end != s.c_str() && *end == '\0') return from_double(f);
    }
    return a0 ? *a0 : Value::Int(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.as_double());
    if (v.is_string()) {
      char* end = nullptr;
      const double f = std::strtod(v.as_string().c_str(), &end);
      if (end != v.as_string().c_str() && *end == '\0') return Value::Float(f);
    }
    return a0 ? *a0 : Value::Float(0);
  }
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.as_double()));
    if (v.is_int()) {
      if (v.as_int() == INT64_MIN) return InvalidArgument("abs: integer overflow");
      return Value::Int(std::llabs(v.as_int()));
    }
    return InvalidArgument("bad operand type for abs()");
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List({});
    if (!v.is_dict()) return InvalidArgument("items filter needs a mapping");
    return CallMethod(v, "items", CallArgs());
  }
  if (name == "list") {
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) return Slice(v, Value(), Value(), Value::Int(-1));
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    return Value::List(ValueList(items.rbegin(), items.rend()));
  }
  if (name == "replace") {
    CallArgs method_args = args;
    return CallMethod(Value::String(v.Str()), "replace", method_args);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(name, v, args);
  }
  if (name == "map") return Map(v, args);
  if (name == "unique") {
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    ValueList out;
    for (const Value& x : items) {  // quadratic, like Jinja's for unhashable items; charged
      bool seen = false;
      for (size_t i = 0; i < out.size() && !seen; ++i) seen = out[i].Equals(x);
      if (WorkBudget::Exhausted()) return ResourceExhausted("unique: the template's work limit is exhausted");
      if (!seen) out.push_back(x);
    }
    return Value::List(std::move(out));
  }
  if (name == "indent") {
    const Value* width_v = args.Get(0, "width");
    const Value* first_v = args.Get(1, "first");
    // Python: " " * width, so a negative width is no indentation.
    const int64_t width = width_v && width_v->is_int() ? std::max<int64_t>(0, width_v->as_int()) : 4;
    if (!(width_v && width_v->is_string()) && !WorkBudget::Charge(width)) {
      return ResourceExhausted("indent: the template's work limit is exhausted");
    }
    const std::string pad = width_v && width_v->is_string() ? width_v->as_string()
                                                            : std::string(static_cast<size_t>(width), ' ');
    const std::string s = v.Str();
    std::string out = first_v && first_v->Truthy() && !s.empty() ? pad : "";
    for (size_t i = 0; i < s.size(); ++i) {
      out.push_back(s[i]);
      if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') {
        // The pad repeats once per line: charged as the output grows.
        if (!WorkBudget::Charge(static_cast<int64_t>(pad.size()))) {
          return ResourceExhausted("indent: the template's work limit is exhausted");
        }
        out += pad;
      }
    }
    return Value::String(std::move(out));
  }
  return InvalidArgument("no filter named '" + name + "'");
}

}  // namespace peng::tmpl
