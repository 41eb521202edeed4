// StreamingDecoder: turns generated token ids into printable text one token at a time. A
// token may end in the middle of a UTF-8 character (byte-level BPE and <0xNN> byte tokens
// split multi-byte characters), so bytes are held back until the character is complete;
// Push() only ever returns valid UTF-8. Bytes that can never form a valid character are
// replaced by U+FFFD as soon as that is known, and an incomplete tail by one U+FFFD at
// Flush(). One decoder per sequence; not thread-safe. The Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace peng {

class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // The text that became complete with this token (possibly empty).
  std::string Push(int32_t id);
  // Everything still held back; the decoder is then empty and can be reused.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 sequence
};

// Appends the valid UTF-8 prefix of `*bytes` to *out (invalid bytes as U+FFFD) and leaves in
// *bytes only a trailing incomplete sequence; with `final`, that tail becomes U+FFFD too.
void DrainUtf8(std::string* bytes, bool final, std::string* out);

}  // namespace peng
