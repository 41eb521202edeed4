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

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

int ValidUtf8Prefix(std::string_view s, bool* incomplete) {
  *incomplete = false;
  if (s.empty()) return 0;
  const auto c0 = static_cast<unsigned char>(s[0]);
  if (c0 < 0x80) return 1;
  int len;
  uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c0 >= 0xC2 && c0 <= 0xDF) {
    len = 2;
  } else if (c0 >= 0xE0 && c0 <= 0xEF) {
    len = 3;
    if (c0 == 0xE0) lo = 0xA0;
    if (c0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (c0 >= 0xF0 && c0 <= 0xF4) {
    len = 4;
    if (c0 == 0xF0) lo = 0x90;
    if (c0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int i = 1; i < len; ++i) {
    if (i >= static_cast<int>(s.size())) {
      *incomplete = true;
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    const uint32_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (c < l || c > h) return 0;
  }
  return len;
}

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
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int n = std::min<int>(Utf8SeqLen(c), static_cast<int>(text.size() - i));
    uint32_t cp = 0xFFFFFFFF;
    if (n == 1 && c < 0x80) {
      cp = c;
    } else if (n == 2) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3F);
    }
    if (cp < t.cp_to_byte.size() && t.cp_to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(t.cp_to_byte[cp]));
    } else {
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

}  // namespace peng
