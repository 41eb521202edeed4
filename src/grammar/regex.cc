// Regular expressions -> GBNF expressions (gbnf_internal.h), and the character-set helpers the
// builders share. The regex is parsed into a small tree (sets, sequences, alternatives,
// repetitions) and written back as GBNF; in JSON-string mode every character is written the
// way it may appear inside a JSON string literal.
#include <algorithm>
#include <cstdio>
#include <limits>

#include "grammar/gbnf_internal.h"

namespace peng::grammar::internal {

// ---------------------------------------------------------------------------------------------
// CharSet

CharSet CharSet::Range(uint32_t lo, uint32_t hi) {
  CharSet s;
  s.Add(lo, hi);
  return s;
}

void CharSet::Add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  std::vector<std::pair<uint32_t, uint32_t>> out;
  bool placed = false;
  for (const auto& r : ranges_) {
    if (r.second + 1 < lo) {
      out.push_back(r);
    } else if (hi + 1 < r.first) {
      if (!placed) out.emplace_back(lo, hi), placed = true;
      out.push_back(r);
    } else {
      lo = std::min(lo, r.first);
      hi = std::max(hi, r.second);
    }
  }
  if (!placed) out.emplace_back(lo, hi);
  ranges_ = std::move(out);
}

void CharSet::Add(const CharSet& other) {
  for (const auto& r : other.ranges_) Add(r.first, r.second);
}

CharSet CharSet::Complement() const {
  CharSet out;
  uint32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.ranges_.emplace_back(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.ranges_.emplace_back(next, kMaxCodePoint);
  return out;
}

CharSet CharSet::Intersect(const CharSet& other) const {
  CharSet out;
  for (const auto& a : ranges_) {
    for (const auto& b : other.ranges_) {
      const uint32_t lo = std::max(a.first, b.first), hi = std::min(a.second, b.second);
      if (lo <= hi) out.Add(lo, hi);
    }
  }
  return out;
}

bool CharSet::Contains(uint32_t c) const {
  for (const auto& r : ranges_) {
    if (c >= r.first && c <= r.second) return true;
  }
  return false;
}

void AppendEscaped(std::string* out, uint32_t c, bool in_class) {
  char buf[16];
  if (c == '"' || c == '\\' || (in_class && (c == '[' || c == ']'))) {
    out->push_back('\\');
    out->push_back(static_cast<char>(c));
  } else if (in_class && (c == '-' || c == '^')) {
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    *out += buf;
  } else if (c == '\n') {
    *out += "\\n";
  } else if (c == '\r') {
    *out += "\\r";
  } else if (c == '\t') {
    *out += "\\t";
  } else if (c >= 0x20 && c < 0x7F) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x80) {
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    *out += buf;
  } else if (c <= 0xFFFF) {
    std::snprintf(buf, sizeof buf, "\\u%04X", c);
    *out += buf;
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", c);
    *out += buf;
  }
}

std::string CharSet::ToGbnf() const {
  if (ranges_.empty()) return "";
  if (ranges_.size() == 1 && ranges_[0].first == ranges_[0].second) {
    std::string s = "\"";
    AppendEscaped(&s, ranges_[0].first, false);
    return s + "\"";
  }
  // The shorter of [...] and [^...].
  const CharSet comp = Complement().Minus(Range(0xD800, 0xDFFF));  // never in UTF-8 text
  const bool negate = comp.ranges_.size() < ranges_.size() && !comp.ranges_.empty();
  std::string s = negate ? "[^" : "[";
  for (const auto& r : (negate ? comp : *this).ranges_) {
    AppendEscaped(&s, r.first, true);
    if (r.second != r.first) {
      if (r.second > r.first + 1) s.push_back('-');
      AppendEscaped(&s, r.second, true);
    }
  }
  return s + "]";
}

namespace {

const char* ShortJsonEscape(uint32_t c) {
  switch (c) {
    case '"': return "\"\\\\\\\"\"";  // GBNF "\\\"" : backslash, quote
    case '\\': return "\"\\\\\\\\\"";
    case '/': return "\"\\\\/\"";
    case '\b': return "\"\\\\b\"";
    case '\f': return "\"\\\\f\"";
    case '\n': return "\"\\\\n\"";
    case '\r': return "\"\\\\r\"";
    case '\t': return "\"\\\\t\"";
    default: return nullptr;
  }
}

// "\u00XX" for a control character, either hex case.
std::string UnicodeJsonEscape(uint32_t c) {
  static const char* kHex = "0123456789abcdef";
  std::string s = "\"\\\\u00";
  s.push_back(kHex[c >> 4]);
  const char lo = kHex[c & 15];
  if (lo >= 'a') {
    s += "\" [";
    s.push_back(lo);
    s.push_back(static_cast<char>(lo - 'a' + 'A'));
    s += "]";
  } else {
    s.push_back(lo);
    s += "\"";
  }
  return s;
}

}  // namespace

