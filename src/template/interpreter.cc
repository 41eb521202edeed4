#include "template/interpreter.h"

#include <cmath>
#include <cstdint>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "template/builtins.h"

namespace peng::tmpl {
namespace {

using Scope = std::unordered_map<std::string, Value>;

Status UndefinedError(const Value& v) {
  return InvalidArgument(v.as_string().empty() ? "value is undefined" : v.as_string());
}

Status IntegerOverflow(const std::string& op, int64_t a, int64_t b) {
  return InvalidArgument("integer overflow: " + std::to_string(a) + " " + op + " " + std::to_string(b) +
                         " does not fit in 64 bits");
}

// a ** b for b >= 0, exactly, or nullopt past 64 bits.
std::optional<int64_t> IntPow(int64_t a, int64_t b) {
  int64_t result = 1;
  while (b > 0) {
    if ((b & 1) && __builtin_mul_overflow(result, a, &result)) return std::nullopt;
    b >>= 1;
    if (b > 0 && __builtin_mul_overflow(a, a, &a)) return std::nullopt;
  }
  return result;
}

StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (op == "+") {
    // Charged before the result is built.
    if (a.is_string() && b.is_string()) {
      if (!WorkBudget::Charge(static_cast<int64_t>(a.as_string().size() + b.as_string().size()))) {
        return ResourceExhausted("'+': the template's work limit is exhausted");
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      if (!WorkBudget::Charge(static_cast<int64_t>(a.as_list().size() + b.as_list().size()) * WorkBudget::kElementBytes)) {
        return ResourceExhausted("'+': the template's work limit is exhausted");
      }
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return Value::List(std::move(out));
    }
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = a.is_int() ? b : a;
    const Value& times = a.is_int() ? a : b;
    if (!times.is_int() || !(seq.is_string() || seq.is_list())) {
      return InvalidArgument("can't multiply sequence by non-int");
    }
    const int64_t n = std::max<int64_t>(0, times.as_int());
    const int64_t len = seq.is_string() ? static_cast<int64_t>(seq.as_string().size())
                                        : static_cast<int64_t>(seq.as_list().size());
    constexpr int64_t kMaxRepeat = 16 << 20;  // bytes or elements of one result
    if (n > kMaxRepeat / std::max<int64_t>(len, 1)) {
      return ResourceExhausted("sequence repetition too large: " + std::to_string(n) + " copies of " +
                               std::to_string(len) + (seq.is_string() ? " bytes" : " elements"));
    }
    if (seq.is_string()) {
      if (!WorkBudget::Charge(n * len)) return ResourceExhausted("sequence repetition: the template's work limit is exhausted");
      // By doubling: n appends of a 1-byte string would be n calls.
      const size_t total = static_cast<size_t>(n * len);
      std::string out;
      out.reserve(total);
      if (total > 0) out = seq.as_string();
      while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
      return Value::String(std::move(out));
    }
    if (!WorkBudget::Charge(n * len * WorkBudget::kElementBytes)) {
      return ResourceExhausted("sequence repetition: the template's work limit is exhausted");
    }
    ValueList out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    return Value::List(std::move(out));
  }
  if (!a.is_number() || !b.is_number()) {
    return InvalidArgument(std::string("unsupported operand type(s) for ") + op + ": '" + a.TypeName() +
                           "' and '" + b.TypeName() + "'");
  }
  const bool ints = a.is_int() && b.is_int();
  const double x = a.as_double(), y = b.as_double();
  if (op == "/") {
    if (y == 0) return InvalidArgument("division by zero");
    return Value::Float(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) return InvalidArgument("integer division or modulo by zero");
    if (ints) {
      const int64_t i = a.as_int(), j = b.as_int();
      if (j == -1) {  // INT64_MIN / -1 overflows (and traps on x86)
        if (op == "%") return Value::Int(0);
        if (i == INT64_MIN) return IntegerOverflow(op, i, j);
        return Value::Int(-i);
      }
      int64_t q = i / j;
      if ((i % j != 0) && ((i < 0) != (j < 0))) --q;
      return Value::Int(op == "//" ? q : i - q * j);
    }
    const double q = std::floor(x / y);
    return Value::Float(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      const std::optional<int64_t> p = IntPow(a.as_int(), b.as_int());
      if (!p) return IntegerOverflow(op, a.as_int(), b.as_int());
      return Value::Int(*p);
    }
    if (x == 0 && y < 0) return InvalidArgument("0.0 cannot be raised to a negative power");
    return Value::Float(std::pow(x, y));
  }
  if (ints) {
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
    else if (op == "-") overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
    else if (op == "*") overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
    else return InvalidArgument("unknown operator " + op);
    if (overflow) return IntegerOverflow(op, a.as_int(), b.as_int());
    return Value::Int(r);
  }
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  return InvalidArgument("unknown operator " + op);
}

StatusOr<bool> Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) return InvalidArgument("'in <string>' requires string as left operand");
    return FindSubstring(container.as_string(), item.as_string()) != std::string::npos;
  }
  if (container.is_dict() || container.is_namespace()) {
    return item.is_string() && container.Find(item.as_string()) != nullptr;
  }
  PENG_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(container));
  for (const Value& x : items) {
    if (x.Equals(item)) return true;
    if (WorkBudget::Exhausted()) return ResourceExhausted("'in': the template's work limit is exhausted");
  }
  return false;
}

