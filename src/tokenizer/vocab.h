// Vocabulary: the plain in-memory description of a tokenizer (token strings, types, scores,
// merges, pre-tokenizer regexes and special ids) that both loaders (GGUF metadata,
// tokenizer.json) produce and the Tokenizer is built from, plus a string -> id index. Token
// strings are stored as the file stores them: byte-level alphabet for byte-level BPE,
// U+2581 for spaces in SentencePiece vocabularies. Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace peng {

// Values are those of GGUF `tokenizer.ggml.token_type` (a fact of the format).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class TokenizerModel { kByteLevelBpe, kSentencePieceBpe };

struct VocabSpec {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  std::vector<std::string> tokens;
  std::vector<TokenType> types;  // empty: all normal
  std::vector<float> scores;     // SentencePiece only
  // Byte-level BPE merges in rank order (rank 0 first), as (left, right) token strings.
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> pre_regexes;  // byte-level BPE pre-tokenizer
  bool ignore_merges = false;  // emit a whole pre-tokenized word if it is a token
  bool add_space_prefix = false;
  bool add_bos = false;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  std::vector<int32_t> eog_ids;  // extra end-of-generation ids (eot, eom, ...)
  std::string chat_template;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

inline int32_t FindToken(const TokenIndex& index, std::string_view text) {
  auto it = index.find(text);
  return it == index.end() ? -1 : it->second;
}

}  // namespace peng
