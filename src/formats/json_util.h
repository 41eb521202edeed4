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

}  // namespace peng
