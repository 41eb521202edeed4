#include "tokenizer/unicode_util.h"

#include <array>

namespace peng {
namespace {

struct ByteTables {
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 324> cp_to_byte;  // alphabet code points are all < 324
};

const ByteTables& Tables() {
  static const ByteTables tables = [] {
    ByteTables t;
    t.cp_to_byte.fill(-1);
    int next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : next_extra++;
      AppendUtf8(cp, &t.byte_to_utf8[b]);
      t.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& ByteToUnicode(uint8_t b) { return Tables().byte_to_utf8[b]; }

std::string ByteLevelEncode(std::string_view raw) {
  const ByteTables& t = Tables();
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += t.byte_to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string ByteLevelDecode(std::string_view text) {
  const ByteTables& t = Tables();
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0, n = 0; i < text.size(); i += n) {
    const uint32_t cp = DecodeUtf8At(text.substr(i), &n);  // U+FFFD (not a letter): a stray byte
    if (cp < t.cp_to_byte.size() && t.cp_to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(t.cp_to_byte[cp]));
    } else {
      out.append(text.substr(i, n));
    }
  }
  return out;
}

}  // namespace peng
