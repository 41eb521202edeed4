#include "template/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/utf8.h"

namespace peng::tmpl {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

enum class TagKind { kVar, kBlock, kComment };

// A tag's effect on the text around it.
struct TagEdge {
  TagKind kind = TagKind::kVar;
  char left = 0;   // '-', '+' or 0 (after the opening delimiter)
  char right = 0;  // '-', '+' or 0 (before the closing delimiter)
};

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  StatusOr<std::vector<Token>> Run() {
    size_t text_start = 0;
    size_t pos = 0;
    bool have_prev = false;
    TagEdge prev;
    while (true) {
      const size_t open = FindTagOpen(pos);
      TagEdge next;
      const bool at_end = open == std::string::npos;
      if (!at_end) {
        const char c = src_[open + 1];
        next.kind = c == '{' ? TagKind::kVar : c == '%' ? TagKind::kBlock : TagKind::kComment;
        if (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')) {
          next.left = src_[open + 2];
        }
      }
      EmitText(text_start, at_end ? src_.size() : open, have_prev ? &prev : nullptr,
               at_end ? nullptr : &next);
      if (at_end) break;
      size_t after = 0;
      PENG_RETURN_IF_ERROR(LexTag(open, &next, &after));
      prev = next;
      have_prev = true;
      text_start = after;
      pos = after;
    }
    Token eof;
    eof.kind = TokenKind::kEof;
    Locate(src_.size(), &eof);
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t FindTagOpen(size_t from) const {
    while (true) {
      const size_t p = src_.find('{', from);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      from = p + 1;
    }
  }

  void Locate(size_t offset, Token* t) const {
    // line_starts_[i] is the offset of line i+1's first character.
    size_t lo = 0, hi = line_starts_.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      (line_starts_[mid] <= offset ? lo : hi) = mid;
    }
    t->line = static_cast<int>(lo) + 1;
    t->column = static_cast<int>(offset - line_starts_[lo]) + 1;
  }

  Status Error(size_t offset, const std::string& what) const {
    Token t;
    Locate(offset, &t);
    return InvalidArgument("syntax error at " + std::to_string(t.line) + ":" +
                           std::to_string(t.column) + ": " + what);
  }

  // Text between the previous tag's end and the next tag's start, with whitespace control.
  void EmitText(size_t begin, size_t end, const TagEdge* prev, const TagEdge* next) {
    if (prev) {
      if (prev->right == '-') {
        while (begin < end && IsSpace(src_[begin])) ++begin;
      } else if (prev->kind != TagKind::kVar && prev->right != '+' && begin < end &&
                 src_[begin] == '\n') {
        ++begin;  // trim_blocks
      } else if (prev->kind != TagKind::kVar && prev->right != '+' && begin + 1 < end &&
                 src_[begin] == '\r' && src_[begin + 1] == '\n') {
        begin += 2;
      }
    }
    const bool line_starting = begin == 0 || src_[begin - 1] == '\n';
    if (next) {
      if (next->left == '-') {
        while (end > begin && IsSpace(src_[end - 1])) --end;
      } else if (next->kind != TagKind::kVar && next->left != '+') {  // lstrip_blocks
        size_t line_begin = begin;
        bool has_newline = false;
        for (size_t i = end; i > begin; --i) {
          if (src_[i - 1] == '\n') {
            line_begin = i;
            has_newline = true;
            break;
          }
        }
        if (has_newline || line_starting) {
          bool blank = true;
          for (size_t i = line_begin; i < end; ++i) blank = blank && IsSpace(src_[i]);
          if (blank) end = line_begin;
        }
      }
    }
    if (end > begin) {
      Token t;
      t.kind = TokenKind::kText;
      t.text = src_.substr(begin, end - begin);
      Locate(begin, &t);
      tokens_.push_back(std::move(t));
    }
  }