constexpr char kWorkLimit[] = "template work limit";

std::string Where(int line, int column) {
  return "render error at " + std::to_string(line) + ":" + std::to_string(column) + ": ";
}

class Interpreter {
 public:
  Interpreter(const Value& context, const RenderLimits& limits)
      : limits_(limits), budget_(limits.max_work_bytes) {
    scopes_.emplace_back();
    InstallGlobals(&scopes_[0]);
    if (context.is_dict()) {
      for (const auto& [k, v] : context.as_dict()) scopes_[0][k] = v;
    }
  }

  // Namespaces are the only mutable values, so every reference cycle runs through one of the
  // namespaces this render created: emptying them frees everything.
  ~Interpreter() {
    for (Value& ns : namespaces_) ns.ClearNamespace();
  }

  Status ExecList(const NodeList& nodes, std::string* out) {
    for (const NodePtr& n : nodes) {
      PENG_RETURN_IF_ERROR(Exec(*n, out));
      if (flow_ != Flow::kNormal) return OkStatus();
    }
    return OkStatus();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Counts one statement or expression and one level of nesting (the recursion of
  // Exec/Eval/macro calls, which is what uses stack); Leave() undoes the nesting.
  Status Enter(int line, int column) {
    if (++steps_ > limits_.max_steps) {
      return ResourceExhausted(Where(line, column) + "template step limit (" + std::to_string(limits_.max_steps) +
                               " statements and expressions) exceeded");
    }
    if (++nesting_ > limits_.max_nesting) {
      --nesting_;
      return ResourceExhausted(Where(line, column) + "template nesting limit (" +
                               std::to_string(limits_.max_nesting) +
                               ") exceeded: statements, expressions and macro calls nest too deeply");
    }
    return OkStatus();
  }
  void Leave() { --nesting_; }

  // The error of a statement or expression during which the work budget ran out: the innermost
  // one reports it, with its position.
  Status WorkLimitError(const Status& inner, int line, int column) const {
    if (!inner.ok() && inner.message().find(kWorkLimit) != std::string::npos) return inner;
    return ResourceExhausted(Where(line, column) + kWorkLimit + " (" + std::to_string(budget_.limit()) +
                             " bytes of strings and values built, copied or compared) exceeded");
  }

  Status Append(const std::string& s, std::string* out) {
    produced_bytes_ += s.size();
    if (produced_bytes_ > limits_.max_output_bytes) {
      return ResourceExhausted("template output exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
    *out += s;
    return OkStatus();
  }

  // Evaluates an expression of a statement, prefixing errors with the statement position.
  StatusOr<Value> EvalAt(const Node& n, const Expr& e) {
    StatusOr<Value> v = Eval(e);
    if (!v.ok() && v.status().message().rfind("render error", 0) != 0) {
      return Status(v.status().code(), Where(e.line, e.column) + v.status().message());
    }
    return v;
  }

  Value Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i > floor_; --i) {
      auto it = scopes_[i - 1].find(name);
      if (it != scopes_[i - 1].end()) return it->second;
    }
    auto it = scopes_[0].find(name);
    if (it != scopes_[0].end()) return it->second;
    return Value::Undefined("'" + name + "' is undefined");
  }

  void Assign(const std::vector<std::string>& targets, const Value& v) {
    Scope& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = v;
      return;
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      scope[targets[i]] = v.is_list() && i < v.as_list().size() ? v.as_list()[i] : Value();
    }
  }

  Status Exec(const Node& n, std::string* out) {
    PENG_RETURN_IF_ERROR(Enter(n.line, n.column));
    Status s = ExecImpl(n, out);
    Leave();
    if (budget_.exhausted()) return WorkLimitError(s, n.line, n.column);
    return s;
  }

  Status ExecImpl(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::Kind::kText: return Append(n.text, out);
      case Node::Kind::kOutput: {
        PENG_ASSIGN_OR_RETURN(Value v, EvalAt(n, *n.expr));
        return Append(v.Str(), out);
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            PENG_ASSIGN_OR_RETURN(Value c, EvalAt(n, *cond));
            take = c.Truthy();
          }
          if (take) return ExecList(body, out);
        }
        return OkStatus();
      case Node::Kind::kFor: return ExecFor(n, out);
      case Node::Kind::kSet: {
        PENG_ASSIGN_OR_RETURN(Value v, EvalAt(n, *n.expr));
        if (!n.is_attr) {
          Assign(n.targets, v);
          return OkStatus();
        }
        Value ns = Lookup(n.targets[0]);
        if (!ns.is_namespace()) {
          return InvalidArgument(Where(n.line, n.column) + "cannot assign attribute on non-namespace object '" +
                                 n.targets[0] + "'");
        }
        ns.SetAttr(n.targets[1], v);
        return OkStatus();
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        PENG_RETURN_IF_ERROR(ExecList(n.body, &captured));
        Assign(n.targets, Value::String(captured));
        return OkStatus();
      }
      case Node::Kind::kMacro: {
        const Node* macro = &n;
        scopes_.back()[n.text] = Value::Callable(
            n.text, [this, macro](const CallArgs& args) { return CallMacro(*macro, args); });
        return OkStatus();
      }
      case Node::Kind::kCallBlock: {
        const Node* block = &n;
        pending_caller_ = Value::Callable("caller", [this, block](const CallArgs&) -> StatusOr<Value> {
          std::string body;
          PENG_RETURN_IF_ERROR(ExecList(block->body, &body));
          return Value::String(body);
        });
        PENG_ASSIGN_OR_RETURN(Value v, EvalAt(n, *n.expr));
        pending_caller_ = Value();
        return Append(v.Str(), out);
      }
      case Node::Kind::kBreak: flow_ = Flow::kBreak; return OkStatus();
      case Node::Kind::kContinue: flow_ = Flow::kContinue; return OkStatus();
      case Node::Kind::kBlock: return ExecList(n.body, out);
    }
    return OkStatus();
  }

  Status ExecFor(const Node& n, std::string* out) {
    PENG_ASSIGN_OR_RETURN(Value seq, EvalAt(n, *n.expr));
    StatusOr<std::vector<Value>> items_or = Iterate(seq);
    if (!items_or.ok()) return Status(items_or.status().code(), Where(n.line, n.column) + items_or.status().message());
    std::vector<Value> items = std::move(items_or).value();
    if (n.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        Assign(n.targets, item);
        StatusOr<Value> keep = EvalAt(n, *n.filter);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return ExecList(n.else_body, out);
    const int64_t length = static_cast<int64_t>(items.size());
    // loop.cycle of every iteration reads the current index (like Jinja's one LoopContext).
    auto index = std::make_shared<int64_t>(0);
    const Value cycle = Value::Callable("cycle", [index](const CallArgs& args) -> StatusOr<Value> {
      if (args.positional.empty()) return InvalidArgument("loop.cycle needs at least one argument");
      return args.positional[static_cast<size_t>(*index) % args.positional.size()];
    });
    for (int64_t i = 0; i < length; ++i) {
      if (++iterations_ > limits_.max_loop_iterations) {
        return ResourceExhausted(Where(n.line, n.column) + "loop iteration limit (" +
                                 std::to_string(limits_.max_loop_iterations) + ") exceeded");
      }
      *index = i;
      scopes_.emplace_back();
      Assign(n.targets, items[i]);
      scopes_.back()["loop"] = MakeLoop(items, i, cycle);
      Status s = ExecList(n.body, out);
      scopes_.pop_back();
      PENG_RETURN_IF_ERROR(s);
      const Flow flow = flow_;
      flow_ = Flow::kNormal;
      if (flow == Flow::kBreak) break;
    }
    return OkStatus();
  }

  // The `loop` variable: fixed-size bookkeeping, bounded by the iteration limit, so not charged
  // to the work budget.
  static Value MakeLoop(const std::vector<Value>& items, int64_t i, const Value& cycle) {
    WorkBudget::Pause pause;
    static const Value* no_prev = new Value(Value::Undefined("there is no previous item"));
    static const Value* no_next = new Value(Value::Undefined("there is no next item"));
    const int64_t n = static_cast<int64_t>(items.size());
    ValueDict d;
    d.reserve(10);
    d.emplace_back("index", Value::Int(i + 1));
    d.emplace_back("index0", Value::Int(i));
    d.emplace_back("revindex", Value::Int(n - i));
    d.emplace_back("revindex0", Value::Int(n - i - 1));
    d.emplace_back("first", Value::Bool(i == 0));
    d.emplace_back("last", Value::Bool(i == n - 1));
    d.emplace_back("length", Value::Int(n));
    d.emplace_back("previtem", i > 0 ? items[i - 1] : *no_prev);
    d.emplace_back("nextitem", i + 1 < n ? items[i + 1] : *no_next);
    d.emplace_back("cycle", cycle);
    return Value::Dict(std::move(d));
  }

  StatusOr<Value> CallMacro(const Node& m, const CallArgs& args) {
    if (call_depth_ >= limits_.max_call_depth) {
      return ResourceExhausted("macro '" + m.text + "' exceeded the call depth limit (" +
                               std::to_string(limits_.max_call_depth) + ")");
    }
    if (args.positional.size() > m.params.size()) {
      return InvalidArgument("macro '" + m.text + "' takes " + std::to_string(m.params.size()) + " arguments");
    }
    const size_t saved_floor = floor_;
    scopes_.emplace_back();
    floor_ = scopes_.size() - 1;
    ++call_depth_;
    if (!pending_caller_.is_undefined()) {
      scopes_.back()["caller"] = pending_caller_;
      pending_caller_ = Value();
    }
    Status status;
    for (size_t i = 0; i < m.params.size() && status.ok(); ++i) {
      const auto& [name, def] = m.params[i];
      const Value* given = args.Get(i, name);
      if (given) {
        scopes_.back()[name] = *given;
      } else if (def) {
        StatusOr<Value> v = Eval(*def);
        if (v.ok()) scopes_.back()[name] = *v;
        else status = v.status();
      } else {
        scopes_.back()[name] = Value::Undefined("'" + name + "' is undefined");
      }
    }
    std::string body;
    if (status.ok()) status = ExecList(m.body, &body);
    flow_ = Flow::kNormal;
    --call_depth_;
    scopes_.pop_back();
    floor_ = saved_floor;
    PENG_RETURN_IF_ERROR(status);
    return Value::String(body);
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e) {
    CallArgs args;
    for (size_t i = 1; i < e.args.size(); ++i) {
      PENG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      const std::string& kw = e.kwarg_names[i - 1];
      if (kw.empty()) args.positional.push_back(std::move(v));
      else args.keyword.emplace_back(kw, std::move(v));
    }
    return args;
  }

  // Evaluates one expression; every value it yields is checked against the nesting limit of
  // values, and a render whose work budget ran out fails here.
  StatusOr<Value> Eval(const Expr& e) {
    PENG_RETURN_IF_ERROR(Enter(e.line, e.column));
    StatusOr<Value> v = EvalImpl(e);
    Leave();
    if (budget_.exhausted()) return WorkLimitError(v.status(), e.line, e.column);
    if (v.ok() && v->depth() > limits_.max_value_depth) {
      return ResourceExhausted(Where(e.line, e.column) + "value nested deeper than " +
                               std::to_string(limits_.max_value_depth) + " levels of lists and dicts");
    }
    return v;
  }
  StatusOr<Value> EvalImpl(const Expr& e);
  StatusOr<Value> EvalDict(const Expr& e);
  StatusOr<Value> EvalBinary(const Expr& e);
  void InstallGlobals(Scope* globals);

  const RenderLimits limits_;
  WorkBudget budget_;  // installed for this thread while the render runs
  std::vector<Value> namespaces_;  // every namespace() this render created
  int64_t steps_ = 0;
  int nesting_ = 0;
  std::vector<Scope> scopes_;  // [0] holds globals; lookups search [floor_, end) then [0]
  size_t floor_ = 1;
  Flow flow_ = Flow::kNormal;
  int64_t iterations_ = 0;
  size_t produced_bytes_ = 0;
  int call_depth_ = 0;
  Value pending_caller_;
};

