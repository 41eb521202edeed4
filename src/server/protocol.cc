#include "server/protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "formats/json_util.h"
#include "grammar/gbnf_builder.h"
#include "tokenizer/tokenizer.h"
#include "template/chat_template.h"

namespace peng::server {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxN = 128;
constexpr int kMaxLogprobs = 20;

ApiError InvalidType(const std::string& field, const char* expected, const json& got) {
  return BadRequest("Invalid type for '" + field + "': expected " + expected + ", but got " +
                        JsonTypeName(got.type()) + " instead.",
                    field, "invalid_type");
}

// Readers of optional fields: absent or null keeps *out; a wrong type is an error.
class FieldReader {
 public:
  explicit FieldReader(const json& body) : body_(body) {}
  const json& body() const { return body_; }

  const json* Get(const char* name) const {
    auto it = body_.find(name);
    if (it == body_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  MaybeError Bool(const char* name, bool* out) const {
    const json* v = Get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return InvalidType(name, "a boolean", *v);
    *out = v->get<bool>();
    return std::nullopt;
  }
  MaybeError Float(const char* name, float* out) const {
    const json* v = Get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) return InvalidType(name, "a number", *v);
    const double d = v->get<double>();
    *out = static_cast<float>(d);
    // A non-zero value too small for a float stays non-zero (top_p = 1e-50 is in (0, 1]).
    if (*out == 0.0f && d != 0.0) {
      *out = std::copysign(std::numeric_limits<float>::denorm_min(), static_cast<float>(d));
    }
    return std::nullopt;
  }
  // Integers; integral decimals (16.0) are accepted, like pydantic's lax mode.
  MaybeError Int64(const char* name, int64_t* out) const {
    const json* v = Get(name);
    if (!v) return std::nullopt;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
        return BadRequest("Invalid '" + std::string(name) + "': integer out of range.", name,
                          "invalid_value");
      }
      *out = v->get<int64_t>();
      return std::nullopt;
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::nearbyint(d) == d && std::fabs(d) < 9e18) {
        *out = static_cast<int64_t>(d);
        return std::nullopt;
      }
    }
    return InvalidType(name, "an integer", *v);
  }
  // An int field kept in an int: values outside int range are out of range.
  MaybeError Int(const char* name, int* out) const {
    int64_t v = *out;
    if (auto e = Int64(name, &v)) return e;
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      return BadRequest(std::string(name) + " = " + std::to_string(v) + ": out of range", name,
                        "invalid_value");
    }
    *out = static_cast<int>(v);
    return std::nullopt;
  }

 private:
  const json& body_;
};

ApiError TooMany(const char* field, size_t got, size_t limit) {
  return BadRequest(std::string(field) + " has " + std::to_string(got) +
                        " entries: at most " + std::to_string(limit) + " are allowed",
                    field, "invalid_value");
}

