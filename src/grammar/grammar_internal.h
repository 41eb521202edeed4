// Internal representation shared by the grammar files (not a public header): the byte-level
// rules a GBNF text compiles to, the vocabulary trie, and the stack-set stepping the Matcher
// and the mask walk use.
//
// Rules are flattened into one element array: each alternative is a run of elements ending
// with kEnd. A kBytes element matches one byte from a 256-bit set (code-point classes were
// split into UTF-8 byte-range sequences by the parser); a kRef element calls a rule. Rules and
// alternatives that can never derive a finite text were dropped by the parser, so every live
// position can still reach a complete sentence.
//
// Matcher state: a set of stacks. A stack is a top position (a kBytes element, or kAccept once
// the root rule is done) plus a frame: a node (return position, parent frame) in a FrameTable
// that hash-conses nodes, so equal stacks have equal (top, frame) pairs. Calls followed by
// kEnd push no frame (tail calls), so repetitions don't grow stacks.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/grammar.h"

namespace peng::grammar {

enum class ElemKind : uint8_t { kBytes, kRef, kEnd };

struct Elem {
  ElemKind kind;
  int32_t arg;  // kBytes: index into byte_sets; kRef: rule id
};

using ByteSet = std::array<uint64_t, 4>;

inline bool HasByte(const ByteSet& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }

class GrammarImpl {
 public:
  struct Rule {
    std::string name;
    std::vector<int32_t> alts;  // start positions (in elems) of the live alternatives
    bool nullable = false;
  };
  std::vector<Elem> elems;
  std::vector<ByteSet> byte_sets;
  std::vector<Rule> rules;
  std::vector<int32_t> rule_of_pos;  // rule owning each element position
  int32_t root = 0;
};

// Limits: grammars past these are rejected by the parser ("grammar too large").
inline constexpr size_t kMaxGrammarElems = 1 << 20;
inline constexpr int32_t kMaxRepetition = 100000;
// Most stacks a matcher state may hold. A step that would exceed it (a highly ambiguous
// grammar) counts as a rejected byte: the matcher never grows past it.
inline constexpr size_t kMaxStacks = 1024;
// Most work one token mask may take: the sum of the stack-set sizes of every fresh byte
// transition of its trie walks (memoized transitions are free). The coldest mask of a JSON
// grammar on Qwen2.5's vocabulary takes ~8,500 (grammar_bench); a grammar whose stack set is new
// after every byte of most tokens (a deepening recursion over a wide character class) takes
// ~10^6 per mask, about a second each, on the engine thread, for everyone. Past this budget the
// mask fails instead (the request ends with an error; the server refuses a grammar whose first
// mask fails with a 400) and nothing is cached.
inline constexpr size_t kMaskWorkBudget = size_t(1) << 18;

// A stack: top position in the high 32 bits, frame id + 1 in the low 32 (0 = root frame).
using Top = uint64_t;
inline constexpr Top kAcceptTop = ~uint64_t{0};
// In a context mask walk (mask.cc): the kept frames were all popped, what follows depends on
// the frames below them. Frames with this return position stand for those unknown frames.
inline constexpr Top kContextTop = kAcceptTop - 1;
inline constexpr int32_t kUnknownRet = -5;
inline Top MakeTop(int32_t pos, int32_t frame) {
  return (uint64_t(uint32_t(pos)) << 32) | uint32_t(frame + 1);
}
inline int32_t TopPos(Top t) { return int32_t(t >> 32); }
inline int32_t TopFrame(Top t) { return int32_t(uint32_t(t)) - 1; }

// Open-addressing set / map of uint64 keys with O(1) clear (generation stamps).
class U64Map {
 public:
  // Returns the value slot for `key`, inserting `fresh` if absent; *inserted says which.
  int32_t& FindOrInsert(uint64_t key, int32_t fresh, bool* inserted);
  void Clear();
  size_t size() const { return size_; }

 private:
  void Grow();
  struct Slot {
    uint64_t key;
    int32_t value;
    uint32_t gen;
  };
  std::vector<Slot> slots_;
  uint32_t gen_ = 1;
  size_t size_ = 0;
};

// Frames (return position, parent frame), hash-consed. Frame -1 is the root.
class FrameTable {
 public:
  int32_t Intern(int32_t ret, int32_t parent);
  const std::pair<int32_t, int32_t>& operator[](int32_t f) const { return frames_[f]; }
  size_t size() const { return frames_.size(); }
  void Clear();

 private:
  std::vector<std::pair<int32_t, int32_t>> frames_;
  U64Map index_;
};

// Advances stack sets by bytes over one FrameTable. Not thread-safe (scratch state).
class Stepper {
 public:
  explicit Stepper(const GrammarImpl& g) : g_(g) {}
  FrameTable& frames() { return frames_; }
  // The stacks at the start of `rule` (root: the initial state). False on overflow.
  bool Start(int32_t rule, std::vector<Top>* out);
  // out = stacks of `in` that accept byte b, advanced and expanded; sorted, unique. False if
  // the result would exceed kMaxStacks (out is then cleared).
  bool Step(const std::vector<Top>& in, uint8_t b, std::vector<Top>* out);
  // out = the stacks continuing at `pos` over `frame` (calls expanded, ends popped); sorted,
  // unique. False on overflow.
  bool Expand(int32_t pos, int32_t frame, std::vector<Top>* out);

