#include "tokenizer/spm_model.h"

#include <cstdio>
#include <queue>

#include "tokenizer/unicode_util.h"

namespace peng {

SpmModel::SpmModel(const VocabSpec& spec, const TokenIndex& index) : spec_(spec), index_(index) {
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = FindToken(index, name);
  }
}

void SpmModel::Encode(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  struct Symbol {
    uint32_t begin;
    uint32_t len;  // 0: merged away
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min<size_t>(Utf8SeqLen(static_cast<unsigned char>(text[i])),
                                      text.size() - i);
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(n), idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
    i += n;
  }
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t len;  // combined length when pushed, to detect stale pairs
    bool operator<(const Candidate& o) const {  // max-heap: higher score, then lower left
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> heap;
  const auto piece = [&](int32_t i) { return text.substr(syms[i].begin, syms[i].len); };
  const auto push = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t len = syms[left].len + syms[right].len;
    const int32_t id = FindToken(index_, text.substr(syms[left].begin, len));
    if (id < 0) return;
    const float score = spec_.scores.empty() ? 0.0f : spec_.scores[id];
    heap.push({score, left, right, len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = syms[c.left];
    Symbol& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    push(l.prev, c.left);
    push(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const std::string_view p = piece(i);
    const int32_t id = FindToken(index_, p);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char c : p) {  // byte fallback
      const int32_t b = byte_ids_[static_cast<uint8_t>(c)];
      if (b >= 0) {
        out->push_back(b);
      } else if (spec_.unk_id >= 0) {
        out->push_back(spec_.unk_id);
        break;  // one unk per unknown character
      }
    }
  }
}

}  // namespace peng