std::string JsonCharsGbnf(const CharSet& set) {
  static const CharSet kRaw = [] {
    CharSet s = CharSet::Range(0x20, kMaxCodePoint).Minus(CharSet::Range(0xD800, 0xDFFF));
    return s.Minus(CharSet::Of('"')).Minus(CharSet::Of('\\'));
  }();
  std::vector<std::string> alts;
  const std::string raw = set.Intersect(kRaw).ToGbnf();
  if (!raw.empty()) alts.push_back(raw);
  for (uint32_t c : {'"', '\\', '/'}) {
    if (set.Contains(c)) alts.push_back(ShortJsonEscape(c));
  }
  const CharSet controls = set.Intersect(CharSet::Range(0, 0x1F));
  const bool all_controls = controls.ranges().size() == 1 && controls.ranges()[0].first == 0 &&
                            controls.ranges()[0].second == 0x1F;
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!controls.Contains(c)) continue;
    if (const char* e = ShortJsonEscape(c)) alts.push_back(e);
    if (!all_controls) alts.push_back(UnicodeJsonEscape(c));
  }
  if (all_controls) alts.push_back("\"\\\\u00\" [01] [0-9a-fA-F]");
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

// One character of JSON string content, its canonical (shortest) written form, as literal text
// (not yet quoted for GBNF).
static std::vector<uint32_t> CanonicalJsonChar(uint32_t c) {
  switch (c) {
    case '"': return {'\\', '"'};
    case '\\': return {'\\', '\\'};
    case '\b': return {'\\', 'b'};
    case '\f': return {'\\', 'f'};
    case '\n': return {'\\', 'n'};
    case '\r': return {'\\', 'r'};
    case '\t': return {'\\', 't'};
    default: break;
  }
  if (c < 0x20) {
    static const char* kHex = "0123456789abcdef";
    return {'\\', 'u', '0', '0', static_cast<uint32_t>(kHex[c >> 4]),
            static_cast<uint32_t>(kHex[c & 15])};
  }
  return {c};
}

bool IsAtom(std::string_view e) {
  if (e.empty()) return false;
  auto is_name = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
  };
  if (std::all_of(e.begin(), e.end(), is_name)) return true;
  const char open = e[0];
  if (open == '"' || open == '[') {
    const char close = open == '"' ? '"' : ']';
    for (size_t i = 1; i < e.size(); ++i) {
      if (e[i] == '\\') {
        ++i;
      } else if (e[i] == close) {
        return i + 1 == e.size();
      }
    }
    return false;
  }
  if (open == '(') {
    int depth = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      const char c = e[i];
      if (c == '"' || c == '[') {
        const char close = c == '"' ? '"' : ']';
        for (++i; i < e.size() && e[i] != close; ++i) {
          if (e[i] == '\\') ++i;
        }
      } else if (c == '(') {
        ++depth;
      } else if (c == ')') {
        if (--depth == 0) return i + 1 == e.size();
      }
    }
  }
  return false;
}

std::string Atom(const std::string& expr) { return IsAtom(expr) ? expr : "(" + expr + ")"; }

// ---------------------------------------------------------------------------------------------
// Regex

namespace {

constexpr int kInf = -1;
constexpr double kMaxExpansion = 1e6;  // repetitions expanded, summed over the regex
constexpr int kMaxRegexDepth = 64;

struct Node {
  enum Kind { kSet, kSeq, kAlt, kRepeat } kind = kSeq;
  CharSet set;
  std::vector<Node> kids;
  int min = 0, max = 0;  // kRepeat; max kInf = unbounded
};

CharSet Digits() { return CharSet::Range('0', '9'); }
CharSet Word() {
  CharSet s = CharSet::Range('a', 'z');
  s.Add('A', 'Z');
  s.Add('0', '9');
  s.Add('_', '_');
  return s;
}
CharSet Space() {
  CharSet s = CharSet::Range('\t', '\r');  // \t \n \v \f \r
  s.Add(' ', ' ');
  return s;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view re) : text_(re), cps_(DecodeUtf8(re)) {}

