// OpenAI tool calling for /v1/chat/completions, both directions:
//
// Request side: `tools` (function tools: name [a-zA-Z0-9_-]{1,64}, description, parameters as a
// JSON Schema object), `tool_choice` ("none" | "auto" | "required" |
// {"type": "function", "function": {"name": ...}} naming one of the tools) and
// `parallel_tool_calls` (default true) are validated into a ToolRequest; assistant messages
// with `tool_calls` and `tool` messages are checked and turned into what chat templates expect
// (arguments as JSON objects, as transformers/vLLM pass them, except for templates that
// concatenate the argument string, DeepSeek's); `tools` goes into the template context (also
// with tool_choice "none", like vLLM). "required" and a named choice are enforced with a GBNF
// grammar (ToolCallGrammar) that writes the model family's own call syntax.
//
// Output side: per-family parsers turn the model's text back into content + tool calls:
//   hermes       Hermes / Qwen2.5: <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>,
//                any number of them, text before/between them is content; small Qwen models
//                often leave the tags out, so an output that is nothing but such JSON objects
//                (';'-separated, possibly in a ```json fence) naming declared tools counts as
//                calls too (such output is held back until it ends);
//   llama3_json  Llama 3.x: the whole output is {"name": N, "parameters": {...}} (or
//                "arguments"), several separated by ';', optionally after <|python_tag|>;
//   deepseek_v3  DeepSeek V2.5/V3: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N
//                \n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (the V3.1 form
//                <｜tool▁call▁begin｜>N<｜tool▁sep｜>ARGS<｜tool▁call▁end｜> is read too).
// The family comes from `peng serve --tool-call-parser` or, with "auto", from the chat
// template's text. A call that does not parse (bad JSON, no name, arguments not an object)
// stays content, marker text included. Names the request did not declare are kept (vLLM does
// the same; the client sees what the model called). Each call gets an id "call_" + 24 random
// alphanumerics; arguments are re-serialized as compact JSON text (key order kept).
//
// The streaming parser (ToolCallStreamParser) takes text deltas and returns the content that is
// safe to send now (text that may be the start of a marker is held back) and each tool call once
// it is complete; the full-text parser is the streaming parser fed everything at once, so both
// always agree. Whitespace next to parsed calls is not content; an output that holds only calls
// and whitespace has empty content.
//
// Pure functions and single-owner objects; thread-safe as values.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace peng::server {

// The model family's tool-call syntax. kAuto: detect from the chat template.
enum class ToolCallFormat { kAuto, kNone, kHermes, kLlama3Json, kDeepSeekV3 };

// "auto" | "none" | "hermes" | "llama3_json" | "deepseek_v3" (InvalidArgument otherwise).
StatusOr<ToolCallFormat> ParseToolCallFormat(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);
// The family whose call syntax the template writes; kNone when none is recognized.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);

// Bounds on what one request may declare.
inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolNameBytes = 64;

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // the JSON Schema as sent; null when absent
};

// The tool fields of a request.
struct ToolRequest {
  // The `tools` array for the template; null if none. Ordered: the server puts the client's
  // key order back (`tools | tojson` shows it), as transformers renders the dicts it is given.
  nlohmann::ordered_json tools;
  std::vector<ToolSpec> specs;
  ToolChoice choice = ToolChoice::kAuto;
  std::string named;              // kNamed: the function
  bool parallel = true;           // parallel_tool_calls
  // Whether the output is parsed for tool calls.
  bool parse_output() const { return !specs.empty() && choice != ToolChoice::kNone; }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const ToolSpec& s : specs) out.push_back(s.name);
    return out;
  }
  // Whether a call is forced (by grammar).
  bool forced() const {
    return !specs.empty() && (choice == ToolChoice::kRequired || choice == ToolChoice::kNamed);
  }
};

// A request error, answered as a 400 with this message, param and code.
struct ToolError {
  std::string message;
  std::string param;
  std::string code = "invalid_value";
};

// Reads tools / tool_choice / parallel_tool_calls of a chat request body (a JSON object).
// A forced tool_choice together with a response_format that constrains the output
// (json_object / json_schema) is an error too.
std::optional<ToolError> ParseToolFields(const nlohmann::ordered_json& body, ToolRequest* out);

