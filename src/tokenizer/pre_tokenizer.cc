#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/check.h"

namespace peng {

const char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Contractions spelled case-insensitively, then the GPT-4 style word/number/punctuation
// alternatives; `digits` is the number alternative (\p{N}{1,3} or \p{N}).
std::string Gpt4StyleRegex(const char* digits) {
  return std::string(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)") + digits +
         R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

}  // namespace

bool RegexesForPreName(std::string_view pre, std::vector<std::string>* regexes) {
  regexes->clear();
  if (pre == "gpt2" || pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais") {
    *regexes = {kGpt2Regex};
  } else if (pre == "llama3" || pre == "llama-bpe" || pre == "llama-v3" || pre == "dbrx" ||
             pre == "smaug-bpe" || pre == "chatglm-bpe") {
    *regexes = {Gpt4StyleRegex(R"(\p{N}{1,3})")};
  } else if (pre == "qwen2" || pre == "stablelm2" || pre == "hunyuan") {
    *regexes = {Gpt4StyleRegex(R"(\p{N})")};
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
             pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    // Every digit is its own piece, then GPT-2 splitting.
    *regexes = {R"(\p{N})", kGpt2Regex};
  } else if (pre == "deepseek-llm") {
    *regexes = {
        "[\r\n]",
        "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293"
        "\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C"
        "\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5"
        "\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77"
        "\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59"
        "\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC"
        "\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107"
        "\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139"
        "\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE"
        "\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E"
        "\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F"
        "\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2"
        "\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
        "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
        "\\s+$",
        "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
        "\\p{N}+",
    };
  } else if (pre == "deepseek-v3" || pre == "deepseek3-llm") {
    *regexes = {
        R"(\p{N}{1,3})",
        "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)"
        R"(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    };
  } else if (pre == "default") {
    // llama.cpp's fallback for BPE vocabularies without a known pre-tokenizer.
    *regexes = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  } else {
    return false;
  }
  return true;
}

StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::vector<std::string> regexes) {
  std::unique_ptr<PreTokenizer> p(new PreTokenizer());
  for (const std::string& re : regexes) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    pcre2_code* code = pcre2_compile(
        reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(),
        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &err,
        &err_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return InvalidArgument("pre-tokenizer regex '" + re + "' at offset " +
                             std::to_string(err_offset) + ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; falls back to interpreter
    p->codes_.push_back(code);
  }
  p->regexes_ = std::move(regexes);
  return p;
}

PreTokenizer::~PreTokenizer() {
  for (pcre2_code* c : codes_) pcre2_code_free(c);
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* out) const {
  if (text.empty()) return;
  if (codes_.empty()) {
    out->push_back(text);
    return;
  }
  SplitOne(0, text, out);
}

void PreTokenizer::SplitOne(size_t i, std::string_view piece,
                            std::vector<std::string_view>* out) const {
  const auto emit = [&](std::string_view s) {
    if (s.empty()) return;
    if (i + 1 == codes_.size()) {
      out->push_back(s);
    } else {
      SplitOne(i + 1, s, out);
    }
  };
  pcre2_code* code = codes_[i];
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  PENG_CHECK(md != nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t gap_start = 0;  // start of text not yet emitted
  size_t search = 0;
  while (search < piece.size()) {
    int rc = pcre2_match(code, subject, piece.size(), search, 0, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, piece.size(), search, PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no match (or an error): the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // empty match: step over one character
      search = start + 1;
      while (search < piece.size() && (static_cast<unsigned char>(piece[search]) & 0xC0) == 0x80)
        ++search;
      continue;
    }
    if (start > gap_start) emit(piece.substr(gap_start, start - gap_start));
    emit(piece.substr(start, end - start));
    gap_start = search = end;
  }
  if (gap_start < piece.size()) emit(piece.substr(gap_start));
  pcre2_match_data_free(md);
}

}  // namespace peng