  StatusOr<Node> Parse() {
    PENG_ASSIGN_OR_RETURN(Node n, ParseAlt(0));
    if (pos_ < cps_.size()) return Error("unbalanced ')'");
    return n;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("regex '" + std::string(text_) + "': " + what + " at offset " +
                           std::to_string(pos_));
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek(size_t k = 0) const { return pos_ + k < cps_.size() ? cps_[pos_ + k] : 0; }

  StatusOr<Node> ParseAlt(int depth) {
    if (depth > kMaxRegexDepth) return Error("groups nested deeper than 64");
    Node alt;
    alt.kind = Node::kAlt;
    while (true) {
      PENG_ASSIGN_OR_RETURN(Node seq, ParseSeq(depth));
      alt.kids.push_back(std::move(seq));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return std::move(alt.kids[0]);
    return alt;
  }

  StatusOr<Node> ParseSeq(int depth) {
    Node seq;
    seq.kind = Node::kSeq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      const uint32_t c = Peek();
      if (c == '^') {
        if (depth != 0 || !seq.kids.empty()) return Error("'^' not at the start");
        ++pos_;
        continue;
      }
      if (c == '$') {
        ++pos_;
        if (depth != 0 || !(AtEnd() || Peek() == '|')) return Error("'$' not at the end");
        continue;
      }
      PENG_ASSIGN_OR_RETURN(Node atom, ParseAtom(depth));
      PENG_ASSIGN_OR_RETURN(atom, ParseQuantifiers(std::move(atom)));
      seq.kids.push_back(std::move(atom));
    }
    return seq;
  }

  // Reads "{m}", "{m,}", "{m,n}", "{,n}" at pos_; false (pos_ unchanged) if it is not one.
  bool ReadBraces(int* min, int* max) {
    size_t p = pos_ + 1;
    auto number = [&](int* v) {
      const size_t start = p;
      long long x = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9') {
        x = std::min<long long>(x * 10 + (cps_[p] - '0'), std::numeric_limits<int>::max());
        ++p;
      }
      *v = static_cast<int>(x);
      return p > start;
    };
    int lo = 0, hi = 0;
    const bool has_lo = number(&lo);
    if (p < cps_.size() && cps_[p] == '}') {
      if (!has_lo) return false;
      hi = lo;
    } else if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(&hi)) hi = kInf;
      if (!has_lo && hi == kInf) return false;
      if (p >= cps_.size() || cps_[p] != '}') return false;
    } else {
      return false;
    }
    *min = lo;
    *max = hi;
    pos_ = p + 1;
    return true;
  }

  StatusOr<Node> ParseQuantifiers(Node atom) {
    bool quantified = false;
    while (!AtEnd()) {
      const uint32_t c = Peek();
      int min = 0, max = 0;
      if (c == '*') {
        min = 0, max = kInf, ++pos_;
      } else if (c == '+') {
        min = 1, max = kInf, ++pos_;
      } else if (c == '?') {
        min = 0, max = 1, ++pos_;
      } else if (c == '{' && ReadBraces(&min, &max)) {
      } else {
        break;
      }
      if (quantified) return Error("multiple repeat");
      if (max != kInf && max < min) return Error("repetition {m,n} with n < m");
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
      if (!AtEnd() && Peek() == '+') return Error("possessive quantifier is not supported");
      Node rep;
      rep.kind = Node::kRepeat;
      rep.min = min;
      rep.max = max;
      rep.kids.push_back(std::move(atom));
      atom = std::move(rep);
      quantified = true;
    }
    return atom;
  }

  StatusOr<Node> ParseAtom(int depth) {
    const uint32_t c = Peek();
    Node n;
    n.kind = Node::kSet;
    if (c == '(') {
      ++pos_;
      if (Peek() == '?') {
        const uint32_t k = Peek(1);
        if (k == ':') {
          pos_ += 2;
        } else if (k == '=' || k == '!' || (k == '<' && (Peek(2) == '=' || Peek(2) == '!'))) {
          return Error("lookaround is not supported");
        } else if (k == 'P' && Peek(2) == '=') {
          return Error("backreference is not supported");
        } else if (k == '<' || (k == 'P' && Peek(2) == '<')) {
          pos_ += k == 'P' ? 3 : 2;
          while (!AtEnd() && Peek() != '>') ++pos_;
          if (AtEnd()) return Error("unterminated group name");
          ++pos_;
        } else {
          return Error("group construct '(?" + std::string(1, static_cast<char>(k)) +
                       "' (flags, conditionals) is not supported");
        }
      }
      PENG_ASSIGN_OR_RETURN(Node inner, ParseAlt(depth + 1));
      if (AtEnd() || Peek() != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '*' || c == '+' || c == '?') return Error("nothing to repeat");
    if (c == '{') {
      int a, b;
      if (ReadBraces(&a, &b)) return Error("nothing to repeat");
    }
    ++pos_;
    if (c == '.') {
      n.set = CharSet::Of('\n').Complement();
      return n;
    }
    if (c == '\\') {
      PENG_RETURN_IF_ERROR(ParseEscape(false, &n.set));
      return n;
    }
    n.set = CharSet::Of(c);
    return n;
  }

  // After a backslash: one character or a class shorthand.
  Status ParseEscape(bool in_class, CharSet* out) {
    if (AtEnd()) return Error("trailing backslash");
    const uint32_t c = Peek();
    ++pos_;
    auto hex = [&](int digits, uint32_t* v) -> Status {
      *v = 0;
      for (int i = 0; i < digits; ++i) {
        const uint32_t h = Peek();
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (AtEnd() || d < 0) return Error("bad hex escape");
        *v = *v * 16 + d;
        ++pos_;
      }
      if (*v > kMaxCodePoint) return Error("escape beyond U+10FFFF");
      return OkStatus();
    };
    uint32_t v = 0;
    switch (c) {
      case 'd': *out = Digits(); return OkStatus();
      case 'D': *out = Digits().Complement(); return OkStatus();
      case 'w': *out = Word(); return OkStatus();
      case 'W': *out = Word().Complement(); return OkStatus();
      case 's': *out = Space(); return OkStatus();
      case 'S': *out = Space().Complement(); return OkStatus();
      case 'n': *out = CharSet::Of('\n'); return OkStatus();
      case 't': *out = CharSet::Of('\t'); return OkStatus();
      case 'r': *out = CharSet::Of('\r'); return OkStatus();
      case 'f': *out = CharSet::Of('\f'); return OkStatus();
      case 'v': *out = CharSet::Of('\v'); return OkStatus();
      case 'a': *out = CharSet::Of('\a'); return OkStatus();
      case '0': *out = CharSet::Of(0); return OkStatus();
      case 'x': PENG_RETURN_IF_ERROR(hex(2, &v)); *out = CharSet::Of(v); return OkStatus();
      case 'u': PENG_RETURN_IF_ERROR(hex(4, &v)); *out = CharSet::Of(v); return OkStatus();
      case 'U': PENG_RETURN_IF_ERROR(hex(8, &v)); *out = CharSet::Of(v); return OkStatus();
      case 'b':
        if (in_class) {
          *out = CharSet::Of('\b');
          return OkStatus();
        }
        return Error("anchor '\\b' is not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') return Error("backreference is not supported");
    if (c == 'k') return Error("backreference is not supported");
    if (c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G') {
      return Error(std::string("anchor '\\") + static_cast<char>(c) + "' is not supported");
    }
    if (c == 'p' || c == 'P') return Error("unicode property escapes are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      return Error(std::string("unknown escape '\\") + static_cast<char>(c) + "'");
    }
    *out = CharSet::Of(c);
    return OkStatus();
  }

  StatusOr<Node> ParseClass() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') negate = true, ++pos_;
    CharSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      uint32_t c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[' && (Peek(1) == ':' || Peek(1) == '=' || Peek(1) == '.')) {
        return Error("POSIX character class is not supported");
      }
      ++pos_;
      CharSet item;
      if (c == '\\') {
        PENG_RETURN_IF_ERROR(ParseEscape(true, &item));
      } else {
        item = CharSet::Of(c);
      }
      const bool single = item.ranges().size() == 1 &&
                          item.ranges()[0].first == item.ranges()[0].second;
      if (single && Peek() == '-' && pos_ + 1 < cps_.size() && Peek(1) != ']') {
        ++pos_;
        uint32_t d = Peek();
        ++pos_;
        CharSet hi_item = CharSet::Of(d);
        if (d == '\\') PENG_RETURN_IF_ERROR(ParseEscape(true, &hi_item));
        if (hi_item.ranges().size() != 1 ||
            hi_item.ranges()[0].first != hi_item.ranges()[0].second) {
          return Error("bad character range");
        }
        const uint32_t lo = item.ranges()[0].first, hi = hi_item.ranges()[0].first;
        if (hi < lo) return Error("bad character range");
        set.Add(lo, hi);
      } else {
        set.Add(item);
      }
    }
    Node n;
    n.kind = Node::kSet;
    n.set = negate ? set.Complement() : set;
    return n;
  }

  std::string_view text_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
};