MaybeError ParseStop(const FieldReader& r, SamplingParams* p) {
  const json* v = r.Get("stop");
  if (v) {
    if (v->is_string()) {
      p->stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      p->stop.clear();
      if (v->size() > kMaxStopStrings) return TooMany("stop", v->size(), kMaxStopStrings);
      for (const json& s : *v) {
        if (!s.is_string()) return InvalidType("stop", "a string or an array of strings", s);
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return InvalidType("stop", "a string or an array of strings", *v);
    }
    for (const std::string& s : p->stop) {
      if (s.size() > kMaxStopStringBytes) {
        return BadRequest("stop string of " + std::to_string(s.size()) + " bytes: at most " +
                              std::to_string(kMaxStopStringBytes) + " are allowed",
                          "stop", "invalid_value");
      }
    }
  }
  if (const json* ids = r.Get("stop_token_ids")) {
    if (!ids->is_array()) return InvalidType("stop_token_ids", "an array of integers", *ids);
    if (ids->size() > kMaxStopTokenIds) {
      return TooMany("stop_token_ids", ids->size(), kMaxStopTokenIds);
    }
    for (const json& id : *ids) {
      if (!id.is_number_integer()) return InvalidType("stop_token_ids", "an integer", id);
      const int64_t x = id.get<int64_t>();
      if (x < 0 || x > std::numeric_limits<int32_t>::max()) {
        return BadRequest("stop_token_ids = " + std::to_string(x) + ": token ids must be >= 0",
                          "stop_token_ids", "invalid_value");
      }
      p->stop_token_ids.push_back(static_cast<int32_t>(x));
    }
  }
  return std::nullopt;
}

// logit_bias: {"token id": bias}, OpenAI's shape (keys are decimal ids).
MaybeError ParseLogitBias(const FieldReader& r, SamplingParams* p) {
  const json* lb = r.Get("logit_bias");
  if (!lb) return std::nullopt;
  if (!lb->is_object()) return InvalidType("logit_bias", "an object", *lb);
  if (lb->size() > kMaxLogitBias) return TooMany("logit_bias", lb->size(), kMaxLogitBias);
  p->logit_bias.clear();
  for (const auto& [key, value] : lb->items()) {
    int64_t id = -1;
    const char* end = key.data() + key.size();
    auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return BadRequest("logit_bias key '" + key + "' is not a token id", "logit_bias",
                        "invalid_value");
    }
    if (!value.is_number()) return InvalidType("logit_bias", "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return BadRequest("logit_bias[" + key + "] = " + value.dump() + ": must be in [-100, 100]",
                        "logit_bias", "invalid_value");
    }
    p->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  std::sort(p->logit_bias.begin(), p->logit_bias.end());
  auto dup = std::adjacent_find(p->logit_bias.begin(), p->logit_bias.end(),
                                [](const auto& a, const auto& b) { return a.first == b.first; });
  if (dup != p->logit_bias.end()) {
    return BadRequest("logit_bias names token " + std::to_string(dup->first) + " twice",
                      "logit_bias", "invalid_value");
  }
  return std::nullopt;
}

// A JSON Schema given inline or as JSON text (vLLM accepts both for guided_json).
MaybeError SchemaGrammar(const json& schema, const std::string& param, std::string* out) {
  json parsed;
  const json* s = &schema;
  if (schema.is_string()) {
    if (auto e = ParseJsonBody(schema.get_ref<const std::string&>(), &parsed)) {
      return BadRequest(param + " is not valid JSON: " + e->message, param, "invalid_value");
    }
    s = &parsed;
  }
  if (!s->is_object() && !s->is_boolean()) return InvalidType(param, "a JSON Schema object", *s);
  StatusOr<std::string> g = grammar::JsonSchemaToGbnf(*s);
  if (!g.ok()) return BadRequest(param + ": " + g.status().message(), param, "invalid_value");
  *out = std::move(*g);
  return std::nullopt;
}

