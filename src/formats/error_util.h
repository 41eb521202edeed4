// Small helpers shared by the format readers for building error messages about untrusted
// bytes: names read from a file are quoted, escaped and truncated so that a hostile file
// cannot produce a multi-megabyte or terminal-garbling message. Stateless, thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace peng::formats_internal {

// 'blk.0.attn_q.weight' -- non-printable bytes become \xNN, long names end in "...".
inline std::string Quote(std::string_view s, size_t max_chars = 96) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max_chars) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out + "'";
}

}  // namespace peng::formats_internal
