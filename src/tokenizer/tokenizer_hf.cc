// Tokenizer::FromHfFolder: fills a VocabSpec from a Hugging Face tokenizer.json (byte-level
// BPE) and tokenizer_config.json (bos/eos, add_bos_token, chat_template).
#include <filesystem>

#include "formats/json_util.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

using nlohmann::json;

// Appends the regexes equivalent to one tokenizer.json pre_tokenizer node.
Status AddPreTokenizer(const json& node, std::vector<std::string>* regexes) {
  if (node.is_null()) return OkStatus();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const json& child : node.at("pretokenizers")) {
      PENG_RETURN_IF_ERROR(AddPreTokenizer(child, regexes));
    }
  } else if (type == "ByteLevel") {
    if (node.value("use_regex", true)) regexes->push_back(kGpt2Regex);
  } else if (type == "Digits") {
    regexes->push_back(node.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else if (type == "Split") {
    const std::string behavior = node.value("behavior", "");
    if (behavior != "Isolated" || node.value("invert", false)) {
      return Unimplemented("tokenizer.json: Split behavior '" + behavior + "' (only Isolated)");
    }
    const json& pattern = node.at("pattern");
    if (pattern.contains("Regex")) {
      regexes->push_back(pattern.at("Regex").get<std::string>());
    } else {
      regexes->push_back("\\Q" + pattern.at("String").get<std::string>() + "\\E");
    }
  } else {
    return Unimplemented("tokenizer.json: pre_tokenizer type '" + type + "'");
  }
  return OkStatus();
}

// "<s>" or {"content": "<s>", ...} -> "<s>"; "" when absent.
std::string TokenContent(const json& config, const char* key) {
  if (!config.contains(key)) return "";
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return "";
}

std::string ChatTemplate(const json& config) {
  if (!config.contains("chat_template")) return "";
  const json& t = config.at("chat_template");
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const json& e : t) {
      if (e.value("name", "") == "default") return e.value("template", "");
    }
    if (!t.empty()) return t.front().value("template", "");
  }
  return "";
}

Status FillSpec(const json& tj, const json& config, VocabSpec* spec) {
  const json& model = tj.at("model");
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") return Unimplemented("tokenizer.json: model type '" + type + "'");
  const json& decoder = tj.contains("decoder") ? tj.at("decoder") : json();
  if (!decoder.is_null() && decoder.value("type", "") != "ByteLevel") {
    return Unimplemented("tokenizer.json: decoder '" + decoder.value("type", "") +
                         "' (only byte-level BPE is supported)");
  }
  spec->model = TokenizerModel::kByteLevelBpe;
  int64_t max_id = -1;
  for (const auto& [text, id] : model.at("vocab").items()) {
    max_id = std::max(max_id, id.get<int64_t>());
  }
  for (const json& t : tj.value("added_tokens", json::array())) {
    max_id = std::max(max_id, t.at("id").get<int64_t>());
  }
  if (max_id < 0 || max_id >= (int64_t{1} << 24)) {
    return InvalidArgument("tokenizer.json: bad vocabulary size " + std::to_string(max_id + 1));
  }
  spec->tokens.assign(max_id + 1, "");
  spec->types.assign(max_id + 1, TokenType::kUnused);
  for (const auto& [text, id] : model.at("vocab").items()) {
    const int64_t i = id.get<int64_t>();
    if (i < 0) return InvalidArgument("tokenizer.json: negative id for '" + text + "'");
    spec->tokens[i] = text;
    spec->types[i] = TokenType::kNormal;
  }
  for (const json& t : tj.value("added_tokens", json::array())) {
    const int64_t i = t.at("id").get<int64_t>();
    if (i < 0) return InvalidArgument("tokenizer.json: negative added token id");
    spec->tokens[i] = t.at("content").get<std::string>();
    spec->types[i] = t.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
  }
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_array() && m.size() == 2) {
      spec->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return InvalidArgument("tokenizer.json: bad merge '" + s + "'");
      spec->merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    }
  }
  spec->ignore_merges = model.value("ignore_merges", false);
  PENG_RETURN_IF_ERROR(AddPreTokenizer(
      tj.contains("pre_tokenizer") ? tj.at("pre_tokenizer") : json(), &spec->pre_regexes));

  const auto find = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    for (size_t i = 0; i < spec->tokens.size(); ++i) {
      if (spec->tokens[i] == text) return static_cast<int32_t>(i);
    }
    return -1;
  };
  const std::string unk = model.contains("unk_token") && model.at("unk_token").is_string()
                              ? model.at("unk_token").get<std::string>()
                              : "";
  spec->unk_id = find(unk);
  spec->bos_id = find(TokenContent(config, "bos_token"));
  spec->eos_id = find(TokenContent(config, "eos_token"));
  spec->add_bos = config.value("add_bos_token", false) && spec->bos_id >= 0;
  spec->chat_template = ChatTemplate(config);
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfFolder(const std::string& dir) {
  const std::string tj_path = dir + "/tokenizer.json";
  PENG_ASSIGN_OR_RETURN(const json tj, ParseJsonFile(tj_path));
  json config = json::object();
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    PENG_ASSIGN_OR_RETURN(config, ParseJsonFile(config_path));
  }
  VocabSpec spec;
  try {
    PENG_RETURN_IF_ERROR(FillSpec(tj, config, &spec));
  } catch (const json::exception& e) {
    return InvalidArgument(tj_path + ": unexpected structure: " + e.what());
  }
  return FromSpec(std::move(spec));
}

}  // namespace peng