StatusOr<Value> Interpreter::EvalImpl(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return Lookup(e.name);
    case Expr::Kind::kList: {
      ValueList items;
      for (const ExprPtr& a : e.args) {
        PENG_ASSIGN_OR_RETURN(Value v, Eval(*a));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Expr::Kind::kDict: return EvalDict(e);
    case Expr::Kind::kAttr: {
      PENG_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      if (obj.is_undefined()) return UndefinedError(obj);
      if (HasMethod(obj, e.name)) {
        const std::string name = e.name;
        return Value::Callable(name, [obj, name](const CallArgs& args) { return CallMethod(obj, name, args); });
      }
      if (obj.is_dict() || obj.is_namespace()) {
        const Value* v = obj.Find(e.name);
        if (v) return *v;
      }
      return Value::Undefined(std::string("'") + obj.TypeName() + " object' has no attribute '" + e.name + "'");
    }
    case Expr::Kind::kItem: {
      PENG_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
      PENG_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice: {
      Value parts[4];
      for (int i = 0; i < 4; ++i) {
        if (!e.args[i]) continue;
        PENG_ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i]));
      }
      return Slice(parts[0], parts[1], parts[2], parts[3]);
    }
    case Expr::Kind::kCall: {
      PENG_ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0]));
      if (fn.is_undefined()) return UndefinedError(fn);
      if (!fn.is_callable()) return InvalidArgument(std::string("'") + fn.TypeName() + "' object is not callable");
      PENG_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
      return fn.as_function()(args);
    }
    case Expr::Kind::kFilter: {
      PENG_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
      PENG_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
      return ApplyFilter(e.name, subject, args);
    }
    case Expr::Kind::kTest: {
      PENG_ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
      PENG_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e));
      PENG_ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, subject, args));
      return Value::Bool(result != e.negated);
    }
    case Expr::Kind::kUnary: {
      PENG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
      if (e.name == "not") return Value::Bool(!v.Truthy());
      if (!v.is_number()) {
        if (v.is_undefined()) return UndefinedError(v);
        return InvalidArgument(std::string("bad operand type for unary ") + e.name + ": '" + v.TypeName() + "'");
      }
      if (e.name == "+") return v.is_int() ? Value::Int(v.as_int()) : v;
      if (v.is_int() && v.as_int() == INT64_MIN) return InvalidArgument("integer overflow: -(" + v.Str() + ")");
      return v.is_int() ? Value::Int(-v.as_int()) : Value::Float(-v.as_double());
    }
    case Expr::Kind::kBinary: return EvalBinary(e);
    case Expr::Kind::kCond: {
      PENG_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0]));
      if (c.Truthy()) return Eval(*e.args[1]);
      if (e.args[2]) return Eval(*e.args[2]);
      return Value::Undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  return Internal("unknown expression kind");
}

