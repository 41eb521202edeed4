// TokenVocab: every token's bytes and the byte trie the mask walk descends.
#include <algorithm>
#include <numeric>

#include "grammar/grammar_internal.h"
#include "tokenizer/tokenizer.h"

namespace peng::grammar {
namespace {

std::shared_ptr<const TokenVocab::Impl> BuildImpl(std::vector<std::string> tokens,
                                                  std::vector<int32_t> eos_ids) {
  auto impl = std::make_shared<TokenVocab::Impl>();
  const int32_t n = int32_t(tokens.size());
  impl->is_eos.assign(n, 0);
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
  for (int32_t id : eos_ids) {
    if (id >= 0 && id < n) {
      impl->is_eos[id] = 1;
      impl->eos_ids.push_back(id);
    }
  }
  // Ids with bytes (end-of-generation ids never go through the trie), in byte order.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    if (!impl->is_eos[id] && !tokens[id].empty() && tokens[id].size() < 65535) order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  // Inserting sorted strings creates the nodes in depth-first preorder.
  impl->byte.push_back(0);
  impl->depth.push_back(0);
  impl->skip.push_back(0);
  impl->tok_begin.push_back(0);
  std::vector<int32_t> path{0};  // node per depth of the current string
  std::string_view prev;
  auto close = [&](size_t keep) {
    while (path.size() > keep) {
      impl->skip[path.back()] = int32_t(impl->byte.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    std::string_view s = tokens[id];
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    close(lcp + 1);
    for (size_t i = lcp; i < s.size(); ++i) {
      path.push_back(int32_t(impl->byte.size()));
      impl->byte.push_back(uint8_t(s[i]));
      impl->depth.push_back(uint16_t(i + 1));
      impl->skip.push_back(0);
      impl->tok_begin.push_back(int32_t(impl->tok_ids.size()));
    }
    impl->tok_ids.push_back(id);
    impl->max_depth = std::max<uint16_t>(impl->max_depth, uint16_t(s.size()));
    prev = s;
  }
  close(0);
  impl->tok_begin.push_back(int32_t(impl->tok_ids.size()));
  impl->tokens = std::move(tokens);
  return impl;
}

}  // namespace

std::shared_ptr<const TokenVocab> TokenVocab::FromTokens(std::vector<std::string> tokens,
                                                         std::vector<int32_t> eos_ids) {
  auto v = std::make_shared<TokenVocab>();
  v->impl_ = BuildImpl(std::move(tokens), std::move(eos_ids));
  return v;
}

std::shared_ptr<const TokenVocab> TokenVocab::Build(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> tokens(n);
  std::vector<int32_t> eos;
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.IsEndOfGeneration(id)) eos.push_back(id);
    TokenType type = tokenizer.token_type(id);
    bool has_bytes = type == TokenType::kNormal || type == TokenType::kUserDefined ||
                     type == TokenType::kByte || type == TokenType::kUndefined;
    if (has_bytes && !tokenizer.IsControl(id)) tokens[id] = tokenizer.TokenText(id);
  }
  if (tokenizer.eos_id() >= 0) eos.push_back(tokenizer.eos_id());
  return FromTokens(std::move(tokens), std::move(eos));
}

int32_t TokenVocab::size() const { return int32_t(impl_->tokens.size()); }
const std::string& TokenVocab::bytes(int32_t id) const { return impl_->tokens[id]; }
const std::vector<int32_t>& TokenVocab::eos_ids() const { return impl_->eos_ids; }

}  // namespace peng::grammar
