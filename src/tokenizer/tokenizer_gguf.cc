// Tokenizer::FromGguf: fills a VocabSpec from GGUF `tokenizer.*` metadata.
#include "formats/gguf.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace peng {
namespace {

int32_t IdOr(const GgufFile& f, const std::string& key, int32_t fallback) {
  const std::optional<int64_t> v = f.GetInt(key);
  return v && *v >= 0 && *v <= INT32_MAX ? static_cast<int32_t>(*v) : fallback;
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& gguf) {
  const std::string where = gguf.path() + ": ";
  const std::optional<std::string> model = gguf.GetString("tokenizer.ggml.model");
  if (!model) return NotFound(where + "no tokenizer.ggml.model");
  const std::vector<std::string>* tokens = gguf.GetStringArray("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->empty()) return NotFound(where + "no tokenizer.ggml.tokens");

  VocabSpec spec;
  spec.tokens = *tokens;
  if (const std::vector<int64_t>* types = gguf.GetIntArray("tokenizer.ggml.token_type")) {
    if (types->size() != tokens->size()) {
      return DataLoss(where + "tokenizer.ggml.token_type has " + std::to_string(types->size()) +
                      " entries for " + std::to_string(tokens->size()) + " tokens");
    }
    spec.types.reserve(types->size());
    for (int64_t t : *types) {
      spec.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::kNormal);
    }
  }
  if (const std::vector<double>* scores = gguf.GetFloatArray("tokenizer.ggml.scores")) {
    if (scores->size() != tokens->size()) {
      return DataLoss(where + "tokenizer.ggml.scores has " + std::to_string(scores->size()) +
                      " entries for " + std::to_string(tokens->size()) + " tokens");
    }
    spec.scores.assign(scores->begin(), scores->end());
  }

  if (*model == "gpt2") {
    spec.model = TokenizerModel::kByteLevelBpe;
    if (const std::vector<std::string>* merges = gguf.GetStringArray("tokenizer.ggml.merges")) {
      spec.merges.reserve(merges->size());
      for (const std::string& m : *merges) {
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) return DataLoss(where + "bad merge '" + m + "'");
        spec.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
      }
    }
    const std::string pre = gguf.GetString("tokenizer.ggml.pre").value_or("default");
    if (!RegexesForPreName(pre, &spec.pre_regexes)) {
      return Unimplemented(where + "unknown pre-tokenizer tokenizer.ggml.pre='" + pre + "'");
    }
    spec.ignore_merges = pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3";
    spec.add_bos = gguf.GetBool("tokenizer.ggml.add_bos_token").value_or(false);
    spec.add_space_prefix = false;
  } else if (*model == "llama") {
    spec.model = TokenizerModel::kSentencePieceBpe;
    spec.add_bos = gguf.GetBool("tokenizer.ggml.add_bos_token").value_or(true);
    spec.add_space_prefix = gguf.GetBool("tokenizer.ggml.add_space_prefix").value_or(true);
  } else {
    return Unimplemented(where + "unsupported tokenizer.ggml.model '" + *model + "'");
  }

  spec.bos_id = IdOr(gguf, "tokenizer.ggml.bos_token_id", -1);
  spec.eos_id = IdOr(gguf, "tokenizer.ggml.eos_token_id", -1);
  spec.unk_id = IdOr(gguf, "tokenizer.ggml.unknown_token_id", -1);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = IdOr(gguf, key, -1);
    if (id >= 0) spec.eog_ids.push_back(id);
  }
  if (const std::vector<int64_t>* eog = gguf.GetIntArray("tokenizer.ggml.eog_token_ids")) {
    for (int64_t id : *eog) {
      if (id >= 0 && id <= INT32_MAX) spec.eog_ids.push_back(static_cast<int32_t>(id));
    }
  }
  spec.chat_template = gguf.GetString("tokenizer.chat_template").value_or("");
  return FromSpec(std::move(spec));
}

}  // namespace peng
