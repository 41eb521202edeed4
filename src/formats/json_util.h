// JSON parsing for untrusted files (config.json, tokenizer.json, safetensors headers and
// indexes) with nlohmann::json. Parse errors become a Status naming the file and the byte
// position; no exception escapes. Stateless and thread-safe.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace peng {

// Reads and parses a whole file: "config.json: invalid JSON at byte 17: ...".
StatusOr<nlohmann::json> ParseJsonFile(const std::string& path);
// Parses text; `name` (a file name, "safetensors header of x") starts error messages.
StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& name);

// The kind of a JSON value in OpenAI's error wording: "null", "a boolean", "a string", "an
// array", "an object", "an integer", "a decimal".
const char* JsonTypeName(nlohmann::json::value_t type);

// Calls on_bracket(i, c) for every '[', '{', ']' or '}' of text[start..] that lies outside a
// JSON string (escapes honoured), until it returns false. Does not validate: a cheap pre-pass
// over untrusted text (nesting depth, the extent of an object) before or instead of a parse.
template <class F>
void ScanJsonBrackets(std::string_view text, size_t start, F&& on_bracket) {
  bool in_string = false, escaped = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{' || c == ']' || c == '}') {
      if (!on_bracket(i, c)) return;
    }
  }
}

}  // namespace peng