 private:
  bool Closure(int32_t pos, int32_t frame, std::vector<Top>* out);
  const GrammarImpl& g_;
  FrameTable frames_;
  U64Map seen_;
  std::vector<std::pair<int32_t, int32_t>> work_;
  // (pos, frame) -> range in memo_tops_ of its closure.
  U64Map memo_index_;
  std::vector<std::pair<uint32_t, uint32_t>> memo_ranges_;
  std::vector<Top> memo_tops_;
  std::vector<Top> tmp_;
};

// Canonical form of a stack set: per stack, its top position then the return positions of its
// frames from the innermost out, -1 terminated; stacks in sorted order. Equal states (same
// stacks) give equal keys whatever frame table they came from.
std::vector<int32_t> CanonicalKey(const std::vector<Top>& tops, const FrameTable& frames);
// Rebuilds `tops` over a fresh frame table holding only their frames, in canonical order.
void Compact(std::vector<Top>* tops, FrameTable* frames);

struct TokenVocab::Impl {
  std::vector<std::string> tokens;
  std::vector<int32_t> eos_ids;
  std::vector<uint8_t> is_eos;
  // Trie in depth-first preorder (node 0 is the root, no byte). skip[i]: the first node after
  // i's subtree. Tokens ending at node i: tok_ids[tok_begin[i] .. tok_begin[i + 1]).
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<int32_t> skip;
  std::vector<int32_t> tok_begin;
  std::vector<int32_t> tok_ids;
  uint16_t max_depth = 0;
};

// Hash of an int sequence (cache keys).
struct IntsHash {
  size_t operator()(const std::vector<int32_t>& k) const;
};

// Bounded LRU of masks keyed by canonical state.
class MaskCache {
 public:
  explicit MaskCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  std::shared_ptr<const std::vector<uint32_t>> Find(const std::vector<int32_t>& key);
  void Insert(std::vector<int32_t> key, std::shared_ptr<const std::vector<uint32_t>> mask);
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }

 private:
  using KeyHash = IntsHash;
  using Entry = std::pair<std::vector<int32_t>, std::shared_ptr<const std::vector<uint32_t>>>;
  std::mutex mu_;
  std::list<Entry> lru_;  // front = most recent
  std::unordered_map<std::vector<int32_t>, std::list<Entry>::iterator, KeyHash> index_;
  size_t bytes_ = 0;
  size_t max_bytes_;
  size_t hits_ = 0, misses_ = 0;
};

// Tokens accepted from one stack top whatever lies below its first kContextFrames frames
// (mask.cc): `accepted` holds in any context; after the bytes of trie node `ctx_nodes[i]` the
// kept frames were all popped, so the tokens below that node depend on the context.
inline constexpr int kContextFrames = 3;
// Memory bounds of one CompiledGrammar's two mask caches (a Qwen2.5 mask is 19 KB, so each
// holds ~850 of them); the server keeps up to 32 compiled grammars (GrammarCache).
inline constexpr size_t kMaskCacheBytes = size_t(16) << 20;
inline constexpr size_t kContextMaskBytes = size_t(16) << 20;
struct ContextMask {
  std::vector<uint32_t> accepted;
  std::vector<int32_t> ctx_nodes;
};

struct CompiledGrammar::Impl {
  Grammar grammar;
  std::shared_ptr<const TokenVocab> vocab;
  std::vector<Top> initial;  // the start state, over initial_frames
  FrameTable initial_frames;
  mutable MaskCache cache{kMaskCacheBytes};
  // Context masks by key (top position, kept return positions, whether frames lie below).
  mutable std::mutex ctx_mu;
  mutable std::unordered_map<std::vector<int32_t>, std::shared_ptr<const ContextMask>, IntsHash>
      ctx_masks;
  mutable size_t ctx_bytes = 0;
};

// ORs into `mask` (MaskWords(vocab size) words, eos ids not included) the tokens allowed by the
// stack set `tops` over `frames`: per top, its context mask (computed once per key and kept in
// `c`), plus the tokens below its context nodes, walked from the real frames below. False when
// it went over kMaskWorkBudget (the mask is then incomplete).
bool ComputeTokenMask(const CompiledGrammar::Impl& c, const std::vector<Top>& tops,
                      const FrameTable& frames, uint32_t* mask);
// The same by walking the whole trie with the stack set (reference for tests / fallback).
void ComputeTokenMaskByWalk(const GrammarImpl& g, const TokenVocab::Impl& vocab,
                            const std::vector<Top>& tops, const FrameTable& frames,
                            uint32_t* mask);

}  // namespace peng::grammar
