// Numeric ranges as GBNF: the decimal numerals (no leading zeros) of the integers in
// [lo, hi], split by digit count and then digit by digit, and JSON numbers between integer
// bounds (integer part in range, fraction constrained only at the ends). Used for JSON Schema
// minimum / maximum / exclusiveMinimum / exclusiveMaximum (json_schema.cc).
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "grammar/gbnf_internal.h"

namespace peng::grammar::internal {

namespace {

std::string DigitClass(char lo, char hi) {
  std::string s;
  if (lo == hi) {
    s.push_back('"');
    s.push_back(lo);
    s.push_back('"');
  } else {
    s.push_back('[');
    s.push_back(lo);
    s.push_back('-');
    s.push_back(hi);
    s.push_back(']');
  }
  return s;
}

std::string Quoted(const std::string& digits) {
  std::string s;
  s.reserve(digits.size() + 2);
  s.push_back('"');
  s.append(digits);
  s.push_back('"');
  return s;
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return "[0-9]{" + std::to_string(n) + "}";
}

std::string Seq(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

std::string Alts(const std::vector<std::string>& alts) {
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string s = "(";
  for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : "") + alts[i];
  return s + ")";
}

// Numerals from a to b, both with the same number of digits, a <= b.
std::string SameLength(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  if (a == b) return Quoted(a);
  size_t i = 0;
  while (a[i] == b[i]) ++i;
  const std::string prefix = i ? Quoted(a.substr(0, i)) : "";
  const std::string ra = a.substr(i + 1), rb = b.substr(i + 1);
  const size_t r = ra.size();
  const bool a_zeros = ra.find_first_not_of('0') == std::string::npos;
  const bool b_nines = rb.find_first_not_of('9') == std::string::npos;
  std::vector<std::string> alts;
  char mid_lo = a[i], mid_hi = b[i];
  if (!a_zeros) {
    alts.push_back(Seq(DigitClass(a[i], a[i]), SameLength(ra, std::string(r, '9'))));
    ++mid_lo;
  }
  std::string high;
  if (!b_nines) {
    high = Seq(DigitClass(b[i], b[i]), SameLength(std::string(r, '0'), rb));
    --mid_hi;
  }
  if (mid_lo <= mid_hi) alts.push_back(Seq(DigitClass(mid_lo, mid_hi), AnyDigits(r)));
  if (!high.empty()) alts.push_back(high);
  return Seq(prefix, Alts(alts));
}

long long Pow10(size_t n) {
  long long p = 1;
  while (n--) p *= 10;
  return p;
}

// Numerals of the integers in [lo, hi] (hi absent: unbounded), 0 <= lo.
std::string NonNegative(long long lo, std::optional<long long> hi) {
  if (hi && lo > *hi) return "";
  const size_t dl = std::to_string(lo).size();
  const size_t dh = hi ? std::to_string(*hi).size() : dl;
  std::vector<std::string> alts;
  for (size_t d = dl; d <= dh; ++d) {
    const long long a = d == dl ? lo : Pow10(d - 1);
    const long long b = hi && d == dh ? *hi : Pow10(d) - 1;
    alts.push_back(SameLength(std::to_string(a), std::to_string(b)));
  }
  // No upper bound: up to 16 digits (a double's precision), as the unbounded integer rule.
  if (!hi) {
    alts.push_back("[1-9] [0-9]{" + std::to_string(dl) + "," +
                   std::to_string(std::max<size_t>(dl, kMaxIntegerDigits - 1)) + "}");
  }
  return Alts(alts);
}

// Non-negative JSON numbers (no exponent) m with lo <(=) m <(=) hi.
std::string Magnitude(long long lo, bool lo_excl, std::optional<long long> hi, bool hi_excl) {
  // Fractions are bounded like the unbounded number rule's (15 digits; a non-zero fraction's
  // last non-zero digit within 15, then at most 14 zeros): a model cannot loop on digits.
  const std::string f = std::to_string(kMaxFractionDigits);
  const std::string f1 = std::to_string(kMaxFractionDigits - 1);
  const std::string any_frac = "(\".\" [0-9]{1," + f + "})?";
  const std::string zero_frac = "(\".\" \"0\"{1," + f + "})?";
  const std::string pos_frac = "\".\" [0-9]{0," + f1 + "} [1-9] \"0\"{0," + f1 + "}";
  const long long lo2 = lo + (lo_excl ? 1 : 0);
  std::vector<std::string> alts;
  std::optional<long long> int_hi;
  if (hi) int_hi = *hi - 1;
  const std::string mid = NonNegative(lo2, int_hi);
  if (!mid.empty()) alts.push_back(mid + " " + any_frac);
  if (hi && !hi_excl && *hi >= lo2) alts.push_back(Quoted(std::to_string(*hi)) + " " + zero_frac);
  if (lo_excl && (!hi || lo < *hi)) alts.push_back(Quoted(std::to_string(lo)) + " " + pos_frac);
  return Alts(alts);
}

}  // namespace

std::string IntegerRangeGbnf(std::optional<long long> lo, std::optional<long long> hi) {
  std::vector<std::string> alts;
  if (!hi || *hi >= 0) {
    const std::string e = NonNegative(lo && *lo > 0 ? *lo : 0, hi);
    if (!e.empty()) alts.push_back(e);
  }
  if (!lo || *lo < 0) {
    const long long mlo = hi && *hi < 0 ? -*hi : 1;
    std::optional<long long> mhi;
    if (lo) mhi = -*lo;
    const std::string e = NonNegative(mlo, mhi);
    if (!e.empty()) alts.push_back("\"-\" " + Atom(e));
  }
  return Alts(alts);
}

std::string NumberRangeGbnf(std::optional<long long> lo, bool lo_excl, std::optional<long long> hi,
                            bool hi_excl) {
  std::vector<std::string> alts;
  if (!hi || *hi > 0 || (*hi == 0 && !hi_excl)) {
    const bool lo_pos = lo && *lo >= 0;
    const std::string e = Magnitude(lo_pos ? *lo : 0, lo_pos && lo_excl, hi, hi_excl);
    if (!e.empty()) alts.push_back(e);
  }
  if (!lo || *lo < 0) {
    const bool hi_neg = hi && *hi <= 0;
    std::optional<long long> mhi;
    if (lo) mhi = -*lo;
    const std::string e = Magnitude(hi_neg ? -*hi : 0, hi_neg && hi_excl, mhi, lo_excl);
    if (!e.empty()) alts.push_back("\"-\" " + Atom(e));
  }
  return Alts(alts);
}

}  // namespace peng::grammar::internal
