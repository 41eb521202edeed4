// PreTokenizer: splits raw text into words before BPE merging, by a sequence of PCRE2
// regexes (UTF + Unicode properties, JIT-compiled when available). Each regex is applied in
// turn to every piece produced by the previous one; both the matches and the text between
// them become pieces ("isolated" splitting), so no byte is ever dropped. Invalid UTF-8 is
// tolerated: bytes that cannot match end up in the gaps. Immutable after Create(); Split()
// is thread-safe (match data is per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

typedef struct pcre2_real_code_8 pcre2_code_8;

namespace peng {

class PreTokenizer {
 public:
  static StatusOr<std::unique_ptr<PreTokenizer>> Create(std::vector<std::string> regexes);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (views into it) to *out, in order.
  void Split(std::string_view text, std::vector<std::string_view>* out) const;

  const std::vector<std::string>& regexes() const { return regexes_; }

 private:
  PreTokenizer() = default;
  void SplitOne(size_t i, std::string_view piece, std::vector<std::string_view>* out) const;

  std::vector<std::string> regexes_;
  std::vector<pcre2_code_8*> codes_;
};

// The GPT-2 pre-tokenizer regex (also what a tokenizer.json ByteLevel(use_regex) means).
extern const char kGpt2Regex[];

// Sets *regexes to the sequence for a GGUF `tokenizer.ggml.pre` name ("gpt2", "llama-bpe",
// "qwen2", "smollm", "deepseek-llm", "deepseek3-llm", "default", ...); false if unknown.
bool RegexesForPreName(std::string_view pre, std::vector<std::string>* regexes);

}  // namespace peng
