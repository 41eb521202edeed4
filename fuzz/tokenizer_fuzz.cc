// libFuzzer target: tokenizers (src/tokenizer) on arbitrary text and arbitrary token ids.
//
// Input: byte 0 picks the tokenizer (bits 0-1: 0 and 3 the DeepSeek-style byte-level BPE of
// tests/data/deepseek_tiny/serve, 1 the byte-level BPE of tests/data/tokenizer/tiny_bpe, 2 a
// small SentencePiece-style vocabulary built here, since the committed SentencePiece
// tokenizers only come inside GGUF files that are not committed); the rest is the text. The
// text is encoded with and without parse_special and decoded again, and the same bytes, read
// as little-endian 16-bit values, are decoded as a token id sequence (mostly in the vocabulary,
// a few outside it), both at once and token by token through StreamingDecoder.
//
// Invariants checked (each holds by construction, see tokenizer.h / streaming_decoder.h):
//   - every encoded id is in [0, vocab);
//   - byte-level BPE with all 256 byte tokens (both fixtures): Decode(Encode(s)) == s for any
//     bytes s, with or without parse_special (special tokens decode to their own text);
//   - streaming: every Push() is valid UTF-8, and the pushes plus Flush() equal the one-shot
//     Decode() run through DrainUtf8 (same skip_special), for byte-level BPE;
//   - Encode(add_bos=true) is Encode(add_bos=false) with the BOS id in front, when there is one.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/test_paths.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace {

using peng::Tokenizer;

std::unique_ptr<Tokenizer> LoadHf(const std::string& rel) {
  const std::string dir = peng::test_util::SourceDir() + "/" + rel;
  auto tok = Tokenizer::FromHfFolder(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_fuzz: %s: %s\n", dir.c_str(), tok.status().ToString().c_str());
    std::abort();
  }
  return std::move(tok).value();
}

// A SentencePiece-style BPE vocabulary: control, unknown and user-defined tokens, byte
// fallback for a few bytes only (so that unknown bytes are reachable), merges by score.
std::unique_ptr<Tokenizer> MakeSpm() {
  peng::VocabSpec spec;
  spec.model = peng::TokenizerModel::kSentencePieceBpe;
  const std::string sp = "\xE2\x96\x81";  // U+2581
  const std::vector<std::pair<std::string, peng::TokenType>> special = {
      {"<unk>", peng::TokenType::kUnknown},
      {"<s>", peng::TokenType::kControl},
      {"</s>", peng::TokenType::kControl},
      {"<start_of_turn>", peng::TokenType::kControl},
      {"<end_of_turn>", peng::TokenType::kControl},
      {"<tool>", peng::TokenType::kUserDefined},
      {"<0x0A>", peng::TokenType::kByte},
      {"<0xC3>", peng::TokenType::kByte},
      {"<0xE4>", peng::TokenType::kByte},
      {"<0xF0>", peng::TokenType::kByte},
      {"<0x80>", peng::TokenType::kByte},
      {"<0xA9>", peng::TokenType::kByte},
  };
  for (const auto& [t, type] : special) {
    spec.tokens.push_back(t);
    spec.types.push_back(type);
    spec.scores.push_back(0.0f);
  }
  const std::vector<std::string> pieces = {
      sp, "a", "b", "c", "d", "e", "h", "i", "l", "n", "o", "r", "s", "t", "w", "\xE4\xBD\xA0",
      "\xE5\xA5\xBD", sp + "t", "th", sp + "th", "he", sp + "the", "in", "er", "ll", "lo",
      sp + "h", sp + "he", "hel", "hello", sp + "hello", sp + "w", "or", "wor", sp + "wor",
      "ld", sp + "world", "\xE4\xBD\xA0\xE5\xA5\xBD", sp + sp, sp + sp + sp + sp};
  for (size_t i = 0; i < pieces.size(); ++i) {
    spec.tokens.push_back(pieces[i]);
    spec.types.push_back(peng::TokenType::kNormal);
    spec.scores.push_back(-static_cast<float>(i % 13) - 0.5f * static_cast<float>(i));
  }
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  spec.add_space_prefix = true;
  auto tok = Tokenizer::FromSpec(std::move(spec));
  PENG_CHECK(tok.ok());
  return std::move(tok).value();
}

struct Fixtures {
  std::unique_ptr<Tokenizer> deepseek = LoadHf("tests/data/deepseek_tiny/serve");
  std::unique_ptr<Tokenizer> tiny_bpe = LoadHf("tests/data/tokenizer/tiny_bpe");
  std::unique_ptr<Tokenizer> spm = MakeSpm();
};

const Fixtures& Get() {
  static const Fixtures* f = new Fixtures();
  return *f;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    bool incomplete = false;
    const int n = peng::ValidUtf8Prefix(s.substr(i), &incomplete);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

void CheckIds(const Tokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) PENG_CHECK(id >= 0 && id < t.vocab_size());
}

// Streams `ids` through a StreamingDecoder; returns the text.
std::string Stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  peng::StreamingDecoder dec(t, skip_special);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = dec.Push(id);
    PENG_CHECK(IsValidUtf8(piece));
    all += piece;
  }
  const std::string tail = dec.Flush();
  PENG_CHECK(IsValidUtf8(tail));
  all += tail;
  PENG_CHECK(dec.Flush().empty());
  return all;
}

void CheckDecode(const Tokenizer& t, const std::vector<int32_t>& ids, bool byte_level) {
  for (bool skip : {false, true}) {
    const std::string text = t.Decode(ids, skip);
    const std::string streamed = Stream(t, ids, skip);
    if (byte_level) {
      std::string pending = text, expect;
      peng::DrainUtf8(&pending, /*final=*/true, &expect);
      PENG_CHECK(pending.empty());
      PENG_CHECK_MSG(streamed == expect, "streamed text differs from Decode()");
    }
  }
  for (int32_t id : ids) (void)t.TokenText(id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Fixtures& f = Get();
  const int which = data[0] & 3;
  const Tokenizer& t = which == 1 ? *f.tiny_bpe : which == 2 ? *f.spm : *f.deepseek;
  const bool byte_level = t.model() == peng::TokenizerModel::kByteLevelBpe;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  for (bool parse_special : {true, false}) {
    const std::vector<int32_t> ids = t.Encode(text, /*add_bos=*/false, parse_special);
    CheckIds(t, ids);
    if (byte_level) {
      PENG_CHECK_MSG(t.Decode(ids) == text, "Decode(Encode(s)) != s");
    }
    const std::vector<int32_t> with_bos = t.Encode(text, /*add_bos=*/true, parse_special);
    if (t.bos_id() >= 0) {
      PENG_CHECK(!with_bos.empty() && with_bos[0] == t.bos_id());
      PENG_CHECK(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()) == ids);
    } else {
      PENG_CHECK(with_bos == ids);
    }
    CheckDecode(t, ids, byte_level);
  }

  // The same bytes as token ids: mostly valid ids, every 16th one possibly outside the vocab.
  std::vector<int32_t> ids;
  const int32_t vocab = t.vocab_size();
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    const uint32_t v = static_cast<uint8_t>(text[i]) | (static_cast<uint8_t>(text[i + 1]) << 8);
    if ((v >> 12) == 0xF) {
      const int32_t odd[] = {-1, vocab, vocab + 1, INT32_MAX, INT32_MIN};
      ids.push_back(odd[v % 5]);
    } else {
      ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(vocab)));
    }
  }
  CheckDecode(t, ids, byte_level);
  return 0;
}
