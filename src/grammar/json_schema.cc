// JSON Schema -> GBNF (GbnfBuilder::AddJsonSchema). A recursive walk over the schema that
// returns a GBNF expression per subschema; object properties, array items and $ref targets
// become named rules. Number ranges are written digit by digit (number_range.cc).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <set>

#include "grammar/gbnf_builder.h"
#include "grammar/gbnf_internal.h"

namespace peng::grammar {

using internal::Atom;
using nlohmann::ordered_json;

namespace {

constexpr int kMaxDepth = 64;
constexpr size_t kMaxRules = 10000;
constexpr size_t kMaxText = 1 << 20;
constexpr size_t kInlineProperties = 6;  // objects with more properties get a rule per tail

const std::set<std::string, std::less<>> kAnnotations = {
    "title",     "description", "default",  "examples",   "example", "$schema", "$id",
    "$comment",  "strict",      "readOnly", "writeOnly",  "deprecated", "$defs",
    "definitions"};

const std::set<std::string, std::less<>> kKeywords = {
    "type",        "properties",  "required",  "additionalProperties", "enum",
    "const",       "anyOf",       "oneOf",     "allOf",                "$ref",
    "items",       "prefixItems", "minItems",  "maxItems",             "minLength",
    "maxLength",   "pattern",     "format",    "minimum",              "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "nullable"};

std::string PointerToken(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string Paren(const std::string& e) {
  std::string s;
  s.reserve(e.size() + 2);
  s.push_back('(');
  s.append(e);
  s.push_back(')');
  return s;
}

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return Paren(Join(alts, " | "));
}

// `e` repeated min..max times (max < 0: unbounded).
std::string Repeat(const std::string& e, long long min, long long max) {
  const std::string a = Atom(e);
  if (max == 0) return "";
  if (min == 0 && max < 0) return a + "*";
  if (min == 1 && max < 0) return a + "+";
  if (min == 0 && max == 1) return a + "?";
  if (min == 1 && max == 1) return e;
  if (max < 0) return a + "{" + std::to_string(min) + ",}";
  if (min == max) return a + "{" + std::to_string(min) + "}";
  return a + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

// Regexes (regex.cc's dialect) for the supported string formats.
const char* FormatRegex(const std::string& format) {
  static const std::string kYear = R"((000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d\d\d))";
  static const std::string kLeapYear =
      R"((\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00))";
  static const std::string kMonthDay =
      R"(((0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|(0[469]|11)-(0[1-9]|[12]\d|30)|)"
      R"(02-(0[1-9]|1\d|2[0-8])))";
  static const std::string kDate = "(" + kYear + "-" + kMonthDay + "|" + kLeapYear + "-02-29)";
  static const std::string kTime =
      R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  static const std::string kDateTime = kDate + "T" + kTime;
  static const std::string kOctet = R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::string kIpv4 = kOctet + R"((\.)" + kOctet + "){3}";
  static const std::string kLabel = R"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)";
  static const std::string kHostname = kLabel + R"((\.)" + kLabel + ")*";
  static const std::string kEmail =
      R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@)" + kLabel +
      R"((\.)" + kLabel + ")+";
  static const std::string kUuid =
      R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
  if (format == "date") return kDate.c_str();
  if (format == "time") return kTime.c_str();
  if (format == "date-time") return kDateTime.c_str();
  if (format == "ipv4") return kIpv4.c_str();
  if (format == "hostname") return kHostname.c_str();
  if (format == "email") return kEmail.c_str();
  if (format == "uuid") return kUuid.c_str();
  return nullptr;  // other formats are annotations only
}

// One JSON value as GBNF: its compact text, with the optional space after ':' and ','.
std::string ValueLiteral(const ordered_json& v) {
  const std::string sep = " \",\" \" \"? ";
  if (v.is_object() && !v.empty()) {
    std::string s = "\"{\"";
    bool first = true;
    for (const auto& [key, x] : v.items()) {
      s += (first ? " " : sep) + GbnfBuilder::Quote(ordered_json(key).dump() + ":") + " \" \"? " +
           ValueLiteral(x);
      first = false;
    }
    return s + " \"}\"";
  }
  if (v.is_array() && !v.empty()) {
    std::string s = "\"[\"";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : " ") + ValueLiteral(v[i]);
    return s + " \"]\"";
  }
  return GbnfBuilder::Quote(v.dump());
}

bool HasType(const ordered_json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     std::floor(v.get<double>()) == v.get<double>());
  }
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

}  // namespace

