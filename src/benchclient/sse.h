// Incremental parser for a text/event-stream (Server-Sent Events) body. Bytes are fed as they
// arrive, in pieces of any size; each complete event's data (its `data:` lines joined by '\n')
// goes to the callback. Comment lines (":") and other fields are ignored. Not thread-safe.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace peng::benchclient {

class SseParser {
 public:
  // Return false from the callback to stop parsing.
  using OnData = std::function<bool(std::string_view data)>;
  explicit SseParser(OnData on_data) : on_data_(std::move(on_data)) {}

  // False once the callback has asked to stop.
  bool Feed(std::string_view bytes);
  // Dispatches an event left unterminated at the end of the stream.
  bool Finish();

 private:
  bool HandleLine(std::string_view line);
  bool Dispatch();

  OnData on_data_;
  std::string pending_;  // bytes of an incomplete line
  std::string data_;
  bool has_data_ = false;
  bool stopped_ = false;
};

}  // namespace peng::benchclient
