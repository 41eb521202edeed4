// Test helpers for the server tests: a server on a random loopback port running in a thread,
// and a raw-socket client that can hang up mid-response. Test-only.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "server/server.h"

namespace peng::server::testing {

// Starts `engine`'s server on 127.0.0.1:<free port>; the destructor shuts it down.
class RunningServer {
 public:
  RunningServer(Engine* engine, ServerOptions options) {
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<Server>(engine, std::move(options));
    const Status bound = server_->Bind();
    if (!bound.ok()) return;
    thread_ = std::thread([this] { served_ = server_->Serve(); });
  }
  ~RunningServer() {
    server_->Shutdown();
    if (thread_.joinable()) thread_.join();
  }
  Server& server() { return *server_; }
  int port() const { return server_->port(); }
  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port());
    c->set_read_timeout(30, 0);
    return c;
  }
  // Waits for the listener thread (after a Shutdown() from elsewhere).
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  const Status& served() const { return served_; }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  Status served_;
};

// Sends a POST over a raw socket, reads until `until` appears in the response (or 10 s), then
// closes the connection. Returns what was read.
inline std::string PostAndHangUp(int port, const std::string& path, const std::string& body,
                                 const std::string& until) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) < 0) {
    close(fd);
    return "";
  }
  std::string got;
  timeval tv{0, 100000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  char buf[4096];
  while (!until.empty() && got.find(until) == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n > 0) got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return got;
}

// Polls `done` every 10 ms for up to `seconds`.
inline bool WaitFor(const std::function<bool()>& done, double seconds = 10) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace peng::server::testing
