// Helpers, tests and methods; filters live in filters.cc.
#include "template/builtins.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/utf8.h"

namespace peng::tmpl {
namespace {

Status UndefinedError(const Value& v) {
  return InvalidArgument(v.as_string().empty() ? "value is undefined" : v.as_string());
}

bool IsPySpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

Status BudgetError(const char* what) {
  return ResourceExhausted(std::string(what) + ": the template's work limit is exhausted");
}

// Bytes of the UTF-8 character at s[i] (1 for stray bytes), clipped to the string.
size_t CharLen(const std::string& s, size_t i) {
  return std::min<size_t>(Utf8SeqLen(static_cast<unsigned char>(s[i])), s.size() - i);
}

std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip_char = [&](char c) {
    if (chars && chars->is_string()) return chars->as_string().find(c) != std::string::npos;
    return IsPySpace(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && strip_char(s[b])) ++b;
  }
  if (right) {
    while (e > b && strip_char(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

Value SplitString(const std::string& s, const Value* sep, const Value* maxsplit_v) {
  int64_t maxsplit = maxsplit_v && maxsplit_v->is_int() ? maxsplit_v->as_int() : -1;
  ValueList parts;
  if (sep && sep->is_string() && !sep->as_string().empty()) {
    const std::string& d = sep->as_string();
    size_t start = 0;
    while (maxsplit != 0 && !WorkBudget::Exhausted()) {
      const size_t p = FindSubstring(s, d, start);
      if (p == std::string::npos) break;
      parts.push_back(Value::String(s.substr(start, p - start)));
      start = p + d.size();
      --maxsplit;
    }
    parts.push_back(Value::String(s.substr(start)));
    return Value::List(std::move(parts));
  }
  size_t i = 0;
  while (i < s.size() && !WorkBudget::Exhausted()) {  // whitespace split drops empty parts
    while (i < s.size() && IsPySpace(s[i])) ++i;
    if (i >= s.size()) break;
    if (maxsplit == 0) {
      parts.push_back(Value::String(Strip(s.substr(i), nullptr, false, true)));
      break;
    }
    size_t j = i;
    while (j < s.size() && !IsPySpace(s[j])) ++j;
    parts.push_back(Value::String(s.substr(i, j - i)));
    --maxsplit;
    i = j;
  }
  return Value::List(std::move(parts));
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t start = 0;
  while (count != 0) {
    const size_t p = FindSubstring(s, from, start);
    if (p == std::string::npos) break;
    // The output can be |s| / |from| * |to| bytes: charged as it grows.
    if (!WorkBudget::Charge(static_cast<int64_t>(p - start + to.size()))) return out;
    out.append(s, start, p - start).append(to);
    start = p + from.size();
    --count;
  }
  return out.append(s, start, std::string::npos);
}

bool AffixMatch(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list()) {
      if (a.is_string() && one(a.as_string())) return true;
    }
    return false;
  }
  return affix.is_string() && one(affix.as_string());
}

StatusOr<Value> StringMethod(const std::string& s, const std::string& name, const CallArgs& args) {
  const Value* a0 = args.Get(0, "");
  if (name == "strip") return Value::String(Strip(s, args.Get(0, "chars"), true, true));
  if (name == "lstrip") return Value::String(Strip(s, args.Get(0, "chars"), true, false));
  if (name == "rstrip") return Value::String(Strip(s, args.Get(0, "chars"), false, true));
  if (name == "upper") return Value::String(MapCase(s, CaseMode::kUpper));
  if (name == "lower") return Value::String(MapCase(s, CaseMode::kLower));
  if (name == "title") return Value::String(MapCase(s, CaseMode::kTitle));
  if (name == "capitalize") return Value::String(MapCase(s, CaseMode::kCapitalize));
  if (name == "startswith" || name == "endswith") {
    if (!a0) return InvalidArgument(name + "() takes one argument");
    return Value::Bool(AffixMatch(s, *a0, name == "startswith"));
  }
  if (name == "split") return SplitString(s, args.Get(0, "sep"), args.Get(1, "maxsplit"));
  if (name == "replace") {
    const Value* from = args.Get(0, "old");
    const Value* to = args.Get(1, "new");
    const Value* count = args.Get(2, "count");
    if (!from || !to || !from->is_string() || !to->is_string()) {
      return InvalidArgument("replace() needs two strings");
    }
    return Value::String(Replace(s, from->as_string(), to->as_string(),
                                 count && count->is_int() ? count->as_int() : -1));
  }
  if (name == "find") {
    if (!a0 || !a0->is_string()) return InvalidArgument("find() needs a string");
    const size_t p = FindSubstring(s, a0->as_string());
    return Value::Int(p == std::string::npos ? -1 : CountChars(s.substr(0, p)));
  }
  if (name == "count") {
    if (!a0 || !a0->is_string() || a0->as_string().empty()) return InvalidArgument("count() needs a string");
    int64_t n = 0;
    for (size_t p = FindSubstring(s, a0->as_string()); p != std::string::npos;
         p = FindSubstring(s, a0->as_string(), p + a0->as_string().size())) {
      ++n;
    }
    return Value::Int(n);
  }
  if (name == "join") {
    if (!a0) return InvalidArgument("join() takes one argument");
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a0));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) return InvalidArgument("join(): sequence item is not a string");
      // The separator repeats once per item: charged as the output grows.
      if (!WorkBudget::Charge(static_cast<int64_t>((i ? s.size() : 0) + items[i].as_string().size()))) {
        return ResourceExhausted("join(): the template's work limit is exhausted");
      }
      if (i) out += s;
      out += items[i].as_string();
    }
    return Value::String(std::move(out));
  }
  return Value::Undefined("'str object' has no attribute '" + name + "'");
}

