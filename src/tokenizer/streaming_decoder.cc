#include "tokenizer/streaming_decoder.h"

#include "tokenizer/unicode_util.h"

namespace peng {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

void DrainUtf8(std::string* bytes, bool final, std::string* out) {
  const std::string_view s = *bytes;
  size_t i = 0;
  while (i < s.size()) {
    bool incomplete = false;
    const int n = ValidUtf8Prefix(s.substr(i), &incomplete);
    if (n > 0) {
      out->append(s.substr(i, n));
      i += n;
    } else if (incomplete && !final) {
      break;  // wait for the rest of the character
    } else {
      out->append(kReplacement);
      // An incomplete tail is one broken character; an invalid byte is skipped alone.
      i = incomplete ? s.size() : i + 1;
    }
  }
  bytes->erase(0, i);
}

std::string StreamingDecoder::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsControl(id)) return {};
  pending_ += tokenizer_.TokenText(id);
  std::string out;
  DrainUtf8(&pending_, /*final=*/false, &out);
  return out;
}

std::string StreamingDecoder::Flush() {
  std::string out;
  DrainUtf8(&pending_, /*final=*/true, &out);
  return out;
}

}  // namespace peng
