// BpeModel: byte-level BPE over pre-tokenized words. A word's bytes are mapped to the GPT-2
// byte alphabet, each byte becomes one symbol, and adjacent symbol pairs are merged lowest
// merge rank first (leftmost first among equal ranks) until no pair has a merge. Symbols are
// token ids throughout, so merging does no string work: O(n log n) per word with a heap of
// candidate pairs over a linked list of symbols. Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/vocab.h"

namespace peng {

class BpeModel {
 public:
  // `index` maps token strings (byte alphabet) to ids and must outlive the model.
  BpeModel(const VocabSpec& spec, const TokenIndex& index);

  // Appends the ids of one pre-tokenized word (raw bytes) to *out.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  size_t num_merges() const { return merges_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  const TokenIndex& index_;
  bool ignore_merges_;
  int32_t unk_id_;
  int32_t byte_ids_[256];  // id of each byte's alphabet letter, -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace peng