StatusOr<Value> DictMethod(const Value& d, const std::string& name, const CallArgs& args) {
  if (name == "get") {
    const Value* key = args.Get(0, "key");
    if (!key) return InvalidArgument("get() takes a key");
    const Value* def = args.Get(1, "default");
    const Value* found = key->is_string() ? d.Find(key->as_string()) : nullptr;
    return found ? *found : def ? *def : Value::None();
  }
  ValueList out;
  if (!WorkBudget::Charge(static_cast<int64_t>(d.as_dict().size()) * WorkBudget::kElementBytes * 2)) {
    return BudgetError(name.c_str());
  }
  for (const auto& [k, v] : d.as_dict()) {
    if (name == "items") out.push_back(Value::List({Value::String(k), v}));
    else if (name == "keys") out.push_back(Value::String(k));
    else if (name == "values") out.push_back(v);
    else return Value::Undefined("'dict object' has no attribute '" + name + "'");
  }
  if (name != "items" && name != "keys" && name != "values") {
    return Value::Undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::List(std::move(out));
}

// Returns the code point's case partner in the direction asked, or cp itself. *is_letter
// reports whether cp is a cased letter we know.
uint32_t MapCodePoint(uint32_t cp, bool upper, bool* is_letter) {
  auto range = [&](uint32_t lo_upper, uint32_t hi_upper, uint32_t delta) -> std::optional<uint32_t> {
    if (cp >= lo_upper && cp <= hi_upper) return upper ? cp : cp + delta;
    if (cp >= lo_upper + delta && cp <= hi_upper + delta) return upper ? cp - delta : cp;
    return std::nullopt;
  };
  auto pairs = [&](uint32_t lo, uint32_t hi, bool even_upper) -> std::optional<uint32_t> {
    if (cp < lo || cp > hi) return std::nullopt;
    const bool is_upper = ((cp % 2) == 0) == even_upper;
    if (upper) return is_upper ? cp : cp - 1;
    return is_upper ? cp + 1 : cp;
  };
  std::optional<uint32_t> r;
  if (!(r = range('A', 'Z', 0x20)) && cp != 0xD7 && cp != 0xF7) r = range(0xC0, 0xDE, 0x20);
  if (!r) r = pairs(0x100, 0x137, true);
  if (!r) r = pairs(0x139, 0x148, false);
  if (!r) r = pairs(0x14A, 0x177, true);
  if (!r) r = pairs(0x179, 0x17E, false);
  if (!r && cp != 0x3A2) r = range(0x391, 0x3A9, 0x20);
  if (!r) r = range(0x410, 0x42F, 0x20);
  if (!r) r = range(0x400, 0x40F, 0x50);
  *is_letter = r.has_value();
  return r.value_or(cp);
}

}  // namespace

