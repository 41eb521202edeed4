#include "formats/json_util.h"

#include <exception>

#include "core/mapped_file.h"

namespace peng {
namespace {

// nlohmann's messages quote the last token read, which in a hostile file can be huge.
std::string Clip(const char* what) {
  std::string s(what);
  if (s.size() > 240) s = s.substr(0, 240) + "...";
  return s;
}

}  // namespace

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& name) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return DataLoss(name + ": invalid JSON at byte " + std::to_string(e.byte) + ": " +
                    Clip(e.what()));
  } catch (const std::exception& e) {
    return DataLoss(name + ": invalid JSON: " + Clip(e.what()));
  }
}

StatusOr<nlohmann::json> ParseJsonFile(const std::string& path) {
  PENG_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseJson(text, path);
}

const char* JsonTypeName(nlohmann::json::value_t type) {
  using T = nlohmann::json::value_t;
  switch (type) {
    case T::null: return "null";
    case T::boolean: return "a boolean";
    case T::string: return "a string";
    case T::array: return "an array";
    case T::object: return "an object";
    case T::number_integer:
    case T::number_unsigned: return "an integer";
    case T::number_float: return "a decimal";
    default: return "an unknown type";
  }
}

}  // namespace peng
