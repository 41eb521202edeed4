// What one client must not be able to do to the others, over raw sockets against the server
// on a scripted fake engine: slow or idle connections, too many connections, oversized or
// smuggled bodies, and a request that fails inside the engine.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/fake_engine.h"
#include "server/server.h"
#include "server/test_http.h"

namespace peng::server {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::RunningServer;
using testing::WaitFor;
using Clock = std::chrono::steady_clock;

// A raw TCP client to 127.0.0.1:port.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    return send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Reads until the peer closes, `until` appears, or `seconds` pass. *closed = peer closed.
  std::string Read(double seconds, const std::string& until = "", bool* closed = nullptr) {
    std::string got;
    timeval tv{0, 50000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    if (closed) *closed = false;
    while (Clock::now() < deadline) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        if (closed) *closed = true;
        break;
      }
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      if (!until.empty() && got.find(until) != std::string::npos) break;
    }
    return got;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

int CountOf(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string Post(const std::string& path, const std::string& body,
                 const std::string& extra_headers = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

class RobustnessTest : public ::testing::Test {
 protected:
  ServerOptions Options() {
    ServerOptions o;
    o.served_model_name = "fake";
    o.max_body_bytes = 4096;
    return o;
  }
  // GET /health on a fresh connection: seconds until the answer (-1 if none within 5 s).
  double HealthSeconds(int port, int* status) {
    const auto t0 = Clock::now();
    auto c = httplib::Client("127.0.0.1", port);
    c.set_read_timeout(5, 0);
    auto r = c.Get("/health");
    *status = r ? r->status : 0;
    return r ? std::chrono::duration<double>(Clock::now() - t0).count() : -1;
  }
  FakeEngine engine_;
};

TEST_F(RobustnessTest, ListenBacklogIs1024AsSeenBySs) {
  RunningServer s(&engine_, Options());
  ASSERT_TRUE(WaitFor([&] { return s.Client()->Get("/health") != nullptr; }));
  const std::string cmd = "ss -ltnH 'sport = :" + std::to_string(s.port()) + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[512] = {};
  const bool got = fgets(line, sizeof(line), p) != nullptr;
  pclose(p);
  if (!got) GTEST_SKIP() << "ss (iproute2) is not installed";
  // "LISTEN 0 1024 127.0.0.1:PORT 0.0.0.0:*": Send-Q of a listening socket is its backlog.
  char state[32] = {};
  long recv_q = -1, send_q = -1;
  ASSERT_EQ(std::sscanf(line, "%31s %ld %ld", state, &recv_q, &send_q), 3) << line;
  EXPECT_STREQ(state, "LISTEN");
  EXPECT_EQ(send_q, 1024) << line;
}

TEST_F(RobustnessTest, SlowHeadersAreCutOffWithoutBlockingHealth) {
  ServerOptions o = Options();
  o.header_timeout = std::chrono::milliseconds(400);
  RunningServer s(&engine_, o);
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 50; ++i) {
    slow.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(slow.back()->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  }
  int status = 0;
  const double secs = HealthSeconds(s.port(), &status);
  EXPECT_EQ(status, 200);
  EXPECT_GE(secs, 0);
  EXPECT_LT(secs, 1.0);
  // The slowloris connections are closed once the header timeout passes.
  bool closed = false;
  const std::string got = slow[0]->Read(3, "", &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(got, "");
}

TEST_F(RobustnessTest, IdleConnectionsDoNotBlockOthersAndTimeOut) {
  ServerOptions o = Options();
  o.idle_timeout = std::chrono::milliseconds(1500);
  RunningServer s(&engine_, o);
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 300; ++i) {  // far more than the server has threads
    idle.push_back(std::make_unique<RawClient>(s.port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  int status = 0;
  EXPECT_LT(HealthSeconds(s.port(), &status), 1.0);
  EXPECT_EQ(status, 200);
  auto r = s.Client()->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 3})",
                            "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  bool closed = false;
  idle[0]->Read(4, "", &closed);
  EXPECT_TRUE(closed) << "an idle keep-alive connection must be closed after idle_timeout";
}

TEST_F(RobustnessTest, ConnectionsBeyondTheCapGet503) {
  ServerOptions o = Options();
  o.max_connections = 4;
  RunningServer s(&engine_, o);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(std::make_unique<RawClient>(s.port()));
  ASSERT_TRUE(WaitFor([&] { return true; }, 0.2));
  RawClient extra(s.port());
  ASSERT_TRUE(extra.Send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  bool closed = false;
  const std::string got = extra.Read(5, "", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 503 ", 0), 0u) << got;
  EXPECT_NE(got.find("\"code\":\"too_many_connections\""), std::string::npos) << got;
  EXPECT_TRUE(closed);
  held.clear();  // freed seats are usable again
  EXPECT_TRUE(WaitFor([&] {
    auto r = s.Client()->Get("/health");
    return r && r->status == 200;
  }, 5));
}

// A body smuggled inside a rejected request is never read as a second request.
TEST_F(RobustnessTest, KeepAliveDesyncAfterEarly401Fails) {
  ServerOptions o = Options();
  o.api_key = "sekret";
  RunningServer s(&engine_, o);
  RawClient c(s.port());
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n\r\n";
  ASSERT_TRUE(c.Send(Post("/v1/completions", smuggled)));
  bool closed = false;
  const std::string got = c.Read(5, "", &closed);
  EXPECT_EQ(got.rfind("HTTP/1.1 401 ", 0), 0u) << got;
  EXPECT_EQ(CountOf(got, "HTTP/1.1 "), 1) << got;
  EXPECT_EQ(got.find("\"object\":\"list\""), std::string::npos) << got;
  EXPECT_TRUE(closed);
}

TEST_F(RobustnessTest, ConflictingLengthsAndOversizedChunkedBodiesAreRejected) {
  RunningServer s(&engine_, Options());
  {
    RawClient c(s.port());
    ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\n\r\n"));
    bool closed = false;
    const std::string got = c.Read(5, "", &closed);
    EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << got;
    EXPECT_EQ(CountOf(got, "HTTP/1.1 "), 1) << got;
    EXPECT_TRUE(closed);
  }
  {
    RawClient c(s.port());
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 8; ++i) req += "400\r\n" + std::string(1024, ' ') + "\r\n";
    req += "0\r\n\r\n";
    ASSERT_TRUE(c.Send(req));
    bool closed = false;
    const std::string got = c.Read(5, "", &closed);
    EXPECT_EQ(got.rfind("HTTP/1.1 413 ", 0), 0u) << got;
    EXPECT_NE(got.find("\"code\":\"request_too_large\""), std::string::npos) << got;
    EXPECT_TRUE(closed);
  }
  {  // a sized body over the limit is refused before it is read
    RawClient c(s.port());
    ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"));
    const std::string got = c.Read(5, "\r\n\r\n");
    EXPECT_EQ(got.rfind("HTTP/1.1 413 ", 0), 0u) << got;
  }
  {  // deeply nested JSON is a 400, not a stack overflow
    std::string deep(100000, '[');
    auto r = s.Client()->Post("/v1/chat/completions",
                              R"({"messages": [{"role": "user", "content": "hi", "x": )" +
                                  deep.substr(0, 3000) + "}]}",
                              "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("deeper than 64 levels"), std::string::npos) << r->body;
  }
}

TEST_F(RobustnessTest, BearerSchemeIsCaseInsensitiveAndMetricsCanBeProtected) {
  ServerOptions o = Options();
  o.api_key = "sekret";
  o.protect_metrics = true;
  RunningServer s(&engine_, o);
  auto c = s.Client();
  for (const char* h : {"Bearer sekret", "bearer sekret", "BEARER   sekret"}) {
    auto r = c->Get("/v1/models", {{"Authorization", h}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << h;
  }
  for (const char* h : {"Bearer sekre", "Bearer sekrett", "Basic sekret", "sekret", "Bearer"}) {
    auto r = c->Get("/v1/models", {{"Authorization", h}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << h;
  }
  EXPECT_EQ(c->Get("/metrics")->status, 401);
  EXPECT_EQ(c->Get("/metrics", {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(c->Get("/health")->status, 200);
}

// A request that fails inside the engine ends with an error of its own; the server goes on.
TEST_F(RobustnessTest, EngineErrorIs500OrAnSseErrorEvent) {
  engine_.fail_after = 1;
  RunningServer s(&engine_, Options());
  auto c = s.Client();
  auto r = c->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 4})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->body,
            R"({"error":{"code":"generation_failed","message":"Generation failed: injected )"
            R"(failure","param":null,"type":"internal_error"}})");
  r = c->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 4, "stream": true})",
              "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const std::string want_tail =
      R"(data: {"error":{"code":"generation_failed","message":"Generation failed: injected )"
      R"(failure","param":null,"type":"internal_error"}})"
      "\n\ndata: [DONE]\n\n";
  ASSERT_GE(r->body.size(), want_tail.size()) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - want_tail.size()), want_tail);
  EXPECT_NE(r->body.find(R"("text":"x")"), std::string::npos) << r->body;  // the first token
  engine_.fail_after = 0;
  r = c->Post("/v1/completions", R"({"prompt": [1], "max_tokens": 2})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(s.server().MetricsText().find("finished_reason=\"error\"} 2\n"), std::string::npos)
      << s.server().MetricsText();
}

TEST_F(RobustnessTest, DrainTimeoutAbortsWhatIsStillRunning) {
  engine_.delay_ms = 50;
  ServerOptions o = Options();
  o.drain_timeout = std::chrono::milliseconds(300);
  RunningServer s(&engine_, o);
  std::string streamed;
  std::thread client([&] {
    auto r = s.Client()->Post("/v1/completions",
                              R"({"prompt": [1], "max_tokens": 60, "stream": true})",
                              "application/json");
    if (r) streamed = r->body;
  });
  ASSERT_TRUE(WaitFor([&] { return engine_.running() == 1; }));
  const auto t0 = Clock::now();
  s.server().Shutdown();
  s.Join();
  client.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  EXPECT_NE(streamed.find("\"finish_reason\":\"abort\""), std::string::npos) << streamed;
}

}  // namespace
}  // namespace peng::server