StatusOr<Value> Interpreter::EvalDict(const Expr& e) {
  ValueDict items;
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    PENG_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
    PENG_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
    if (!k.is_string()) return InvalidArgument("dict keys must be strings");
    WorkBudget::Charge(static_cast<int64_t>(items.size()) * WorkBudget::kElementBytes);
    bool replaced = false;
    for (auto& [old_k, old_v] : items) {
      if (old_k == k.as_string()) {
        old_v = v;
        replaced = true;
      }
    }
    if (!replaced) items.emplace_back(k.as_string(), std::move(v));
  }
  return Value::Dict(std::move(items));
}

StatusOr<Value> Interpreter::EvalBinary(const Expr& e) {
  const std::string& op = e.name;
  PENG_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
  if (op == "and") return a.Truthy() ? Eval(*e.args[1]) : a;
  if (op == "or") return a.Truthy() ? a : Eval(*e.args[1]);
  PENG_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
  if (op == "==") return Value::Bool(a.Equals(b));
  if (op == "!=") return Value::Bool(!a.Equals(b));
  if (op == "~") {
    // Charged before the copies are made (Str() of a non-string is charged as it prints).
    const int64_t known = static_cast<int64_t>((a.is_string() ? a.as_string().size() : 0) +
                                               (b.is_string() ? b.as_string().size() : 0));
    if (!WorkBudget::Charge(2 * known)) return ResourceExhausted("'~': the template's work limit is exhausted");
    return Value::String(a.Str() + b.Str());
  }
  if (op == "in" || op == "not in") {
    PENG_ASSIGN_OR_RETURN(bool found, Contains(b, a));
    return Value::Bool(found == (op == "in"));
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    PENG_ASSIGN_OR_RETURN(int c, Compare(a, b));
    if (op == "<") return Value::Bool(c < 0);
    if (op == "<=") return Value::Bool(c <= 0);
    if (op == ">") return Value::Bool(c > 0);
    return Value::Bool(c >= 0);
  }
  return Arithmetic(op, a, b);
}

