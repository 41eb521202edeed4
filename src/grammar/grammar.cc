// CompiledGrammar, its mask cache, the trie walk that computes a token mask, and the Matcher.
#include "grammar/grammar.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "grammar/grammar_internal.h"

namespace peng::grammar {

// ---- MaskCache ----

size_t IntsHash::operator()(const std::vector<int32_t>& k) const {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ k.size();
  for (int32_t v : k) {
    h ^= uint32_t(v);
    h *= 0x100000001B3ULL;
    h ^= h >> 29;
  }
  return size_t(h);
}

std::shared_ptr<const std::vector<uint32_t>> MaskCache::Find(const std::vector<int32_t>& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void MaskCache::Insert(std::vector<int32_t> key,
                       std::shared_ptr<const std::vector<uint32_t>> mask) {
  size_t cost = mask->size() * sizeof(uint32_t) + key.size() * sizeof(int32_t) * 2 + 64;
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key)) return;
  lru_.emplace_front(key, std::move(mask));
  index_.emplace(std::move(key), lru_.begin());
  bytes_ += cost;
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    auto& [k, m] = lru_.back();
    bytes_ -= m->size() * sizeof(uint32_t) + k.size() * sizeof(int32_t) * 2 + 64;
    index_.erase(k);
    lru_.pop_back();
  }
}

// ---- CompiledGrammar ----

StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Create(
    const Grammar& grammar, std::shared_ptr<const TokenVocab> vocab) {
  if (!grammar.impl()) return InvalidArgument("grammar: empty Grammar (not parsed)");
  if (!vocab) return InvalidArgument("grammar: no vocabulary");
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar());
  c->impl_ = std::make_unique<Impl>();
  c->impl_->grammar = grammar;
  c->impl_->vocab = std::move(vocab);
  const GrammarImpl& g = *grammar.impl();
  Stepper st(g);
  if (!st.Start(g.root, &c->impl_->initial)) {
    return ResourceExhausted("grammar: the start state has more than " +
                             std::to_string(kMaxStacks) + " stacks (grammar too ambiguous)");
  }
  c->impl_->initial_frames = st.frames();
  Compact(&c->impl_->initial, &c->impl_->initial_frames);
  return std::shared_ptr<const CompiledGrammar>(std::move(c));
}

CompiledGrammar::~CompiledGrammar() = default;
const Grammar& CompiledGrammar::grammar() const { return impl_->grammar; }
const TokenVocab& CompiledGrammar::vocab() const { return *impl_->vocab; }

// ---- Matcher ----

struct Matcher::State {
  std::vector<Top> tops;  // sorted; canonical over `frames` (Compact)
  FrameTable frames;
  bool ended = false;  // an end-of-generation token was accepted
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>()) {
  state_->tops = grammar_->impl().initial;
  state_->frames = grammar_->impl().initial_frames;
}

Matcher::Matcher(const Matcher& o)
    : grammar_(o.grammar_), state_(std::make_unique<State>(*o.state_)) {}

Matcher& Matcher::operator=(const Matcher& o) {
  if (this != &o) {
    grammar_ = o.grammar_;
    state_ = std::make_unique<State>(*o.state_);
  }
  return *this;
}

Matcher::~Matcher() = default;

bool Matcher::IsComplete() const {
  return state_->ended || (!state_->tops.empty() && state_->tops.back() == kAcceptTop);
}

bool Matcher::IsTerminated() const {
  return state_->ended || (state_->tops.size() == 1 && state_->tops[0] == kAcceptTop);
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  if (bytes.empty()) return true;
  if (state_->ended) return false;
  const GrammarImpl& g = *grammar_->impl().grammar.impl();
  Stepper st(g);
  st.frames() = state_->frames;
  std::vector<Top> cur = state_->tops, next;
  for (char c : bytes) {
    if (!st.Step(cur, uint8_t(c), &next) || next.empty()) return false;
    cur.swap(next);
  }
  Compact(&cur, &st.frames());
  state_->tops = std::move(cur);
  state_->frames = std::move(st.frames());
  return true;
}

bool Matcher::Accept(int32_t id) {
  const TokenVocab::Impl& v = grammar_->impl().vocab->impl();
  if (id < 0 || id >= int32_t(v.tokens.size())) return false;
  if (v.is_eos[id]) {
    if (!IsComplete()) return false;
    state_->ended = true;
    return true;
  }
  if (state_->ended || v.tokens[id].empty()) return false;
  return AcceptBytes(v.tokens[id]);
}

bool Matcher::FillMask(uint32_t* mask, int64_t vocab) const {
  const size_t words = MaskWords(vocab);
  std::memset(mask, 0, words * sizeof(uint32_t));
  const CompiledGrammar::Impl& c = grammar_->impl();
  const TokenVocab::Impl& v = c.vocab->impl();
  const int64_t n = std::min<int64_t>(vocab, int64_t(v.tokens.size()));
  if (!state_->ended) {
    std::vector<int32_t> key = CanonicalKey(state_->tops, state_->frames);
    auto cached = c.cache.Find(key);
    if (!cached) {
      auto fresh = std::make_shared<std::vector<uint32_t>>(MaskWords(int64_t(v.tokens.size())), 0);
      if (!ComputeTokenMask(c, state_->tops, state_->frames, fresh->data())) {
        std::memset(mask, 0, words * sizeof(uint32_t));  // over the work budget: nothing
        return false;
      }
      cached = fresh;
      c.cache.Insert(std::move(key), std::move(fresh));
    }
    const size_t full = size_t(n / 32);
    std::memcpy(mask, cached->data(), full * sizeof(uint32_t));
    if (n % 32) mask[full] = (*cached)[full] & ((1u << (n % 32)) - 1);
  }
  if (IsComplete()) {
    for (int32_t id : v.eos_ids) {
      if (id < vocab) mask[id >> 5] |= 1u << (id & 31);
    }
  }
  return true;
}

bool Matcher::ApplyMask(float* logits, int64_t vocab) const {
  thread_local std::vector<uint32_t> mask;  // scratch: no allocation per call
  mask.resize(MaskWords(vocab));
  const bool ok = FillMask(mask.data(), vocab);
  const float ninf = -std::numeric_limits<float>::infinity();
  // A word at a time: whole words of disallowed ids (most of the vocabulary in most states)
  // are one fill, whole allowed words are skipped.
  for (int64_t w = 0, base = 0; base < vocab; ++w, base += 32) {
    const uint32_t bits = mask[w];
    const int64_t n = std::min<int64_t>(32, vocab - base);
    if (bits == 0) {
      std::fill_n(logits + base, n, ninf);
    } else if (bits != 0xffffffffu) {
      for (int64_t i = 0; i < n; ++i)
        if (!((bits >> i) & 1)) logits[base + i] = ninf;
    }
  }
  return ok;
}

}  // namespace peng::grammar
