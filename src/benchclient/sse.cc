#include "benchclient/sse.h"

namespace peng::benchclient {

bool SseParser::Feed(std::string_view bytes) {
  if (stopped_) return false;
  pending_.append(bytes);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!HandleLine(line)) {
      stopped_ = true;
      return false;
    }
  }
  pending_.erase(0, start);
  return true;
}

bool SseParser::Finish() {
  if (stopped_) return false;
  if (!pending_.empty()) {
    std::string last = std::move(pending_);
    pending_.clear();
    if (!last.empty() && last.back() == '\r') last.pop_back();
    if (!HandleLine(last)) return false;
  }
  return Dispatch();
}

bool SseParser::HandleLine(std::string_view line) {
  if (line.empty()) return Dispatch();
  if (line.front() == ':') return true;
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return true;
  std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
  return true;
}

bool SseParser::Dispatch() {
  if (!has_data_) return true;
  has_data_ = false;
  const std::string data = std::move(data_);
  data_.clear();
  return on_data_(data);
}

}  // namespace peng::benchclient
