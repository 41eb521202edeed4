#include "monitor/prom_text.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace peng::monitor {
namespace {

bool IsNameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

bool ParseNumber(std::string_view s, double* out) {
  if (s == "+Inf" || s == "Inf") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-Inf") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "NaN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Parses `{a="x",b="y"}` at line[*i] (which is '{'); leaves *i after the '}'.
Status ParseLabels(std::string_view line, size_t* i, std::map<std::string, std::string>* out) {
  ++*i;
  for (;;) {
    while (*i < line.size() && line[*i] == ' ') ++*i;
    if (*i < line.size() && line[*i] == '}') {
      ++*i;
      return OkStatus();
    }
    const size_t b = *i;
    while (*i < line.size() && IsNameChar(line[*i], *i == b)) ++*i;
    if (*i == b) return InvalidArgument("a label name was expected");
    std::string key(line.substr(b, *i - b));
    if (*i + 1 >= line.size() || line[*i] != '=' || line[*i + 1] != '"')
      return InvalidArgument("label " + key + " has no =\"value\"");
    *i += 2;
    std::string value;
    for (;;) {
      if (*i >= line.size()) return InvalidArgument("label " + key + ": unterminated value");
      const char c = line[(*i)++];
      if (c == '"') break;
      if (c == '\\') {
        if (*i >= line.size()) return InvalidArgument("label " + key + ": unterminated value");
        const char e = line[(*i)++];
        value += e == 'n' ? '\n' : e;
      } else {
        value += c;
      }
    }
    (*out)[std::move(key)] = std::move(value);
    while (*i < line.size() && line[*i] == ' ') ++*i;
    if (*i < line.size() && line[*i] == ',') ++*i;
    else if (*i >= line.size() || line[*i] != '}') return InvalidArgument("',' or '}' expected");
  }
}

}  // namespace

StatusOr<std::vector<PromSample>> ParsePromText(std::string_view text) {
  std::vector<PromSample> out;
  int line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t i = 0;
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == line.size() || line[i] == '#') continue;
    auto fail = [&](const std::string& what) {
      return InvalidArgument("metrics line " + std::to_string(line_no) + ": " + what);
    };
    PromSample s;
    const size_t b = i;
    while (i < line.size() && IsNameChar(line[i], i == b)) ++i;
    if (i == b) return fail("a metric name was expected");
    s.name = std::string(line.substr(b, i - b));
    if (i < line.size() && line[i] == '{') {
      if (Status st = ParseLabels(line, &i, &s.labels); !st.ok()) return fail(st.message());
    }
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t vb = i;
    while (i < line.size() && line[i] != ' ') ++i;
    if (!ParseNumber(line.substr(vb, i - vb), &s.value))
      return fail("bad value '" + std::string(line.substr(vb, i - vb)) + "'");
    out.push_back(std::move(s));  // a trailing timestamp is ignored
  }
  return out;
}

double PromScrape::Sum(const std::string& name,
                       const std::map<std::string, std::string>& match) const {
  double sum = 0;
  bool any = false;
  for (const PromSample& s : samples_) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) {
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    sum += s.value;
    any = true;
  }
  return any ? sum : std::numeric_limits<double>::quiet_NaN();
}

bool PromScrape::Has(const std::string& name) const {
  for (const PromSample& s : samples_)
    if (s.name == name) return true;
  return false;
}

std::map<double, double> PromScrape::Buckets(const std::string& histogram) const {
  std::map<double, double> out;
  const std::string name = histogram + "_bucket";
  for (const PromSample& s : samples_) {
    if (s.name != name) continue;
    auto it = s.labels.find("le");
    double le;
    if (it == s.labels.end() || !ParseNumber(it->second, &le)) continue;
    out[le] += s.value;
  }
  return out;
}

double HistogramQuantile(const std::map<double, double>& buckets, double q) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (buckets.empty()) return nan;
  const double total = buckets.rbegin()->second;
  if (!(total > 0)) return nan;
  const double rank = q * total;
  double prev_bound = 0, prev_count = 0;
  for (const auto& [bound, count] : buckets) {
    if (count >= rank) {
      if (std::isinf(bound)) return prev_bound;  // beyond the last finite bucket
      if (count == prev_count) return bound;
      return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count);
    }
    prev_bound = bound;
    prev_count = count;
  }
  return prev_bound;
}

}  // namespace peng::monitor