std::string MapCase(const std::string& s, CaseMode mode) {
  std::string out;
  bool word_start = true;
  bool first = true;
  WorkBudget::Charge(static_cast<int64_t>(s.size()));
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {  // no allocation per character: strings can be long
    size_t n = 0;
    const uint32_t cp = DecodeUtf8At(std::string_view(s).substr(i), &n);  // U+FFFD: a stray byte
    const std::string_view c = std::string_view(s).substr(i, n);
    i += n;
    bool upper = mode == CaseMode::kUpper;
    if (mode == CaseMode::kTitle) upper = word_start;
    if (mode == CaseMode::kCapitalize) upper = first;
    bool is_letter = false;
    const uint32_t mapped = MapCodePoint(cp, upper, &is_letter);
    if (mapped == cp) {
      out += c;
    } else {
      AppendUtf8(mapped, &out);
    }
    // Python's title() starts a word after any non-letter; unknown non-ASCII letters count as letters.
    word_start = !(is_letter || cp >= 0x80);
    first = false;
  }
  return out;
}

std::vector<std::string> Utf8Chars(const std::string& s) {
  std::vector<std::string> out;
  // Each character becomes a std::string of its own: charged per character, before they are
  // built (nothing is built once the budget is spent).
  if (!WorkBudget::Charge(CountChars(s) * static_cast<int64_t>(sizeof(std::string)))) return out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = CharLen(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

int64_t CountChars(const std::string& s) {
  WorkBudget::Charge(static_cast<int64_t>(s.size()));
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); i += CharLen(s, i)) ++n;
  return n;
}

size_t FindSubstring(std::string_view haystack, std::string_view needle, size_t from) {
  if (from > haystack.size()) return std::string_view::npos;
  WorkBudget::Charge(static_cast<int64_t>(haystack.size() - from + needle.size()));
  // Short needles: the library search is at most |haystack| * 16 steps.
  if (needle.size() <= 16) return haystack.find(needle, from);
  // Knuth-Morris-Pratt: fail[i] = length of the longest proper border of needle[0..i].
  std::vector<size_t> fail(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fail[k - 1];
    if (needle[i] == needle[k]) ++k;
    fail[i] = k;
  }
  for (size_t i = from, k = 0; i < haystack.size(); ++i) {
    while (k > 0 && haystack[i] != needle[k]) k = fail[k - 1];
    if (haystack[i] == needle[k]) ++k;
    if (k == needle.size()) return i + 1 - needle.size();
  }
  return std::string_view::npos;
}