// The output constraint of a request: response_format, or one of vLLM's guided_* fields (also
// spelled structured_outputs.{json, regex, choice, grammar}). At most one may be given.
MaybeError ParseStructuredOutput(const FieldReader& r, ParsedRequest* out) {
  struct Source {
    std::string param;
    const json* value;
    bool json_object = false;  // response_format json_object: any JSON object
  };
  std::vector<Source> given;
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (const json* v = r.Get(name); v && !v->is_null()) given.push_back({name, v});
  }
  if (const json* so = r.Get("structured_outputs"); so && !so->is_null()) {
    if (!so->is_object()) return InvalidType("structured_outputs", "an object", *so);
    for (const char* key : {"json", "regex", "choice", "grammar"}) {
      auto it = so->find(key);
      if (it != so->end() && !it->is_null())
        given.push_back({std::string("structured_outputs.") + key, &*it});
    }
  }
  if (const json* rf = r.Get("response_format"); rf && !rf->is_null()) {
    if (!rf->is_object()) return InvalidType("response_format", "an object", *rf);
    auto type = rf->find("type");
    if (type == rf->end() || !type->is_string()) {
      return BadRequest("response_format.type must be a string", "response_format");
    }
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "json_object") {
      given.push_back({"response_format", rf, true});
    } else if (t == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object()) {
        return BadRequest("response_format.json_schema must be an object with a 'schema'",
                          "response_format", "invalid_value");
      }
      auto schema = js->find("schema");
      if (schema == js->end()) {
        return BadRequest("response_format.json_schema.schema is required", "response_format",
                          "invalid_value");
      }
      if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() &&
                                            !strict->is_boolean()) {
        return InvalidType("response_format.json_schema.strict", "a boolean", *strict);
      }
      given.push_back({"response_format", &*schema});
    } else if (t != "text") {
      return BadRequest("response_format type '" + t + "' is not supported (text, json_object, "
                        "json_schema)", "response_format", "invalid_value");
    }
  }
  if (given.empty()) return std::nullopt;
  if (given.size() > 1) {
    return BadRequest("only one output constraint may be given, got " + given[0].param +
                          " and " + given[1].param, given[1].param, "invalid_value");
  }
  const std::string& param = given[0].param;
  const json& v = *given[0].value;
  out->grammar_param = param;
  if (given[0].json_object) {
    out->grammar = grammar::JsonObjectGbnf();
    return std::nullopt;
  }
  if (param == "response_format" || param.ends_with("json")) {
    return SchemaGrammar(v, param, &out->grammar);
  }
  if (param.ends_with("regex")) {
    if (!v.is_string()) return InvalidType(param, "a string", v);
    StatusOr<std::string> g = grammar::RegexToGbnf(v.get_ref<const std::string&>());
    if (!g.ok()) return BadRequest(param + ": " + g.status().message(), param, "invalid_value");
    out->grammar = std::move(*g);
    return std::nullopt;
  }
  if (param.ends_with("choice")) {
    if (!v.is_array() || v.empty()) return InvalidType(param, "a non-empty array of strings", v);
    if (v.size() > kMaxChoices) return TooMany("guided_choice", v.size(), kMaxChoices);
    std::vector<std::string> choices;
    for (const json& c : v) {
      if (!c.is_string()) return InvalidType(param, "a non-empty array of strings", c);
      choices.push_back(c.get<std::string>());
    }
    out->grammar = grammar::ChoiceToGbnf(choices);
    return std::nullopt;
  }
  if (!v.is_string()) return InvalidType(param, "a string (GBNF)", v);  // grammar
  out->grammar = v.get<std::string>();
  return std::nullopt;
}

// Fields both endpoints share.
MaybeError ParseCommon(const FieldReader& r, ParsedRequest* out) {
  SamplingParams& p = out->params;
  if (const json* m = r.Get("model")) {
    if (!m->is_string()) return InvalidType("model", "a string", *m);
    out->model = m->get<std::string>();
  }
  if (auto e = r.Float("temperature", &p.temperature)) return e;
  if (auto e = r.Float("top_p", &p.top_p)) return e;
  if (auto e = r.Int("top_k", &p.top_k)) return e;
  if (auto e = r.Float("min_p", &p.min_p)) return e;
  if (auto e = r.Float("repetition_penalty", &p.repetition_penalty)) return e;
  if (auto e = r.Float("presence_penalty", &p.presence_penalty)) return e;
  if (auto e = r.Float("frequency_penalty", &p.frequency_penalty)) return e;
  if (auto e = r.Int64("seed", &p.seed)) return e;
  if (auto e = r.Int("min_tokens", &p.min_tokens)) return e;
  if (auto e = r.Bool("ignore_eos", &p.ignore_eos)) return e;
  if (auto e = r.Bool("include_stop_str_in_output", &p.include_stop_str_in_output)) return e;
  bool skip_special = true;
  if (auto e = r.Bool("skip_special_tokens", &skip_special)) return e;
  if (auto e = ParseStop(r, &p)) return e;
  if (auto e = r.Int("n", &out->n)) return e;
  if (out->n < 1 || out->n > kMaxN) {
    return BadRequest("n = " + std::to_string(out->n) + ": must be in [1, " +
                          std::to_string(kMaxN) + "]",
                      "n", "invalid_value");
  }
  // Completion i of a seeded request samples with seed + i: that must stay an int64.
  if (p.seed > std::numeric_limits<int64_t>::max() - (out->n - 1)) {
    return BadRequest("seed = " + std::to_string(p.seed) + ": with n = " +
                          std::to_string(out->n) + " the seeds seed..seed+n-1 must be <= " +
                          std::to_string(std::numeric_limits<int64_t>::max()),
                      "seed", "invalid_value");
  }
  int best_of = out->n;
  if (auto e = r.Int("best_of", &best_of)) return e;
  if (best_of != out->n) return BadRequest("best_of != n is not supported", "best_of");
  if (auto e = r.Bool("stream", &out->stream)) return e;
  if (const json* so = r.Get("stream_options")) {
    if (!so->is_object()) return InvalidType("stream_options", "an object", *so);
    FieldReader sr(*so);
    if (auto e = sr.Bool("include_usage", &out->include_usage)) return e;
    if (auto e = sr.Bool("continuous_usage_stats", &out->continuous_usage)) return e;
    if (!out->stream) {
      return BadRequest("stream_options is only allowed when stream is true", "stream_options");
    }
  }
  if (auto e = ParseLogitBias(r, &p)) return e;
  p.skip_special_tokens = skip_special;
  if (auto e = ParseStructuredOutput(r, out)) return e;
  if (const json* u = r.Get("user")) {
    if (!u->is_string()) return InvalidType("user", "a string", *u);
  }
  return std::nullopt;
}

