// ChatTemplate: renders chat requests with the model's own template (GGUF
// `tokenizer.chat_template`, HF tokenizer_config.json `chat_template`), a Jinja2 subset run the
// way transformers runs it (trim_blocks, lstrip_blocks, raise_exception, strftime_now,
// namespace, tojson as json.dumps(ensure_ascii=False)). Parse once, render many times; a parsed
// template is immutable and Render is safe to call from several threads. Every failure (syntax
// error with line:column, undefined-name errors, raise_exception('...') from the template, runaway
// loops or recursion) comes back as a Status; nothing throws.
//
// Key order: pass contexts as nlohmann::ordered_json to keep the caller's key order (it shows in
// `tools | tojson`); a plain nlohmann::json sorts object keys.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "template/ast.h"
#include "template/interpreter.h"

namespace peng {

class ChatTemplate {
 public:
  static StatusOr<ChatTemplate> Parse(const std::string& source);

  // `context` is a JSON object: messages, add_generation_prompt, bos_token, eos_token, tools...
  StatusOr<std::string> Render(const nlohmann::json& context) const;
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

  void set_limits(const tmpl::RenderLimits& limits) { limits_ = limits; }

 private:
  StatusOr<std::string> RenderValue(const tmpl::Value& context) const;

  std::shared_ptr<const tmpl::NodeList> nodes_;
  tmpl::RenderLimits limits_;
};

// Parse + Render with the context transformers builds: messages, tools = documents = None
// (unless `extra` sets them), add_generation_prompt, bos_token, eos_token; `extra` (a JSON object,
// e.g. {"tools": [...]}) adds or overrides variables. Renders under `limits`.
StatusOr<std::string> ApplyChatTemplate(const std::string& source, const nlohmann::json& messages,
                                        bool add_generation_prompt, const std::string& bos_token,
                                        const std::string& eos_token,
                                        const nlohmann::json& extra = {},
                                        const tmpl::RenderLimits& limits = {});
// The same with ordered JSON, so that objects keep the caller's key order where the template
// prints them (`tools | tojson`, tool-call arguments), as transformers renders Python dicts.
StatusOr<std::string> ApplyChatTemplateOrdered(const std::string& source,
                                               const nlohmann::ordered_json& messages,
                                               bool add_generation_prompt,
                                               const std::string& bos_token,
                                               const std::string& eos_token,
                                               const nlohmann::ordered_json& extra,
                                               const tmpl::RenderLimits& limits = {});

}  // namespace peng
