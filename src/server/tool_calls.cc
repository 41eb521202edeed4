#include "server/tool_calls.h"

#include <algorithm>
#include <random>
#include <set>

#include "formats/json_util.h"
#include "grammar/gbnf_builder.h"

namespace peng::server {
namespace {

using json = nlohmann::ordered_json;  // request bodies keep the client's key order
using nlohmann::ordered_json;

// Call markers. DeepSeek's are written with U+FF5C (fullwidth vertical line) and U+2581
// (lower one eighth block), as in the DeepSeek V2.5/V3 vocabularies and templates.
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kJsonFence = "```json";

// Calls nested deeper than this stay content (their JSON is re-serialized recursively).
constexpr int kMaxCallDepth = 64;

// Whether JSON text nests arrays/objects deeper than kMaxCallDepth (brackets in strings
// do not count).
bool TooDeep(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxCallDepth) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// Parses JSON text of a call; discarded when invalid or too deep.
ordered_json ParseCallJson(std::string_view text) {
  if (TooDeep(text)) return ordered_json(ordered_json::value_t::discarded);
  return ordered_json::parse(text, nullptr, false);
}

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

ToolError Invalid(std::string message, std::string param, std::string code = "invalid_value") {
  return ToolError{std::move(message), std::move(param), std::move(code)};
}

ToolError WrongType(const std::string& field, const char* expected, const json& got,
                    const std::string& param) {
  return Invalid("Invalid type for '" + field + "': expected " + expected + ", but got " +
                     JsonTypeName(got.type()) + " instead.",
                 param, "invalid_type");
}

bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ToolError> ParseTool(const json& t, size_t i, ToolSpec* spec) {
  const std::string where = "tools[" + std::to_string(i) + "]";
  if (!t.is_object()) return WrongType(where, "an object", t, "tools");
  const json* type = Field(t, "type");
  if (!type || !type->is_string()) {
    return Invalid(where + ".type must be \"function\"", "tools", "missing_required");
  }
  if (*type != "function") {
    return Invalid(where + ".type '" + type->get<std::string>() +
                       "' is not supported: only \"function\" tools are",
                   "tools");
  }
  const json* fn = Field(t, "function");
  if (!fn) return Invalid(where + ".function is required", "tools", "missing_required");
  if (!fn->is_object()) return WrongType(where + ".function", "an object", *fn, "tools");
  const json* name = Field(*fn, "name");
  if (!name) return Invalid(where + ".function.name is required", "tools", "missing_required");
  if (!name->is_string()) return WrongType(where + ".function.name", "a string", *name, "tools");
  spec->name = name->get<std::string>();
  if (!ValidToolName(spec->name)) {
    return Invalid(where + ".function.name '" + spec->name +
                       "' must be 1 to 64 characters a-z, A-Z, 0-9, '_' or '-'",
                   "tools");
  }
  if (const json* d = Field(*fn, "description"); d && !d->is_string()) {
    return WrongType(where + ".function.description", "a string", *d, "tools");
  }
  if (const json* s = Field(*fn, "strict"); s && !s->is_boolean()) {
    return WrongType(where + ".function.strict", "a boolean", *s, "tools");
  }
  if (const json* p = Field(*fn, "parameters")) {
    if (!p->is_object()) return WrongType(where + ".function.parameters", "an object", *p, "tools");
    if (const json* pt = Field(*p, "type"); pt && *pt != "object") {
      return Invalid(where + ".function.parameters must be a JSON Schema of type \"object\"",
                     "tools");
    }
    spec->parameters = *p;
  }
  return std::nullopt;
}

// The arguments of a call as a JSON value: a JSON text (parsed) or an object.
std::optional<ordered_json> ArgumentsValue(const json& args) {
  if (args.is_string()) {
    ordered_json v = ordered_json::parse(args.get<std::string>(), nullptr, false);
    if (v.is_discarded()) return std::nullopt;
    return v;
  }
  if (args.is_object()) return ordered_json(args);
  return std::nullopt;
}

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// A call from a parsed object {"name": N, "arguments"|"parameters": {...} or a JSON text}.
std::optional<ToolCall> CallFromObject(const ordered_json& obj) {
  if (!obj.is_object()) return std::nullopt;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  auto args = obj.find("arguments");
  if (args == obj.end()) args = obj.find("parameters");
  if (args == obj.end()) return std::nullopt;
  ordered_json value = *args;
  if (value.is_string()) value = ParseCallJson(args->get<std::string>());
  if (!value.is_object()) return std::nullopt;
  ToolCall call;
  call.id = NewToolCallId();
  call.name = name->get<std::string>();
  call.arguments = Dump(value);
  return call;
}

std::optional<ToolCall> CallFromJsonText(std::string_view text) {
  ordered_json obj = ParseCallJson(Trim(text));
  if (obj.is_discarded()) return std::nullopt;
  return CallFromObject(obj);
}

// DeepSeek: "function<｜tool▁sep｜>NAME\n```json\nARGS\n```" (V2.5/V3) or "NAME<｜tool▁sep｜>ARGS"
// (V3.1).
std::optional<ToolCall> DeepSeekCall(std::string_view body) {
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view before = Trim(body.substr(0, sep));
  std::string_view after = body.substr(sep + kDsSep.size());
  std::string_view name, args;
  if (before == "function") {
    const size_t nl = after.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;
    name = Trim(after.substr(0, nl));
    args = Trim(after.substr(nl + 1));
  } else {
    name = before;
    args = Trim(after);
  }
  if (StartsWith(args, "```json")) {
    args.remove_prefix(7);
  } else if (StartsWith(args, "```")) {
    args.remove_prefix(3);
  }
  args = Trim(args);
  if (args.size() >= 3 && args.substr(args.size() - 3) == "```") args.remove_suffix(3);
  if (name.empty()) return std::nullopt;
  ordered_json value = ParseCallJson(Trim(args));
  if (value.is_discarded() || !value.is_object()) return std::nullopt;
  ToolCall call;
  call.id = NewToolCallId();
  call.name = std::string(name);
  call.arguments = Dump(value);
  return call;
}

// The end of the JSON object starting at s[start] == '{' (one past its '}'), or npos when it
// does not close in s. Brackets inside strings do not count.
size_t ObjectEnd(std::string_view s, size_t start) {
  int depth = 0;
  size_t end = std::string_view::npos;
  ScanJsonBrackets(s, start, [&](size_t i, char c) {
    if (c == '{' || c == '[') {
      ++depth;
      return true;
    }
    if (--depth == 0) end = i + 1;
    return depth > 0;  // closed (found) or unbalanced (npos): stop
  });
  return end;
}

// Llama 3 JSON: [<|python_tag|>] obj (; obj)*, each a call. nullopt if anything else.
std::optional<std::vector<ToolCall>> LlamaCalls(std::string_view text) {
  std::string_view s = Trim(text);
  if (StartsWith(s, kPythonTag)) s = Trim(s.substr(kPythonTag.size()));
  std::vector<ToolCall> calls;
  size_t i = 0;
  while (true) {
    while (i < s.size() && IsSpace(s[i])) ++i;
    if (i >= s.size() || s[i] != '{') return std::nullopt;
    const size_t end = ObjectEnd(s, i);
    if (end == std::string_view::npos) return std::nullopt;
    std::optional<ToolCall> call = CallFromJsonText(s.substr(i, end - i));
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    i = end;
    while (i < s.size() && IsSpace(s[i])) ++i;
    if (i == s.size()) return calls;
    if (s[i] != ';') return std::nullopt;
    ++i;
  }
}

struct Markers {
  std::string_view open, close;
  std::vector<std::string_view> drop;  // dropped from the output (DeepSeek's outer markers)
};

Markers MarkersFor(ToolCallFormat f) {
  if (f == ToolCallFormat::kDeepSeekV3) return {kDsCallBegin, kDsCallEnd, {kDsCallsBegin, kDsCallsEnd}};
  return {kHermesOpen, kHermesClose, {}};
}

}  // namespace

StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name) {
  if (name == "auto") return ToolCallFormat::kAuto;
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  return InvalidArgument("unknown tool-call parser '" + std::string(name) +
                         "': expected auto, none, hermes, llama3_json or deepseek_v3");
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kAuto: return "auto";
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kDeepSeekV3: return "deepseek_v3";
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has(kHermesOpen)) return ToolCallFormat::kHermes;
  if (has("tool▁call▁begin") || has("tool▁calls▁begin")) return ToolCallFormat::kDeepSeekV3;
  if (has(kPythonTag) ||
      (has("<|start_header_id|>") && (has("ipython") || has("\"parameters\"")))) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

