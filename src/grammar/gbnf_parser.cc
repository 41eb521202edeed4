// GBNF text -> GrammarImpl (byte-level rules): parsing, code-point classes compiled into UTF-8
// byte-range sequences, repetition expansion, and the checks (undefined rules, left
// recursion) and clean-up (rules that can never finish) that make the rules safe to step.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "core/utf8.h"
#include "grammar/grammar_internal.h"

namespace peng::grammar {
namespace {

struct RawRule {
  std::string name;  // user rules: their name; helpers: the enclosing user rule's
  size_t offset = 0;  // definition (or first reference / generating construct)
  bool defined = false;
  bool helper = false;
  std::vector<std::vector<Elem>> alts;
};

using CpRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive, sorted, disjoint

CpRanges Normalize(CpRanges r) {
  std::sort(r.begin(), r.end());
  CpRanges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

// Valid scalar values minus `r`, or `r` itself, always without surrogates.
CpRanges Finish(const CpRanges& r, bool negate) {
  CpRanges set = Normalize(r);
  if (negate) {
    CpRanges comp;
    uint32_t next = 0;
    for (auto [lo, hi] : set) {
      if (lo > next) comp.push_back({next, lo - 1});
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
    set = comp;
  }
  CpRanges out;
  for (auto [lo, hi] : set) {
    if (lo <= 0xD7FF) out.push_back({lo, std::min<uint32_t>(hi, 0xD7FF)});
    if (hi >= 0xE000) out.push_back({std::max<uint32_t>(lo, 0xE000), hi});
  }
  return out;
}

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (no surrogates) into byte-range sequences whose concatenated products are
// exactly the UTF-8 encodings of the range.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteSeq>* out) {
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= b && b < hi) {
      SplitUtf8(lo, b, out);
      SplitUtf8(b + 1, hi, out);
      return;
    }
  }
  if (hi <= 0x7F) {
    out->push_back({{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  uint8_t a[4], z[4];
  int n = EncodeUtf8(lo, a);
  EncodeUtf8(hi, z);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], z[i]});
  out->push_back(seq);
}

class Parser {
 public:
  explicit Parser(std::string_view text) : t_(text) {}
  StatusOr<std::shared_ptr<GrammarImpl>> Run(std::string_view root);

 private:
  Status Error(size_t at, const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument("line " + std::to_string(line) + ", column " + std::to_string(col) +
                           ": " + msg);
  }
  bool Eof() const { return p_ >= t_.size(); }
  char Cur() const { return Eof() ? '\0' : t_[p_]; }
  static bool IsWordChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
  }
  void SkipSpace(bool newlines);
  Status ParseRule();
  Status ParseAlternatives(int32_t rule, int depth);
  Status ParseSequence(int32_t rule, int depth, std::vector<Elem>* seq);
  Status ParseChar(uint32_t* cp);  // one (possibly escaped) code point inside "" or []
  Status ParseClass(std::vector<Elem>* seq);
  Status ApplyPostfix(int32_t rule, size_t at, std::vector<Elem>* seq, size_t last_start);
  int32_t RuleId(std::string_view name, size_t at);
  int32_t NewHelper(int32_t parent, size_t at);
  int32_t ByteSetId(const ByteSet& s);
  Elem SingleByte(uint8_t b) {
    ByteSet s{};
    s[b >> 6] |= uint64_t{1} << (b & 63);
    return {ElemKind::kBytes, ByteSetId(s)};
  }
  Status Count(size_t n, size_t at) {
    size_ += n;
    if (size_ > kMaxGrammarElems) {
      return Error(at, "grammar too large (more than " + std::to_string(kMaxGrammarElems) +
                           " elements after expanding repetitions)");
    }
    return OkStatus();
  }
  Status Finalize(std::string_view root, GrammarImpl* g);

  std::string_view t_;
  size_t p_ = 0;
  size_t size_ = 0;
  std::vector<RawRule> rules_;
  std::unordered_map<std::string, int32_t> names_;
  std::map<ByteSet, int32_t> set_ids_;
  std::vector<ByteSet> sets_;
  std::map<CpRanges, int32_t> class_rules_;
};

void Parser::SkipSpace(bool newlines) {
  while (!Eof()) {
    char c = Cur();
    if (c == '#') {
      while (!Eof() && Cur() != '\n' && Cur() != '\r') ++p_;
    } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
      ++p_;
    } else {
      break;
    }
  }
}

