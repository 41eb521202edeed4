#include "server/grammar_cache.h"

#include <vector>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace peng::server {

GrammarCache::GrammarCache(const Tokenizer* tokenizer, size_t capacity)
    : tokenizer_(tokenizer), capacity_(capacity == 0 ? 1 : capacity) {}

GrammarCache::~GrammarCache() = default;

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> GrammarCache::Get(
    const std::string& gbnf) {
  if (!tokenizer_) return InvalidArgument("structured output needs the model's tokenizer");
  std::shared_ptr<const grammar::TokenVocab> vocab;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(gbnf); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    if (!vocab_) vocab_ = grammar::TokenVocab::Build(*tokenizer_);
    vocab = vocab_;
  }
  // Compiled outside the lock: a slow grammar does not hold up requests with cached ones. Two
  // requests with the same new grammar may both compile it; the second insert wins.
  StatusOr<grammar::Grammar> parsed = grammar::Grammar::ParseGbnf(gbnf);
  if (!parsed.ok()) return parsed.status();
  StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
      grammar::CompiledGrammar::Create(*parsed, std::move(vocab));
  if (!compiled.ok()) return compiled.status();
  // The first mask, here on a worker thread (the engine finds it cached): a grammar whose very
  // first mask goes over the work budget is refused now, as a bad request.
  std::vector<uint32_t> mask(grammar::MaskWords((*compiled)->vocab().size()));
  if (!grammar::Matcher(*compiled).FillMask(mask.data(), (*compiled)->vocab().size())) {
    return InvalidArgument("the grammar is too ambiguous to follow (its first token mask went "
                           "over the work budget)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(gbnf); it != index_.end()) {
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(gbnf, *compiled);
  index_[gbnf] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return *compiled;
}

}  // namespace peng::server
