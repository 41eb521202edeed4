#include "template/parser.h"

#include <algorithm>
#include <set>

#include "template/lexer.h"

namespace peng::tmpl {
namespace {

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  StatusOr<NodeList> ParseAll() {
    NodeList nodes;
    std::string end;
    PENG_RETURN_IF_ERROR(ParseBody({}, &nodes, &end));
    return nodes;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  const Token& Next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  bool IsOp(const char* op, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kOp && Peek(ahead).text == op;
  }
  bool IsName(const char* name, size_t ahead = 0) const {
    return Peek(ahead).kind == TokenKind::kName && Peek(ahead).text == name;
  }
  bool AcceptOp(const char* op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool AcceptName(const char* name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }

  Status Error(const Token& t, const std::string& what) const {
    return InvalidArgument("syntax error at " + std::to_string(t.line) + ":" +
                           std::to_string(t.column) + ": " + what);
  }
  static std::string Describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEof: return "end of template";
      case TokenKind::kBlockEnd: return "'%}'";
      case TokenKind::kVarEnd: return "'}}'";
      case TokenKind::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }
  Status ExpectOp(const char* op) {
    if (AcceptOp(op)) return OkStatus();
    return Error(Peek(), std::string("expected '") + op + "', got " + Describe(Peek()));
  }
  Status ExpectBlockEnd() {
    if (Peek().kind == TokenKind::kBlockEnd) {
      ++pos_;
      return OkStatus();
    }
    return Error(Peek(), "expected '%}', got " + Describe(Peek()));
  }
  StatusOr<std::string> ExpectName() {
    if (Peek().kind != TokenKind::kName) return Error(Peek(), "expected a name, got " + Describe(Peek()));
    return Next().text;
  }

  // Sets e's height from its operands. Chains that the grammar builds in loops rather than by
  // recursion (`a + b + c ...`, `x.a.b ...`, `x | f | g ...`, `f()()...`) get as tall as the
  // source is long, and evaluating or freeing an expression recurses once per level: past
  // kMaxNesting levels the template is refused.
  Status Seal(Expr* e) {
    int h = 0;
    for (const ExprPtr& a : e->args) {
      if (a) h = std::max(h, a->height);
    }
    e->height = h + 1;
    if (e->height > kMaxNesting) return Error(Peek(), "expression nested too deeply");
    return OkStatus();
  }

  template <typename T>
  static std::unique_ptr<T> At(const Token& t) {
    auto n = std::make_unique<T>();
    n->line = t.line;
    n->column = t.column;
    return n;
  }

  // Parses nodes until a `{% name %}` with name in `ends` (consumed up to the name; *end = name).
  Status ParseBody(const std::set<std::string>& ends, NodeList* out, std::string* end) {
    if (++depth_ > kMaxNesting) return Error(Peek(), "blocks nested too deeply");
    while (true) {
      const Token& t = Peek();
      if (t.kind == TokenKind::kEof) {
        if (ends.empty()) break;
        return Error(t, "unexpected end of template, expected '{% " + *ends.begin() + " %}'");
      }
      if (t.kind == TokenKind::kText) {
        auto n = At<Node>(t);
        n->kind = Node::Kind::kText;
        n->text = Next().text;
        out->push_back(std::move(n));
      } else if (t.kind == TokenKind::kVarBegin) {
        auto n = At<Node>(Next());
        n->kind = Node::Kind::kOutput;
        PENG_ASSIGN_OR_RETURN(n->expr, ParseExpr());
        if (Peek().kind != TokenKind::kVarEnd) return Error(Peek(), "expected '}}', got " + Describe(Peek()));
        ++pos_;
        out->push_back(std::move(n));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const Token& kw = Peek(1);
        if (kw.kind == TokenKind::kName && ends.count(kw.text)) {
          pos_ += 2;
          *end = kw.text;
          --depth_;
          return OkStatus();
        }
        ++pos_;
        PENG_ASSIGN_OR_RETURN(NodePtr n, ParseStatement());
        out->push_back(std::move(n));
      } else {
        return Error(t, "unexpected " + Describe(t));
      }
    }
    --depth_;
    return OkStatus();
  }

  StatusOr<NodePtr> ParseStatement() {
    const Token& kw = Peek();
    if (kw.kind != TokenKind::kName) return Error(kw, "expected a statement name");
    const std::string name = Next().text;
    auto n = At<Node>(kw);
    std::string end;
    if (name == "if") {
      n->kind = Node::Kind::kIf;
      PENG_ASSIGN_OR_RETURN(ExprPtr cond, ParseExpr());
      PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      while (true) {
        NodeList body;
        PENG_RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end));
        n->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "endif") break;
        if (end == "else") {
          NodeList else_body;
          PENG_RETURN_IF_ERROR(ExpectBlockEnd());
          PENG_RETURN_IF_ERROR(ParseBody({"endif"}, &else_body, &end));
          n->branches.emplace_back(nullptr, std::move(else_body));
          break;
        }
        PENG_ASSIGN_OR_RETURN(cond, ParseExpr());
        PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      }
    } else if (name == "for") {
      n->kind = Node::Kind::kFor;
      do {
        PENG_ASSIGN_OR_RETURN(std::string target, ExpectName());
        n->targets.push_back(target);
      } while (AcceptOp(","));
      if (!AcceptName("in")) return Error(Peek(), "expected 'in' in for loop");
      PENG_ASSIGN_OR_RETURN(n->expr, ParseOr());  // `if` here is the loop filter
      if (AcceptName("if")) {
        PENG_ASSIGN_OR_RETURN(n->filter, ParseOr());
      }
      if (IsName("recursive")) return Error(Peek(), "recursive loops are not supported");
      PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      PENG_RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n->body, &end));
      if (end == "else") {
        PENG_RETURN_IF_ERROR(ExpectBlockEnd());
        PENG_RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &end));
      }
    } else if (name == "set") {
      PENG_ASSIGN_OR_RETURN(std::string target, ExpectName());
      n->targets.push_back(target);
      if (AcceptOp(".")) {
        PENG_ASSIGN_OR_RETURN(std::string attr, ExpectName());
        n->targets.push_back(attr);
        n->is_attr = true;
      }
      while (!n->is_attr && AcceptOp(",")) {
        PENG_ASSIGN_OR_RETURN(std::string more, ExpectName());
        n->targets.push_back(more);
      }
      if (AcceptOp("=")) {
        n->kind = Node::Kind::kSet;
        PENG_ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpr());
      } else {
        if (n->is_attr || n->targets.size() != 1) return Error(Peek(), "expected '='");
        n->kind = Node::Kind::kSetBlock;
        PENG_RETURN_IF_ERROR(ExpectBlockEnd());
        PENG_RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &end));
      }
    } else if (name == "macro") {
      n->kind = Node::Kind::kMacro;
      PENG_ASSIGN_OR_RETURN(n->text, ExpectName());
      PENG_RETURN_IF_ERROR(ExpectOp("("));
      while (!AcceptOp(")")) {
        if (!n->params.empty()) PENG_RETURN_IF_ERROR(ExpectOp(","));
        if (AcceptOp(")")) break;
        PENG_ASSIGN_OR_RETURN(std::string param, ExpectName());
        ExprPtr def;
        if (AcceptOp("=")) {
          PENG_ASSIGN_OR_RETURN(def, ParseExpr());
        }
        n->params.emplace_back(param, std::move(def));
      }
      PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      PENG_RETURN_IF_ERROR(ParseBody({"endmacro"}, &n->body, &end));
    } else if (name == "call") {
      n->kind = Node::Kind::kCallBlock;
      PENG_ASSIGN_OR_RETURN(n->expr, ParseExpr());
      if (n->expr->kind != Expr::Kind::kCall) return Error(kw, "'call' needs a macro call");
      PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      PENG_RETURN_IF_ERROR(ParseBody({"endcall"}, &n->body, &end));
    } else if (name == "break" || name == "continue") {
      n->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    } else if (name == "generation") {
      n->kind = Node::Kind::kBlock;
      PENG_RETURN_IF_ERROR(ExpectBlockEnd());
      PENG_RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n->body, &end));
    } else {
      return Error(kw, "unknown statement '" + name + "'");
    }
    PENG_RETURN_IF_ERROR(ExpectBlockEnd());
    return n;
  }

  // `a, b` without brackets (in `set x = a, b`) is a tuple.
  StatusOr<ExprPtr> ParseTupleOrExpr() {
    const Token& start = Peek();
    PENG_ASSIGN_OR_RETURN(ExprPtr first, ParseExpr());
    if (!IsOp(",")) return first;
    auto list = At<Expr>(start);
    list->kind = Expr::Kind::kList;
    list->args.push_back(std::move(first));
    while (AcceptOp(",")) {
      PENG_ASSIGN_OR_RETURN(ExprPtr e, ParseExpr());
      list->args.push_back(std::move(e));
    }
    PENG_RETURN_IF_ERROR(Seal(list.get()));
    return list;
  }

  StatusOr<ExprPtr> ParseExpr() {
    if (++depth_ > kMaxNesting) return Error(Peek(), "expression nested too deeply");
    const Token& start = Peek();
    PENG_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (AcceptName("if")) {
      auto cond = At<Expr>(start);
      cond->kind = Expr::Kind::kCond;
      PENG_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (AcceptName("else")) {
        PENG_ASSIGN_OR_RETURN(otherwise, ParseExpr());
      }
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(e));
      cond->args.push_back(std::move(otherwise));
      PENG_RETURN_IF_ERROR(Seal(cond.get()));
      e = std::move(cond);
    }
    --depth_;
    return e;
  }

  StatusOr<ExprPtr> Binary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto b = At<Expr>(at);
    b->kind = Expr::Kind::kBinary;
    b->name = std::move(op);
    b->args.push_back(std::move(l));
    b->args.push_back(std::move(r));
    PENG_RETURN_IF_ERROR(Seal(b.get()));
    return b;
  }

  StatusOr<ExprPtr> ParseOr() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseAnd());
    while (IsName("or")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, "or", std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParseAnd() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseNot());
    while (IsName("and")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, "and", std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      auto n = At<Expr>(Next());
      n->kind = Expr::Kind::kUnary;
      n->name = "not";
      if (++depth_ > kMaxNesting) return Error(Peek(), "expression nested too deeply");
      PENG_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      --depth_;
      n->args.push_back(std::move(operand));
      PENG_RETURN_IF_ERROR(Seal(n.get()));
      return n;
    }
    return ParseCompare();
  }
  StatusOr<ExprPtr> ParseCompare() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseAdd());
    while (true) {
      const Token& op = Peek();
      std::string name;
      if (op.kind == TokenKind::kOp &&
          (op.text == "==" || op.text == "!=" || op.text == "<" || op.text == "<=" ||
           op.text == ">" || op.text == ">=")) {
        name = op.text;
        ++pos_;
      } else if (IsName("in")) {
        name = "in";
        ++pos_;
      } else if (IsName("not") && IsName("in", 1)) {
        name = "not in";
        pos_ += 2;
      } else {
        return l;
      }
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseAdd());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, name, std::move(l), std::move(r)));
    }
  }
  StatusOr<ExprPtr> ParseAdd() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseConcat());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, op.text, std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParseConcat() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseMul());
    while (IsOp("~")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseMul());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, "~", std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParseMul() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParsePow());
      PENG_ASSIGN_OR_RETURN(l, Binary(op, op.text, std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParsePow() {
    PENG_ASSIGN_OR_RETURN(ExprPtr l, ParseUnary(true));
    while (IsOp("**")) {
      const Token& op = Next();
      PENG_ASSIGN_OR_RETURN(ExprPtr r, ParseUnary(true));
      PENG_ASSIGN_OR_RETURN(l, Binary(op, "**", std::move(l), std::move(r)));
    }
    return l;
  }
  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      auto n = At<Expr>(Peek());
      n->kind = Expr::Kind::kUnary;
      n->name = Next().text;
      if (++depth_ > kMaxNesting) return Error(Peek(), "expression nested too deeply");
      PENG_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      --depth_;
      n->args.push_back(std::move(operand));
      PENG_RETURN_IF_ERROR(Seal(n.get()));
      e = std::move(n);
    } else {
      PENG_ASSIGN_OR_RETURN(e, ParsePrimary());
      PENG_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    }
    if (with_filter) return ParseFilterAndTest(std::move(e));
    return e;
  }

  Status ParseCallArgs(Expr* call) {  // after '('
    while (!AcceptOp(")")) {
      if (call->args.size() > 1) PENG_RETURN_IF_ERROR(ExpectOp(","));
      if (AcceptOp(")")) break;
      std::string kw;
      if (Peek().kind == TokenKind::kName && IsOp("=", 1)) {
        kw = Next().text;
        ++pos_;
      }
      PENG_ASSIGN_OR_RETURN(ExprPtr arg, ParseExpr());
      call->args.push_back(std::move(arg));
      call->kwarg_names.push_back(kw);
    }
    return OkStatus();
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      const Token& t = Peek();
      if (AcceptOp(".")) {
        auto a = At<Expr>(t);
        a->kind = Expr::Kind::kAttr;
        if (Peek().kind == TokenKind::kInt) {  // foo.0 is foo[0]
          a->kind = Expr::Kind::kItem;
          auto idx = At<Expr>(Peek());
          idx->literal = Value::Int(Next().int_value);
          a->args.push_back(std::move(e));
          a->args.push_back(std::move(idx));
        } else {
          PENG_ASSIGN_OR_RETURN(a->name, ExpectName());
          a->args.push_back(std::move(e));
        }
        PENG_RETURN_IF_ERROR(Seal(a.get()));
        e = std::move(a);
      } else if (AcceptOp("[")) {
        PENG_ASSIGN_OR_RETURN(e, ParseSubscript(t, std::move(e)));
      } else if (AcceptOp("(")) {
        auto c = At<Expr>(t);
        c->kind = Expr::Kind::kCall;
        c->args.push_back(std::move(e));
        PENG_RETURN_IF_ERROR(ParseCallArgs(c.get()));
        PENG_RETURN_IF_ERROR(Seal(c.get()));
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParseSubscript(const Token& t, ExprPtr obj) {
    ExprPtr parts[3];
    int colons = 0;
    while (!IsOp("]")) {
      if (AcceptOp(":")) {
        if (++colons > 2) return Error(Peek(), "too many ':' in slice");
        continue;
      }
      if (parts[colons]) return Error(Peek(), "expected ']' or ':'");
      PENG_ASSIGN_OR_RETURN(parts[colons], ParseExpr());
    }
    ++pos_;
    auto s = At<Expr>(t);
    s->args.push_back(std::move(obj));
    if (colons == 0) {
      if (!parts[0]) return Error(t, "empty subscript");
      s->kind = Expr::Kind::kItem;
      s->args.push_back(std::move(parts[0]));
    } else {
      s->kind = Expr::Kind::kSlice;
      for (auto& p : parts) s->args.push_back(std::move(p));
    }
    PENG_RETURN_IF_ERROR(Seal(s.get()));
    return s;
  }

  StatusOr<ExprPtr> ParseFilterAndTest(ExprPtr e) {
    while (true) {
      const Token& t = Peek();
      if (AcceptOp("|")) {
        auto f = At<Expr>(t);
        f->kind = Expr::Kind::kFilter;
        PENG_ASSIGN_OR_RETURN(f->name, ExpectName());
        f->args.push_back(std::move(e));
        if (AcceptOp("(")) PENG_RETURN_IF_ERROR(ParseCallArgs(f.get()));
        PENG_RETURN_IF_ERROR(Seal(f.get()));
        PENG_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(f)));
      } else if (AcceptName("is")) {
        auto test = At<Expr>(t);
        test->kind = Expr::Kind::kTest;
        test->negated = AcceptName("not");
        PENG_ASSIGN_OR_RETURN(test->name, ExpectName());
        test->args.push_back(std::move(e));
        if (AcceptOp("(")) {
          PENG_RETURN_IF_ERROR(ParseCallArgs(test.get()));
        } else if (Peek().kind == TokenKind::kString || Peek().kind == TokenKind::kInt ||
                   Peek().kind == TokenKind::kFloat ||
                   (Peek().kind == TokenKind::kName && !IsName("and") && !IsName("or") &&
                    !IsName("if") && !IsName("else") && !IsName("is") && !IsName("in") &&
                    !IsName("not"))) {
          PENG_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());  // `x is divisibleby 3`
          test->args.push_back(std::move(arg));
          test->kwarg_names.push_back("");
        }
        PENG_RETURN_IF_ERROR(Seal(test.get()));
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Peek();
    auto e = At<Expr>(t);
    switch (t.kind) {
      case TokenKind::kString: {
        std::string s;
        while (Peek().kind == TokenKind::kString) s += Next().text;  // adjacent literals join
        e->literal = Value::String(std::move(s));
        return e;
      }
      case TokenKind::kInt: e->literal = Value::Int(Next().int_value); return e;
      case TokenKind::kFloat: e->literal = Value::Float(Next().float_value); return e;
      case TokenKind::kName: {
        const std::string& n = Next().text;
        if (n == "true" || n == "True") e->literal = Value::Bool(true);
        else if (n == "false" || n == "False") e->literal = Value::Bool(false);
        else if (n == "none" || n == "None") e->literal = Value::None();
        else {
          e->kind = Expr::Kind::kName;
          e->name = n;
        }
        return e;
      }
      case TokenKind::kOp: break;
      default: return Error(t, "unexpected " + Describe(t));
    }
    if (++depth_ > kMaxNesting) return Error(t, "expression nested too deeply");
    if (AcceptOp("(")) {
      if (AcceptOp(")")) {
        e->kind = Expr::Kind::kList;
      } else {
        PENG_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpr());
        if (IsOp(",")) {
          e->kind = Expr::Kind::kList;
          e->args.push_back(std::move(inner));
          while (AcceptOp(",") && !IsOp(")")) {
            PENG_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
            e->args.push_back(std::move(item));
          }
        } else {
          e = std::move(inner);
        }
        PENG_RETURN_IF_ERROR(ExpectOp(")"));
      }
    } else if (AcceptOp("[")) {
      e->kind = Expr::Kind::kList;
      while (!AcceptOp("]")) {
        if (!e->args.empty()) PENG_RETURN_IF_ERROR(ExpectOp(","));
        if (AcceptOp("]")) break;
        PENG_ASSIGN_OR_RETURN(ExprPtr item, ParseExpr());
        e->args.push_back(std::move(item));
      }
    } else if (AcceptOp("{")) {
      e->kind = Expr::Kind::kDict;
      while (!AcceptOp("}")) {
        if (!e->args.empty()) PENG_RETURN_IF_ERROR(ExpectOp(","));
        if (AcceptOp("}")) break;
        PENG_ASSIGN_OR_RETURN(ExprPtr key, ParseExpr());
        PENG_RETURN_IF_ERROR(ExpectOp(":"));
        PENG_ASSIGN_OR_RETURN(ExprPtr value, ParseExpr());
        e->args.push_back(std::move(key));
        e->args.push_back(std::move(value));
      }
    } else {
      return Error(t, "unexpected " + Describe(t));
    }
    --depth_;
    if (e->kind == Expr::Kind::kList || e->kind == Expr::Kind::kDict) PENG_RETURN_IF_ERROR(Seal(e.get()));
    return e;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StatusOr<NodeList> ParseTemplate(const std::string& source) {
  PENG_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseAll();
}

}  // namespace peng::tmpl
