// Small helpers shared by the format readers for their errors about untrusted bytes: names read
// from a file are quoted, escaped and truncated so that a hostile file cannot produce a
// multi-megabyte or terminal-garbling message; a message gets its context (the file, the
// entry) in front; a parse never lets an exception out. Stateless, thread-safe.
#pragma once

#include <exception>
#include <string>
#include <string_view>

#include "core/status.h"

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

// "<context>: <message>", same code.
inline Status WithContext(const Status& s, const std::string& context) {
  return Status(s.code(), context + ": " + s.message());
}

// Parse() itself reports problems as Status values; this only keeps an allocation failure
// (or any other exception from the standard library) from escaping the reader.
template <typename ParseFn>
Status GuardedParse(ParseFn parse) {
  try {
    return parse();
  } catch (const std::exception& e) {
    return ResourceExhausted(std::string("cannot parse: ") + e.what());
  }
}

}  // namespace peng::formats_internal