bool TemplateWantsArgumentObjects(std::string_view chat_template) {
  return DetectToolCallFormat(chat_template) != ToolCallFormat::kDeepSeekV3;
}

std::optional<ToolError> ParseToolFields(const ordered_json& body, ToolRequest* out) {
  *out = ToolRequest();
  if (const json* tools = Field(body, "tools")) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools, "tools");
    if (tools->size() > kMaxTools) {
      return Invalid("tools has " + std::to_string(tools->size()) + " entries: at most " +
                         std::to_string(kMaxTools) + " are allowed",
                     "tools");
    }
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      ToolSpec spec;
      if (auto e = ParseTool((*tools)[i], i, &spec)) return e;
      if (!names.insert(spec.name).second) {
        return Invalid("tools: the function name '" + spec.name + "' appears twice", "tools");
      }
      out->specs.push_back(std::move(spec));
    }
    if (!tools->empty()) out->tools = *tools;
  }
  if (const json* p = Field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) {
      return WrongType("parallel_tool_calls", "a boolean", *p, "parallel_tool_calls");
    }
    out->parallel = p->get<bool>();
  }
  const json* choice = Field(body, "tool_choice");
  if (!choice) {
    out->choice = out->specs.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
    return std::nullopt;
  }
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") {
      out->choice = ToolChoice::kNone;
    } else if (c == "auto") {
      out->choice = ToolChoice::kAuto;
    } else if (c == "required") {
      out->choice = ToolChoice::kRequired;
    } else {
      return Invalid("Invalid value for 'tool_choice': '" + c +
                         "'. Expected 'none', 'auto', 'required' or a named function.",
                     "tool_choice");
    }
  } else if (choice->is_object()) {
    const json* type = Field(*choice, "type");
    if (!type || *type != "function") {
      return Invalid("tool_choice.type must be \"function\"", "tool_choice");
    }
    const json* fn = Field(*choice, "function");
    const json* name = fn && fn->is_object() ? Field(*fn, "name") : nullptr;
    if (!name || !name->is_string()) {
      return Invalid("tool_choice.function.name must be a string", "tool_choice");
    }
    out->choice = ToolChoice::kNamed;
    out->named = name->get<std::string>();
    if (!out->specs.empty() &&
        std::none_of(out->specs.begin(), out->specs.end(),
                     [&](const ToolSpec& s) { return s.name == out->named; })) {
      return Invalid("tool_choice names the function '" + out->named +
                         "', which is not in tools",
                     "tool_choice");
    }
  } else {
    return WrongType("tool_choice", "a string or an object", *choice, "tool_choice");
  }
  if (out->specs.empty() &&
      (out->choice == ToolChoice::kRequired || out->choice == ToolChoice::kNamed)) {
    return Invalid("tool_choice '" +
                       std::string(out->choice == ToolChoice::kRequired ? "required"
                                                                        : "function") +
                       "' needs tools",
                   "tool_choice");
  }
  if (out->forced()) {
    if (const json* rf = Field(body, "response_format"); rf && rf->is_object()) {
      auto t = rf->find("type");
      if (t != rf->end() && t->is_string() && *t != "text") {
        return Invalid("response_format '" + t->get<std::string>() +
                           "' cannot be combined with a forced tool_choice",
                       "tool_choice");
      }
    }
  }
  return std::nullopt;
}

