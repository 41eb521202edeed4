#include "server/byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace peng::server {

StatusOr<int64_t> ParseByteSize(const std::string& text) {
  const Status bad =
      InvalidArgument("invalid memory size '" + text + "' (e.g. 512MiB, 2GB, 1073741824)");
  size_t i = 0;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0) return bad;
  const std::string number = text.substr(0, i);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return bad;
  const std::string unit = text.substr(i);
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else {
    static const std::string kLetters = "KMGT";
    const size_t power = kLetters.find(static_cast<char>(std::toupper(unit[0])));
    if (power == std::string::npos) return bad;
    const std::string rest = unit.substr(1);
    if (rest.empty() || rest == "i" || rest == "iB") {
      scale = std::pow(1024.0, static_cast<double>(power + 1));
    } else if (rest == "B") {
      scale = std::pow(1000.0, static_cast<double>(power + 1));
    } else {
      return bad;
    }
  }
  const double bytes = value * scale;
  if (!(bytes >= 0) || bytes > 9.0e18) return bad;
  return static_cast<int64_t>(bytes);
}

}  // namespace peng::server