  Status LexTag(size_t open, TagEdge* edge, size_t* after) {
    size_t pos = open + 2 + (edge->left ? 1 : 0);
    if (edge->kind == TagKind::kComment) {
      const size_t close = src_.find("#}", pos);
      if (close == std::string::npos) return Error(open, "unterminated comment");
      if (close > pos && (src_[close - 1] == '-' || src_[close - 1] == '+')) edge->right = src_[close - 1];
      *after = close + 2;
      return OkStatus();
    }
    const bool is_var = edge->kind == TagKind::kVar;
    Token begin;
    begin.kind = is_var ? TokenKind::kVarBegin : TokenKind::kBlockBegin;
    Locate(open, &begin);
    tokens_.push_back(begin);
    const char close_char = is_var ? '}' : '%';
    int depth = 0;
    while (true) {
      while (pos < src_.size() && IsSpace(src_[pos])) ++pos;
      if (pos >= src_.size()) return Error(open, is_var ? "unterminated '{{'" : "unterminated '{%'");
      if (depth == 0) {
        char mod = 0;
        size_t p = pos;
        if ((src_[p] == '-' || src_[p] == '+') && p + 1 < src_.size()) mod = src_[p++];
        if (p + 1 < src_.size() && src_[p] == close_char && src_[p + 1] == '}') {
          edge->right = mod;
          Token end;
          end.kind = is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd;
          Locate(pos, &end);
          tokens_.push_back(end);
          *after = p + 2;
          return OkStatus();
        }
      }
      PENG_RETURN_IF_ERROR(LexExprToken(&pos, &depth));
    }
  }

  Status LexExprToken(size_t* pos_io, int* depth) {
    size_t pos = *pos_io;
    Token t;
    Locate(pos, &t);
    const char c = src_[pos];
    if (IsNameStart(c)) {
      size_t e = pos;
      while (e < src_.size() && IsNameChar(src_[e])) ++e;
      t.kind = TokenKind::kName;
      t.text = src_.substr(pos, e - pos);
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos;
      bool is_float = false;
      while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
        is_float = true;
        ++e;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
          is_float = true;
          e = x;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
      }
      std::string num;
      for (size_t i = pos; i < e; ++i) {
        if (src_[i] != '_') num.push_back(src_[i]);
      }
      t.kind = is_float ? TokenKind::kFloat : TokenKind::kInt;
      t.text = num;
      errno = 0;
      if (is_float) t.float_value = std::strtod(num.c_str(), nullptr);
      else t.int_value = std::strtoll(num.c_str(), nullptr, 10);
      if (!is_float && errno == ERANGE) return Error(pos, "integer literal " + num + " does not fit in 64 bits");
      pos = e;
    } else if (c == '\'' || c == '"') {
      PENG_RETURN_IF_ERROR(LexString(&pos, &t));
    } else {
      static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
      t.kind = TokenKind::kOp;
      for (const char* op : kTwo) {
        if (src_.compare(pos, 2, op) == 0) t.text = op;
      }
      if (t.text.empty()) {
        if (std::string("+-*/%~<>()[]{},.:|=").find(c) == std::string::npos) {
          return Error(pos, std::string("unexpected character '") + c + "'");
        }
        t.text = std::string(1, c);
      }
      if (c == '(' || c == '[' || c == '{') ++*depth;
      if ((c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
      pos += t.text.size();
    }
    tokens_.push_back(std::move(t));
    *pos_io = pos;
    return OkStatus();
  }

  Status LexString(size_t* pos_io, Token* t) {
    const size_t start = *pos_io;
    const char quote = src_[start];
    size_t pos = start + 1;
    std::string value;
    while (true) {
      if (pos >= src_.size()) return Error(start, "unterminated string");
      const char c = src_[pos];
      if (c == quote) break;
      if (c != '\\' || pos + 1 >= src_.size()) {
        value.push_back(c);
        ++pos;
        continue;
      }
      const char e = src_[pos + 1];
      pos += 2;
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case '0': value.push_back('\0'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos + n > src_.size()) return Error(pos - 2, "truncated escape");
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = src_[pos + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return Error(pos - 2, "bad escape");
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : std::tolower(h) - 'a' + 10);
          }
          if (cp > kMaxCodePoint) return Error(pos - 2, "escape beyond U+10FFFF");
          AppendUtf8(cp, &value);
          pos += n;
          break;
        }
        default:  // Python keeps unknown escapes verbatim
          value.push_back('\\');
          value.push_back(e);
      }
    }
    t->kind = TokenKind::kString;
    t->text = std::move(value);
    *pos_io = pos + 1;
    return OkStatus();
  }

  const std::string& src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Tokenize(const std::string& source) {
  // Jinja's default keep_trailing_newline=False drops one trailing newline of the source.
  if (!source.empty() && source.back() == '\n') {
    const size_t cut = source.size() >= 2 && source[source.size() - 2] == '\r' ? 2 : 1;
    const std::string trimmed = source.substr(0, source.size() - cut);
    return Lexer(trimmed).Run();
  }
  return Lexer(source).Run();
}

}  // namespace peng::tmpl
