// SpmModel: SentencePiece-style BPE for vocabularies that carry a score per piece (GGUF model
// "llama": LLaMA 1/2, Gemma). The text (spaces already replaced by U+2581) starts as one
// symbol per UTF-8 character; the adjacent pair whose concatenation is a piece with the
// highest score is merged first (leftmost among equal scores) until no pair forms a piece.
// Characters that are not pieces fall back to <0xNN> byte tokens (or unk). Immutable after
// construction; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace peng {

class SpmModel {
 public:
  // `spec` and `index` must outlive the model.
  SpmModel(const VocabSpec& spec, const TokenIndex& index);

  // Appends the ids of `text` (already escaped: U+2581 for spaces) to *out.
  void Encode(std::string_view text, std::vector<int32_t>* out) const;

 private:
  const VocabSpec& spec_;
  const TokenIndex& index_;
  int32_t byte_ids_[256];  // <0xNN> tokens, -1 when absent
};

// "\xE2\x96\x81" (U+2581 LOWER ONE EIGHTH BLOCK), SentencePiece's visible space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

}  // namespace peng