std::optional<ToolError> CheckToolMessage(const ordered_json& m, size_t index,
                                          ordered_json* normalized) {
  if (!m.is_object()) return std::nullopt;
  const std::string where = "messages[" + std::to_string(index) + "]";
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return std::nullopt;
  if (*role == "tool") {
    if (const json* id = Field(m, "tool_call_id"); id && !id->is_string()) {
      return WrongType(where + ".tool_call_id", "a string", *id, "messages");
    }
    return std::nullopt;
  }
  const json* calls = Field(m, "tool_calls");
  if (*role != "assistant" || !calls) return std::nullopt;
  if (!calls->is_array()) return WrongType(where + ".tool_calls", "an array", *calls, "messages");
  if (calls->size() > kMaxTools) {
    return Invalid(where + ".tool_calls has " + std::to_string(calls->size()) +
                       " entries: at most " + std::to_string(kMaxTools) + " are allowed",
                   "messages");
  }
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string w = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) return WrongType(w, "an object", c, "messages");
    if (const json* id = Field(c, "id"); id && !id->is_string()) {
      return WrongType(w + ".id", "a string", *id, "messages");
    }
    if (const json* t = Field(c, "type"); t && *t != "function") {
      return Invalid(w + ".type must be \"function\"", "messages");
    }
    const json* fn = Field(c, "function");
    if (!fn || !fn->is_object()) {
      return Invalid(w + ".function must be an object", "messages");
    }
    const json* name = Field(*fn, "name");
    if (!name || !name->is_string()) {
      return Invalid(w + ".function.name must be a string", "messages");
    }
    const json* args = Field(*fn, "arguments");
    if (!args || !(args->is_string() || args->is_object())) {
      return Invalid(w + ".function.arguments must be a JSON string", "messages");
    }
    if (!ArgumentsValue(*args)) {
      return Invalid(w + ".function.arguments is not valid JSON", "messages");
    }
  }
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) (*normalized)["content"] = nullptr;
  return std::nullopt;
}

