#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/bpe_model.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/unicode_util.h"

namespace peng {
namespace {

// Texts of tokens that end a turn in common chat formats.
constexpr std::string_view kEndOfGenerationNames[] = {
    "<|eot_id|>", "<|eom_id|>",    "<|im_end|>",      "<|end|>",   "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<EOT>",   "<|return|>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",  // DeepSeek
};

bool IsSpecialType(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

}  // namespace

Tokenizer::Tokenizer(VocabSpec spec) : spec_(std::move(spec)) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(VocabSpec spec) {
  std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(spec)));
  PENG_RETURN_IF_ERROR(t->Init());
  return t;
}

Status Tokenizer::Init() {
  const int32_t n = vocab_size();
  if (n == 0) return InvalidArgument("tokenizer: empty vocabulary");
  if (!spec_.types.empty() && spec_.types.size() != spec_.tokens.size()) {
    return InvalidArgument("tokenizer: " + std::to_string(spec_.types.size()) +
                           " token types for " + std::to_string(n) + " tokens");
  }
  if (!spec_.scores.empty() && spec_.scores.size() != spec_.tokens.size()) {
    return InvalidArgument("tokenizer: " + std::to_string(spec_.scores.size()) +
                           " scores for " + std::to_string(n) + " tokens");
  }
  for (int32_t* id : {&spec_.bos_id, &spec_.eos_id, &spec_.unk_id}) {
    if (*id >= n) *id = -1;
  }
  index_.reserve(n);
  for (int32_t i = 0; i < n; ++i) index_.emplace(spec_.tokens[i], i);  // first spelling wins

  decoded_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& tok = spec_.tokens[i];
    const TokenType type = token_type(i);
    if (type == TokenType::kControl || type == TokenType::kUserDefined) {
      decoded_[i] = tok;
    } else if (spec_.model == TokenizerModel::kByteLevelBpe) {
      decoded_[i] = ByteLevelDecode(tok);
    } else if (type == TokenType::kByte && tok.size() == 6 && tok.starts_with("<0x")) {
      decoded_[i] = std::string(1, static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
    } else {
      decoded_[i] = ReplaceAll(tok, kSpmSpace, " ");
    }
  }

  BuildSpecialTrie();

  if (spec_.eos_id >= 0) eog_.insert(spec_.eos_id);
  for (int32_t id : spec_.eog_ids) {
    if (id >= 0 && id < n) eog_.insert(id);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (!IsSpecialType(token_type(i))) continue;
    for (std::string_view name : kEndOfGenerationNames) {
      if (spec_.tokens[i] == name) eog_.insert(i);
    }
  }

  if (spec_.model == TokenizerModel::kByteLevelBpe) {
    PENG_ASSIGN_OR_RETURN(pre_, PreTokenizer::Create(spec_.pre_regexes));
    bpe_ = std::make_unique<BpeModel>(spec_, index_);
  } else {
    spm_ = std::make_unique<SpmModel>(spec_, index_);
  }
  return OkStatus();
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return spec_.types.empty() ? TokenType::kNormal : spec_.types[id];
}

bool Tokenizer::IsControl(int32_t id) const {
  return token_type(id) == TokenType::kControl || id == spec_.bos_id || id == spec_.eos_id;
}

void Tokenizer::BuildSpecialTrie() {
  trie_.assign(1, TrieNode());
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const std::string& text = spec_.tokens[id];
    if (!IsSpecialType(token_type(id)) || text.empty()) continue;
    int32_t node = 0;
    for (char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      auto& kids = trie_[node].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, int32_t{-1}));
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        const auto next = static_cast<int32_t>(trie_.size());
        kids.insert(it, {c, next});
        trie_.emplace_back();  // invalidates `kids`; not used after this
        node = next;
      }
    }
    if (trie_[node].token < 0) trie_[node].token = id;
  }
}

void Tokenizer::Partition(std::string_view text, bool parse_special,
                          std::vector<Fragment>* out) const {
  size_t raw_start = 0, pos = 0;
  while (pos < text.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& kids = trie_[node].children;
      const auto c = static_cast<unsigned char>(text[i]);
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, int32_t{-1}));
      if (it == kids.end() || it->first != c) break;
      node = it->second;
      const int32_t tok = trie_[node].token;
      if (tok >= 0 && (parse_special || token_type(tok) == TokenType::kUserDefined)) {
        best = tok;
        best_len = i + 1 - pos;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    if (pos > raw_start) out->push_back({-1, text.substr(raw_start, pos - raw_start)});
    out->push_back({best, {}});
    pos += best_len;
    raw_start = pos;
  }
  if (raw_start < text.size()) out->push_back({-1, text.substr(raw_start)});
}

void Tokenizer::EncodeRaw(std::string_view text, bool prev_special,
                          std::vector<int32_t>* out) const {
  if (spm_) {
    std::string escaped;
    if (spec_.add_space_prefix && prev_special) escaped = kSpmSpace;
    escaped += ReplaceAll(text, " ", kSpmSpace);
    spm_->Encode(escaped, out);
    return;
  }
  std::vector<std::string_view> words;
  pre_->Split(text, &words);
  for (std::string_view w : words) bpe_->EncodeWord(w, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && spec_.bos_id >= 0) ids.push_back(spec_.bos_id);
  std::vector<Fragment> fragments;
  Partition(text, parse_special, &fragments);
  bool prev_special = true;  // the start of the text counts as a boundary
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      prev_special = true;
    } else {
      EncodeRaw(f.text, prev_special, &ids);
      prev_special = false;
    }
  }
  return ids;
}

std::string Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return decoded_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && IsControl(id)) continue;
    std::string_view piece = decoded_[id];
    // SentencePiece adds a space before the text; the first piece gives it back.
    if (first && spm_ && spec_.add_space_prefix && token_type(id) == TokenType::kNormal &&
        piece.starts_with(' ')) {
      piece.remove_prefix(1);
    }
    if (!IsControl(id)) first = false;
    out.append(piece);
  }
  return out;
}

}  // namespace peng
