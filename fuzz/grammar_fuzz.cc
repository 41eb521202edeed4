// libFuzzer target: GBNF grammars (src/grammar) and the Matcher, differentially against the
// brute-force recognizer.
//
// Input: a GBNF grammar text, then a 0 byte, then a byte string (no 0 byte: the whole input is
// the grammar and the text is empty). The grammar is parsed (errors are fine); a parsed grammar
// is compiled against a tiny fixed vocabulary and a Matcher fed the text byte by byte.
//
// Invariants checked (each holds by construction, see grammar.h):
//   - AcceptBytes(prefix + b) succeeds exactly when Grammar::Matches(prefix + b, false);
//   - IsComplete() == Matches(prefix, true) after every accepted byte;
//   - FillMask allows token t exactly when Matches(prefix + bytes(t), false) (eos: when
//     complete), for the first few prefixes;
//   - a copied Matcher gives the same mask.
// The text is cut at 48 bytes and the grammar at 3000 bytes: the recognizer is cubic.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace {

using namespace peng::grammar;

void Fail(const char* what, std::string_view prefix) {
  std::fprintf(stderr, "grammar_fuzz: %s (prefix of %zu bytes)\n", what, prefix.size());
  std::abort();
}

const std::shared_ptr<const TokenVocab>& Vocab() {
  static const auto* v = new std::shared_ptr<const TokenVocab>(TokenVocab::FromTokens(
      {"a", "b", "{", "}", "\"", ",", " ", "1", "\xC3\xA9", "\xC3", "\xA9", "\xE2\x82\xAC", "ab",
       "\"}", "\\", "", "", "x\"y", "\xF0\x9F\x98\x80", "[0"},
      {16}));
  return *v;
}

bool Bit(const std::vector<uint32_t>& m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

void CheckMask(const Grammar& g, const Matcher& m, const std::string& prefix) {
  const TokenVocab& v = *Vocab();
  std::vector<uint32_t> mask(MaskWords(v.size() + 5));
  m.FillMask(mask.data(), v.size() + 5);
  Matcher copy = m;
  std::vector<uint32_t> again(mask.size());
  copy.FillMask(again.data(), v.size() + 5);
  if (again != mask) Fail("copied matcher has another mask", prefix);
  bool complete = g.Matches(prefix, true);
  for (int32_t id = 0; id < v.size() + 5; ++id) {
    bool want;
    if (id >= v.size()) {
      want = false;
    } else if (id == 16) {
      want = complete;
    } else if (v.bytes(id).empty()) {
      want = false;
    } else {
      want = g.Matches(prefix + v.bytes(id), false);
    }
    if (Bit(mask, id) == want) continue;
    // Allowed difference: a token refused because a step went past the ambiguity cap, which
    // AcceptBytes refuses the same way.
    Matcher probe = m;
    if (Bit(mask, id) || probe.AcceptBytes(v.bytes(id))) Fail("mask differs from the recognizer", prefix);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t zero = in.find('\0');
  std::string_view text = in.substr(0, zero);
  std::string_view bytes = zero == std::string_view::npos ? "" : in.substr(zero + 1);
  if (text.size() > 3000) return 0;
  if (bytes.size() > 48) bytes = bytes.substr(0, 48);
  auto g = Grammar::ParseGbnf(text);
  if (!g.ok()) {
    if (g.status().message().rfind("line ", 0) != 0) Fail("error without a position", "");
    return 0;
  }
  auto c = CompiledGrammar::Create(*g, Vocab());
  if (!c.ok()) return 0;
  Matcher m(*c);
  std::string prefix;
  for (size_t i = 0; i <= bytes.size(); ++i) {
    if (m.IsComplete() != g->Matches(prefix, true)) Fail("IsComplete differs", prefix);
    if (i < 3) CheckMask(*g, m, prefix);
    if (i == bytes.size()) break;
    std::string next = prefix + bytes[i];
    bool ok = m.AcceptBytes(bytes.substr(i, 1));
    if (ok != g->Matches(next, false)) {
      // The only allowed difference: the Matcher refuses a step past its ambiguity cap.
      if (ok) Fail("AcceptBytes took a byte the recognizer rejects", next);
      return 0;
    }
    if (!ok) break;
    prefix = std::move(next);
  }
  return 0;
}