ordered_json MessagesForTemplate(const ordered_json& messages, bool arguments_as_objects) {
  ordered_json out = messages;
  for (ordered_json& m : out) {
    if (!m.is_object()) continue;
    auto calls = m.find("tool_calls");
    if (calls == m.end() || !calls->is_array()) continue;
    for (ordered_json& c : *calls) {
      if (!c.is_object()) continue;
      auto fn = c.find("function");
      if (fn == c.end() || !fn->is_object()) continue;
      auto args = fn->find("arguments");
      if (args == fn->end()) continue;
      if (arguments_as_objects && args->is_string()) {
        ordered_json v = ordered_json::parse(args->get<std::string>(), nullptr, false);
        if (!v.is_discarded()) *args = std::move(v);
      } else if (!arguments_as_objects && !args->is_string()) {
        *args = args->dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      }
      if (c.find("type") == c.end()) c["type"] = "function";
    }
  }
  return out;
}

ordered_json MessagesForChatTemplate(const ordered_json& messages,
                                     std::string_view chat_template) {
  ordered_json out = MessagesForTemplate(messages, TemplateWantsArgumentObjects(chat_template));
  if (chat_template.find("tool_calls") == std::string_view::npos) {
    for (ordered_json& m : out) {
      if (m.is_object() && m.contains("content") && m["content"].is_null()) m["content"] = "";
    }
  }
  return out;
}

StatusOr<std::string> ToolCallGrammar(const ToolRequest& request, ToolCallFormat format) {
  // Per family: around all calls, around each call, between calls, and each call's text
  // before the name, between name and arguments, after the arguments.
  struct Syntax {
    std::string all_open, all_close, call_open, call_close, sep, before_name, after_name,
        after_args;
  };
  Syntax s;
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      s = {"", "", "", "", "; ", "{\"name\": \"", "\", \"parameters\": ", "}"};
      break;
    case ToolCallFormat::kDeepSeekV3:
      s = {std::string(kDsCallsBegin), std::string(kDsCallsEnd), std::string(kDsCallBegin),
           std::string(kDsCallEnd), "\n", "function" + std::string(kDsSep), "\n```json\n",
           "\n```"};
      break;
    default:  // hermes, and the fallback when the model has no known syntax
      s = {"", "", std::string(kHermesOpen) + "\n", "\n" + std::string(kHermesClose), "\n",
           "{\"name\": \"", "\", \"arguments\": ", "}"};
      break;
  }
  auto quote = [](const std::string& text) {
    return text.empty() ? std::string() : grammar::GbnfBuilder::Quote(text) + " ";
  };
  grammar::GbnfBuilder b;
  std::string alternatives;
  for (size_t i = 0; i < request.specs.size(); ++i) {
    const ToolSpec& spec = request.specs[i];
    if (request.choice == ToolChoice::kNamed && spec.name != request.named) continue;
    std::string args;
    const json& p = spec.parameters;
    if (p.is_null() || p.empty()) {
      args = b.AddJsonObject();
    } else {
      StatusOr<std::string> rule = b.AddJsonSchema(p);
      if (!rule.ok()) {
        return InvalidArgument("tools[" + std::to_string(i) + "] ('" + spec.name +
                               "'): parameters: " + rule.status().message());
      }
      args = *rule;
    }
    const std::string call = b.AddRule(
        "tool-call", quote(s.call_open + s.before_name + spec.name + s.after_name) + args + " " +
                         quote(s.after_args + s.call_close));
    alternatives += (alternatives.empty() ? "" : " | ") + call;
  }
  if (alternatives.empty()) return InvalidArgument("tool_choice: no such tool");
  const std::string one = b.AddRule("tool-calls-one", alternatives);
  std::string body = quote(s.all_open) + one;
  if (request.parallel) body += " (" + quote(s.sep) + one + ")*";
  if (!s.all_close.empty()) body += " " + grammar::GbnfBuilder::Quote(s.all_close);
  const std::string root = b.AddRule("tool-calls", body);
  return b.Build(root);
}