MaybeError ParseMaxTokens(const FieldReader& r, const char* name, ParsedRequest* out) {
  int64_t v = -1;
  if (auto e = r.Int64(name, &v)) return e;
  if (!r.Get(name)) return std::nullopt;
  if (v < 1 || v > std::numeric_limits<int>::max()) {
    return BadRequest(std::string(name) + " = " + std::to_string(v) + ": must be >= 1", name,
                      "invalid_value");
  }
  out->params.max_tokens = static_cast<int>(v);
  out->max_tokens_given = true;
  return std::nullopt;
}

// One token-id prompt: an array of integers.
MaybeError ParseIdArray(const json& a, std::vector<int32_t>* out) {
  for (const json& t : a) {
    if (!t.is_number_integer()) {
      return InvalidType("prompt", "a string, an array of strings or token ids", t);
    }
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return BadRequest("Token id " + std::to_string(id) + " is out of vocabulary", "prompt",
                        "invalid_value");
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

MaybeError ParsePrompt(const FieldReader& r, ParsedRequest* out) {
  const json* p = r.Get("prompt");
  if (!p) return BadRequest("'prompt' is a required property", "prompt", "missing_required");
  const char* kWant = "a string, an array of strings or token ids";
  if (p->is_string()) {
    out->prompt_is_text = true;
    out->prompt_texts.push_back(p->get<std::string>());
    return std::nullopt;
  }
  if (!p->is_array()) return InvalidType("prompt", kWant, *p);
  if (p->empty()) return BadRequest("Prompt cannot be empty", "prompt", "invalid_value");
  if (!p->front().is_number_integer() && p->size() > kMaxPrompts) {
    return TooMany("prompt", p->size(), kMaxPrompts);
  }
  const json& first = p->front();
  if (first.is_number_integer()) {  // [1, 2, 3]
    out->prompts.emplace_back();
    return ParseIdArray(*p, &out->prompts.back());
  }
  for (const json& e : *p) {  // ["a", "b"] or [[1, 2], [3]]
    if (first.is_string() && e.is_string()) {
      out->prompt_is_text = true;
      out->prompt_texts.push_back(e.get<std::string>());
    } else if (first.is_array() && e.is_array()) {
      out->prompts.emplace_back();
      if (auto err = ParseIdArray(e, &out->prompts.back())) return err;
    } else {
      return InvalidType("prompt", kWant, e);
    }
  }
  return std::nullopt;
}

MaybeError ParseCompletionFields(const FieldReader& r, ParsedRequest* out) {
  if (auto e = ParsePrompt(r, out)) return e;
  if (auto e = ParseMaxTokens(r, "max_tokens", out)) return e;
  if (auto e = r.Bool("echo", &out->echo)) return e;
  if (const json* s = r.Get("suffix")) {
    if (!s->is_string()) return InvalidType("suffix", "a string", *s);
    if (!s->get<std::string>().empty()) return BadRequest("suffix is not supported", "suffix");
  }
  if (r.Get("logprobs")) {
    int lp = 0;
    if (auto e = r.Int("logprobs", &lp)) return e;
    if (lp < 0 || lp > kMaxLogprobs) {
      return BadRequest("logprobs = " + std::to_string(lp) + ": must be in [0, 20]", "logprobs",
                        "invalid_value");
    }
    out->logprobs = true;
    out->top_logprobs = lp;
  }
  if (out->echo && out->logprobs) {
    return BadRequest("echo together with logprobs is not supported", "echo");
  }
  return std::nullopt;
}

// Flattens one message's content to a string: text parts joined by "\n".
MaybeError NormalizeMessage(const json& m, size_t i, json* out) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return InvalidType(where, "an object", m);
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) {
    return BadRequest(where + ": 'role' must be a string", "messages", "invalid_value");
  }
  *out = m;
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    (*out)["content"] = "";
    return std::nullopt;
  }
  if (content->is_string()) return std::nullopt;
  if (!content->is_array()) {
    return InvalidType(where + ".content", "a string or an array of content parts", *content);
  }
  std::string text;
  for (size_t k = 0; k < content->size(); ++k) {
    const json& part = (*content)[k];
    auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) {
      return BadRequest(where + ".content[" + std::to_string(k) + "]: expected a content part "
                        "object with a 'type'", "messages", "invalid_value");
    }
    if (*type != "text") {
      return BadRequest("content part type '" + type->get<std::string>() + "' is not supported",
                        "messages", "invalid_value");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      return BadRequest(where + ".content[" + std::to_string(k) + "]: 'text' must be a string",
                        "messages", "invalid_value");
    }
    if (k > 0) text += "\n";
    text += t->get<std::string>();
  }
  (*out)["content"] = text;
  return std::nullopt;
}

