#include "template/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace peng::tmpl {

const Value* CallArgs::Get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::move(s);
  return v;
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.str_ = std::move(name);
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

Status AppendJson(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 512) return InvalidArgument("tojson: value nested too deeply");
  auto newline = [&](int level) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * level, ' ');
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
    case Value::Kind::kString: AppendJsonString(v.as_string(), out); return OkStatus();
    case Value::Kind::kList: {
      if (v.as_list().empty()) { *out += "[]"; return OkStatus(); }
      out->push_back('[');
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        PENG_RETURN_IF_ERROR(AppendJson(e, indent, depth + 1, out));
      }
      newline(depth);
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
        AppendJsonString(k, out);
        *out += ": ";
        PENG_RETURN_IF_ERROR(AppendJson(e, indent, depth + 1, out));
      }
      newline(depth);
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
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::SetAttr(const std::string& key, Value v) {
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !str_.empty();
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
    case Kind::kString: return str_;
    default: return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return FormatPythonFloat(float_);
    case Kind::kString: {
      std::string out;
      AppendPythonStringRepr(str_, &out);
      return out;
    }
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : *dict_) {
        if (!first) out += ", ";
        first = false;
        AppendPythonStringRepr(k, &out);
        out += ": " + v.Repr();
      }
      return out + "}";
    }
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kCallable: return "<function " + str_ + ">";
  }
  return "";
}

StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  PENG_RETURN_IF_ERROR(AppendJson(*this, indent, 0, &out));
  return out;
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) return as_double() == other.as_double();
    return int_ == other.int_;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return str_ == other.str_;
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