StatusOr<std::vector<Value>> Iterate(const Value& v) {
  std::vector<Value> out;
  switch (v.kind()) {
    case Value::Kind::kUndefined: return out;
    case Value::Kind::kList:
      if (!WorkBudget::Charge(static_cast<int64_t>(v.as_list().size()) * WorkBudget::kElementBytes)) {
        return BudgetError("iteration");
      }
      return v.as_list();
    case Value::Kind::kDict:
      if (!WorkBudget::Charge(static_cast<int64_t>(v.as_dict().size()) * WorkBudget::kElementBytes)) {
        return BudgetError("iteration");
      }
      for (const auto& [k, e] : v.as_dict()) out.push_back(Value::String(k));
      return out;
    case Value::Kind::kString: {
      // Every character becomes a string value: charged before any is built.
      const int64_t n = CountChars(v.as_string());
      if (!WorkBudget::Charge(n * (WorkBudget::kElementBytes + WorkBudget::kStringBytes))) {
        return BudgetError("iteration");
      }
      WorkBudget::Pause charged;  // the strings below are paid for
      out.reserve(static_cast<size_t>(n));
      for (auto& c : Utf8Chars(v.as_string())) out.push_back(Value::String(std::move(c)));
      return out;
    }
    default: return InvalidArgument(std::string("'") + v.TypeName() + "' object is not iterable");
  }
}

StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return CountChars(v.as_string());
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: return static_cast<int64_t>(v.as_dict().size());
    default: return InvalidArgument(std::string("object of type '") + v.TypeName() + "' has no len()");
  }
}

StatusOr<Value> Slice(const Value& v, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string() && !v.is_list()) {
    return InvalidArgument(std::string("'") + v.TypeName() + "' object is not subscriptable");
  }
  // Strings are sliced by code point: offsets[i] is where character i starts.
  std::vector<size_t> offsets;
  if (v.is_string()) {
    const std::string& s = v.as_string();
    if (!WorkBudget::Charge(static_cast<int64_t>(s.size() * sizeof(size_t)))) return BudgetError("slice");
    for (size_t i = 0; i < s.size(); i += CharLen(s, i)) offsets.push_back(i);
    offsets.push_back(s.size());
  }
  for (const Value* p : {&start_v, &stop_v, &step_v}) {
    if (!p->is_undefined() && !p->is_none() && !p->is_int()) {
      return InvalidArgument("slice indices must be integers or None");
    }
  }
  const int64_t n = v.is_string() ? static_cast<int64_t>(offsets.size()) - 1
                                  : static_cast<int64_t>(v.as_list().size());
  const int64_t step = step_v.is_int() ? step_v.as_int() : 1;
  if (step == 0) return InvalidArgument("slice step cannot be zero");
  auto norm = [&](const Value& x, int64_t dflt) {
    if (!x.is_int()) return dflt;
    int64_t i = x.as_int();
    if (i < 0) i = i < -n ? -n - 1 : i + n;  // no overflow for i near INT64_MIN
    return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = norm(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = norm(stop_v, step > 0 ? n : -1);
  // Indices start, start + step, ... before stop; computed without overflowing for any step.
  std::vector<int64_t> picked;
  if (!WorkBudget::Charge((step > 0 ? stop - start : start - stop) * static_cast<int64_t>(sizeof(int64_t)))) {
    return BudgetError("slice");
  }
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    picked.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  if (v.is_list()) {
    ValueList out;
    out.reserve(picked.size());
    for (int64_t i : picked) out.push_back(v.as_list()[static_cast<size_t>(i)]);
    return Value::List(std::move(out));
  }
  const std::string& str = v.as_string();
  if (step == 1 && !picked.empty()) {
    return Value::String(str.substr(offsets[picked.front()], offsets[picked.back() + 1] - offsets[picked.front()]));
  }
  std::string s;
  for (int64_t i : picked) s.append(str, offsets[i], offsets[i + 1] - offsets[i]);
  return Value::String(std::move(s));
}

StatusOr<Value> GetItem(const Value& v, const Value& key) {
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_dict() || v.is_namespace()) {
    const Value* found = key.is_string() ? v.Find(key.as_string()) : nullptr;
    if (found) return *found;
    return Value::Undefined("'dict object' has no attribute '" + key.Str() + "'");
  }
  if (v.is_list() || v.is_string()) {
    if (!key.is_int()) {
      return Value::Undefined(std::string("'") + v.TypeName() + " object' has no attribute '" +
                              key.Str() + "'");
    }
    const int64_t n = v.is_list() ? static_cast<int64_t>(v.as_list().size()) : CountChars(v.as_string());
    const int64_t i = key.as_int() < 0 && key.as_int() >= -n ? key.as_int() + n : key.as_int();
    if (i < 0 || i >= n) return Value::Undefined(std::string(v.TypeName()) + " object has no element " + key.Str());
    if (v.is_list()) return v.as_list()[static_cast<size_t>(i)];
    const std::string& s = v.as_string();
    size_t at = 0;
    for (int64_t k = 0; k < i; ++k) at += CharLen(s, at);
    return Value::String(s.substr(at, CharLen(s, at)));
  }
  return Value::Undefined(std::string("'") + v.TypeName() + " object' has no attribute '" + key.Str() + "'");
}

