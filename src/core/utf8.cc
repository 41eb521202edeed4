#include "core/utf8.h"

namespace peng {

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

uint32_t DecodeUtf8At(std::string_view s, size_t* len) {
  bool incomplete = false;
  const int n = ValidUtf8Prefix(s, &incomplete);
  if (n == 0) {
    *len = 1;
    return 0xFFFD;
  }
  *len = static_cast<size_t>(n);
  const auto b0 = static_cast<unsigned char>(s[0]);
  uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
  return cp;
}

std::vector<uint32_t> DecodeUtf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0, n = 0; i < text.size(); i += n) {
    out.push_back(DecodeUtf8At(text.substr(i), &n));
  }
  return out;
}

int EncodeUtf8(uint32_t cp, uint8_t out[4]) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    return 1;
  }
  if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
  out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
  out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
  out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  return 4;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  uint8_t bytes[4];
  out->append(reinterpret_cast<const char*>(bytes), EncodeUtf8(cp, bytes));
}

}  // namespace peng
