#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace peng::tmpl {

static_assert(sizeof(Value) <= WorkBudget::kElementBytes);

namespace {
thread_local WorkBudget* current_budget = nullptr;
}  // namespace

WorkBudget::WorkBudget(int64_t limit) : limit_(limit), previous_(current_budget) {
  current_budget = this;
}

WorkBudget::~WorkBudget() { current_budget = previous_; }

bool WorkBudget::Charge(int64_t bytes) {
  WorkBudget* b = current_budget;
  if (b == nullptr) return true;
  bytes = std::max<int64_t>(bytes, 0);
  // Saturating: a huge request must not wrap around into a small one.
  b->used_ = bytes > b->limit_ - b->used_ ? b->limit_ + 1 : b->used_ + bytes;
  return b->used_ <= b->limit_;
}

WorkBudget::Pause::Pause() : paused_(current_budget) { current_budget = nullptr; }

WorkBudget::Pause::~Pause() { current_budget = paused_; }

bool WorkBudget::Exhausted() { return current_budget != nullptr && current_budget->exhausted(); }

const std::string& Value::EmptyString() {
  static const std::string* empty = new std::string();
  return *empty;
}

const Value* CallArgs::Get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::Undefined(std::string hint) {
  Value v;
  WorkBudget::Charge(static_cast<int64_t>(hint.size()));
  if (!hint.empty()) v.str_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  WorkBudget::Charge(static_cast<int64_t>(s.size()) + WorkBudget::kStringBytes);
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  WorkBudget::Charge(static_cast<int64_t>(items.size()) * WorkBudget::kElementBytes);
  int depth = 0;
  for (const Value& e : items) depth = std::max(depth, e.depth_);
  v.depth_ = depth + 1;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  int64_t key_bytes = 0;
  int depth = 0;
  for (const auto& [k, e] : items) {
    key_bytes += static_cast<int64_t>(k.size());
    depth = std::max(depth, e.depth_);
  }
  WorkBudget::Charge(static_cast<int64_t>(items.size()) * WorkBudget::kElementBytes + key_bytes);
  v.depth_ = depth + 1;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  v.depth_ = 1;  // mutable: what it holds is checked when it is assigned
  return v;
}

Value Value::Callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.str_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const NativeFunction>(std::move(fn));
  return v;
}

namespace {

template <typename Json>
Value FromJsonImpl(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      for (const auto& e : j) items.push_back(FromJsonImpl(e));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      ValueDict items;
      for (auto it = j.begin(); it != j.end(); ++it) items.emplace_back(it.key(), FromJsonImpl(*it));
      return Value::Dict(std::move(items));
    }
    default:
      return Value::None();
  }
}

void AppendPythonStringRepr(const std::string& s, std::string* out) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->push_back(quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == quote) {
      out->push_back('\\');
      out->push_back(quote);
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      *out += buf;
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back(quote);
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

Status JsonBudgetError() {
  return ResourceExhausted("tojson: the template's work limit is exhausted");
}

Status AppendJson(const Value& v, int64_t indent, int depth, std::string* out) {
  if (depth > 512) return InvalidArgument("tojson: value nested too deeply");
  if (!WorkBudget::Charge(WorkBudget::kElementBytes)) return JsonBudgetError();
  bool newline_ok = true;
  auto newline = [&](int level) {
    if (indent < 0) return;
    // Charged before appending: indent * level may be huge.
    const int64_t n = indent > (int64_t{1} << 40) / (level + 1) ? int64_t{1} << 40 : indent * level;
    if (!WorkBudget::Charge(n + 1)) {
      newline_ok = false;
      return;
    }
    out->push_back('\n');
    out->append(static_cast<size_t>(n), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return InvalidArgument("tojson: value is undefined (" + v.as_string() + ")");
    case Value::Kind::kNone: *out += "null"; return OkStatus();
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return OkStatus();
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.as_double();
      if (std::isnan(f)) *out += "NaN";
      else if (std::isinf(f)) *out += f > 0 ? "Infinity" : "-Infinity";
      else *out += FormatPythonFloat(f);
      return OkStatus();
    }
    case Value::Kind::kString:
      if (!WorkBudget::Charge(static_cast<int64_t>(v.as_string().size()))) return JsonBudgetError();
      AppendJsonString(v.as_string(), out);
      return OkStatus();
    case Value::Kind::kList: {
      if (v.as_list().empty()) { *out += "[]"; return OkStatus(); }
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        if (!newline_ok) return JsonBudgetError();
        PENG_RETURN_IF_ERROR(AppendJson(e, indent, depth + 1, out));
      }
      newline(depth);
      if (!newline_ok) return JsonBudgetError();
      out->push_back(']');
      return OkStatus();
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.as_dict().empty()) { *out += "{}"; return OkStatus(); }
      out->push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.as_dict()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        if (!newline_ok || !WorkBudget::Charge(static_cast<int64_t>(k.size()))) {
          return JsonBudgetError();
        }
        AppendJsonString(k, out);
        *out += ": ";
        PENG_RETURN_IF_ERROR(AppendJson(e, indent, depth + 1, out));
      }
      newline(depth);
      if (!newline_ok) return JsonBudgetError();
      out->push_back('}');
      return OkStatus();
    }
    case Value::Kind::kCallable:
      return InvalidArgument("tojson: cannot serialize function " + v.as_string());
  }
  return OkStatus();
}

}  // namespace

