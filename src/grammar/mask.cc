// Token masks from a stack set.
//
// The plain way walks the vocabulary trie depth-first carrying the whole stack set, pruning a
// subtree as soon as no stack survives its byte (ComputeTokenMaskByWalk). For a state where
// nearly every token is allowed (inside a JSON string) that visits the whole trie, and the
// per-state cache does not help the next time the same position is met at another nesting
// depth. So masks are split by context (the idea of xgrammar's context-independent tokens):
// for each stack top, keep only its first kContextFrames frames and put an "unknown" frame
// below. Walking the trie from that truncated stack gives the tokens accepted whatever lies
// below (they never pop the unknown frame, or pop it exactly at their last byte) and the trie
// nodes after which it was popped. That ContextMask depends only on (top position, kept return
// positions), is computed once and kept in the CompiledGrammar. A state's mask is then the OR
// of its tops' accepted sets plus, for each context node, a walk of that node's subtree from
// the real continuation below the kept frames -- usually a few small subtrees (tokens like
// `",` after a string).
#include <algorithm>
#include <unordered_map>

#include "grammar/grammar_internal.h"

namespace peng::grammar {
namespace {

inline void SetTokens(const TokenVocab::Impl& v, int32_t node, uint32_t* mask) {
  for (int32_t t = v.tok_begin[node]; t < v.tok_begin[node + 1]; ++t) {
    int32_t id = v.tok_ids[t];
    mask[id >> 5] |= 1u << (id & 31);
  }
}

// Stack sets met during one mask computation, interned, with their byte transitions memoized:
// most trie nodes lead to a set already seen (after any character of a string the set is the
// same), so a trie node usually costs one hash probe instead of a step.
class SetGraph {
 public:
  // `work` counts, over one whole mask computation, the stacks stepped by fresh transitions;
  // past kMaskWorkBudget every transition fails (the walk then ends quickly) and over() says so.
  SetGraph(Stepper& st, size_t* work) : st_(st), work_(work) {}
  bool over() const { return *work_ > kMaskWorkBudget; }
  int32_t Intern(const std::vector<Top>& set) {
    auto [it, inserted] = index_.emplace(set, int32_t(sets_.size()));
    if (inserted) sets_.push_back(set);
    return it->second;
  }
  // The set after byte b from set `id`; -1 when empty (or past the stack cap).
  int32_t Next(int32_t id, uint8_t b) {
    bool fresh;
    int32_t& slot = trans_.FindOrInsert((uint64_t(uint32_t(id)) << 8) | b, -1, &fresh);
    if (!fresh) return slot;
    int32_t next = -1;
    *work_ += sets_[id].size();
    if (over()) return -1;  // not memoized: nothing more is computed anyway
    if (st_.Step(sets_[id], b, &tmp_) && !tmp_.empty()) next = Intern(tmp_);
    // Intern does not touch trans_, so the slot is still valid.
    slot = next;
    return next;
  }
  bool HasContext(int32_t id) const { return sets_[id].back() == kContextTop; }