void Interpreter::InstallGlobals(Scope* g) {
  const int64_t max_range = limits_.max_loop_iterations;
  (*g)["range"] = Value::Callable("range", [max_range](const CallArgs& args) -> StatusOr<Value> {
    const auto& p = args.positional;
    if (p.empty() || p.size() > 3) return InvalidArgument("range expects 1 to 3 arguments");
    for (const Value& v : p) {
      if (!v.is_int()) return InvalidArgument("range() arguments must be integers");
    }
    const int64_t start = p.size() > 1 ? p[0].as_int() : 0;
    const int64_t stop = p.size() > 1 ? p[1].as_int() : p[0].as_int();
    const int64_t step = p.size() > 2 ? p[2].as_int() : 1;
    if (step == 0) return InvalidArgument("range() arg 3 must not be zero");
    // Length, in unsigned arithmetic (the distance may exceed INT64_MAX), checked and charged
    // before anything is built.
    uint64_t count = 0;
    if (step > 0 && start < stop) {
      count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
    } else if (step < 0 && start > stop) {
      count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / (0 - static_cast<uint64_t>(step)) + 1;
    }
    if (count > static_cast<uint64_t>(max_range)) {
      return ResourceExhausted("range() too large: " + std::to_string(count) + " items, at most " +
                               std::to_string(max_range));
    }
    if (!WorkBudget::Charge(static_cast<int64_t>(count) * WorkBudget::kElementBytes)) {
      return ResourceExhausted("range(): the template's work limit is exhausted");
    }
    WorkBudget::Pause charged;  // the list below is paid for
    ValueList out;
    out.reserve(count);
    int64_t i = start;
    for (uint64_t k = 0; k < count; ++k) {
      out.push_back(Value::Int(i));
      if (k + 1 < count) i += step;  // stays before stop: cannot overflow
    }
    return Value::List(std::move(out));
  });
  auto make_dict = [this](bool ns) {
    return [this, ns](const CallArgs& args) -> StatusOr<Value> {
      ValueDict items;
      for (const Value& p : args.positional) {
        if (!p.is_dict()) return InvalidArgument("expected a mapping argument");
        items.insert(items.end(), p.as_dict().begin(), p.as_dict().end());
      }
      for (const auto& [k, v] : args.keyword) items.emplace_back(k, v);
      if (!ns) return Value::Dict(std::move(items));
      Value v = Value::Namespace(std::move(items));
      namespaces_.push_back(v);
      return v;
    };
  };
  (*g)["namespace"] = Value::Callable("namespace", make_dict(true));
  (*g)["dict"] = Value::Callable("dict", make_dict(false));
  (*g)["raise_exception"] = Value::Callable("raise_exception", [](const CallArgs& args) -> StatusOr<Value> {
    const Value* msg = args.Get(0, "message");
    return InvalidArgument("raise_exception: " + (msg ? msg->Str() : std::string()));
  });
  (*g)["strftime_now"] = Value::Callable("strftime_now", [](const CallArgs& args) -> StatusOr<Value> {
    const Value* fmt = args.Get(0, "format");
    if (!fmt || !fmt->is_string()) return InvalidArgument("strftime_now needs a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), fmt->as_string().c_str(), &tm);
    return Value::String(std::string(buf, n));
  });
}

}  // namespace

StatusOr<std::string> RenderTemplate(const NodeList& nodes, const Value& context, const RenderLimits& limits) {
  if (context.depth() > limits.max_value_depth) {
    return ResourceExhausted("template context nested deeper than " + std::to_string(limits.max_value_depth) +
                             " levels of lists and dicts");
  }
  Interpreter interp(context, limits);
  std::string out;
  PENG_RETURN_IF_ERROR(interp.ExecList(nodes, &out));
  return out;
}

}  // namespace peng::tmpl