nlohmann::json ToolCall::ToJson() const {
  return nlohmann::json{{"id", id},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", arguments}}}};
}

nlohmann::json ToolCall::ToDeltaJson(int index) const {
  return nlohmann::json{{"index", index},
              {"id", id},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", arguments}}}};
}

std::string NewToolCallId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kAlnum[] =
      "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::uniform_int_distribution<int> pick(0, 61);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[pick(rng)];
  return id;
}

ParsedToolOutput ParseToolCalls(std::string_view text, ToolCallFormat format,
                                const std::vector<std::string>& tool_names) {
  ToolCallStreamParser p(format, tool_names);
  ParsedToolOutput out = p.Push(text);
  ParsedToolOutput end = p.Finish();
  out.content += end.content;
  for (ToolCall& c : end.calls) out.calls.push_back(std::move(c));
  return out;
}

ToolCallStreamParser::ToolCallStreamParser(ToolCallFormat format,
                                           std::vector<std::string> tool_names)
    : format_(format), tool_names_(std::move(tool_names)) {}

std::string_view ToolCallStreamParser::LeadMarker() const {
  return format_ == ToolCallFormat::kLlama3Json ? kPythonTag : kJsonFence;
}

bool ToolCallStreamParser::HoldBareJson(bool final) {
  if (lead_mode_ == 0) {
    const std::string_view s = Trim(pending_);
    if (s.empty()) {
      if (!final) return true;
      lead_mode_ = 1;
    } else if (s.front() == '{' || StartsWith(s, LeadMarker())) {
      lead_mode_ = 2;
    } else if (StartsWith(LeadMarker(), s) && !final) {
      return true;  // may still become the marker
    } else {
      lead_mode_ = 1;
    }
  }
  return lead_mode_ == 2 && !final;
}

ParsedToolOutput ToolCallStreamParser::Push(std::string_view delta) {
  ParsedToolOutput out;
  if (finished_) return out;
  pending_.append(delta);
  Scan(&out, /*final=*/false);
  return out;
}

ParsedToolOutput ToolCallStreamParser::Finish() {
  ParsedToolOutput out;
  if (finished_) return out;
  Scan(&out, /*final=*/true);
  FlushContentAtEnd(&out);
  finished_ = true;
  return out;
}

void ToolCallStreamParser::Scan(ParsedToolOutput* out, bool final) {
  switch (format_) {
    case ToolCallFormat::kHermes:
      if (!tool_names_.empty()) {  // untagged calls: {"name": ..., "arguments": ...}
        if (HoldBareJson(final)) return;
        if (lead_mode_ == 2) {
          lead_mode_ = 1;
          std::string_view body = Trim(pending_);
          if (StartsWith(body, kJsonFence)) {  // ```json\n{...}\n```
            body = Trim(body.substr(kJsonFence.size()));
            if (body.size() >= 3 && body.substr(body.size() - 3) == "```") body.remove_suffix(3);
          }
          std::optional<std::vector<ToolCall>> calls = LlamaCalls(body);
          const bool known =
              calls && std::all_of(calls->begin(), calls->end(), [&](const ToolCall& c) {
                return std::find(tool_names_.begin(), tool_names_.end(), c.name) !=
                       tool_names_.end();
              });
          if (known) {
            for (ToolCall& c : *calls) EmitCall(std::move(c), out);
            pending_.clear();
            return;
          }
        }
      }
      return ScanMarkers(out, final);
    case ToolCallFormat::kDeepSeekV3:
      return ScanMarkers(out, final);
    case ToolCallFormat::kLlama3Json:
      return ScanLlama(out, final);
    default:
      EmitContent(pending_, out);
      pending_.clear();
  }
}

void ToolCallStreamParser::EmitContent(std::string_view text, ParsedToolOutput* out) {
  if (after_call_) {
    while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
    if (text.empty()) return;
    after_call_ = false;
  }
  size_t body = text.size();
  while (body > 0 && IsSpace(text[body - 1])) --body;
  if (body > 0) {
    out->content += ws_hold_;
    out->content.append(text.substr(0, body));
    ws_hold_.assign(text.substr(body));
    any_content_ = true;
  } else {
    ws_hold_.append(text);
  }
}

void ToolCallStreamParser::EmitCall(ToolCall call, ParsedToolOutput* out) {
  out->calls.push_back(std::move(call));
  ++calls_;
  after_call_ = true;
  ws_hold_.clear();
}

void ToolCallStreamParser::FlushContentAtEnd(ParsedToolOutput* out) {
  // Without calls the content is the text as it came; with calls, trailing whitespace goes.
  if (calls_ == 0) out->content += ws_hold_;
  ws_hold_.clear();
}

void ToolCallStreamParser::ScanMarkers(ParsedToolOutput* out, bool final) {
  const Markers mk = MarkersFor(format_);
  while (true) {
    if (in_block_) {
      const size_t pos = pending_.find(mk.close, close_scan_);
      if (pos == std::string::npos && !final) {
        close_scan_ = pending_.size() >= mk.close.size() ? pending_.size() - mk.close.size() + 1
                                                          : 0;
        return;
      }
      const bool closed = pos != std::string::npos;
      const std::string body = pending_.substr(0, closed ? pos : pending_.size());
      pending_.erase(0, closed ? pos + mk.close.size() : pending_.size());
      in_block_ = false;
      close_scan_ = 0;
      std::optional<ToolCall> call = format_ == ToolCallFormat::kDeepSeekV3
                                         ? DeepSeekCall(body)
                                         : CallFromJsonText(body);
      if (call) {
        EmitCall(std::move(*call), out);
      } else {  // not a call: the text stays content, markers included
        ws_hold_ = ws_before_block_;
        EmitContent(std::string(mk.open) + body + (closed ? std::string(mk.close) : ""), out);
      }
      continue;
    }
    // Outside a block: the earliest marker.
    size_t pos = std::string::npos;
    std::string_view which;
    auto consider = [&](std::string_view m) {
      const size_t p = pending_.find(m);
      if (p < pos) {
        pos = p;
        which = m;
      }
    };
    consider(mk.open);
    for (std::string_view d : mk.drop) consider(d);
    if (pos != std::string::npos) {
      EmitContent(std::string_view(pending_).substr(0, pos), out);
      pending_.erase(0, pos + which.size());
      if (which == mk.open) {
        in_block_ = true;
        close_scan_ = 0;
        ws_before_block_ = ws_hold_;
        ws_hold_.clear();
      }
      continue;
    }
    // No marker: hold back a tail that could be the start of one.
    size_t hold = 0;
    if (!final) {
      auto longest_prefix_tail = [&](std::string_view m) {
        const size_t max_k = std::min(pending_.size(), m.size() - 1);
        for (size_t k = max_k; k > hold; --k) {
          if (std::string_view(pending_).substr(pending_.size() - k) == m.substr(0, k)) {
            hold = k;
            return;
          }
        }
      };
      longest_prefix_tail(mk.open);
      for (std::string_view d : mk.drop) longest_prefix_tail(d);
    }
    EmitContent(std::string_view(pending_).substr(0, pending_.size() - hold), out);
    pending_.erase(0, pending_.size() - hold);
    return;
  }
}

void ToolCallStreamParser::ScanLlama(ParsedToolOutput* out, bool final) {
  if (HoldBareJson(final)) return;  // a call attempt is decided on the whole output
  if (lead_mode_ == 1) {
    EmitContent(pending_, out);
    pending_.clear();
    return;
  }
  if (std::optional<std::vector<ToolCall>> calls = LlamaCalls(pending_)) {
    for (ToolCall& c : *calls) EmitCall(std::move(c), out);
  } else {
    EmitContent(pending_, out);
  }
  pending_.clear();
}

}  // namespace peng::server
