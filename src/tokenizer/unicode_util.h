// UTF-8 helpers and the GPT-2 byte-level alphabet used by byte-level BPE vocabularies.
// Byte-level BPE stores every token as a string over a 256-letter alphabet of printable
// code points: each raw byte maps to exactly one code point (printable Latin-1 bytes map to
// themselves, the others to U+0100 and up, in byte order). All functions are pure and
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace peng {

// Length of the UTF-8 sequence that starts with lead byte `c` (1 for invalid lead bytes and
// continuation bytes, so that a scanner always makes progress).
inline int Utf8SeqLen(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

void AppendUtf8(uint32_t cp, std::string* out);

// Length in bytes of the valid UTF-8 sequence at the start of `s`, or 0 when `s` does not
// start with a complete valid sequence. Sets *incomplete when `s` is a proper prefix of a
// valid sequence (more bytes could still make it valid).
int ValidUtf8Prefix(std::string_view s, bool* incomplete);

// GPT-2 byte-level alphabet: byte -> code point (as UTF-8) and back.
const std::string& ByteToUnicode(uint8_t b);
// Maps every byte of `raw` to its alphabet letter.
std::string ByteLevelEncode(std::string_view raw);
// Inverse of ByteLevelEncode. Code points outside the alphabet are copied as UTF-8, so
// decoding never loses text.
std::string ByteLevelDecode(std::string_view text);

}  // namespace peng