class SchemaConverter {
 public:
  SchemaConverter(GbnfBuilder* b, const ordered_json& root) : b_(b), root_(root) {}

  StatusOr<std::string> Top() {
    PENG_ASSIGN_OR_RETURN(std::string e, Convert(root_, "#", "schema", 0));
    const std::string name = Named("schema", e);
    PENG_RETURN_IF_ERROR(CheckLimits("#"));
    return name;
  }

 private:
  Status CheckLimits(const std::string& path) const {
    if (b_->rules_.size() > kMaxRules) {
      return InvalidArgument("JSON Schema needs more than 10,000 grammar rules (at " + path + ")");
    }
    if (b_->text_size_ > kMaxText) {
      return InvalidArgument("JSON Schema needs more than 1 MB of grammar (at " + path + ")");
    }
    return OkStatus();
  }

  // A rule name for `expr`: itself when it already is a name, else a new rule.
  std::string Named(const std::string& hint, const std::string& expr) {
    bool name = !expr.empty();
    for (char c : expr) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) name = false;
    }
    if (name) return expr;
    const std::string n = b_->UniqueName(hint);
    b_->SetRule(n, expr);
    return n;
  }

  StatusOr<std::string> Convert(const ordered_json& s, const std::string& path,
                                const std::string& hint, int depth) {
    if (depth > kMaxDepth) return InvalidArgument("JSON Schema nested deeper than 64 at " + path);
    PENG_RETURN_IF_ERROR(CheckLimits(path));
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_->Primitive("value");
      return InvalidArgument("schema false (matches nothing) at " + path);
    }
    if (!s.is_object()) return InvalidArgument("schema at " + path + " is not an object");
    for (const auto& [key, v] : s.items()) {
      if (!kKeywords.count(key) && !kAnnotations.count(key)) {
        return InvalidArgument("unsupported JSON Schema keyword '" + key + "' at " + path);
      }
    }
    if (s.contains("nullable")) {
      if (!s["nullable"].is_boolean()) return Bad("nullable", path, "must be a boolean");
      if (s["nullable"].get<bool>()) {
        ordered_json inner = s;
        inner.erase("nullable");
        PENG_ASSIGN_OR_RETURN(std::string e, Convert(inner, path, hint, depth));
        return "(" + e + " | " + b_->Primitive("null") + ")";
      }
    }
    if (s.contains("$ref")) return ConvertRef(s, path, hint, depth);
    if (s.contains("allOf")) {
      const ordered_json& all = s["allOf"];
      if (!all.is_array() || all.empty()) return Bad("allOf", path, "must be a non-empty array");
      ordered_json merged = s;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) {
        const std::string p = path + "/allOf/" + std::to_string(i);
        PENG_RETURN_IF_ERROR(Merge(&merged, all[i], p));
      }
      return Convert(merged, path, hint, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const ordered_json& any = s[key];
      if (!any.is_array() || any.empty()) return Bad(key, path, "must be a non-empty array");
      ordered_json rest = s;
      rest.erase(key);
      const bool constrained = HasConstraints(rest);
      std::vector<std::string> alts;
      for (size_t i = 0; i < any.size(); ++i) {
        const std::string p = path + "/" + key + "/" + std::to_string(i);
        ordered_json branch = any[i];
        if (constrained) {
          ordered_json m = rest;
          PENG_RETURN_IF_ERROR(Merge(&m, any[i], p));
          branch = std::move(m);
        }
        PENG_ASSIGN_OR_RETURN(std::string e,
                              Convert(branch, p, hint + "-" + std::to_string(i), depth + 1));
        alts.push_back(e);
      }
      return Alternatives(alts);
    }
    if (s.contains("const") || s.contains("enum")) return ConvertEnum(s, path);
    return ConvertTyped(s, path, hint, depth);
  }

  static Status Bad(const std::string& key, const std::string& path, const std::string& what) {
    return InvalidArgument("'" + key + "' at " + path + " " + what);
  }

  static bool HasConstraints(const ordered_json& s) {
    for (const auto& [key, v] : s.items()) {
      if (!kAnnotations.count(key)) return true;
    }
    return false;
  }

  StatusOr<const ordered_json*> Resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      return InvalidArgument("unsupported $ref '" + ref + "' at " + path + " (only #/... refs)");
    }
    try {
      const ordered_json::json_pointer ptr(ref.substr(1));
      if (!root_.contains(ptr)) {
        return InvalidArgument("$ref '" + ref + "' at " + path + " does not resolve");
      }
      return &root_.at(ptr);
    } catch (const std::exception&) {
      return InvalidArgument("$ref '" + ref + "' at " + path + " is not a JSON pointer");
    }
  }

  // Shallow intersection of two schemas: properties and required are united; any other
  // keyword present in both must be equal.
  Status Merge(ordered_json* into, const ordered_json& from_in, const std::string& path) {
    const ordered_json* from = &from_in;
    for (int hops = 0; from->is_object() && from->contains("$ref"); ++hops) {
      if (hops > kMaxDepth) return InvalidArgument("$ref chain too long at " + path);
      if (!(*from)["$ref"].is_string()) return Bad("$ref", path, "must be a string");
      ordered_json rest = *from;
      rest.erase("$ref");
      if (HasConstraints(rest)) {
        return InvalidArgument("keywords alongside '$ref' inside allOf/anyOf at " + path +
                               " are not supported");
      }
      PENG_ASSIGN_OR_RETURN(from, Resolve((*from)["$ref"].get<std::string>(), path));
    }
    if (from->is_boolean() && from->get<bool>()) return OkStatus();
    if (!from->is_object()) return InvalidArgument("schema at " + path + " is not an object");
    for (const auto& [key, v] : from->items()) {
      if (kAnnotations.count(key)) continue;
      if (!into->contains(key)) {
        (*into)[key] = v;
      } else if (key == "properties" && v.is_object() && (*into)[key].is_object()) {
        for (const auto& [name, sub] : v.items()) {
          ordered_json& props = (*into)[key];
          if (props.contains(name) && props[name] != sub) {
            return InvalidArgument("property '" + name + "' defined differently in allOf at " +
                                   path);
          }
          props[name] = sub;
        }
      } else if (key == "required" && v.is_array() && (*into)[key].is_array()) {
        for (const auto& r : v) {
          bool seen = false;
          for (const auto& q : (*into)[key]) seen = seen || q == r;
          if (!seen) (*into)[key].push_back(r);
        }
      } else if ((*into)[key] != v) {
        return InvalidArgument("keyword '" + key + "' with different values to combine at " +
                               path + " is not supported");
      }
    }
    return OkStatus();
  }

  StatusOr<std::string> ConvertRef(const ordered_json& s, const std::string& path,
                                   const std::string& hint, int depth) {
    if (!s["$ref"].is_string()) return Bad("$ref", path, "must be a string");
    for (const auto& [key, v] : s.items()) {
      if (key != "$ref" && !kAnnotations.count(key)) {
        return InvalidArgument("keyword '" + key + "' alongside '$ref' at " + path +
                               " is not supported");
      }
    }
    const std::string ref = s["$ref"].get<std::string>();
    if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) {
      if (unguarded_.count(ref)) {
        return InvalidArgument("$ref '" + ref + "' at " + path +
                               " refers to itself without any text in between");
      }
      return it->second;
    }
    PENG_ASSIGN_OR_RETURN(const ordered_json* target, Resolve(ref, path));
    const size_t slash = ref.rfind('/');
    std::string ref_hint = slash == std::string::npos ? hint : ref.substr(slash + 1);
    if (ref_hint.empty()) ref_hint = "schema";
    const std::string name = b_->UniqueName(ref_hint);
    ref_rules_[ref] = name;
    unguarded_.insert(ref);
    auto e = Convert(*target, ref, name, depth + 1);
    unguarded_.erase(ref);
    if (!e.ok()) return e.status();
    b_->SetRule(name, *e);
    return name;
  }

  StatusOr<std::string> ConvertEnum(const ordered_json& s, const std::string& path) {
    std::vector<ordered_json> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array()) return Bad("enum", path, "must be an array");
      for (const auto& v : s["enum"]) values.push_back(v);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      PENG_ASSIGN_OR_RETURN(types, Types(s, path));
    }
    std::vector<std::string> alts;
    for (const auto& v : values) {
      bool ok = types.empty();
      for (const auto& t : types) ok = ok || HasType(v, t);
      if (ok) alts.push_back(ValueLiteral(v));
    }
    if (alts.empty()) {
      return InvalidArgument("'" + std::string(s.contains("const") ? "const" : "enum") + "' at " +
                             path + " has no value of the schema's type");
    }
    return Alternatives(alts);
  }

  StatusOr<std::vector<std::string>> Types(const ordered_json& s, const std::string& path) {
    static const std::set<std::string, std::less<>> kTypes = {
        "string", "number", "integer", "boolean", "null", "object", "array"};
    std::vector<std::string> types;
    const ordered_json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& x : t) {
        if (!x.is_string()) return Bad("type", path, "must be a string or an array of strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Bad("type", path, "must be a string or a non-empty array of strings");
    }
    for (const auto& x : types) {
      if (!kTypes.count(x)) return InvalidArgument("unknown type '" + x + "' at " + path);
    }
    return types;
  }

  StatusOr<std::string> ConvertTyped(const ordered_json& s, const std::string& path,
                                     const std::string& hint, int depth) {
    std::vector<std::string> types;
    if (s.contains("type")) {
      PENG_ASSIGN_OR_RETURN(types, Types(s, path));
    } else {
      auto has = [&](std::initializer_list<const char*> keys) {
        for (const char* k : keys) {
          if (s.contains(k)) return true;
        }
        return false;
      };
      if (has({"properties", "additionalProperties", "required"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
        types.push_back("number");
      }
      if (types.empty()) return b_->Primitive("value");
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<std::string> alts;
    std::set<std::string> done;
    for (const auto& t : types) {
      if (!done.insert(t).second || (t == "integer" && has_number)) continue;
      std::string e;
      if (t == "string") {
        PENG_ASSIGN_OR_RETURN(e, ConvertString(s, path));
      } else if (t == "number" || t == "integer") {
        PENG_ASSIGN_OR_RETURN(e, ConvertNumber(s, path, t == "integer"));
      } else if (t == "boolean" || t == "null") {
        e = b_->Primitive(t);
      } else if (t == "object") {
        PENG_ASSIGN_OR_RETURN(e, ConvertObject(s, path, hint, depth));
      } else {
        PENG_ASSIGN_OR_RETURN(e, ConvertArray(s, path, hint, depth));
      }
      alts.push_back(e);
    }
    return Alternatives(alts);
  }

  static StatusOr<long long> Count(const ordered_json& s, const char* key,
                                   const std::string& path, long long dflt) {
    if (!s.contains(key)) return dflt;
    const ordered_json& v = s[key];
    if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<long long>() >= 0))) {
      return Bad(key, path, "must be a non-negative integer");
    }
    const unsigned long long x = v.get<unsigned long long>();
    if (x > 1000000) return Bad(key, path, "is larger than 1,000,000");
    return static_cast<long long>(x);
  }

  StatusOr<std::string> ConvertString(const ordered_json& s, const std::string& path) {
    PENG_ASSIGN_OR_RETURN(long long min, Count(s, "minLength", path, 0));
    PENG_ASSIGN_OR_RETURN(long long max, Count(s, "maxLength", path, -1));
    if (max >= 0 && max < min) return Bad("maxLength", path, "is below minLength");
    std::string regex;
    std::string key = "pattern";
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return Bad("pattern", path, "must be a string");
      regex = s["pattern"].get<std::string>();
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return Bad("format", path, "must be a string");
      if (const char* f = FormatRegex(s["format"].get<std::string>())) {
        if (!regex.empty()) {
          return InvalidArgument("'format' together with 'pattern' at " + path +
                                 " is not supported");
        }
        regex = f;
        key = "format";
      }
    }
    const std::string quote = "\"\\\"\"";
    if (!regex.empty()) {
      if (s.contains("minLength") || s.contains("maxLength")) {
        return InvalidArgument("'minLength'/'maxLength' together with '" + key + "' at " + path +
                               " is not supported");
      }
      auto e = internal::RegexToGbnfExpr(regex, true);
      if (!e.ok()) {
        return InvalidArgument("'" + key + "' at " + path + ": " + e.status().message());
      }
      return quote + " " + Atom(*e) + " " + quote;
    }
    if (min == 0 && max < 0) return b_->Primitive("string");
    return Join({quote, Repeat(b_->Primitive("char"), min, max), quote}, " ");
  }

  StatusOr<std::string> ConvertNumber(const ordered_json& s, const std::string& path,
                                      bool integer) {
    struct Bound {
      std::optional<double> v;
      bool excl = false;
    } lo, hi;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const ordered_json& v = s[key];
      const std::string k = key;
      const bool is_min = k == "minimum" || k == "exclusiveMinimum";
      const bool excl = k.starts_with("exclusive");
      Bound& b = is_min ? lo : hi;
      if (v.is_boolean()) {  // draft 4: exclusiveMinimum: true modifies minimum
        if (!excl) return Bad(key, path, "must be a number");
        if (v.get<bool>()) b.excl = true;
        continue;
      }
      if (!v.is_number() || !std::isfinite(v.get<double>())) {
        return Bad(key, path, "must be a number");
      }
      const double x = v.get<double>();
      if (std::fabs(x) > 1e15) return Bad(key, path, "is beyond +-1e15");
      if (!b.v || (is_min ? x > *b.v || (x == *b.v && excl) : x < *b.v || (x == *b.v && excl))) {
        b.v = x;
        b.excl = excl;
      }
    }
    if (!lo.v && !hi.v) return b_->Primitive(integer ? "integer" : "number");
    // Fractional bounds are rounded inwards (a subset of the valid numbers).
    std::optional<long long> ilo, ihi;
    bool lo_excl = false, hi_excl = false;
    if (lo.v) {
      const double c = std::ceil(*lo.v);
      ilo = static_cast<long long>(c);
      lo_excl = lo.excl && c == *lo.v;
    }
    if (hi.v) {
      const double f = std::floor(*hi.v);
      ihi = static_cast<long long>(f);
      hi_excl = hi.excl && f == *hi.v;
    }
    std::string e;
    if (integer) {
      if (ilo && lo_excl) ++*ilo;
      if (ihi && hi_excl) --*ihi;
      e = internal::IntegerRangeGbnf(ilo, ihi);
    } else {
      e = internal::NumberRangeGbnf(ilo, lo_excl, ihi, hi_excl);
    }
    if (e.empty()) {
      return InvalidArgument("no " + std::string(integer ? "integer" : "number") +
                             " satisfies the bounds at " + path);
    }
    return e;
  }

  // While converting an object or array, text has been consumed: $refs met again are fine.
  struct Guard {
    explicit Guard(std::set<std::string>* s) : set(s), saved(std::move(*s)) { s->clear(); }
    ~Guard() { *set = std::move(saved); }
    std::set<std::string>* set;
    std::set<std::string> saved;
  };

  StatusOr<std::string> ConvertObject(const ordered_json& s, const std::string& path,
                                      const std::string& hint, int depth) {
    Guard guard(&unguarded_);
    struct Prop {
      std::string name;
      std::string kv;
      bool required;
    };
    std::vector<Prop> props;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Bad("required", path, "must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return Bad("required", path, "must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    const ordered_json empty = ordered_json::object();
    const ordered_json& properties = s.contains("properties") ? s["properties"] : empty;
    if (!properties.is_object()) return Bad("properties", path, "must be an object");
    // Additional properties: absent = any when no properties are listed, else none.
    std::string extra_value;
    const std::string sep = "\",\" \" \"? ";
    if (s.contains("additionalProperties")) {
      const ordered_json& a = s["additionalProperties"];
      if (!(a.is_boolean() && !a.get<bool>())) {
        PENG_ASSIGN_OR_RETURN(std::string e, Convert(a, path + "/additionalProperties",
                                                     hint + "-additional", depth + 1));
        extra_value = Named(hint + "-additional", e);
      }
    } else if (properties.empty()) {
      extra_value = b_->Primitive("value");
    }
    auto key_literal = [](const std::string& name) {
      return GbnfBuilder::Quote(ordered_json(name).dump() + ":") + " \" \"? ";
    };
    for (const auto& [name, sub] : properties.items()) {
      const std::string p = path + "/properties/" + PointerToken(name);
      PENG_ASSIGN_OR_RETURN(std::string e, Convert(sub, p, hint + "-" + name, depth + 1));
      props.push_back({name, key_literal(name) + Named(hint + "-" + name, e),
                       required.count(name) > 0});
    }
    for (const auto& r : required) {
      if (properties.contains(r)) continue;
      if (extra_value.empty()) {
        return InvalidArgument("required property '" + r + "' at " + path +
                               " is not allowed by additionalProperties");
      }
      props.push_back({r, key_literal(r) + extra_value, true});
    }
    std::string extra_kv;
    if (!extra_value.empty()) {
      std::vector<std::string> names;
      for (const auto& p : props) names.push_back(p.name);
      const std::string key = names.empty() ? b_->Primitive("string") : OtherKey(names, hint);
      extra_kv = Named(hint + "-extra-kv", key + " \":\" \" \"? " + extra_value);
    }
    // S(i): the rest from property i on when something came before it (commas lead);
    // T(i): the rest from property i on when nothing came before.
    const size_t n = props.size();
    const bool named_tails = n > kInlineProperties;
    std::vector<std::string> tail(n + 1);
    tail[n] = extra_kv.empty() ? "" : "(" + sep + extra_kv + ")*";
    for (size_t i = n; i-- > 0;) {
      std::string e = props[i].required ? Join({sep + props[i].kv, tail[i + 1]}, " ")
                                        : Join({"(" + sep + props[i].kv + ")?", tail[i + 1]}, " ");
      tail[i] = named_tails && i > 0 ? Named(hint + "-rest", e) : e;
    }
    std::string first = extra_kv.empty() ? "" : "(" + Join({extra_kv, tail[n]}, " ") + ")?";
    for (size_t i = n; i-- > 0;) {
      const std::string with = Join({props[i].kv, tail[i + 1]}, " ");
      if (props[i].required) {
        first = with;
      } else if (first.empty()) {
        first = "(" + with + ")?";
      } else {
        first = "(" + with + " | " + first + ")";
      }
      if (named_tails && i > 0) first = Named(hint + "-from", first);
    }
    if (first.empty()) return std::string("\"{}\"");
    return "\"{\" " + first + " \"}\"";
  }

  // JSON string (with quotes) whose content is none of `names`: a trie walk on the names,
  // left for free text as soon as the key differs from all of them.
  std::string OtherKey(const std::vector<std::string>& names, const std::string& hint) {
    struct TrieNode {
      std::map<uint32_t, int> kids;
      bool terminal = false;
    };
    std::vector<TrieNode> trie(1);
    for (const auto& name : names) {
      int at = 0;
      for (uint32_t c : DecodeUtf8(name)) {
        auto it = trie[at].kids.find(c);
        if (it == trie[at].kids.end()) {
          trie.push_back({});
          it = trie[at].kids.emplace(c, static_cast<int>(trie.size()) - 1).first;
        }
        at = it->second;
      }
      trie[at].terminal = true;
    }
    const std::string free = Named(hint + "-key-any", b_->Primitive("char") + "*");
    std::vector<std::string> rule(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) rule[i] = b_->UniqueName(hint + "-key");
    const internal::CharSet raw = [] {
      internal::CharSet r = internal::CharSet::Range(0x20, kMaxCodePoint);
      r = r.Minus(internal::CharSet::Range(0xD800, 0xDFFF));
      return r.Minus(internal::CharSet::Of('"')).Minus(internal::CharSet::Of('\\'));
    }();
    static const std::vector<std::pair<uint32_t, const char*>> kEscapes = {
        {'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'/', "\"\\\\/\""}, {'\b', "\"\\\\b\""},
        {'\f', "\"\\\\f\""},   {'\n', "\"\\\\n\""},   {'\r', "\"\\\\r\""}, {'\t', "\"\\\\t\""}};
    for (size_t i = 0; i < trie.size(); ++i) {
      std::vector<std::string> alts;
      internal::CharSet kid_chars;
      for (const auto& [c, k] : trie[i].kids) {
        kid_chars.Add(c, c);
        if (raw.Contains(c)) alts.push_back(internal::CharSet::Of(c).ToGbnf() + " " + rule[k]);
      }
      const std::string other = raw.Minus(kid_chars).ToGbnf();
      if (!other.empty()) alts.push_back(other + " " + free);
      for (const auto& [c, esc] : kEscapes) {
        auto it = trie[i].kids.find(c);
        alts.push_back(std::string(esc) + " " + (it == trie[i].kids.end() ? free : rule[it->second]));
      }
      b_->SetRule(rule[i], Paren(Join(alts, " | ")) + (trie[i].terminal ? "" : "?"));
    }
    return "\"\\\"\" " + rule[0] + " \"\\\"\"";
  }

  StatusOr<std::string> ConvertArray(const ordered_json& s, const std::string& path,
                                     const std::string& hint, int depth) {
    Guard guard(&unguarded_);
    PENG_ASSIGN_OR_RETURN(long long min, Count(s, "minItems", path, 0));
    PENG_ASSIGN_OR_RETURN(long long max, Count(s, "maxItems", path, -1));
    if (max >= 0 && max < min) return Bad("maxItems", path, "is below minItems");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return Bad("prefixItems", path, "must be an array");
      const ordered_json& pi = s["prefixItems"];
      for (size_t i = 0; i < pi.size(); ++i) {
        const std::string h = hint + "-" + std::to_string(i);
        PENG_ASSIGN_OR_RETURN(std::string e, Convert(pi[i], path + "/prefixItems/" +
                                                                std::to_string(i), h, depth + 1));
        prefix.push_back(Named(h, e));
      }
    }
    // Items after the prefix: absent = any value without prefixItems, none with them.
    std::string item;
    if (s.contains("items")) {
      const ordered_json& it = s["items"];
      if (it.is_array()) return Bad("items", path, "as an array is not supported (prefixItems)");
      if (!(it.is_boolean() && !it.get<bool>())) {
        PENG_ASSIGN_OR_RETURN(std::string e,
                              Convert(it, path + "/items", hint + "-item", depth + 1));
        item = Named(hint + "-item", e);
      }
    } else if (prefix.empty()) {
      item = b_->Primitive("value");
    }
    const long long k = max >= 0 ? std::min<long long>(prefix.size(), max) : prefix.size();
    if (item.empty() && min > k) {
      return Bad("minItems", path, "exceeds the number of items the array may hold");
    }
    const std::string sep = "\",\" \" \"? ";
    // Extra items after the prefix.
    std::string extras;
    if (!item.empty() && max != k) {
      const long long lo = std::max<long long>(0, min - k), hi = max < 0 ? -1 : max - k;
      extras = Repeat("(" + sep + item + ")", lo, hi);
      if (k == 0) {  // no prefix: the first item has no comma
        const std::string rest = Repeat("(" + sep + item + ")", lo > 0 ? lo - 1 : 0,
                                        hi < 0 ? -1 : hi - 1);
        const std::string body = Join({item, rest}, " ");
        extras = lo > 0 ? body : "(" + body + ")?";
      }
    }
    std::string inner = extras;
    for (long long i = k; i-- > 0;) {
      const std::string lead = i == 0 ? "" : sep;
      const std::string with = Join({lead + prefix[i], inner}, " ");
      inner = i < min ? with : "(" + with + ")?";
    }
    if (inner.empty()) return std::string("\"[]\"");
    return "\"[\" " + inner + " \"]\"";
  }

  GbnfBuilder* b_;
  const ordered_json& root_;
  std::map<std::string, std::string> ref_rules_;  // $ref -> rule name
  std::set<std::string> unguarded_;  // $refs being converted, with no text consumed since
};

StatusOr<std::string> GbnfBuilder::AddJsonSchema(const nlohmann::ordered_json& schema) {
  SchemaConverter c(this, schema);
  return c.Top();
}

StatusOr<std::string> GbnfBuilder::AddJsonSchema(const nlohmann::json& schema) {
  return AddJsonSchema(ordered_json::parse(schema.dump()));
}

}  // namespace peng::grammar