MaybeError ParseChatFields(const FieldReader& r, ParsedRequest* out) {
  const json* msgs = r.Get("messages");
  if (!msgs) return BadRequest("'messages' is a required property", "messages",
                               "missing_required");
  if (!msgs->is_array()) return InvalidType("messages", "an array", *msgs);
  if (msgs->empty()) return BadRequest("'messages' must not be empty", "messages",
                                       "invalid_value");
  if (msgs->size() > kMaxMessages) return TooMany("messages", msgs->size(), kMaxMessages);
  out->messages = json::array();
  for (size_t i = 0; i < msgs->size(); ++i) {
    json m;
    if (auto e = NormalizeMessage((*msgs)[i], i, &m)) return e;
    if (auto e = CheckToolMessage((*msgs)[i], i, &m)) {
      return BadRequest(e->message, e->param, e->code);
    }
    out->messages.push_back(std::move(m));
  }
  if (auto e = ParseMaxTokens(r, "max_tokens", out)) return e;
  if (auto e = ParseMaxTokens(r, "max_completion_tokens", out)) return e;
  if (auto e = r.Bool("logprobs", &out->logprobs)) return e;
  if (r.Get("top_logprobs")) {
    if (auto e = r.Int("top_logprobs", &out->top_logprobs)) return e;
    if (out->top_logprobs < 0 || out->top_logprobs > kMaxLogprobs) {
      return BadRequest("top_logprobs = " + std::to_string(out->top_logprobs) +
                            ": must be in [0, 20]",
                        "top_logprobs", "invalid_value");
    }
    if (!out->logprobs && out->top_logprobs > 0) {
      return BadRequest("top_logprobs requires logprobs to be true", "top_logprobs");
    }
  }
  if (auto e = r.Bool("add_generation_prompt", &out->add_generation_prompt)) return e;
  bool continue_final = false;
  if (auto e = r.Bool("continue_final_message", &continue_final)) return e;
  if (continue_final) {
    return BadRequest("continue_final_message is not supported", "continue_final_message");
  }
  if (const json* kw = r.Get("chat_template_kwargs")) {
    if (!kw->is_object()) return InvalidType("chat_template_kwargs", "an object", *kw);
    out->chat_template_kwargs = *kw;
  }
  if (auto e = ParseToolFields(r.body(), &out->tools)) {
    return BadRequest(e->message, e->param, e->code);
  }
  return std::nullopt;
}

}  // namespace

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return nlohmann::json{{"error", std::move(e)}};
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