 private:
  struct TopsHash {
    size_t operator()(const std::vector<Top>& k) const {
      uint64_t h = k.size();
      for (Top t : k) h = (h ^ t) * 0x9E3779B97F4A7C15ULL;
      return size_t(h ^ (h >> 31));
    }
  };
  Stepper& st_;
  size_t* work_;
  std::vector<std::vector<Top>> sets_;
  std::unordered_map<std::vector<Top>, int32_t, TopsHash> index_;
  U64Map trans_;
  std::vector<Top> tmp_;
};

// Walks the subtree below `node` (not the node itself) starting from set `start` (the set at
// `node`). Marks allowed tokens; appends to `ctx_nodes` (if given) the nodes with children
// whose set holds kContextTop.
void WalkSubtree(SetGraph& sg, const TokenVocab::Impl& v, int32_t node, int32_t start,
                 std::vector<int32_t>& level, uint32_t* mask, std::vector<int32_t>* ctx_nodes) {
  level[v.depth[node]] = start;
  const int32_t end = v.skip[node];
  for (int32_t i = node + 1; i < end;) {
    uint16_t d = v.depth[i];
    int32_t next = sg.Next(level[d - 1], v.byte[i]);
    if (next < 0) {
      i = v.skip[i];
      continue;
    }
    level[d] = next;
    SetTokens(v, i, mask);
    if (ctx_nodes && v.skip[i] > i + 1 && sg.HasContext(next)) ctx_nodes->push_back(i);
    ++i;
  }
}

// Context key of top `t`: position, kept return positions, then -3 if frames lie below the
// kept ones (*below = the first of them) or -1 if the stack ends there (*below = -1).
void ContextKey(Top t, const FrameTable& frames, std::vector<int32_t>* key, int32_t* below) {
  key->clear();
  key->push_back(TopPos(t));
  int32_t f = TopFrame(t);
  for (int k = 0; k < kContextFrames && f >= 0; ++k) {
    key->push_back(frames[f].first);
    f = frames[f].second;
  }
  key->push_back(f >= 0 ? -3 : -1);
  *below = f;
}

// Null when the walk went over the work budget.
std::shared_ptr<const ContextMask> BuildContextMask(const CompiledGrammar::Impl& c,
                                                    const std::vector<int32_t>& key,
                                                    size_t* work) {
  const GrammarImpl& g = *c.grammar.impl();
  const TokenVocab::Impl& v = c.vocab->impl();
  auto cm = std::make_shared<ContextMask>();
  cm->accepted.assign(MaskWords(int64_t(v.tokens.size())), 0);
  Stepper st(g);
  int32_t f = key.back() == -3 ? st.frames().Intern(kUnknownRet, -1) : -1;
  for (size_t i = key.size() - 2; i >= 1; --i) f = st.frames().Intern(key[i], f);
  std::vector<int32_t> level(size_t(v.max_depth) + 1);
  SetGraph sg(st, work);
  WalkSubtree(sg, v, 0, sg.Intern({MakeTop(key[0], f)}), level, cm->accepted.data(),
              &cm->ctx_nodes);
  return sg.over() ? nullptr : cm;
}

std::shared_ptr<const ContextMask> GetContextMask(const CompiledGrammar::Impl& c,
                                                  const std::vector<int32_t>& key, size_t* work) {
  {
    std::lock_guard<std::mutex> lock(c.ctx_mu);
    auto it = c.ctx_masks.find(key);
    if (it != c.ctx_masks.end()) return it->second;
  }
  auto cm = BuildContextMask(c, key, work);
  if (!cm) return nullptr;  // over budget: nothing kept
  size_t cost = cm->accepted.size() * 4 + cm->ctx_nodes.size() * 4 + key.size() * 8 + 128;
  std::lock_guard<std::mutex> lock(c.ctx_mu);
  if (c.ctx_bytes + cost > kContextMaskBytes) {  // full: drop all, start over
    c.ctx_masks.clear();
    c.ctx_bytes = 0;
  }
  auto [it, inserted] = c.ctx_masks.emplace(key, cm);
  if (inserted) c.ctx_bytes += cost;
  return it->second;
}

}  // namespace

bool ComputeTokenMask(const CompiledGrammar::Impl& c, const std::vector<Top>& tops,
                      const FrameTable& frames, uint32_t* mask) {
  const GrammarImpl& g = *c.grammar.impl();
  const TokenVocab::Impl& v = c.vocab->impl();
  const size_t words = MaskWords(int64_t(v.tokens.size()));
  // Distinct (key, frames below) pairs of the tops.
  std::vector<std::pair<std::vector<int32_t>, int32_t>> groups;
  std::vector<int32_t> key;
  for (Top t : tops) {
    if (t >= kContextTop) continue;
    int32_t below;
    ContextKey(t, frames, &key, &below);
    groups.emplace_back(key, below);
  }
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  Stepper st(g);
  st.frames() = frames;
  std::vector<int32_t> level(size_t(v.max_depth) + 1);
  size_t work = 0;
  SetGraph sg(st, &work);
  std::vector<Top> start;
  const std::vector<int32_t>* last_key = nullptr;
  std::shared_ptr<const ContextMask> cm;
  for (const auto& [k, below] : groups) {
    if (!last_key || *last_key != k) {
      cm = GetContextMask(c, k, &work);
      if (!cm) return false;
      for (size_t w = 0; w < words; ++w) mask[w] |= cm->accepted[w];
      last_key = &k;
    }
    if (below < 0 || cm->ctx_nodes.empty()) continue;
    // The real continuation once the kept frames are popped: pop the frame below them.
    if (!st.Expand(frames[below].first, frames[below].second, &start) || start.empty()) continue;
    int32_t start_id = sg.Intern(start);
    for (int32_t node : cm->ctx_nodes) WalkSubtree(sg, v, node, start_id, level, mask, nullptr);
    if (sg.over()) return false;
  }
  return true;
}

void ComputeTokenMaskByWalk(const GrammarImpl& g, const TokenVocab::Impl& vocab,
                            const std::vector<Top>& tops, const FrameTable& frames,
                            uint32_t* mask) {
  Stepper st(g);
  st.frames() = frames;
  std::vector<int32_t> level(size_t(vocab.max_depth) + 1);
  if (tops.empty()) return;
  size_t work = 0;  // the reference walk has no budget
  SetGraph sg(st, &work);
  WalkSubtree(sg, vocab, 0, sg.Intern(tops), level, mask, nullptr);
}

}  // namespace peng::grammar
