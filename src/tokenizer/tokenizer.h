// Tokenizer: text <-> token ids for byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM, DeepSeek)
// and SentencePiece-style BPE (GGUF model "llama": LLaMA 2, Gemma) vocabularies. Built from a
// VocabSpec, which the loaders fill from GGUF metadata (FromGguf) or from a Hugging Face
// folder (FromHfFolder: tokenizer.json + tokenizer_config.json).
//
// Encode() first cuts special tokens out of the raw text (control and user-defined tokens,
// leftmost-longest; control tokens only when parse_special), then pre-tokenizes and merges
// the remaining text. TokenText() gives the raw bytes a token stands for, which may be a
// partial UTF-8 sequence; use StreamingDecoder to print tokens as they are generated.
//
// Immutable after construction: every method is const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "tokenizer/vocab.h"

namespace peng {

class GgufFile;
class BpeModel;
class SpmModel;
class PreTokenizer;

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> FromSpec(VocabSpec spec);
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& gguf);
  // `dir` holds tokenizer.json and optionally tokenizer_config.json.
  static StatusOr<std::unique_ptr<Tokenizer>> FromHfFolder(const std::string& dir);
  // The tokenizer of a model path: a GGUF file's, or a HF folder's tokenizer.json. A HF folder
  // without tokenizer.json has none: returns nullptr (token ids only).
  static StatusOr<std::unique_ptr<Tokenizer>> ForModel(const std::string& model_path);
  ~Tokenizer();

  std::vector<int32_t> Encode(std::string_view text, bool add_bos,
                              bool parse_special = true) const;
  // Raw bytes of one token (empty for out-of-range ids).
  std::string TokenText(int32_t id) const;
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  int32_t vocab_size() const { return static_cast<int32_t>(spec_.tokens.size()); }
  bool add_bos_default() const { return spec_.add_bos; }
  const std::string& chat_template() const { return spec_.chat_template; }
  TokenizerModel model() const { return spec_.model; }
  TokenType token_type(int32_t id) const;
  // The token string as the vocabulary stores it (byte alphabet / U+2581 escaped).
  const std::string& token_piece(int32_t id) const { return spec_.tokens[id]; }
  // -1 when `piece` (stored spelling) is not a token.
  int32_t FindPiece(std::string_view piece) const { return FindToken(index_, piece); }
  // Control tokens (and the bos/eos ids): what Decode(skip_special=true) leaves out.
  bool IsControl(int32_t id) const;
  bool IsEndOfGeneration(int32_t id) const { return eog_.count(id) != 0; }

 private:
  struct Fragment {
    int32_t token;          // >= 0: a special token matched in the text
    std::string_view text;  // raw text when token < 0
  };
  struct TrieNode {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;
  };

  explicit Tokenizer(VocabSpec spec);
  Status Init();
  void BuildSpecialTrie();
  void Partition(std::string_view text, bool parse_special, std::vector<Fragment>* out) const;
  void EncodeRaw(std::string_view text, bool prev_special, std::vector<int32_t>* out) const;

  VocabSpec spec_;
  TokenIndex index_;
  std::vector<std::string> decoded_;  // raw bytes of every token
  std::vector<TrieNode> trie_;        // special tokens; node 0 is the root
  std::unordered_set<int32_t> eog_;
  std::unique_ptr<PreTokenizer> pre_;
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<SpmModel> spm_;
};

}  // namespace peng
