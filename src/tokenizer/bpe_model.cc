#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "tokenizer/unicode_util.h"

namespace peng {

BpeModel::BpeModel(const VocabSpec& spec, const TokenIndex& index)
    : index_(index), ignore_merges_(spec.ignore_merges), unk_id_(spec.unk_id) {
  for (int b = 0; b < 256; ++b) byte_ids_[b] = FindToken(index, ByteToUnicode(b));
  merges_.reserve(spec.merges.size());
  std::string joined;
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [left, right] = spec.merges[r];
    const int32_t l = FindToken(index, left), rt = FindToken(index, right);
    joined = left;
    joined += right;
    const int32_t m = FindToken(index, joined);
    if (l < 0 || rt < 0 || m < 0) continue;  // a merge into nothing can never apply
    merges_.emplace(Key(l, rt), Merge{static_cast<int32_t>(r), m});  // first rank wins
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t id = FindToken(index_, ByteLevelEncode(word));
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  const int n = static_cast<int>(word.size());
  std::vector<Symbol> syms(n);
  for (int i = 0; i < n; ++i) {
    syms[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t a = syms[left].id, b = syms[right].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(Key(a, b));
    if (it == merges_.end()) return;
    heap.push({it->second.rank, left, right, a, b, it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    // Stale if either side has merged since: ids only ever grow into longer tokens.
    if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;
    Symbol& r = syms[c.right];
    l.id = c.merged_id;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -2;  // dead
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  for (int i = 0; i >= 0; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out->push_back(syms[i].id);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
  }
}

}  // namespace peng