// Deepest nesting of arrays/objects in `body`, stopping early past `limit`. Brackets inside
// strings (with escapes) do not count. Malformed JSON is left to the parser.
static int JsonDepth(std::string_view body, int limit) {
  int depth = 0, max_depth = 0;
  ScanJsonBrackets(body, 0, [&](size_t, char c) {
    if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      return max_depth <= limit;
    }
    --depth;
    return true;
  });
  return max_depth;
}

MaybeError ParseJsonBody(std::string_view body, json* out) {
  if (JsonDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return BadRequest("The request body nests arrays/objects deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels",
                      "", "invalid_json");
  }
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) {
    return BadRequest("Invalid JSON in the request body", "", "invalid_json");
  }
  return std::nullopt;
}

MaybeError ParseRequest(const json& body, Endpoint endpoint, ParsedRequest* out) {
  *out = ParsedRequest();
  out->endpoint = endpoint;
  if (!body.is_object()) return BadRequest("The request body must be a JSON object");
  FieldReader r(body);
  if (auto e = ParseCommon(r, out)) return e;
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = ParseCompletionFields(r, out)) return e;
  } else {
    if (auto e = ParseChatFields(r, out)) return e;
  }
  out->params.want_logprobs = out->logprobs;
  out->params.logprobs = out->logprobs ? out->top_logprobs : 0;
  // max_tokens is checked against the prompt later; validate the rest now.
  SamplingParams check = out->params;
  check.max_tokens = std::max(check.max_tokens, check.min_tokens);
  if (Status s = check.Validate(); !s.ok()) return FromStatus(s);
  // The OpenAI API's range (SamplingParams allows more for the CLI).
  if (out->params.temperature > 2.0f) {
    return BadRequest("temperature = " + std::to_string(out->params.temperature) +
                          ": must be in [0, 2]",
                      "temperature", "invalid_value");
  }
  if (out->params.min_tokens > out->params.max_tokens && out->max_tokens_given) {
    return BadRequest("min_tokens = " + std::to_string(out->params.min_tokens) +
                          ": must be in [0, max_tokens]",
                      "min_tokens", "invalid_value");
  }
  return std::nullopt;
}

MaybeError CheckPrompt(const std::vector<int32_t>& prompt, const PromptLimits& limits,
                       ParsedRequest* req) {
  const char* param = req->endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (prompt.empty()) return BadRequest("Prompt cannot be empty", param, "invalid_value");
  for (int32_t id : prompt) {
    if (limits.vocab_size > 0 && id >= limits.vocab_size) {
      return BadRequest("Token id " + std::to_string(id) + " is out of vocabulary (vocab size " +
                            std::to_string(limits.vocab_size) + ")",
                        param, "invalid_value");
    }
  }
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (req->endpoint == Endpoint::kChat && !req->max_tokens_given) {
    const int64_t room = limits.max_model_len - n_prompt;
    req->params.max_tokens = static_cast<int>(std::clamp<int64_t>(
        room, 1, std::numeric_limits<int>::max()));
  }
  const int64_t want = n_prompt + req->params.max_tokens;
  if (want > limits.max_model_len) {
    const char* what = req->endpoint == Endpoint::kChat ? "messages" : "prompt";
    return BadRequest("This model's maximum context length is " +
                          std::to_string(limits.max_model_len) +
                          " tokens. However, you requested " + std::to_string(want) +
                          " tokens (" + std::to_string(n_prompt) + " in the " + what + ", " +
                          std::to_string(req->params.max_tokens) +
                          " in the completion). Please reduce the length of the " + what +
                          " or completion.",
                      param, "context_length_exceeded");
  }
  if (req->params.min_tokens > req->params.max_tokens) {
    return BadRequest("min_tokens = " + std::to_string(req->params.min_tokens) +
                          ": must be in [0, max_tokens]",
                      "min_tokens", "invalid_value");
  }
  return std::nullopt;
}

