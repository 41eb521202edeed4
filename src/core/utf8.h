// UTF-8, in one place: a lead byte's sequence length, strict validation and decoding (the
// shortest form only; no surrogates, nothing above U+10FFFF), and encoding. The tokenizers, the
// chat templates and the grammars all take these. Pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace peng {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Length of the UTF-8 sequence that starts with lead byte `c` (1 for invalid lead bytes and
// continuation bytes, so that a scanner always makes progress). Not a validation.
inline int Utf8SeqLen(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

// Length in bytes of the valid UTF-8 sequence at the start of `s`, or 0 when `s` does not
// start with a complete valid sequence. Sets *incomplete when `s` is a proper prefix of a
// valid sequence (more bytes could still make it valid).
int ValidUtf8Prefix(std::string_view s, bool* incomplete);

// The code point at the start of `s` (not empty) and, in *len, how many bytes it takes; where
// `s` does not start with a valid sequence, U+FFFD and 1 (a scanner resumes at the next byte).
uint32_t DecodeUtf8At(std::string_view s, size_t* len);

// Every code point of `text`, each invalid byte as U+FFFD (DecodeUtf8At over the whole text).
std::vector<uint32_t> DecodeUtf8(std::string_view text);

// Writes the 1-4 bytes of code point `cp` (at most kMaxCodePoint) to `out`; returns how many.
int EncodeUtf8(uint32_t cp, uint8_t out[4]);
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace peng