int32_t Parser::RuleId(std::string_view name, size_t at) {
  auto it = names_.find(std::string(name));
  if (it != names_.end()) return it->second;
  int32_t id = int32_t(rules_.size());
  rules_.push_back({std::string(name), at, false, false, {}});
  names_.emplace(std::string(name), id);
  return id;
}

int32_t Parser::NewHelper(int32_t parent, size_t at) {
  int32_t id = int32_t(rules_.size());
  rules_.push_back({rules_[parent].name, at, true, true, {}});
  return id;
}

int32_t Parser::ByteSetId(const ByteSet& s) {
  auto [it, inserted] = set_ids_.emplace(s, int32_t(sets_.size()));
  if (inserted) sets_.push_back(s);
  return it->second;
}

Status Parser::ParseRule() {
  size_t start = p_;
  while (!Eof() && IsWordChar(Cur())) ++p_;
  if (p_ == start) return Error(p_, "expected a rule name");
  std::string_view name = t_.substr(start, p_ - start);
  int32_t id = RuleId(name, start);
  if (rules_[id].defined) {
    return Error(start, "rule '" + std::string(name) + "' is defined twice");
  }
  rules_[id].defined = true;
  rules_[id].offset = start;
  SkipSpace(false);
  if (t_.substr(p_, 3) != "::=") return Error(p_, "expected '::=' after rule name");
  p_ += 3;
  SkipSpace(true);
  PENG_RETURN_IF_ERROR(ParseAlternatives(id, 0));
  SkipSpace(false);
  if (!Eof() && Cur() != '\n' && Cur() != '\r') {
    return Error(p_, std::string("unexpected '") + Cur() + "'");
  }
  return OkStatus();
}

Status Parser::ParseAlternatives(int32_t rule, int depth) {
  if (depth > 200) return Error(p_, "groups nested too deeply");
  while (true) {
    std::vector<Elem> seq;
    PENG_RETURN_IF_ERROR(ParseSequence(rule, depth, &seq));
    PENG_RETURN_IF_ERROR(Count(seq.size() + 1, p_));
    rules_[rule].alts.push_back(std::move(seq));
    if (Cur() != '|') return OkStatus();
    ++p_;
    SkipSpace(true);
  }
}

Status Parser::ParseChar(uint32_t* cp) {
  size_t at = p_;
  auto c = uint8_t(Cur());
  if (c == '\\') {
    ++p_;
    if (Eof()) return Error(at, "unterminated escape");
    char e = Cur();
    ++p_;
    int hex = 0;
    switch (e) {
      case 'n': *cp = '\n'; return OkStatus();
      case 'r': *cp = '\r'; return OkStatus();
      case 't': *cp = '\t'; return OkStatus();
      case '\\': case '"': case '[': case ']': *cp = uint8_t(e); return OkStatus();
      case 'x': hex = 2; break;
      case 'u': hex = 4; break;
      case 'U': hex = 8; break;
      default:
        return Error(at, std::string("unknown escape '\\") + e + "'");
    }
    uint32_t v = 0;
    for (int i = 0; i < hex; ++i) {
      char h = Cur();
      int d = (h >= '0' && h <= '9')   ? h - '0'
              : (h >= 'a' && h <= 'f') ? h - 'a' + 10
              : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                       : -1;
      if (d < 0) return Error(at, "escape needs " + std::to_string(hex) + " hex digits");
      v = v * 16 + uint32_t(d);
      ++p_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error(at, "escape is not a Unicode scalar value");
    }
    *cp = v;
    return OkStatus();
  }
  // One UTF-8 encoded code point (an invalid sequence decodes as U+FFFD of one byte; the
  // character itself takes three).
  size_t n = 0;
  *cp = DecodeUtf8At(t_.substr(p_), &n);
  if (*cp == 0xFFFD && n == 1) return Error(at, "invalid UTF-8");
  p_ += n;
  return OkStatus();
}

