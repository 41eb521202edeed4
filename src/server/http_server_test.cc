// The HTTP layer alone, with a scripted handler: streams with gaps longer than the write
// timeout, keep-alive after a stream, pipelined requests, and a client that never reads.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

namespace peng::server::http {
namespace {

// GET /stream: three chunks "a", "b", "c", `gap_ms` apart. GET /big: `big_bytes` in chunks.
// Anything else: 200 "ok:" + path.
class ScriptedHandler : public Handler {
 public:
  std::optional<Response> OnHeaders(const Request&) override { return std::nullopt; }
  void OnRequest(Request req, std::shared_ptr<Responder> out) override {
    if (req.path == "/stream") {
      out->BeginStream(200, "text/plain", {});
      threads.emplace_back([out, gap = gap_ms] {
        for (const char* s : {"a", "b", "c"}) {
          std::this_thread::sleep_for(std::chrono::milliseconds(gap));
          out->Write(s);
        }
        out->End();
      });
      return;
    }
    if (req.path == "/big") {
      out->BeginStream(200, "text/plain", {});
      out->OnClientGone([this] { gone = true; });
      threads.emplace_back([out, n = big_bytes] {
        for (size_t i = 0; i < n; i += 65536) out->Write(std::string(65536, 'x'));
        out->End();
      });
      return;
    }
    Response r;
    r.content_type = "text/plain";
    r.body = "ok:" + req.path;
    out->Send(std::move(r));
  }
  int gap_ms = 0;
  size_t big_bytes = 0;
  std::atomic<bool> gone{false};
  std::vector<std::thread> threads;  // joined before the server goes
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpOptions o) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<HttpServer>(&handler_, o);
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { (void)server_->Serve(); });
  }
  void TearDown() override {
    for (auto& t : handler_.threads) t.join();
    if (server_) server_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  ScriptedHandler handler_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

TEST_F(HttpServerTest, StreamGapsLongerThanTheWriteTimeoutAreFine) {
  HttpOptions o;
  o.write_timeout = std::chrono::milliseconds(200);
  Start(o);
  handler_.gap_ms = 500;
  httplib::Client c("127.0.0.1", server_->port());
  auto r = c.Get("/stream");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "abc");
  // The same keep-alive connection serves the next request.
  r = c.Get("/next");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "ok:/next");
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start(HttpOptions());
  httplib::Client probe("127.0.0.1", server_->port());
  ASSERT_TRUE(probe.Get("/x"));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string reqs = "GET /one HTTP/1.1\r\nHost: x\r\n\r\nGET /two HTTP/1.1\r\nHost: x\r\n\r\n"
                           "GET /three HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(send(fd, reqs.data(), reqs.size(), 0), static_cast<ssize_t>(reqs.size()));
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) got.append(buf, n);
  close(fd);
  const size_t one = got.find("ok:/one"), two = got.find("ok:/two"), three = got.find("ok:/three");
  ASSERT_NE(one, std::string::npos) << got;
  ASSERT_NE(two, std::string::npos) << got;
  ASSERT_NE(three, std::string::npos) << got;
  EXPECT_LT(one, two);
  EXPECT_LT(two, three);
  EXPECT_NE(got.find("Connection: close"), std::string::npos);
}

// A client that asks for a lot and never reads is dropped once its unsent bytes pass the cap.
TEST_F(HttpServerTest, AClientThatDoesNotReadIsDropped) {
  HttpOptions o;
  o.max_queued_bytes = 1 << 20;
  Start(o);
  handler_.big_bytes = size_t{64} << 20;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string req = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  for (int i = 0; i < 500 && !handler_.gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(handler_.gone);
  close(fd);
}

}  // namespace
}  // namespace peng::server::http
