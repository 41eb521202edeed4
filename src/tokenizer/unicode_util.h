// The GPT-2 byte-level alphabet used by byte-level BPE vocabularies.
// Byte-level BPE stores every token as a string over a 256-letter alphabet of printable
// code points: each raw byte maps to exactly one code point (printable Latin-1 bytes map to
// themselves, the others to U+0100 and up, in byte order). All functions are pure and
// thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"  // (the UTF-8 helpers the tokenizers use)

namespace peng {

// GPT-2 byte-level alphabet: byte -> code point (as UTF-8) and back.
const std::string& ByteToUnicode(uint8_t b);
// Maps every byte of `raw` to its alphabet letter.
std::string ByteLevelEncode(std::string_view raw);
// Inverse of ByteLevelEncode. Code points outside the alphabet are copied as UTF-8, so
// decoding never loses text.
std::string ByteLevelDecode(std::string_view text);

}  // namespace peng
