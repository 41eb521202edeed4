// Grammar::Matches: an Earley recognizer over the byte-level rules, the test oracle for the
// Matcher. Deliberately independent of the Matcher's stack stepping (no shared code beyond the
// rule tables): items are (position, origin) pairs in per-byte sets, with the Aycock-Horspool
// treatment of nullable rules. Slow (cubic) and only meant for tests and fuzzing.
#include <unordered_set>

#include "grammar/grammar_internal.h"

namespace peng::grammar {

bool Grammar::Matches(std::string_view text, bool complete) const {
  if (!impl_) return false;
  const GrammarImpl& g = *impl_;
  struct Item {
    int32_t pos;
    int32_t origin;
  };
  const size_t n = text.size();
  std::vector<std::vector<Item>> sets(n + 1);
  std::vector<std::unordered_set<uint64_t>> seen(n + 1);
  auto add = [&](size_t k, int32_t pos, int32_t origin) {
    uint64_t key = (uint64_t(uint32_t(pos)) << 32) | uint32_t(origin);
    if (seen[k].insert(key).second) sets[k].push_back({pos, origin});
  };
  for (int32_t a : g.rules[g.root].alts) add(0, a, 0);
  for (size_t k = 0; k <= n; ++k) {
    // sets[k] grows while it is processed.
    for (size_t i = 0; i < sets[k].size(); ++i) {
      const Item it = sets[k][i];
      const Elem& e = g.elems[it.pos];
      switch (e.kind) {
        case ElemKind::kBytes:
          if (k < n && HasByte(g.byte_sets[e.arg], uint8_t(text[k]))) add(k + 1, it.pos + 1, it.origin);
          break;
        case ElemKind::kRef:
          for (int32_t a : g.rules[e.arg].alts) add(k, a, int32_t(k));
          if (g.rules[e.arg].nullable) add(k, it.pos + 1, it.origin);
          break;
        case ElemKind::kEnd: {
          int32_t rule = g.rule_of_pos[it.pos];
          std::vector<Item>& from = sets[it.origin];
          for (size_t j = 0; j < from.size(); ++j) {
            const Item w = from[j];
            const Elem& we = g.elems[w.pos];
            if (we.kind == ElemKind::kRef && we.arg == rule) add(k, w.pos + 1, w.origin);
          }
          break;
        }
      }
    }
    if (k < n && sets[k + 1].empty()) return false;
  }
  for (const Item& it : sets[n]) {
    const Elem& e = g.elems[it.pos];
    bool done = e.kind == ElemKind::kEnd && it.origin == 0 && g.rule_of_pos[it.pos] == g.root;
    if (done) return true;
    if (!complete && e.kind == ElemKind::kBytes) return true;
  }
  return false;
}

}  // namespace peng::grammar