Status Parser::ParseClass(std::vector<Elem>* seq) {
  size_t at = p_;
  bool negate = false;
  CpRanges ranges;
  if (Cur() == '.') {
    ++p_;
    negate = true;  // [^] : every code point
  } else {
    ++p_;  // '['
    if (Cur() == '^') {
      negate = true;
      ++p_;
    }
    while (Cur() != ']') {
      if (Eof()) return Error(at, "unterminated character class");
      uint32_t lo, hi;
      PENG_RETURN_IF_ERROR(ParseChar(&lo));
      hi = lo;
      if (Cur() == '-' && p_ + 1 < t_.size() && t_[p_ + 1] != ']') {
        size_t dash = p_;
        ++p_;
        PENG_RETURN_IF_ERROR(ParseChar(&hi));
        if (hi < lo) return Error(dash, "character range is out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++p_;  // ']'
    if (ranges.empty() && !negate) return Error(at, "empty character class");
  }
  CpRanges set = Finish(ranges, negate);
  if (set.empty()) return Error(at, "character class matches no character");
  if (set.back().second < 0x80) {
    ByteSet s{};
    for (auto [lo, hi] : set) {
      for (uint32_t b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
    }
    PENG_RETURN_IF_ERROR(Count(1, at));
    seq->push_back({ElemKind::kBytes, ByteSetId(s)});
    return OkStatus();
  }
  auto found = class_rules_.find(set);
  if (found != class_rules_.end()) {
    PENG_RETURN_IF_ERROR(Count(1, at));
    seq->push_back({ElemKind::kRef, found->second});
    return OkStatus();
  }
  std::vector<ByteSeq> seqs;
  for (auto [lo, hi] : set) SplitUtf8(lo, hi, &seqs);
  // Sequences with the same tail share one alternative: their first bytes form one set.
  std::map<ByteSeq, ByteSet> by_tail;
  for (const ByteSeq& s : seqs) {
    ByteSet& first = by_tail[ByteSeq(s.begin() + 1, s.end())];
    for (uint32_t b = s[0].first; b <= s[0].second; ++b) first[b >> 6] |= uint64_t{1} << (b & 63);
  }
  int32_t rule = NewHelper(0, at);
  for (const auto& [tail, first] : by_tail) {
    std::vector<Elem> alt{{ElemKind::kBytes, ByteSetId(first)}};
    for (auto [lo, hi] : tail) {
      ByteSet s{};
      for (uint32_t b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
      alt.push_back({ElemKind::kBytes, ByteSetId(s)});
    }
    PENG_RETURN_IF_ERROR(Count(alt.size() + 1, at));
    rules_[rule].alts.push_back(std::move(alt));
  }
  rules_[rule].name = "character class";
  class_rules_.emplace(set, rule);
  PENG_RETURN_IF_ERROR(Count(1, at));
  seq->push_back({ElemKind::kRef, rule});
  return OkStatus();
}

Status Parser::ParseSequence(int32_t rule, int depth, std::vector<Elem>* seq) {
  bool nested = depth > 0;
  size_t last_start = SIZE_MAX;
  while (!Eof()) {
    size_t at = p_;
    char c = Cur();
    if (c == '"') {
      ++p_;
      last_start = seq->size();
      std::vector<Elem> lit;
      while (Cur() != '"') {
        if (Eof()) return Error(at, "unterminated string literal");
        uint32_t cp;
        PENG_RETURN_IF_ERROR(ParseChar(&cp));
        uint8_t buf[4];
        int n = EncodeUtf8(cp, buf);
        for (int i = 0; i < n; ++i) lit.push_back(SingleByte(buf[i]));
      }
      ++p_;
      PENG_RETURN_IF_ERROR(Count(lit.size(), at));
      if (lit.empty()) {
        // "" matches the empty text; a postfix on it repeats nothing.
        int32_t h = NewHelper(rule, at);
        rules_[h].alts.push_back({});
        lit.push_back({ElemKind::kRef, h});
      }
      seq->insert(seq->end(), lit.begin(), lit.end());
    } else if (c == '[' || c == '.') {
      last_start = seq->size();
      PENG_RETURN_IF_ERROR(ParseClass(seq));
    } else if (IsWordChar(c)) {
      size_t start = p_;
      while (!Eof() && IsWordChar(Cur())) ++p_;
      // A name followed by ::= starts the next rule (only possible when not nested, after a
      // newline; a missing newline is caught by the caller).
      last_start = seq->size();
      PENG_RETURN_IF_ERROR(Count(1, at));
      seq->push_back({ElemKind::kRef, RuleId(t_.substr(start, p_ - start), start)});
    } else if (c == '(') {
      ++p_;
      SkipSpace(true);
      int32_t h = NewHelper(rule, at);
      PENG_RETURN_IF_ERROR(ParseAlternatives(h, depth + 1));
      if (Cur() != ')') return Error(at, "unmatched '('");
      ++p_;
      last_start = seq->size();
      PENG_RETURN_IF_ERROR(Count(1, at));
      seq->push_back({ElemKind::kRef, h});
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (last_start == SIZE_MAX) return Error(at, std::string("'") + c + "' needs an element before it");
      PENG_RETURN_IF_ERROR(ApplyPostfix(rule, at, seq, last_start));
    } else {
      break;
    }
    SkipSpace(nested);
  }
  return OkStatus();
}

Status Parser::ApplyPostfix(int32_t rule, size_t at, std::vector<Elem>* seq,
                            size_t last_start) {
  char c = Cur();
  ++p_;
  uint64_t min = 0, max = 0;
  bool unbounded = false;
  if (c == '*') {
    unbounded = true;
  } else if (c == '+') {
    min = 1;
    unbounded = true;
  } else if (c == '?') {
    max = 1;
  } else {
    auto number = [&](uint64_t* v) -> Status {
      SkipSpace(false);
      size_t s = p_;
      *v = 0;
      while (Cur() >= '0' && Cur() <= '9') {
        *v = *v * 10 + uint64_t(Cur() - '0');
        if (*v > uint64_t(kMaxRepetition)) {
          return Error(s, "repetition count above " + std::to_string(kMaxRepetition));
        }
        ++p_;
      }
      if (p_ == s) return Error(s, "expected a number in '{}'");
      SkipSpace(false);
      return OkStatus();
    };
    PENG_RETURN_IF_ERROR(number(&min));
    max = min;
    if (Cur() == ',') {
      ++p_;
      SkipSpace(false);
      if (Cur() == '}') {
        unbounded = true;
      } else {
        PENG_RETURN_IF_ERROR(number(&max));
        if (max < min) return Error(at, "repetition {m,n} with n < m");
      }
    }
    if (Cur() != '}') return Error(at, "expected '}'");
    ++p_;
  }
  // The repeated item as one element.
  Elem item;
  if (seq->size() - last_start == 1) {
    item = (*seq)[last_start];
  } else {
    int32_t h = NewHelper(rule, at);
    rules_[h].alts.emplace_back(seq->begin() + last_start, seq->end());
    item = {ElemKind::kRef, h};
  }
  seq->resize(last_start);
  uint64_t optional = unbounded ? 0 : max - min;
  PENG_RETURN_IF_ERROR(Count(min + 4 * optional + 4, at));
  for (uint64_t i = 0; i < min; ++i) seq->push_back(item);
  if (unbounded) {
    int32_t star = NewHelper(rule, at);  // star ::= item star |
    rules_[star].alts.push_back({item, {ElemKind::kRef, star}});
    rules_[star].alts.push_back({});
    seq->push_back({ElemKind::kRef, star});
  } else if (optional > 0) {
    int32_t prev = -1;  // opt_k ::= item opt_(k-1) |
    for (uint64_t k = 0; k < optional; ++k) {
      int32_t h = NewHelper(rule, at);
      std::vector<Elem> alt{item};
      if (prev >= 0) alt.push_back({ElemKind::kRef, prev});
      rules_[h].alts.push_back(std::move(alt));
      rules_[h].alts.push_back({});
      prev = h;
    }
    seq->push_back({ElemKind::kRef, prev});
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<GrammarImpl>> Parser::Run(std::string_view root) {
  SkipSpace(true);
  if (Eof()) return Error(p_, "empty grammar (no rules)");
  while (!Eof()) {
    PENG_RETURN_IF_ERROR(ParseRule());
    SkipSpace(true);
  }
  auto impl = std::make_shared<GrammarImpl>();
  PENG_RETURN_IF_ERROR(Finalize(root, impl.get()));
  return impl;
}

Status Parser::Finalize(std::string_view root, GrammarImpl* g) {
  const size_t n = rules_.size();
  // Undefined rules: report the one referenced first.
  size_t bad = SIZE_MAX;
  for (size_t r = 0; r < n; ++r) {
    if (!rules_[r].defined && (bad == SIZE_MAX || rules_[r].offset < rules_[bad].offset)) bad = r;
  }
  if (bad != SIZE_MAX) return Error(rules_[bad].offset, "undefined rule '" + rules_[bad].name + "'");
  auto root_it = names_.find(std::string(root));
  if (root_it == names_.end()) return Error(0, "no rule named '" + std::string(root) + "'");

  // Nullable rules (derive the empty text).
  std::vector<uint8_t> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : rules_[r].alts) {
        bool all = std::all_of(alt.begin(), alt.end(), [&](const Elem& e) {
          return e.kind == ElemKind::kRef && nullable[e.arg];
        });
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }

  // Left recursion: a rule that can call itself before consuming a byte. Cycles made only of
  // tail calls (the call is an alternative's last element) are harmless -- a tail call pushes
  // nothing -- and allowed, so `("a"?)*` works; any other such cycle is rejected.
  struct Edge {
    int32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (size_t r = 0; r < n; ++r) {
    for (const auto& alt : rules_[r].alts) {
      for (size_t i = 0; i < alt.size(); ++i) {
        if (alt[i].kind != ElemKind::kRef) break;
        edges[r].push_back({alt[i].arg, i + 1 == alt.size()});
        if (!nullable[alt[i].arg]) break;
      }
    }
  }
  // Tarjan's strongly connected components, iteratively.
  std::vector<int32_t> index(n, -1), low(n, 0), comp(n, -1), stack;
  std::vector<uint8_t> on_stack(n, 0);
  int32_t counter = 0, ncomp = 0;
  for (size_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    std::vector<std::pair<int32_t, size_t>> call{{int32_t(s), 0}};
    index[s] = low[s] = counter++;
    stack.push_back(int32_t(s));
    on_stack[s] = 1;
    while (!call.empty()) {
      auto& [v, ei] = call.back();
      if (ei < edges[v].size()) {
        int32_t w = edges[v][ei++].to;
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.push_back(w);
          on_stack[w] = 1;
          call.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      int32_t done = v;
      call.pop_back();
      if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
      if (low[done] == index[done]) {
        while (true) {
          int32_t w = stack.back();
          stack.pop_back();
          on_stack[w] = 0;
          comp[w] = ncomp;
          if (w == done) break;
        }
        ++ncomp;
      }
    }
  }
  for (size_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (!e.tail && comp[e.to] == comp[r]) {
        return Error(rules_[r].offset, "left recursion in rule '" + rules_[r].name + "'");
      }
    }
  }

  // Productive rules (derive some finite text); alternatives using others are dropped.
  std::vector<uint8_t> productive(n, 0);
  auto alt_ok = [&](const std::vector<Elem>& alt) {
    return std::all_of(alt.begin(), alt.end(), [&](const Elem& e) {
      return e.kind == ElemKind::kBytes || productive[e.arg];
    });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (productive[r]) continue;
      if (std::any_of(rules_[r].alts.begin(), rules_[r].alts.end(), alt_ok)) {
        productive[r] = changed = true;
      }
    }
  }
  int32_t root_id = root_it->second;
  if (!productive[root_id]) {
    return Error(rules_[root_id].offset,
                 "rule '" + rules_[root_id].name + "' can never finish (matches no text)");
  }

  g->byte_sets = sets_;
  g->root = root_id;
  g->rules.resize(n);
  for (size_t r = 0; r < n; ++r) {
    GrammarImpl::Rule& out = g->rules[r];
    out.name = rules_[r].name;
    out.nullable = nullable[r];
    for (const auto& alt : rules_[r].alts) {
      if (!alt_ok(alt)) continue;
      out.alts.push_back(int32_t(g->elems.size()));
      g->elems.insert(g->elems.end(), alt.begin(), alt.end());
      g->elems.push_back({ElemKind::kEnd, 0});
      g->rule_of_pos.resize(g->elems.size(), int32_t(r));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<Grammar> Grammar::ParseGbnf(std::string_view text, std::string_view root) {
  Parser parser(text);
  auto impl = parser.Run(root);
  if (!impl.ok()) return impl.status();
  Grammar g;
  g.impl_ = std::move(*impl);
  return g;
}

}  // namespace peng::grammar
