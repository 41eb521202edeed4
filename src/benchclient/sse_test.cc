#include "benchclient/sse.h"

#include <gtest/gtest.h>

#include <vector>

namespace peng::benchclient {
namespace {

std::vector<std::string> ParseInPieces(const std::string& body, size_t piece) {
  std::vector<std::string> events;
  SseParser p([&](std::string_view d) {
    events.emplace_back(d);
    return true;
  });
  for (size_t i = 0; i < body.size(); i += piece) p.Feed(body.substr(i, piece));
  p.Finish();
  return events;
}

TEST(SseParserTest, SplitsEventsWhateverThePieceSize) {
  const std::string body =
      ": keep-alive comment\n\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata:{\"b\":2}\r\n\r\n"
      "data: line1\ndata: line2\n\n"
      "id: 5\n\n"
      "data: [DONE]";  // unterminated final event
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"};
  for (size_t piece : {1, 2, 3, 7, 1000}) EXPECT_EQ(ParseInPieces(body, piece), want) << piece;
}

TEST(SseParserTest, CallbackCanStopParsing) {
  int calls = 0;
  SseParser p([&](std::string_view) { return ++calls < 2; });
  EXPECT_TRUE(p.Feed("data: 1\n\n"));
  EXPECT_FALSE(p.Feed("data: 2\n\ndata: 3\n\n"));
  EXPECT_FALSE(p.Feed("data: 4\n\n"));
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace peng::benchclient