// Checks message `index` of the request for tool use: an assistant message's `tool_calls`
// (an array of {"id"?, "type": "function", "function": {"name", "arguments"}}; arguments a
// JSON text or an object) and a tool message's `tool_call_id` (a string). `normalized` is the
// message after content flattening: an assistant message with tool_calls and null/absent
// content keeps content null there (templates test `content is none`).
std::optional<ToolError> CheckToolMessage(const nlohmann::ordered_json& message, size_t index,
                                          nlohmann::ordered_json* normalized);

// The messages as the chat template gets them: tool_calls' arguments parsed into JSON
// objects in their key order (arguments_as_objects) or kept as JSON text.
nlohmann::ordered_json MessagesForTemplate(const nlohmann::ordered_json& messages,
                                           bool arguments_as_objects);
// MessagesForTemplate as `chat_template` wants them (TemplateWantsArgumentObjects); a template
// that knows nothing of tool_calls gets "" for a null content (it would fail on null).
nlohmann::ordered_json MessagesForChatTemplate(const nlohmann::ordered_json& messages,
                                               std::string_view chat_template);
// Whether the template wants argument objects (not DeepSeek's string concatenation).
bool TemplateWantsArgumentObjects(std::string_view chat_template);

// The GBNF grammar (gbnf_builder.h) that forces `format`'s call syntax with a tool of the
// request (the named one for kNamed) and its parameters' schema; one or more calls when
// parallel. kNone/kAuto write the hermes syntax. InvalidArgument for a parameters schema the
// grammar builder does not support (message names the tool).
StatusOr<std::string> ToolCallGrammar(const ToolRequest& request, ToolCallFormat format);

// One parsed call.
struct ToolCall {
  std::string id;         // "call_" + 24 alphanumerics
  std::string name;
  std::string arguments;  // compact JSON text
  // {"id", "type": "function", "function": {"name", "arguments"}}
  nlohmann::json ToJson() const;
  // The streamed delta of a complete call: {"index", "id", "type", "function": {...}}.
  nlohmann::json ToDeltaJson(int index) const;
};

std::string NewToolCallId();

struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};

// Splits a whole output into content and calls (the streaming parser, fed at once).
// `tool_names`: the request's tools (hermes: bare JSON calls must name one of them).
ParsedToolOutput ParseToolCalls(std::string_view text, ToolCallFormat format,
                                const std::vector<std::string>& tool_names = {});

class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallFormat format,
                                std::vector<std::string> tool_names = {});

  // Feeds a text delta; returns the content that may be sent now and the calls completed.
  ParsedToolOutput Push(std::string_view delta);
  // End of output: what was held back (content, or the last call).
  ParsedToolOutput Finish();
  // Calls returned so far.
  int calls() const { return calls_; }

 private:
  void Scan(ParsedToolOutput* out, bool final);
  void ScanMarkers(ParsedToolOutput* out, bool final);
  void ScanLlama(ParsedToolOutput* out, bool final);
  // Whether the output so far is still undecided or held as a bare JSON call attempt
  // (lead_mode_); false = go on with the family's normal scan.
  bool HoldBareJson(bool final);
  // What may precede bare JSON calls: llama <|python_tag|>, hermes a ```json fence.
  std::string_view LeadMarker() const;
  void EmitContent(std::string_view text, ParsedToolOutput* out);
  void EmitCall(ToolCall call, ParsedToolOutput* out);
  void FlushContentAtEnd(ParsedToolOutput* out);

  ToolCallFormat format_;
  std::vector<std::string> tool_names_;
  std::string pending_;       // received, not yet classified
  bool in_block_ = false;     // inside open..close marker
  size_t close_scan_ = 0;     // pending_ offset already searched for the close marker
  std::string ws_hold_;       // trailing whitespace of content, held back
  std::string ws_before_block_;  // ws_hold_ when the current block opened
  bool after_call_ = false;   // drop leading whitespace (right after a parsed call)
  bool any_content_ = false;  // non-whitespace content emitted
  int calls_ = 0;
  // Llama, and hermes' untagged calls: 0 = deciding, 1 = not bare JSON (llama: content;
  // hermes: marker scan), 2 = output starts with '{': held until the end.
  int lead_mode_ = 0;
  bool finished_ = false;
};

}  // namespace peng::server
