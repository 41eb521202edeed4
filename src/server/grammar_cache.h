// GrammarCache: compiles the GBNF grammars of requests (structured output, forced tool calls)
// against the served model's vocabulary, and keeps the most recently used ones, so the many
// requests of an application that sends the same schema share one CompiledGrammar -- and its
// memoized token masks. The vocabulary index (grammar::TokenVocab) is built on first use.
//
// Thread-safe: Get() is called from the server's worker threads.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/status.h"

namespace peng {
class Tokenizer;
namespace grammar {
class CompiledGrammar;
class TokenVocab;
}  // namespace grammar

namespace server {

class GrammarCache {
 public:
  // `tokenizer` may be null (then every Get() fails); it must outlive the cache.
  explicit GrammarCache(const Tokenizer* tokenizer, size_t capacity = 32);
  ~GrammarCache();

  // The grammar `gbnf` compiled for the tokenizer; InvalidArgument for a bad grammar.
  StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> Get(const std::string& gbnf);

  size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const grammar::CompiledGrammar>>;
  const Tokenizer* tokenizer_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::shared_ptr<const grammar::TokenVocab> vocab_;  // guarded by mu_
  std::list<Entry> lru_;                              // most recent first; guarded by mu_
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

}  // namespace server
}  // namespace peng