double Expansion(const Node& n) {
  switch (n.kind) {
    case Node::kSet: return 1;
    case Node::kRepeat: {
      const double k = n.max == kInf ? std::max(n.min, 1) : std::max(n.max, 1);
      return k * Expansion(n.kids[0]);
    }
    default: {
      double s = 0;
      for (const auto& k : n.kids) s += Expansion(k);
      return s;
    }
  }
}

bool Single(const Node& n, uint32_t* c) {
  if (n.kind != Node::kSet || n.set.ranges().size() != 1) return false;
  if (n.set.ranges()[0].first != n.set.ranges()[0].second) return false;
  *c = n.set.ranges()[0].first;
  return true;
}

class Emitter {
 public:
  explicit Emitter(bool json) : json_(json) {}

  StatusOr<std::string> Emit(const Node& n) {
    switch (n.kind) {
      case Node::kSet: {
        const CharSet set = n.set.Minus(CharSet::Range(0xD800, 0xDFFF));
        const std::string s = json_ ? JsonCharsGbnf(set) : set.ToGbnf();
        if (s.empty()) return InvalidArgument("regex: a character class matches nothing");
        return s;
      }
      case Node::kAlt: {
        std::string s;
        for (size_t i = 0; i < n.kids.size(); ++i) {
          PENG_ASSIGN_OR_RETURN(std::string k, Emit(n.kids[i]));
          s += (i ? " | " : "") + k;
        }
        return "(" + s + ")";
      }
      case Node::kRepeat: {
        PENG_ASSIGN_OR_RETURN(std::string k, Emit(n.kids[0]));
        k = Atom(k);
        if (n.min == 0 && n.max == kInf) return k + "*";
        if (n.min == 1 && n.max == kInf) return k + "+";
        if (n.min == 0 && n.max == 1) return k + "?";
        if (n.max == 0) return std::string("\"\"");
        if (n.min == 1 && n.max == 1) return k;
        if (n.max == kInf) return k + "{" + std::to_string(n.min) + ",}";
        if (n.min == n.max) return k + "{" + std::to_string(n.min) + "}";
        return k + "{" + std::to_string(n.min) + "," + std::to_string(n.max) + "}";
      }
      case Node::kSeq: {
        std::vector<std::string> parts;
        std::vector<uint32_t> lit;  // pending run of single characters
        auto flush = [&] {
          if (lit.empty()) return;
          std::string s = "\"";
          for (uint32_t c : lit) AppendEscaped(&s, c);
          parts.push_back(s + "\"");
          lit.clear();
        };
        for (const Node& k : n.kids) {
          uint32_t c;
          if (Single(k, &c) && !(c >= 0xD800 && c <= 0xDFFF)) {
            if (json_) {
              for (uint32_t w : CanonicalJsonChar(c)) lit.push_back(w);
            } else {
              lit.push_back(c);
            }
            continue;
          }
          flush();
          PENG_ASSIGN_OR_RETURN(std::string e, Emit(k));
          parts.push_back(e);  // alternatives come parenthesized
        }
        flush();
        if (parts.empty()) return std::string("\"\"");
        if (parts.size() == 1) return parts[0];
        std::string s;
        for (size_t i = 0; i < parts.size(); ++i) s += (i ? " " : "") + parts[i];
        return s;
      }
    }
    return Internal("regex: bad node");
  }

 private:
  bool json_;
};

}  // namespace

StatusOr<std::string> RegexToGbnfExpr(std::string_view regex, bool json_string) {
  RegexParser parser(regex);
  PENG_ASSIGN_OR_RETURN(Node root, parser.Parse());
  if (Expansion(root) > kMaxExpansion) {
    return InvalidArgument("regex '" + std::string(regex) +
                           "': more than 1,000,000 characters after expanding repetitions");
  }
  return Emitter(json_string).Emit(root);
}

}  // namespace peng::grammar::internal