StatusOr<int> Compare(const Value& a, const Value& b) {
  if (!WorkBudget::Charge(WorkBudget::kElementBytes)) {
    return ResourceExhausted("comparison: the template's work limit is exhausted");
  }
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    WorkBudget::Charge(static_cast<int64_t>(std::min(a.as_string().size(), b.as_string().size())));
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      PENG_ASSIGN_OR_RETURN(int c, Compare(x[i], y[i]));
      if (c) return c;
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return InvalidArgument(std::string("'<' not supported between instances of '") + a.TypeName() +
                         "' and '" + b.TypeName() + "'");
}

StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
  const Value* a0 = args.Get(0, "");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_callable();
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    const std::string& s = v.as_string();
    return s == MapCase(s, name == "lower" ? CaseMode::kLower : CaseMode::kUpper);
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_int()) return InvalidArgument("test '" + name + "' needs an integer");
    const int64_t d = name == "divisibleby" ? (a0 && a0->is_int() ? a0->as_int() : 0) : 2;
    if (d == 0) return InvalidArgument("divisibleby needs a nonzero integer");
    const bool divisible = d == -1 || v.as_int() % d == 0;  // INT64_MIN % -1 overflows
    return name == "odd" ? !divisible : divisible;
  }
  if (!a0) return InvalidArgument("unknown test '" + name + "' or missing argument");
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return v.Equals(*a0);
  if (name == "ne" || name == "!=") return !v.Equals(*a0);
  if (name == "in") {
    if (a0->is_string() && v.is_string()) return FindSubstring(a0->as_string(), v.as_string()) != std::string::npos;
    PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a0));
    for (const Value& x : items) {
      if (x.Equals(v)) return true;
      if (WorkBudget::Exhausted()) return ResourceExhausted("'in': the template's work limit is exhausted");
    }
    return false;
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge" || name == "<" || name == "<=" ||
      name == ">" || name == ">=") {
    PENG_ASSIGN_OR_RETURN(int c, Compare(v, *a0));
    if (name == "lt" || name == "<") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == ">") return c > 0;
    return c >= 0;
  }
  return InvalidArgument("no test named '" + name + "'");
}

bool HasMethod(const Value& object, const std::string& name) {
  static const char* kStr[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                               "startswith", "endswith", "split", "replace", "find", "count", "join"};
  static const char* kDict[] = {"get", "items", "keys", "values"};
  if (object.is_string()) {
    return std::find_if(std::begin(kStr), std::end(kStr), [&](const char* m) { return name == m; }) !=
           std::end(kStr);
  }
  if (object.is_dict()) {
    return std::find_if(std::begin(kDict), std::end(kDict), [&](const char* m) { return name == m; }) !=
           std::end(kDict);
  }
  return false;
}

StatusOr<Value> CallMethod(const Value& object, const std::string& name, const CallArgs& args) {
  if (object.is_string()) return StringMethod(object.as_string(), name, args);
  if (object.is_dict()) return DictMethod(object, name, args);
  return Value::Undefined(std::string("'") + object.TypeName() + " object' has no attribute '" + name + "'");
}

}  // namespace peng::tmpl
