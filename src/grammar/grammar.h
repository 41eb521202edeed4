// Grammar-constrained decoding: a context-free grammar over UTF-8 text (written in GBNF, the
// grammar notation of llama.cpp), compiled against one tokenizer's vocabulary, and a Matcher
// that tracks one generation's position in it and says which tokens may come next.
//
//   ParseGbnf(text)            -> Grammar            (syntax errors name line:column)
//   TokenVocab::Build(tok)     -> TokenVocab         (once per tokenizer: token bytes in a trie)
//   CompiledGrammar::Create(grammar, vocab)          (immutable, shared by every request using
//                                                    it; owns a thread-safe mask cache)
//   Matcher(compiled)          per completion: FillMask() -> sample -> Accept(token) -> ...
//
// GBNF accepted (llama.cpp's grammar notation): `name ::= alternatives` rules (names
// [a-zA-Z0-9-_]+), the start rule `root`; "literal" strings with escapes \n \r \t \\ \" \[ \]
// \xHH \uHHHH \UHHHHHHHH; character classes [a-z0-9_] with ranges and [^...] negation (same
// escapes), `.` (any character except nothing: every code point), grouping ( ... ), `|`,
// postfix `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments to end of line, newlines inside
// parentheses. Characters are Unicode code points matched as their UTF-8 bytes.
//
// Token mask: a token is allowed when its bytes (TokenVocab) can extend the text matched so
// far; an end-of-generation token is allowed exactly when the text so far is a complete
// sentence of the grammar (IsComplete()); other special/control tokens (empty byte string)
// are never allowed. Masks are computed by walking the vocabulary trie with the matcher's
// stack set (pruned as soon as no stack survives a byte) and memoized per matcher state in
// the CompiledGrammar (LRU, 16 MiB), so a state met again costs a copy of vocab/32 words. A
// state not met before mostly reuses per-position work: for each stack top, the tokens
// accepted whatever lies more than 3 frames below it are computed once per (position, 3
// return positions) and kept; only tokens that reach below are walked with the real stack.
//
// Limits: grammars over 2^20 elements after expanding repetitions ({m,n} counts up to 100000)
// are rejected. A matcher state holds at most 1024 stacks: a byte that would lead past that (a
// highly ambiguous grammar) is treated as not allowed, never as unbounded growth. One token
// mask may take at most kMaskWorkBudget steps (grammar_internal.h): FillMask returns false
// past it rather than hold the engine thread.
// After an end-of-generation token is accepted the matcher has ended: IsComplete() and
// IsTerminated() are true, FillMask allows only end-of-generation ids and Accept only them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace peng {
class Tokenizer;
namespace grammar {

class GrammarImpl;

// A parsed grammar. Immutable; copies share the rules.
class Grammar {
 public:
  // Parses GBNF text with start rule `root`. InvalidArgument with "line L, column C: ..." for
  // syntax errors, undefined rules, missing root, left recursion, empty character class, ...
  static StatusOr<Grammar> ParseGbnf(std::string_view text, std::string_view root = "root");
  // Brute-force reference: whether the whole of `text` is a sentence of the grammar
  // (complete=true) or a prefix of one (complete=false). For tests.
  bool Matches(std::string_view text, bool complete) const;
  const std::shared_ptr<const GrammarImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<const GrammarImpl> impl_;
};

// The byte strings of a vocabulary, in a trie. Built once per tokenizer (cheap to share).
class TokenVocab {
 public:
  // Token i's bytes are tokenizer.TokenText(i) for normal / user-defined / byte tokens; control
  // tokens have no bytes. `eos_ids` are the end-of-generation ids (tokenizer EOG set).
  static std::shared_ptr<const TokenVocab> Build(const Tokenizer& tokenizer);
  // For tests: explicit token byte strings ("" = special token) and end-of-generation ids.
  static std::shared_ptr<const TokenVocab> FromTokens(std::vector<std::string> tokens,
                                                      std::vector<int32_t> eos_ids);
  int32_t size() const;
  const std::string& bytes(int32_t id) const;
  const std::vector<int32_t>& eos_ids() const;
  // (implementation: trie nodes etc. in the .cc via a private struct)
  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

class CompiledGrammar;

// Mask words: bit (id % 32) of word (id / 32) set = token id allowed.
inline size_t MaskWords(int64_t vocab) { return static_cast<size_t>((vocab + 31) / 32); }

// One generation's position in a grammar: a deduplicated set of parse stacks (positions in
// the rules) over the bytes so far. Copyable (n > 1 completions fork it; a copy costs the
// stacks, a few hundred bytes typically). Holds a reference to its CompiledGrammar. Not
// thread-safe; different Matchers of one CompiledGrammar may run on different threads.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);
  ~Matcher();

  // Writes MaskWords(vocab) words for ids [0, vocab): `vocab` may exceed the TokenVocab's
  // size (a model's padded logits row); ids beyond it are disallowed. False (and an empty mask)
  // when computing this state's mask went over the work budget (kMaskWorkBudget stack steps: a
  // grammar ambiguous enough to keep thousands of stacks alive); the caller should give up on
  // the request rather than hold everyone else up.
  bool FillMask(uint32_t* mask, int64_t vocab) const;
  // Sets logits of disallowed ids to -inf (uses FillMask; the same return value).
  bool ApplyMask(float* logits, int64_t vocab) const;
  // Advances by one token. Returns false (state unchanged) if the token is not allowed.
  // Accepting an end-of-generation id is allowed only when IsComplete(); it ends the matcher.
  bool Accept(int32_t id);
  // Advances by raw bytes (for tests and for forced text); false and unchanged if rejected.
  bool AcceptBytes(std::string_view bytes);
  // The text so far is a complete sentence (EOS allowed).
  bool IsComplete() const;
  // Complete and no byte can extend it: generation must stop now.
  bool IsTerminated() const;

 private:
  struct State;
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<State> state_;
};

class CompiledGrammar {
 public:
  static StatusOr<std::shared_ptr<const CompiledGrammar>> Create(
      const Grammar& grammar, std::shared_ptr<const TokenVocab> vocab);
  const Grammar& grammar() const;
  const TokenVocab& vocab() const;
  struct Impl;
  const Impl& impl() const { return *impl_; }
  ~CompiledGrammar();

 private:
  CompiledGrammar() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grammar
}  // namespace peng