Value Value::FromJson(const nlohmann::json& j) { return FromJsonImpl(j); }
Value Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j); }

const Value* Value::Find(const std::string& key) const {
  if (!dict_) return nullptr;
  int64_t scanned = 0;
  const Value* found = nullptr;
  for (const auto& [k, v] : *dict_) {
    ++scanned;
    if (k == key) {
      found = &v;
      break;
    }
  }
  WorkBudget::Charge(scanned * WorkBudget::kElementBytes);
  return found;
}

void Value::SetAttr(const std::string& key, Value v) {
  WorkBudget::Charge(WorkBudget::kElementBytes);
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

void Value::ClearNamespace() {
  if (kind_ != Kind::kNamespace) return;
  ValueDict entries;
  entries.swap(*dict_);  // destroyed after the dict is empty: re-entry sees no entries
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !list_->empty();
    case Kind::kDict: return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string FormatPythonFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  const size_t e_pos = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string mantissa = sci.substr(0, e_pos);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) out.append(".").append(digits, 1, std::string::npos);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_buf;
  }
  if (exponent < 0) {
    out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
    return out;
  }
  const size_t int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len) {
    out.append(digits).append(int_len - digits.size(), '0').append(".0");
    return out;
  }
  out.append(digits, 0, int_len).append(".").append(digits, int_len, std::string::npos);
  return out;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return as_string();
    default: return Repr();
  }
}

std::string Value::Repr() const {
  std::string out;
  AppendRepr(&out);
  return out;
}

void Value::AppendRepr(std::string* out) const {
  // Charged per element and per string, and cut short once the budget is spent (a list can
  // hold the same big value many times over, so its text can be far larger than its memory).
  if (!WorkBudget::Charge(WorkBudget::kElementBytes)) {
    *out += "...";
    return;
  }
  switch (kind_) {
    case Kind::kUndefined: return;
    case Kind::kNone: *out += "None"; return;
    case Kind::kBool: *out += int_ ? "True" : "False"; return;
    case Kind::kInt: *out += std::to_string(int_); return;
    case Kind::kFloat: *out += FormatPythonFloat(float_); return;
    case Kind::kString:
      if (!WorkBudget::Charge(static_cast<int64_t>(as_string().size()))) {
        *out += "...";
        return;
      }
      AppendPythonStringRepr(as_string(), out);
      return;
    case Kind::kList:
      out->push_back('[');
      for (size_t i = 0; i < list_->size() && !WorkBudget::Exhausted(); ++i) {
        if (i) *out += ", ";
        (*list_)[i].AppendRepr(out);
      }
      out->push_back(']');
      return;
    case Kind::kDict: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, v] : *dict_) {
        if (WorkBudget::Exhausted()) break;
        if (!first) *out += ", ";
        first = false;
        WorkBudget::Charge(static_cast<int64_t>(k.size()));
        AppendPythonStringRepr(k, out);
        *out += ": ";
        v.AppendRepr(out);
      }
      out->push_back('}');
      return;
    }
    case Kind::kNamespace: *out += "<Namespace>"; return;
    case Kind::kCallable: *out += "<function " + as_string() + ">"; return;
  }
}

StatusOr<std::string> Value::ToJson(int64_t indent) const {
  std::string out;
  PENG_RETURN_IF_ERROR(AppendJson(*this, indent, 0, &out));
  return out;
}

bool Value::Equals(const Value& other) const {
  // Charged per element: shared sublists make the compared trees far larger than memory.
  // Once the budget is spent the answer is false and the render fails.
  if (!WorkBudget::Charge(WorkBudget::kElementBytes)) return false;
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) return as_double() == other.as_double();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString:
      WorkBudget::Charge(static_cast<int64_t>(std::min(as_string().size(), other.as_string().size())));
      return as_string() == other.as_string();
    case Kind::kList: {
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_->size() != other.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* o = other.Find(k);
        if (!o || !v.Equals(*o)) return false;
      }
      return true;
    }
    default: return dict_ == other.dict_ && fn_ == other.fn_;
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

}  // namespace peng::tmpl