MaybeError PreparePrompts(ParsedRequest* req, const Tokenizer* tokenizer,
                          const PromptLimits& limits) {
  if (req->endpoint == Endpoint::kChat) {
    if (!tokenizer || tokenizer->chat_template().empty()) {
      return BadRequest("model has no chat template", "messages");
    }
    auto piece = [&](int32_t id) {
      return id >= 0 && id < tokenizer->vocab_size() ? tokenizer->token_piece(id)
                                                     : std::string();
    };
    // Tool calling: the tools and tool_calls as the template wants them, the call syntax, and
    // the grammar of a forced call (tool_calls.h).
    const std::string& source = tokenizer->chat_template();
    if (req->tool_format == ToolCallFormat::kAuto) req->tool_format = DetectToolCallFormat(source);
    if (req->tools.forced() && req->tool_format == ToolCallFormat::kNone) {
      req->tool_format = ToolCallFormat::kHermes;  // some syntax to force and parse
    }
    nlohmann::ordered_json extra = req->chat_template_kwargs;
    if (!req->tools.tools.is_null()) extra["tools"] = req->tools.tools;
    if (req->tools.forced()) {
      if (!req->grammar.empty()) {
        return BadRequest("a forced tool_choice cannot be combined with " + req->grammar_param,
                          "tool_choice", "invalid_value");
      }
      StatusOr<std::string> g = ToolCallGrammar(req->tools, req->tool_format);
      if (!g.ok()) return BadRequest(g.status().message(), "tools", "invalid_value");
      req->grammar = std::move(*g);
      req->grammar_param = "tools";
    }
    StatusOr<std::string> text = ApplyChatTemplateOrdered(
        source, MessagesForChatTemplate(req->messages, source),
        req->add_generation_prompt, piece(tokenizer->bos_id()), piece(tokenizer->eos_id()),
        extra);
    if (!text.ok()) {
      return BadRequest("chat template failed: " + text.status().message(), "messages");
    }
    req->prompts = {tokenizer->Encode(*text, /*add_bos=*/false, /*parse_special=*/true)};
  } else if (req->prompt_is_text) {
    if (!tokenizer) {
      return BadRequest("model has no tokenizer: send the prompt as token ids", "prompt");
    }
    req->prompts.clear();
    for (const std::string& t : req->prompt_texts) {
      if (t.empty()) return BadRequest("Prompt cannot be empty", "prompt", "invalid_value");
      req->prompts.push_back(tokenizer->Encode(t, tokenizer->add_bos_default()));
    }
  }
  for (const auto& p : req->prompts) {
    if (auto e = CheckPrompt(p, limits, req)) return e;
  }
  return std::nullopt;
}

ApiError FromStatus(const Status& status) {
  ApiError e = BadRequest(status.message());
  const std::string& m = status.message();
  const size_t eq = m.find(" = ");
  if (eq != std::string::npos && eq < 40 && m.find(' ') == eq) {
    e.param = m.substr(0, eq);
    e.code = "invalid_value";
  }
  if (status.code() == StatusCode::kResourceExhausted) {
    e.http_status = 429;
    e.type = "rate_limit_error";
    e.code = "";
  } else if (status.code() == StatusCode::kInternal) {
    e.http_status = 500;
    e.type = "internal_error";
  }
  return e;
}

}  // namespace peng::server
